// Per-sandbox networking: a network namespace per sandbox holding the tap QEMU's virtio-net uses
// and one end of a veth pair to the host, an address pair from a pool of /30 subnets, NAT at the
// namespace boundary and the sandbox's egress policy as an nftables table inside the namespace.
//
//   guest eth0 172.31.255.2/30 --tap0 [172.31.255.1]  netns "<prefix>-<i>"  eth0 [pool .2/30]
//        == veth ==  host "<prefix><i>" [pool .1/30] -> the host's routes
//
// Every guest has the same internal address, so a restored or forked guest needs no
// re-addressing; the namespace masquerades its traffic to the subnet's address. The host keeps
// one table (`install_host_rules`) that drops everything a sandbox sends to the host itself and
// between sandboxes, whatever the sandbox's own policy says.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vmm-driver/egress_log.h"
#include "vmm-driver/egress_watcher.h"
#include "vmm-driver/error.h"

namespace pandastack::vmm {

// The guest side of every sandbox network (baked into the guest agent's start-up).
inline constexpr const char* kGuestAddress = "172.31.255.2";
inline constexpr const char* kGuestGateway = "172.31.255.1";
inline constexpr const char* kGuestMac = "02:50:53:00:00:02";
// The tap's MAC is fixed too: a forked or restored guest's ARP cache stays valid.
inline constexpr const char* kGatewayMac = "02:50:53:00:00:01";

struct EgressPolicy {
  enum class Mode { deny_all, allow_all, allowlist };
  Mode mode = Mode::deny_all;
  std::vector<std::string> cidrs;    // allowlist: IPv4 addresses or CIDRs, normalized ("a.b.c.d/n")
  std::vector<std::string> domains;  // allowlist: names (resolved by the platform resolver)

  bool operator==(const EgressPolicy&) const = default;
};
const char* to_string(EgressPolicy::Mode m);
std::optional<EgressPolicy::Mode> egress_mode_from_string(const std::string& s);
// "10.1.2.3" -> "10.1.2.3/32", "10.1.2.0/24" -> same; host bits set or bad syntax -> error.
Result<std::string> normalize_cidr(const std::string& s);
// Checks and normalizes a policy (CIDRs, domain syntax, counts: at most `max_entries` each).
Result<EgressPolicy> validate(EgressPolicy p, size_t max_entries = 256);

// A pool of /30 subnets carved from one IPv4 CIDR; subnet `i` is base + 4*i.
class SubnetPool {
 public:
  static Result<SubnetPool> parse(const std::string& cidr);
  uint32_t capacity() const { return capacity_; }
  const std::string& cidr() const { return cidr_; }
  std::string host_address(uint32_t index) const;  // .1 of subnet i (the host's veth end)
  std::string ns_address(uint32_t index) const;    // .2 of subnet i (the namespace's veth end)

 private:
  uint32_t base_ = 0;
  uint32_t capacity_ = 0;
  std::string cidr_;
};

// Host-wide settings of sandbox networking.
struct NetworkSettings {
  std::string pool_cidr = "10.200.0.0/16";  // 16,384 /30 subnets
  std::string prefix = "psv";               // interface / namespace names; <= 5 chars
  // Where each sandbox's resolver (vmm-driver/dns.h) forwards allowed names: "IPv4[:port]".
  // Empty: no resolver (domain allowlists cannot be enforced and are refused upstream of here).
  std::string dns_upstream;
  // Distinct names a sandbox resolver forwards in a VM's life (--dns-max-names): a bound on what
  // DNS can carry out of a sandbox whose addresses are all closed.
  size_t dns_max_names = 1000;
  // Ranges no sandbox reaches whatever its policy (on top of the pool, loopback, link-local,
  // multicast and broadcast, which are never reachable): private and reserved ranges (RFC 1918,
  // CGNAT 100.64/10, 0/8, 192.0.0/24, the benchmark range 198.18/15, 240/4) and the prefixes of
  // the host's own interfaces (its LAN, its cloud VPC). Normalized CIDRs.
  std::vector<std::string> reserved = default_reserved_ranges();
  // The operator's exceptions to `reserved` (--allow-private-egress): what a sandbox's policy may
  // then reach like any public address. Normalized CIDRs.
  std::vector<std::string> reserved_allowed;

  static std::vector<std::string> default_reserved_ranges();
};
// The IPv4 prefixes of this host's interfaces (not loopback, not links named `skip_prefix`*).
std::vector<std::string> host_interface_prefixes(const std::string& skip_prefix);
// Is `addr` (host order) in `reserved` and not in `allowed`? (Normalized CIDR lists.)
bool is_reserved(uint32_t addr, const std::vector<std::string>& reserved,
                 const std::vector<std::string>& allowed);
// Merges CIDRs into disjoint "a.b.c.d-e.f.g.h" / "a.b.c.d/n" nft interval elements.
std::vector<std::string> merged_intervals(const std::vector<std::string>& cidrs);
// Does `policy` need the sandbox resolver (allow_all: a working resolver; domains: enforcement)?
bool needs_resolver(const EgressPolicy& policy);
// The first IPv4 nameserver of a resolv.conf text ("" when none).
std::string first_nameserver(const std::string& resolv_conf);

// The ports of a sandbox's egress proxy on the gateway address (vmm-driver/egress_proxy_host.h):
// with the proxy on, the guest's TCP 443 and 80 are redirected there.
inline constexpr uint16_t kEgressProxyTlsPort = 15443, kEgressProxyPlainPort = 15080;

// The nftables ruleset of one sandbox namespace (pure; tested on its own). The namespace's own
// connections out (the egress proxy's) obey the same rules as the guest's.
std::string sandbox_ruleset(const NetworkSettings& settings, const EgressPolicy& policy,
                            bool egress_proxy = false);
// The host's ruleset for all sandboxes of `settings` (pure).
std::string host_ruleset(const NetworkSettings& settings);

// Forwards TCP connections from a host address to a port of the guest: a listening socket in the
// host's namespace and a thread that lives in the sandbox's namespace, where it opens the
// connections to the guest (they come from the gateway address, 172.31.255.1).
class PortForward;
class DnsServer;
inline constexpr size_t kMaxForwardConnections = 256;  // per exposed port; more wait in the backlog

// One sandbox's network. Removing it (the destructor) deletes the namespace, the veth pair and
// with them the tap and the nftables table.
class Network {
 public:
  // Creates namespace, tap, veth pair, addresses, routes, NAT and `policy`. The tap is open in
  // this object until `take_tap_fd` (QEMU inherits it).
  static Result<std::shared_ptr<Network>> create(const NetworkSettings& settings, uint32_t index,
                                                 const EgressPolicy& policy);
  // The network of a VM that outlived its host process (its namespace is still mounted).
  static Result<std::shared_ptr<Network>> adopt(const NetworkSettings& settings, uint32_t index);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  // Replaces the egress policy (one nft transaction: never a moment without a policy).
  Status set_policy(const EgressPolicy& policy);
  // The sandbox's egress proxy, listening in this namespace: while `proxy` is held (not null),
  // the guest's TCP 443 and 80 are redirected to it. Released (its listeners stopped) before the
  // namespace goes, or when replaced.
  Status set_egress_proxy(std::shared_ptr<void> proxy);
  bool egress_proxy() const;
  const EgressPolicy& policy() const { return policy_; }
  uint32_t index() const { return index_; }
  const std::string& netns() const { return netns_; }  // name under /run/netns
  const std::string& host_link() const { return host_link_; }
  int netns_fd() const { return netns_fd_; }
  // The open tap (-1 once taken or for an adopted network). QEMU gets it as `-netdev tap,fd=N`.
  int tap_fd() const { return tap_fd_; }
  void close_tap();
  // Exposes guest TCP `port` on `bind_host` (a free host port, returned); exposing it again
  // returns the same one. Removed with the network or by `unexpose`.
  Result<uint16_t> expose(uint16_t port, const std::string& bind_host);
  void unexpose(uint16_t port);
  std::map<uint16_t, uint16_t> exposed() const;  // guest port -> host port
  // What this network let out and refused (its resolver's answers, connections, denials). The
  // owner points it at the sandbox's log (EgressLog::forward_to) once it knows the sandbox.
  const std::shared_ptr<EgressLog>& egress_log() const { return egress_log_; }
  // Connections and denials reach the log while `watch` lives (EgressWatcher::watch).
  void set_egress_watch(std::unique_ptr<EgressWatcher::Subscription> watch) {
    egress_watch_ = std::move(watch);
  }
  // Called with the index when this network is removed (the owner frees the subnet).
  void set_on_release(std::function<void(uint32_t)> f) { on_release_ = std::move(f); }

  // Host set-up once per daemon: IPv4 forwarding on and the host table (re)installed.
  static Status install_host_rules(const NetworkSettings& settings);
  static void remove_host_rules(const NetworkSettings& settings);
  // Removes every namespace and host link of `settings.prefix` whose index is not in `keep`
  // (left behind by a crashed host). Returns how many it removed.
  static int remove_leftovers(const NetworkSettings& settings, const std::set<uint32_t>& keep);
  // Names of the namespaces of `prefix` that exist now (for tests and recovery).
  static std::vector<std::string> list_namespaces(const std::string& prefix);

 private:
  Network() = default;
  void destroy();
  NetworkSettings settings_;
  uint32_t index_ = 0;
  std::string netns_, host_link_;
  int netns_fd_ = -1;
  int tap_fd_ = -1;
  mutable std::mutex rules_mu_;  // the ruleset's inputs: policy_ and egress_proxy_
  EgressPolicy policy_;
  std::shared_ptr<void> egress_proxy_;
  std::function<void(uint32_t)> on_release_;
  mutable std::mutex forwards_mu_;
  std::map<uint16_t, std::unique_ptr<PortForward>> forwards_;
  std::unique_ptr<DnsServer> dns_;
  std::shared_ptr<EgressLog> egress_log_ = std::make_shared<EgressLog>();
  std::unique_ptr<EgressWatcher::Subscription> egress_watch_;
  Status sync_resolver();  // starts, updates or stops the resolver for policy_
};

// Applies an nftables script (libnftables, in-process) in the network namespace `netns_fd` (-1:
// this process's own). The error carries nft's message.
Status apply_nft(const std::string& rules, int netns_fd = -1);

// Runs `argv` (optionally inside the network namespace `netns_fd`) with `input` on stdin; the
// error carries its output. For ip/nft, which the network set-up drives.
Status run_net_tool(const std::vector<std::string>& argv, const std::string& input = "",
                    int netns_fd = -1);

}  // namespace pandastack::vmm
