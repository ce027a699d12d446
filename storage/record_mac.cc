#include "storage/record_mac.h"

#include <openssl/crypto.h>

#include "wire/sha256.h"

namespace pandastack::storage {

namespace {
constexpr size_t kMacLen = 32;
}

std::string seal_record(const std::string& key, const std::string& purpose, const std::string& id,
                        const std::string& record) {
  if (key.empty()) return record;
  std::string input = purpose;
  input += '\0';
  input += id;
  input += '\0';
  input += record;
  return record + wire::hmac_sha256(key, input).substr(0, kMacLen);
}

std::optional<std::string> open_record(const std::string& key, const std::string& purpose,
                                       const std::string& id, const std::string& sealed) {
  if (key.empty()) return sealed;
  if (sealed.size() < kMacLen) return std::nullopt;
  std::string record = sealed.substr(0, sealed.size() - kMacLen);
  std::string expected = seal_record(key, purpose, id, record);
  if (CRYPTO_memcmp(expected.data() + record.size(), sealed.data() + record.size(), kMacLen) != 0)
    return std::nullopt;
  return record;
}

}  // namespace pandastack::storage
