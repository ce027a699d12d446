// Tenant secrets as the API offers them (storage/secrets.h keeps them sealed): the name, hosts,
// value and expiry of each checked, at most kPerTenant per tenant, and a value never answered.
// A sandbox's use of secrets is a binding (bind): a placeholder per secret, which its processes
// get as the secret's environment variable, header rules (E2B's network rules, whose values name
// secrets with ${e2b.secrets.NAME}), and a CA of its own; its egress proxy
// (vmm-driver/egress_proxy.h, actors/egress_proxies.h) puts the values in (bound_secrets,
// headers_for).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/sandbox.h"
#include "storage/secrets.h"
#include "vmm-driver/egress_proxy.h"

namespace pandastack::actors {

struct SecretRequest {
  std::string tenant, name;
  std::optional<std::string> value;
  std::optional<std::vector<std::string>> hosts;
  std::optional<uint32_t> ttl_seconds;  // from now; absent: never expires (create), unchanged
  // Where the value may go besides headers (query, body) and whether plain HTTP may carry it;
  // absent: no (create), unchanged (update).
  std::optional<std::pair<bool, bool>> inject_into;  // (query, body)
  std::optional<bool> allow_plain_http;
  // Made through E2B's API (Secret.create, gateway/e2b_secrets.cc): an E2B name (check_e2b_name)
  // and no hosts of its own: E2B's secrets go where a sandbox's network rules send them.
  bool e2b = false;
};

// A bound secret as the egress proxy uses it (its value revealed).
struct BoundSecret {
  std::string name, placeholder, value;
  std::vector<std::string> hosts;
  storage::SecretUse use;
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

  // Secrets one sandbox may use at most.
  static constexpr size_t kMaxPerSandbox = 16;

  // Binds the tenant's secrets `names` (each must exist) and header `rules` to `sandbox`: a new
  // placeholder for each name ("pds_secret_" + 32 random base32), the rules, and a new CA, kept
  // sealed. secret_not_found, invalid_argument (a name twice, more than kMaxPerSandbox, nothing
  // to bind, check_rules).
  Reply<storage::SecretBinding> bind(const std::string& tenant, const std::string& sandbox,
                                     const std::vector<std::string>& names,
                                     const std::vector<storage::HeaderRule>& rules = {});
  // Header rules as a create takes them (actors/header_rules.h's checks): each secret a value
  // names must be the tenant's (secret_not_found), and one with hosts of its own is only for
  // rules of those hosts (invalid_argument).
  std::optional<Rejection> check_rules(const std::string& tenant,
                                       const std::vector<storage::HeaderRule>& rules);
  // Replaces the header rules of `sandbox`'s binding (check_rules), keeping its placeholders and
  // CA. sandbox_not_found when it has none (or it is another tenant's).
  Reply<bool> set_rules(const std::string& tenant, const std::string& sandbox,
                        const std::vector<storage::HeaderRule>& rules);
  // A secret's value for the host's own use toward `host` (an image pull's registry): only a
  // secret whose hosts name `host` (an E2B secret has none: refused). secret_not_found,
  // invalid_argument.
  Reply<std::string> value_for_host(const std::string& tenant, const std::string& name,
                                    const std::string& host);
  // The sandbox's binding (nullopt: none).
  Reply<std::optional<storage::SecretBinding>> binding(const std::string& sandbox);
  // Its bound secrets with their values now (a rotation shows at the next call; a secret deleted
  // or expired since is left out: its placeholder then goes out as it is).
  Reply<std::vector<BoundSecret>> bound_secrets(const std::string& sandbox);
  // What its header rules give a request to `host` now (values resolved at each call: a
  // rotation shows; a secret deleted, expired or not for `host` is refused, as is every secret
  // of a plain HTTP request, which is not transformed).
  vmm::ProxyHeaders headers_for(const std::string& sandbox, const std::string& host, bool tls);
  // The environment its processes get: NAME=placeholder per bound secret; nullopt when it has no
  // binding. Kept in memory after the first read (an exec's path).
  std::optional<std::map<std::string, std::string>> env_of(const std::string& sandbox);
  void unbind(const std::string& sandbox);
  // Recovery: the bindings of every sandbox but `live` go (ended while the daemon was down, or
  // its retirement cut short). How many went.
  size_t unbind_all_but(const std::set<std::string>& live);
  // A fork's child that inherits: the parent's binding given to `child` too (the same
  // placeholders and CA, which the child's memory and trust store already hold). False when the
  // parent has none.
  Reply<bool> inherit(const std::string& parent, const std::string& child);

  // The checks (pure): a rejection or nothing.
  static std::optional<Rejection> check_name(const std::string& name);
  // E2B's ids of secrets: this prefix + the name (gateway/e2b_secrets.cc).
  static constexpr const char* kE2bIdPrefix = "sec_";
  // An E2B secret's name: 1..64 of a-z 0-9 . _ -, starting with a letter or a digit, not
  // kE2bIdPrefix.
  static std::optional<Rejection> check_e2b_name(const std::string& name);
  static std::optional<Rejection> check_value(const std::string& value);
  // Whether a sandbox may be given secret `s` (its placeholder as an environment variable, its
  // value for its hosts): not one made through E2B's API.
  static std::optional<Rejection> bindable(const storage::SecretInfo& s);
  // The hosts normalized (lower case, sorted, no duplicates), or a rejection.
  static Reply<std::vector<std::string>> check_hosts(const std::vector<std::string>& hosts);

 private:
  storage::SecretStore& store_;
  std::mutex mu_;                                 // a create's quota check and write are one step
  static constexpr size_t kMaxEnvCached = 10000;  // sandboxes' environments kept in memory
  std::mutex env_mu_;
  // sandbox -> its env (nullopt: no binding)
  std::map<std::string, std::optional<std::map<std::string, std::string>>> env_;
};

}  // namespace pandastack::actors
