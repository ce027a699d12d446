#include "actors/secrets.h"

#include <tuple>

#include "actors/env.h"
#include "actors/header_rules.h"
#include "vmm-driver/dns.h"
#include "vmm-driver/egress_ca.h"
#include "vmm-driver/egress_proxy.h"
#include "vmm-driver/network.h"

namespace pandastack::actors {

namespace {

Rejection no_secret(const std::string& name) {
  return {Code::secret_not_found, "no secret " + name.substr(0, 64)};
}

Rejection from_store(const storage::Error& e, const std::string& name) {
  switch (e.code) {
    case storage::ErrorCode::not_found:
      return no_secret(name);
    case storage::ErrorCode::conflict:
      return {Code::already_exists, "a secret named " + name + " exists (PATCH rotates it)"};
    case storage::ErrorCode::no_space:
      return {Code::no_space, e.message};
    default:
      return {Code::storage_error, e.message};
  }
}

std::optional<Rejection> check_ttl(const std::optional<uint32_t>& ttl) {
  if (ttl && (*ttl == 0 || *ttl > Secrets::kMaxTtlSeconds))
    return Rejection{Code::invalid_argument,
                     "ttl_seconds must be within 1.." + std::to_string(Secrets::kMaxTtlSeconds)};
  return std::nullopt;
}

}  // namespace

std::optional<Rejection> Secrets::check_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= storage::SecretStore::kMaxNameBytes &&
            !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (ok) return std::nullopt;
  return Rejection{Code::invalid_argument,
                   "a secret's name is 1..64 letters, digits and _, not starting with a digit "
                   "(it names an environment variable)"};
}

std::optional<Rejection> Secrets::check_e2b_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= storage::SecretStore::kMaxNameBytes &&
            std::isalnum(static_cast<unsigned char>(name[0])) && name.rfind(kE2bIdPrefix, 0) != 0;
  for (char c : name)
    ok = ok && (std::islower(static_cast<unsigned char>(c)) ||
                std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (ok) return std::nullopt;
  return Rejection{Code::invalid_argument,
                   "an E2B secret's name is 1..64 of a-z 0-9 . _ -, starting with a letter or a "
                   "digit, not sec_ (names are lower-cased)"};
}

namespace {
// A name a secret may have, made either way.
bool possible_name(const std::string& name) {
  return !Secrets::check_name(name) || !Secrets::check_e2b_name(name);
}
}  // namespace

std::optional<Rejection> Secrets::check_value(const std::string& value) {
  if (!value.empty() && value.size() <= storage::SecretStore::kMaxValueBytes) return std::nullopt;
  return Rejection{
      Code::invalid_argument,
      "a secret's value is 1.." + std::to_string(storage::SecretStore::kMaxValueBytes) + " bytes"};
}

Reply<std::vector<std::string>> Secrets::check_hosts(const std::vector<std::string>& hosts) {
  if (hosts.empty() || hosts.size() > kMaxHosts)
    return Rejection{Code::invalid_argument, "hosts: 1.." + std::to_string(kMaxHosts) +
                                                 " host names (\"api.example.com\", "
                                                 "\"*.example.com\") the value may be sent to"};
  // The same syntax as an egress allowlist's domains (it adds them to the sandbox's).
  vmm::EgressPolicy p;
  p.mode = vmm::EgressPolicy::Mode::allowlist;
  p.domains = hosts;
  auto v = vmm::validate(p, kMaxHosts);
  if (!v) return Rejection{Code::invalid_argument, "hosts: " + v.error().message};
  return v->domains;
}

Reply<storage::SecretInfo> Secrets::create(const SecretRequest& r) {
  if (auto no = r.e2b ? check_e2b_name(r.name) : check_name(r.name)) return *no;
  if (!r.value) return Rejection{Code::invalid_argument, "value is required"};
  if (auto no = check_value(*r.value)) return *no;
  std::vector<std::string> hosts;
  if (r.e2b) {
    if (r.hosts || r.inject_into || r.allow_plain_http)
      return Rejection{Code::invalid_argument, "an E2B secret has no hosts of its own"};
  } else {
    if (!r.hosts) return Rejection{Code::invalid_argument, "hosts is required"};
    auto h = check_hosts(*r.hosts);
    if (!h) return h.error();
    hosts = std::move(*h);
  }
  if (auto no = check_ttl(r.ttl_seconds)) return *no;
  storage::SecretInfo info;
  info.tenant = r.tenant;
  info.name = r.name;
  info.hosts = std::move(hosts);
  if (r.inject_into) std::tie(info.use.in_query, info.use.in_body) = *r.inject_into;
  if (r.allow_plain_http) info.use.allow_plain_http = *r.allow_plain_http;
  if (r.ttl_seconds) info.expires_ms = now_ms() + int64_t(*r.ttl_seconds) * 1000;
  std::lock_guard l(mu_);
  auto have = store_.list(r.tenant);
  if (!have) return from_store(have.error(), r.name);
  if (have->size() >= kPerTenant)
    return Rejection{Code::quota_exceeded,
                     "at most " + std::to_string(kPerTenant) + " secrets per tenant",
                     QuotaDetail{"secrets", kPerTenant, have->size(), 1}};
  auto made = store_.create(info, *r.value);
  if (!made) return from_store(made.error(), r.name);
  return *made;
}

Reply<storage::SecretInfo> Secrets::update(const SecretRequest& r) {
  if (!possible_name(r.name)) return no_secret(r.name);
  if (!r.value && !r.hosts && !r.ttl_seconds && !r.inject_into && !r.allow_plain_http)
    return Rejection{Code::invalid_argument,
                     "give value, hosts, ttl_seconds, inject_into and/or allow_plain_http"};
  if (r.value)
    if (auto no = check_value(*r.value)) return *no;
  std::optional<std::vector<std::string>> hosts;
  if (r.hosts) {
    auto h = check_hosts(*r.hosts);
    if (!h) return h.error();
    hosts = *h;
  }
  if (auto no = check_ttl(r.ttl_seconds)) return *no;
  std::optional<int64_t> expires;
  if (r.ttl_seconds) expires = now_ms() + int64_t(*r.ttl_seconds) * 1000;
  std::optional<storage::SecretUse> use;
  std::lock_guard l(mu_);  // (the use read and written as one step)
  if (r.inject_into || r.allow_plain_http) {
    auto now = store_.get(r.tenant, r.name);
    if (!now) return from_store(now.error(), r.name);
    use = now->use;
    if (r.inject_into) std::tie(use->in_query, use->in_body) = *r.inject_into;
    if (r.allow_plain_http) use->allow_plain_http = *r.allow_plain_http;
  }
  auto u = store_.update(r.tenant, r.name, r.value, hosts, expires, use);
  if (!u) return from_store(u.error(), r.name);
  return *u;
}

Reply<std::vector<storage::SecretInfo>> Secrets::list(const std::string& tenant) {
  auto l = store_.list(tenant);
  if (!l) return from_store(l.error(), "");
  return *l;
}

Reply<storage::SecretInfo> Secrets::get(const std::string& tenant, const std::string& name) {
  if (!possible_name(name)) return no_secret(name);
  auto g = store_.get(tenant, name);
  if (!g) return from_store(g.error(), name);
  return *g;
}

Reply<bool> Secrets::remove(const std::string& tenant, const std::string& name) {
  if (!possible_name(name)) return no_secret(name);
  auto st = store_.remove(tenant, name);
  if (!st) return from_store(st.error(), name);
  return true;
}

std::optional<Rejection> Secrets::bindable(const storage::SecretInfo& s) {
  if (!s.hosts.empty() && !check_name(s.name)) return std::nullopt;
  return Rejection{Code::invalid_argument,
                   "secret " + s.name +
                       " was made through E2B's API: it has no hosts and no environment "
                       "variable's name (E2B's network rules use it: ${e2b.secrets.NAME})"};
}

Reply<storage::SecretBinding> Secrets::bind(const std::string& tenant, const std::string& sandbox,
                                            const std::vector<std::string>& names,
                                            const std::vector<storage::HeaderRule>& rules) {
  if (names.size() > kMaxPerSandbox || (names.empty() && rules.empty()))
    return Rejection{Code::invalid_argument,
                     "secrets: 1.." + std::to_string(kMaxPerSandbox) + " names of the tenant's"};
  if (auto no = check_rules(tenant, rules)) return *no;
  storage::SecretBinding b;
  b.tenant = tenant;
  b.sandbox = sandbox;
  b.rules = rules;
  for (auto& name : names) {
    for (auto& [n, p] : b.placeholders)
      if (n == name) return Rejection{Code::invalid_argument, "secret " + name + " named twice"};
    auto info = store_.get(tenant, name);
    if (!info) return from_store(info.error(), name);
    if (auto no = bindable(*info)) return *no;
    b.placeholders.emplace_back(name, vmm::EgressProxy::new_placeholder());
  }
  auto ca = vmm::EgressCa::make(sandbox);
  if (!ca) return Rejection{Code::internal, "the sandbox's CA: " + ca.error().message};
  b.ca_cert = (*ca)->ca().cert;
  b.ca_key = (*ca)->ca().key;
  if (auto st = store_.bind(b); !st) return from_store(st.error(), sandbox);
  std::lock_guard lock(env_mu_);
  env_.erase(sandbox);
  return b;
}

std::optional<Rejection> Secrets::check_rules(const std::string& tenant,
                                              const std::vector<storage::HeaderRule>& rules) {
  if (auto no = header_rules::check(rules)) return no;
  auto names = header_rules::secret_names(rules);
  if (names.size() > kMaxPerSandbox)
    return Rejection{
        Code::invalid_argument,
        "network rules: at most " + std::to_string(kMaxPerSandbox) + " secrets per sandbox"};
  for (auto& name : names) {
    auto info = store_.get(tenant, name);
    if (!info) return from_store(info.error(), name);
    if (info->hosts.empty()) continue;  // (an E2B secret: it goes where the rules send it)
    for (auto& r : rules)
      if (r.value.find(header_rules::kSecretMarker + name + "}") != std::string::npos &&
          !vmm::dns::allowed(r.host, info->hosts))
        return Rejection{Code::invalid_argument, "network rules: secret " + name +
                                                     " is for its own hosts only, not " + r.host};
  }
  return std::nullopt;
}

Reply<bool> Secrets::set_rules(const std::string& tenant, const std::string& sandbox,
                               const std::vector<storage::HeaderRule>& rules) {
  if (auto no = check_rules(tenant, rules)) return *no;
  std::lock_guard lock(mu_);  // (two replacements do not interleave their read and write)
  auto b = binding(sandbox);
  if (!b) return b.error();
  if (!*b || (*b)->tenant != tenant)
    return Rejection{Code::sandbox_not_found, "sandbox " + sandbox + " has no secrets binding"};
  auto next = std::move(**b);
  next.rules = rules;
  if (auto st = store_.bind(next); !st) return from_store(st.error(), sandbox);
  return true;
}

Reply<std::optional<storage::SecretBinding>> Secrets::binding(const std::string& sandbox) {
  auto b = store_.binding(sandbox);
  if (!b) return Rejection{Code::storage_error, b.error().message};
  return *b;
}

Reply<std::string> Secrets::value_for_host(const std::string& tenant, const std::string& name,
                                           const std::string& host) {
  storage::SecretInfo info;
  auto value = store_.reveal(tenant, name, &info);
  if (!value) return Rejection{Code::secret_not_found, "no secret " + name.substr(0, 64)};
  if (info.hosts.empty() || !vmm::dns::allowed(host, info.hosts))
    return Rejection{Code::invalid_argument,
                     "secret " + name + " is not for " + host + " (its hosts must name it)"};
  return *value;
}

Reply<std::vector<BoundSecret>> Secrets::bound_secrets(const std::string& sandbox) {
  auto b = binding(sandbox);
  if (!b) return b.error();
  std::vector<BoundSecret> out;
  if (!*b) return out;
  for (auto& [name, placeholder] : (*b)->placeholders) {
    storage::SecretInfo info;
    auto value = store_.reveal((*b)->tenant, name, &info);  // (one read: value and hosts)
    if (!value) continue;                                   // (deleted or expired since)
    out.push_back({name, placeholder, *value, info.hosts, info.use});
  }
  return out;
}

vmm::ProxyHeaders Secrets::headers_for(const std::string& sandbox, const std::string& host,
                                       bool tls) {
  vmm::ProxyHeaders out;
  auto b = store_.binding(sandbox);
  if (!b || !*b || (*b)->rules.empty()) return out;
  auto rules = header_rules::for_host((*b)->rules, host);
  auto refuse = [&](const std::string& name, const char* why) {
    if (std::find(out.refused.begin(), out.refused.end(), name) == out.refused.end())
      out.refused.push_back(name);
    if (out.why.empty()) out.why = why;
  };
  for (auto* r : rules) {
    std::string value;
    for (auto& [text, marker] : header_rules::parts(r->value)) {
      if (!marker) {
        value += text;
        continue;
      }
      if (!tls) {
        refuse(text, "plain_http");
        continue;
      }
      storage::SecretInfo info;
      auto v = store_.reveal((*b)->tenant, text, &info);
      if (!v) {
        refuse(text, "unknown_secret");
        continue;
      }
      if (!info.hosts.empty() && !vmm::dns::allowed(host, info.hosts)) {
        refuse(text, "not_secret_host");
        continue;
      }
      if (!header_rules::one_line(*v)) {
        refuse(text, "bad_value");
        continue;
      }
      value += *v;
      if (std::find(out.injected.begin(), out.injected.end(), text) == out.injected.end())
        out.injected.push_back(text);
    }
    // A later rule's header replaces an earlier one's of the same name.
    auto same = [&](const std::pair<std::string, std::string>& h) {
      return h.first.size() == r->header.size() &&
             std::equal(h.first.begin(), h.first.end(), r->header.begin(), [](char a, char c) {
               return std::tolower(static_cast<unsigned char>(a)) ==
                      std::tolower(static_cast<unsigned char>(c));
             });
    };
    out.set.erase(std::remove_if(out.set.begin(), out.set.end(), same), out.set.end());
    out.set.emplace_back(r->header, std::move(value));
  }
  if (!tls || !out.refused.empty()) {
    out.set.clear();  // (not transformed, or not sent)
    out.injected.clear();
  }
  return out;
}

std::optional<std::map<std::string, std::string>> Secrets::env_of(const std::string& sandbox) {
  {
    std::lock_guard lock(env_mu_);
    if (auto it = env_.find(sandbox); it != env_.end()) return it->second;
  }
  std::optional<std::map<std::string, std::string>> env;
  auto b = store_.binding(sandbox);
  if (b && *b) {
    env.emplace();
    for (auto& [name, placeholder] : (*b)->placeholders) (*env)[name] = placeholder;
  }
  std::lock_guard lock(env_mu_);
  if (env_.size() >= kMaxEnvCached) env_.clear();  // (bounded: read again from the store)
  if (b) env_[sandbox] = env;                      // (a read that failed is tried again)
  return env;
}

Reply<bool> Secrets::inherit(const std::string& parent, const std::string& child) {
  auto b = binding(parent);
  if (!b) return b.error();
  if (!*b) return false;
  auto copy = **b;
  copy.sandbox = child;
  if (auto st = store_.bind(copy); !st) return from_store(st.error(), child);
  std::lock_guard lock(env_mu_);
  env_.erase(child);
  return true;
}

void Secrets::unbind(const std::string& sandbox) {
  (void)store_.unbind(sandbox);
  std::lock_guard lock(env_mu_);
  env_.erase(sandbox);
}

size_t Secrets::unbind_all_but(const std::set<std::string>& live) {
  auto bound = store_.bound();
  if (!bound) return 0;
  size_t n = 0;
  for (auto& id : *bound)
    if (!live.count(id)) {
      unbind(id);
      ++n;
    }
  return n;
}

}  // namespace pandastack::actors
