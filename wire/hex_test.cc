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

TEST(Hex, Fnv1aNamesAreStableAcrossReleases) {
  // Folder names on disk (the state folder, run folders, cached scripts) are made of these: they
  // never change. (The offset basis is 1469598103934665603, a digit short of FNV's published
  // 14695981039346656037; kept, since the names depend on it.)
  EXPECT_EQ(fnv1a_hex(""), "14650fb0739d0383");
  EXPECT_EQ(fnv1a_hex("a"), "44bd8ad473cd9906");
  EXPECT_EQ(fnv1a_hex("foobar"), "88fad7c0a8ff07f2");
}

}  // namespace
}  // namespace pandastack::wire
