#include "actors/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "vmm-driver/usage.h"

namespace pandastack::actors {
namespace {

TEST(Metrics, KeepsTheLastSamplesAndAnswersARange) {
  MetricsStore store;
  for (int64_t i = 0; i < int64_t(MetricsStore::kMaxSamples) + 10; ++i) {
    MetricSample m;
    m.at_ms = i;
    store.add("sbx_a", m);
  }
  auto all = store.range("sbx_a", 0, INT64_MAX);
  ASSERT_EQ(all.size(), MetricsStore::kMaxSamples);
  EXPECT_EQ(all.front().at_ms, 10);  // the oldest went
  auto some = store.range("sbx_a", 100, 102);
  ASSERT_EQ(some.size(), 3u);
  EXPECT_EQ(some[0].at_ms, 100);
  EXPECT_TRUE(store.range("sbx_b", 0, INT64_MAX).empty());
  store.erase("sbx_a");
  EXPECT_TRUE(store.range("sbx_a", 0, INT64_MAX).empty());
}

TEST(Metrics, CpuPercentOfItsCpus) {
  EXPECT_DOUBLE_EQ(cpu_percent(500000, 1000000, 1), 50);
  EXPECT_DOUBLE_EQ(cpu_percent(500000, 1000000, 2), 25);
  EXPECT_DOUBLE_EQ(cpu_percent(3000000, 1000000, 2), 100);  // (clamped: tick rounding)
  EXPECT_DOUBLE_EQ(cpu_percent(1, 0, 1), 0);
  EXPECT_DOUBLE_EQ(cpu_percent(1, 1, 0), 0);
}

TEST(Metrics, ProcessUsageOfThisProcess) {
  volatile uint64_t spin = 0;
  for (uint64_t i = 0; i < 50000000; ++i) spin = spin + i;
  auto u = vmm::process_usage(::getpid());
  ASSERT_TRUE(u);
  EXPECT_GT(u->cpu_usec, 0u);
  EXPECT_GT(u->rss_bytes, 1u << 20);
  EXPECT_FALSE(vmm::process_usage(0x7ffffff0));  // (no such process)
  EXPECT_GT(vmm::allocated_bytes("/proc/self/exe"), 0u);
  EXPECT_EQ(vmm::allocated_bytes("/no/such/file"), 0u);
}

}  // namespace
}  // namespace pandastack::actors
