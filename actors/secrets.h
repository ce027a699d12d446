// Tenant secrets as the API offers them (storage/secrets.h keeps them sealed): the name, hosts,
// value and expiry of each checked, at most kPerTenant per tenant, and a value never answered.
// A secret's use -- its value put into a sandbox's requests to its hosts by an egress proxy, the
// guest seeing only a placeholder -- is not built yet: a create naming secrets is refused (501).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/sandbox.h"
#include "storage/secrets.h"

namespace pandastack::actors {

struct SecretRequest {
  std::string tenant, name;
  std::optional<std::string> value;
  std::optional<std::vector<std::string>> hosts;
  std::optional<uint32_t> ttl_seconds;  // from now; absent: never expires (create), unchanged
};

class Secrets {
 public:
  static constexpr size_t kPerTenant = 100;
  static constexpr size_t kMaxHosts = 32;
  static constexpr uint32_t kMaxTtlSeconds = 30 * 24 * 3600;

  explicit Secrets(storage::SecretStore& store) : store_(store) {}

  // 201: name [A-Za-z_][A-Za-z0-9_]{0,63}, value 1..16 KiB, 1..32 hosts (names, "*.domain").
  // already_exists, invalid_argument, quota_exceeded (secrets).
  Reply<storage::SecretInfo> create(const SecretRequest& r);
  // Rotates the value (version + 1) and/or replaces hosts or expiry. secret_not_found.
  Reply<storage::SecretInfo> update(const SecretRequest& r);
  Reply<std::vector<storage::SecretInfo>> list(const std::string& tenant);
  Reply<storage::SecretInfo> get(const std::string& tenant, const std::string& name);
  Reply<bool> remove(const std::string& tenant, const std::string& name);

  // The checks (pure): a rejection or nothing.
  static std::optional<Rejection> check_name(const std::string& name);
  static std::optional<Rejection> check_value(const std::string& value);
  // The hosts normalized (lower case, sorted, no duplicates), or a rejection.
  static Reply<std::vector<std::string>> check_hosts(const std::vector<std::string>& hosts);

 private:
  storage::SecretStore& store_;
  std::mutex mu_;  // a create's quota check and write are one step
};

}  // namespace pandastack::actors
