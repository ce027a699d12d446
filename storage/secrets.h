// Tenant secrets: a name, a value and the hosts it may be sent to. The value is sealed with
// AES-256-GCM under a key kept in a file of its own (never in the database, the event stream or
// the audit log), bound to its tenant and name; only `reveal` ever opens it. Records live in the
// event store's database under their own prefix ("x"), never as events.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/error.h"
#include "storage/event_store.h"
#include "storage/header_rule.h"

namespace pandastack::storage {

// Where the egress proxy may put a secret's value besides request headers (opted in per secret),
// and whether a plain HTTP request may carry it (by default only HTTPS does).
struct SecretUse {
  bool in_query = false, in_body = false, allow_plain_http = false;
  bool operator==(const SecretUse&) const = default;
  // The parts of a request the value may go into, as the APIs name them: "headers" (always),
  // "query", "body".
  std::vector<std::string> places() const {
    std::vector<std::string> p{"headers"};
    if (in_query) p.push_back("query");
    if (in_body) p.push_back("body");
    return p;
  }
};

struct SecretInfo {
  std::string tenant, name;
  std::vector<std::string> hosts;  // where its value may go ("api.github.com", "*.example.com")
  int64_t created_ms = 0, updated_ms = 0;
  int64_t expires_ms = 0;  // 0: never
  uint32_t version = 1;    // bumped by each rotation
  SecretUse use;
};

// A sandbox's use of secrets, for its egress proxy: the secrets it may use, the placeholder its
// guest holds for each, the headers its HTTPS requests to some hosts get (E2B's network rules),
// and its own CA (the guest trusts its certificate; its key signs the proxy's certificates). Kept
// sealed as a value is (bound to the sandbox), never as an event.
struct SecretBinding {
  std::string tenant, sandbox;
  std::vector<std::pair<std::string, std::string>> placeholders;  // (secret name, placeholder)
  std::vector<HeaderRule> rules;
  std::string ca_cert, ca_key;  // PEM
};

class SecretStore {
 public:
  static constexpr size_t kMaxValueBytes = 16 * 1024;
  static constexpr size_t kMaxNameBytes = 64;

  // `key_file`: 32 random bytes, made (mode 0600) when missing; a file of another size or mode
  // readable by others is refused.
  static Result<std::unique_ptr<SecretStore>> open(EventStore& db,
                                                   const std::filesystem::path& key_file);

  // Stores a new secret (already_exists when the tenant has one of that name). The caller checked
  // the name, hosts and quota.
  Result<SecretInfo> create(const SecretInfo& info, const std::string& value);
  // Replaces the value (rotation: version + 1) and/or the hosts, expiry and use of an existing
  // secret.
  Result<SecretInfo> update(const std::string& tenant, const std::string& name,
                            const std::optional<std::string>& value,
                            const std::optional<std::vector<std::string>>& hosts,
                            std::optional<int64_t> expires_ms,
                            std::optional<SecretUse> use = std::nullopt);
  // A tenant's secrets (expired ones are removed on the way), by name.
  Result<std::vector<SecretInfo>> list(const std::string& tenant);
  // not_found when absent or expired.
  Result<SecretInfo> get(const std::string& tenant, const std::string& name);
  // The value, for the egress proxy that injects it (never for an API answer); with `info`, the
  // secret's info from the same read.
  Result<std::string> reveal(const std::string& tenant, const std::string& name,
                             SecretInfo* info = nullptr);
  Status remove(const std::string& tenant, const std::string& name);

  // A sandbox's binding: kept (replacing its previous one), read (nullopt: none), removed.
  Status bind(const SecretBinding& b);
  Result<std::optional<SecretBinding>> binding(const std::string& sandbox);
  Status unbind(const std::string& sandbox);
  // The sandboxes with a binding (recovery drops those of sandboxes that no longer exist).
  Result<std::vector<std::string>> bound();

 private:
  SecretStore(EventStore& db, std::string key) : db_(db), key_(std::move(key)) {}
  struct Record;
  Result<std::optional<Record>> load(const std::string& tenant, const std::string& name);
  Status save(const Record& r, bool sync);
  std::string seal(const SecretInfo& info, const std::string& value) const;
  std::optional<std::string> unseal(const SecretInfo& info, const std::string& sealed) const;
  // The same with the additional data given.
  std::string seal_with(const std::string& aad, const std::string& value) const;
  std::optional<std::string> unseal_with(const std::string& aad, const std::string& sealed) const;

  EventStore& db_;
  std::string key_;  // 32 bytes
};

}  // namespace pandastack::storage
