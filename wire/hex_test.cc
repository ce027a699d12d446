#include "wire/hex.h"

#include <gtest/gtest.h>

namespace pandastack::wire {
namespace {

TEST(Hex, RoundTripsEveryByteInLowercase) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += char(i);
  auto hex = hex_encode(all);
  EXPECT_EQ(hex.size(), 512u);
  EXPECT_EQ(hex.substr(0, 6), "000102");
  EXPECT_EQ(hex.substr(506), "fdfeff");
  EXPECT_EQ(hex_decode(hex), all);
  EXPECT_EQ(hex_encode(""), "");
  EXPECT_EQ(hex_decode(""), std::string());
}

TEST(Hex, RefusesOddLengthsUppercaseAndOtherCharacters) {
  EXPECT_EQ(hex_decode("abc"), std::nullopt);
  EXPECT_EQ(hex_decode("AB"), std::nullopt);
  EXPECT_EQ(hex_decode("0g"), std::nullopt);
  EXPECT_EQ(hex_decode("0 "), std::nullopt);
}

}  // namespace
}  // namespace pandastack::wire
