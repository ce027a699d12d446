// API keys: `pds_<id>_<secret>`. Only SHA-256(secret) is stored, keyed by the id; verification
// compares hashes in constant time. A key belongs to one tenant; admin keys manage keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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

class Etcd;

// Records live in the event store, or (cluster mode, share()) in etcd under /pandastack/keys/,
// where every host of the cluster verifies them. A key verified through etcd is remembered for
// kSharedCacheFor: a revocation on another host takes effect within that. In etcd each record
// carries an HMAC-SHA256 under the cluster's records key (a file on every host, never in etcd):
// whoever writes to etcd without it (etcd's operator, a stolen etcd client certificate) cannot
// mint a key; a record whose MAC does not verify counts as no key at all.
class KeyStore {
 public:
  explicit KeyStore(EventStore& db);
  ~KeyStore();
  static constexpr std::chrono::milliseconds kSharedCacheFor{2000};

  // From now on keys are read and written in etcd (the local records are no longer used).
  // `records_key`: the MAC key ("" only for an --insecure-cluster: records unauthenticated).
  void share(std::unique_ptr<Etcd> etcd, std::string records_key);

  // Creates a key; returns the token (shown once, never stored) and the key's record.
  Result<std::pair<std::string, ApiKey>> create(const std::string& tenant, bool admin);
  // The key `token` belongs to; not_found for unknown, revoked or malformed tokens.
  Result<ApiKey> verify(const std::string& token);
  // Key `id` as it is now (not_found once revoked): for credentials issued under a key, which
  // end with it (E2B access tokens). Shared keys are remembered for kSharedCacheFor.
  Result<ApiKey> find(const std::string& id);
  Status revoke(const std::string& id);
  Result<std::vector<ApiKey>> list();

 private:
  Result<std::optional<std::string>> get_record(const std::string& id);
  Status put_record(const std::string& id, const std::string& record);
  Status remove_record(const std::string& id);

  EventStore& db_;
  // The record stored in etcd for `record` (MAC appended), and back (nullopt: forged).
  std::string seal(const std::string& id, const std::string& record) const;
  std::optional<std::string> open(const std::string& id, const std::string& sealed) const;

  std::unique_ptr<Etcd> shared_;
  std::string records_key_;
  std::mutex cache_mu_;
  // id + SHA-256(secret) -> the key and when it was verified (shared keys only).
  std::map<std::string, std::pair<ApiKey, std::chrono::steady_clock::time_point>> verified_;
  // id -> the key and when it was read (find(); shared keys only).
  std::map<std::string, std::pair<ApiKey, std::chrono::steady_clock::time_point>> found_;
};

}  // namespace pandastack::storage
