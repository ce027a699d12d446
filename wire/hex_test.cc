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

TEST(Hex, Fnv1aIsTheStandard64BitHashIn16Digits) {
  // The published FNV-1a test vectors.
  EXPECT_EQ(fnv1a_hex(""), "cbf29ce484222325");
  EXPECT_EQ(fnv1a_hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(fnv1a_hex("foobar"), "85944171f73967e8");
}

}  // namespace
}  // namespace pandastack::wire
