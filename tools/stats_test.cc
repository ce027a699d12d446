#include "tools/stats.h"

#include <gtest/gtest.h>

#include "wire/json.h"

namespace pandastack::tools {
namespace {

TEST(Stats, NearestRankPercentiles) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  auto s = summarize(v);
  EXPECT_EQ(s.n, 100u);
  EXPECT_DOUBLE_EQ(s.p50_ms, 50);
  EXPECT_DOUBLE_EQ(s.p99_ms, 99);
  EXPECT_DOUBLE_EQ(s.min_ms, 1);
  EXPECT_DOUBLE_EQ(s.max_ms, 100);
  EXPECT_DOUBLE_EQ(s.mean_ms, 50.5);
}

TEST(Stats, SmallSamples) {
  auto s = summarize({7.0, 3.0});
  EXPECT_DOUBLE_EQ(s.p50_ms, 3);
  EXPECT_DOUBLE_EQ(s.p99_ms, 7);
  EXPECT_EQ(summarize({}).n, 0u);
}

TEST(Stats, JsonHasTheDocumentedFields) {
  auto line = summary_json("exec", summarize({1.0, 2.0, 3.0}), "tcg", {{"throughput_mb_s", "12.5"}});
  auto j = wire::Json::parse(line);
  ASSERT_TRUE(j);
  for (auto k : {"scenario", "n", "p50_ms", "p99_ms", "min_ms", "max_ms", "accel"}) EXPECT_TRUE(j->has(k)) << k;
  EXPECT_EQ((*j)["scenario"].as_string(), "exec");
  EXPECT_EQ((*j)["n"].as_int(), 3);
  EXPECT_EQ((*j)["accel"].as_string(), "tcg");
  EXPECT_DOUBLE_EQ((*j)["throughput_mb_s"].as_double(), 12.5);
}

}  // namespace
}  // namespace pandastack::tools
