#include "wire/sha256.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <new>

#include "wire/hex.h"

namespace pandastack::wire {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::bad_alloc();
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

Sha256& Sha256::add(std::string_view data) {
  EVP_DigestUpdate(ctx_, data.data(), data.size());
  return *this;
}

std::string Sha256::digest() const {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* copy = EVP_MD_CTX_new();
  if (copy == nullptr || EVP_MD_CTX_copy_ex(copy, ctx_) != 1 ||
      EVP_DigestFinal_ex(copy, md, &len) != 1) {
    EVP_MD_CTX_free(copy);
    throw std::bad_alloc();
  }
  EVP_MD_CTX_free(copy);
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string Sha256::hex() const { return hex_encode(digest()); }

std::string sha256(std::string_view data) { return Sha256().add(data).digest(); }

std::string hmac_sha256(std::string_view key, std::string_view msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string sha256_hex(std::string_view data) { return hex_encode(sha256(data)); }

}  // namespace pandastack::wire
