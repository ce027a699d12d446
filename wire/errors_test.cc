#include "wire/errors.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace pandastack {
namespace {

TEST(Errors, EveryCodeHasAUniqueNameAStatusAndASummary) {
  std::set<std::string> names;
  for (auto c : all_codes()) {
    std::string name = to_string(c);
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_GE(http_status(c), 400u) << name;
    EXPECT_LT(http_status(c), 600u) << name;
    EXPECT_GT(std::string(summary(c)).size(), 5u) << name;
    EXPECT_EQ(code_from_string(name), c) << name;
  }
  EXPECT_GT(names.size(), 50u);
}

TEST(Errors, NamesAndStatusesAreTheApis) {
  EXPECT_STREQ(to_string(Code::sandbox_not_found), "sandbox_not_found");
  EXPECT_EQ(http_status(Code::sandbox_not_found), 404u);
  EXPECT_EQ(http_status(Code::quota_exceeded), 429u);
  EXPECT_EQ(http_status(Code::internal), 500u);
  EXPECT_EQ(http_status(Code::not_implemented), 501u);
  EXPECT_EQ(http_status(Code::no_space), 507u);
  EXPECT_EQ(code_from_string("no_such_code"), std::nullopt);
  EXPECT_EQ(code_from_string(""), std::nullopt);
}

}  // namespace
}  // namespace pandastack
