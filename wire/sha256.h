// SHA-256 (OpenSSL's), the one hasher of the tree: image blobs and manifests, carried snapshot
// files, step cache keys, tenant hashes, API key records and signatures; and HMAC-SHA256 over it
// (API key records, preview and E2B tokens, S3 request signing).
#pragma once

#include <string>
#include <string_view>

struct evp_md_ctx_st;  // (OpenSSL's EVP_MD_CTX)

namespace pandastack::wire {

// An incremental hash: add() the parts, read the digest at any point (the hash goes on).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& add(std::string_view data);
  std::string digest() const;  // the 32 bytes of what was added so far
  std::string hex() const;     // the same as 64 lowercase hex digits

 private:
  evp_md_ctx_st* ctx_;
};

std::string sha256(std::string_view data);      // 32 bytes
std::string sha256_hex(std::string_view data);  // 64 lowercase hex digits
// HMAC-SHA256 of `msg` under `key` (RFC 2104): 32 bytes.
std::string hmac_sha256(std::string_view key, std::string_view msg);

}  // namespace pandastack::wire
