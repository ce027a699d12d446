#include "actors/egress_proxies.h"

#include <arpa/inet.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <atomic>

#include "actors/env.h"
#include "actors/secrets.h"
#include "vmm-driver/egress_proxy_host.h"
#include "vmm-driver/network.h"

namespace pandastack::actors {

namespace {

// A running proxy, stopped when its network lets it go.
struct Running {
  std::weak_ptr<vmm::ProxyHost> host;
  std::string key;
  ~Running() {
    if (auto h = host.lock()) h->stop(key);
  }
};

// Addresses the proxy never connects to for a guest: its own namespace (the gateway, where its
// listeners are: a loop) and nothing at all. The rest is the ruleset's to refuse.
bool own_address(const std::string& address) {
  in_addr a{};
  if (::inet_pton(AF_INET, address.c_str(), &a) != 1) return true;
  uint32_t x = ntohl(a.s_addr);
  in_addr g{};
  ::inet_pton(AF_INET, vmm::kGuestGateway, &g);
  uint32_t gw = ntohl(g.s_addr) & ~3u;
  return (x & ~3u) == gw || (x >> 24) == 127 || x == 0;
}

vmm::EgressEntry entry_of(const vmm::ProxyUse& u) {
  vmm::EgressEntry e;
  e.kind = vmm::EgressEntry::Kind::secret;
  e.allowed = !u.blocked && u.refused.empty();
  if (!e.allowed) e.reason = u.why.empty() ? "not_secret_host" : u.why;
  e.name = u.host;
  e.protocol = u.tls ? "https" : "http";
  e.destination = u.address;
  e.port = u.port;
  e.method = u.method;
  e.injected = u.injected;
  e.refused = u.refused;
  return e;
}

}  // namespace

std::shared_ptr<vmm::ProxyHost> Env::proxy_host() {
  std::lock_guard lock(proxy_mu);
  if (!proxies) proxies = std::make_shared<vmm::ProxyHost>();
  return proxies;
}

vmm::Status start_egress_proxy(Env& env, vmm::Network& n, const std::string& id) {
  if (!env.secrets) return vmm::Ok{};
  auto b = env.secrets->binding(id);
  if (!b) return vmm::make_error(vmm::ErrorCode::io_error, "its secrets: " + b.error().message);
  if (!*b) return vmm::Ok{};
  auto ca = vmm::EgressCa::load(vmm::PemPair{(*b)->ca_cert, (*b)->ca_key});
  if (!ca) return ca.error();
  auto host = env.proxy_host();
  static std::atomic<uint64_t> serial{0};
  std::string key = id + "#" + std::to_string(++serial);  // (this network's; a next one differs)
  vmm::ProxyOptions o;
  o.ca = *ca;
  o.secrets = [secrets = env.secrets, id] {
    std::vector<vmm::ProxySecret> out;
    auto bound = secrets->bound_secrets(id);
    if (!bound) {
      spdlog::warn("egress proxy: sandbox={}: its secrets: {}", id, bound.error().message);
      return out;  // (placeholders then go out as they are)
    }
    for (auto& s : *bound)
      out.push_back({s.name, s.placeholder, s.value, s.hosts, s.use.in_query, s.use.in_body,
                     s.use.allow_plain_http});
    return out;
  };
  int netns = n.netns_fd();  // (the proxy stops before the network closes it)
  o.connect = [netns](const std::string&, const std::string& address,
                      uint16_t port) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
    if (own_address(address))
      return KJ_EXCEPTION(FAILED, "not a destination of the sandbox's", address.c_str());
    return vmm::ProxyHost::connect_in(netns, address, port);
  };
  o.headers = [secrets = env.secrets, id](const std::string& host, bool tls) {
    return secrets->headers_for(id, host, tls);
  };
  o.extra_ca_pems = env.config.egress_trusted_cas;
  o.on_use = [log = n.egress_log()](const vmm::ProxyUse& u) { log->add(entry_of(u)); };
  auto started = host->start(key, netns, std::move(o), vmm::kGuestGateway);
  if (!started) return started;
  auto running = std::make_shared<Running>();
  running->host = host;
  running->key = key;
  auto on = n.set_egress_proxy(std::move(running));
  if (!on) return on;
  spdlog::debug("egress proxy: sandbox={}: serving ({} secrets)", id, (*b)->placeholders.size());
  return vmm::Ok{};
}

std::map<std::string, std::string> secret_env(Env& env, const std::string& id) {
  if (!env.secrets) return {};
  auto bound = env.secrets->env_of(id);
  if (!bound) return {};
  auto e = std::move(*bound);
  for (const char* name : {"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE"})
    e[name] = kGuestCaBundle;
  e["NODE_EXTRA_CA_CERTS"] = kGuestCaFile;
  return e;
}

vmm::ExecRequest trust_ca_request(const std::string& ca_pem) {
  vmm::ExecRequest r;
  r.shell = std::string("set -e; umask 022; mkdir -p \"$(dirname ") + kGuestCaFile +
            ")\" \"$(dirname " + kGuestCaBundle + ")\"; cat > " + kGuestCaFile + "; cat " +
            kGuestCaFile + " >> " + kGuestCaBundle;
  r.stdin_data = ca_pem;
  r.timeout_ms = 30000;
  return r;
}

}  // namespace pandastack::actors
