#include "wire/sha256.h"

#include <gtest/gtest.h>

#include "wire/hex.h"

namespace pandastack::wire {
namespace {

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256("abc").size(), 32u);
  EXPECT_EQ(hex_encode(sha256("abc")), sha256_hex("abc"));
}

TEST(Sha256, HmacMatchesRfc4231) {
  // RFC 4231 test case 2 (a key shorter than the block).
  EXPECT_EQ(hex_encode(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Sha256, PartsHashAsTheWholeAndTheDigestCanBeReadOnTheWay) {
  Sha256 h;
  h.add("a");
  auto after_a = h.hex();
  EXPECT_EQ(after_a, sha256_hex("a"));
  h.add("b").add("c");
  EXPECT_EQ(h.hex(), sha256_hex("abc"));
  EXPECT_EQ(h.hex(), sha256_hex("abc"));  // (reading it changes nothing)
  std::string big(3 << 20, 'x');
  Sha256 parts;
  for (size_t at = 0; at < big.size(); at += 65536)
    parts.add(std::string_view(big).substr(at, 65536));
  EXPECT_EQ(parts.digest(), sha256(big));
}

}  // namespace
}  // namespace pandastack::wire
