// API keys: `pds_<id>_<secret>`. Only SHA-256(secret) is stored, keyed by the id; verification
// compares hashes in constant time. A key belongs to one tenant; admin keys manage keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/error.h"
#include "storage/event_store.h"

namespace pandastack::storage {

struct ApiKey {
  std::string id;
  std::string tenant;
  bool admin = false;
  int64_t created_ms = 0;
};

class KeyStore {
 public:
  explicit KeyStore(EventStore& db) : db_(db) {}

  // Creates a key; returns the token (shown once, never stored) and the key's record.
  Result<std::pair<std::string, ApiKey>> create(const std::string& tenant, bool admin);
  // The key `token` belongs to; not_found for unknown, revoked or malformed tokens.
  Result<ApiKey> verify(const std::string& token);
  Status revoke(const std::string& id);
  Result<std::vector<ApiKey>> list();

 private:
  EventStore& db_;
};

}  // namespace pandastack::storage
