#include "vmm-driver/network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "vmm-driver/dns.h"
#include "vmm-driver/netns.h"
#include "vmm-driver/port_forward.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;

namespace {
constexpr const char* kNetnsDir = "/run/netns";
constexpr const char* kTable = "pandastack";

std::string errno_text(const std::string& what, int err) { return what + ": " + strerror(err); }

std::string ip_string(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char buf[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// /run/netns as a mount point of its own (as `ip netns add` makes it), so that a jail can detach
// every namespace mount below it in one call.
Status ensure_netns_dir() {
  static std::atomic<bool> ready{false};  // checked once per process, not on every create
  if (ready) return Ok{};
  std::error_code ec;
  fs::create_directories(kNetnsDir, ec);
  if (ec)
    return make_error(ErrorCode::io_error,
                      std::string("cannot create ") + kNetnsDir + ": " + ec.message());
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mounts, line)) {
    // mountinfo: id parent major:minor root mount-point ...
    std::istringstream in(line);
    std::string id, parent, dev, root, point;
    in >> id >> parent >> dev >> root >> point;
    if (point == kNetnsDir) {
      ready = true;
      return Ok{};
    }
  }
  if (::mount(kNetnsDir, kNetnsDir, "none", MS_BIND | MS_REC, nullptr) != 0)
    return make_error(ErrorCode::io_error, errno_text("bind-mounting /run/netns", errno));
  ::mount("", kNetnsDir, "none", MS_SHARED | MS_REC, nullptr);
  ready = true;
  return Ok{};
}

void unmount_netns(const std::string& name) {
  auto path = std::string(kNetnsDir) + "/" + name;
  ::umount2(path.c_str(), MNT_DETACH);
  ::unlink(path.c_str());
}
}  // namespace

const char* to_string(EgressPolicy::Mode m) {
  switch (m) {
    case EgressPolicy::Mode::deny_all:
      return "deny_all";
    case EgressPolicy::Mode::allow_all:
      return "allow_all";
    case EgressPolicy::Mode::allowlist:
      return "allowlist";
  }
  return "deny_all";
}

std::optional<EgressPolicy::Mode> egress_mode_from_string(const std::string& s) {
  for (auto m :
       {EgressPolicy::Mode::deny_all, EgressPolicy::Mode::allow_all, EgressPolicy::Mode::allowlist})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

Result<std::string> normalize_cidr(const std::string& s) {
  auto slash = s.find('/');
  std::string addr = s.substr(0, slash);
  int prefix = 32;
  if (slash != std::string::npos) {
    std::string p = s.substr(slash + 1);
    if (!all_digits(p) || p.size() > 2 || std::stoi(p) > 32)
      return make_error(ErrorCode::invalid_argument, "bad prefix length in '" + s + "'");
    prefix = std::stoi(p);
  }
  in_addr a{};
  if (::inet_pton(AF_INET, addr.c_str(), &a) != 1)
    return make_error(ErrorCode::invalid_argument, "not an IPv4 address or CIDR: '" + s + "'");
  uint32_t v = ntohl(a.s_addr);
  uint32_t mask = prefix == 0 ? 0 : ~uint32_t(0) << (32 - prefix);
  if ((v & ~mask) != 0)
    return make_error(ErrorCode::invalid_argument, "'" + s + "' has host bits set (did you mean " +
                                                       ip_string(v & mask) + "/" +
                                                       std::to_string(prefix) + "?)");
  return ip_string(v) + "/" + std::to_string(prefix);
}

Result<EgressPolicy> validate(EgressPolicy p, size_t max_entries) {
  if (p.cidrs.size() > max_entries || p.domains.size() > max_entries)
    return make_error(ErrorCode::invalid_argument, "an egress allowlist holds at most " +
                                                       std::to_string(max_entries) +
                                                       " CIDRs and as many domains");
  if (p.mode != EgressPolicy::Mode::allowlist && (!p.cidrs.empty() || !p.domains.empty()))
    return make_error(ErrorCode::invalid_argument, "CIDRs and domains need mode allowlist");
  for (auto& c : p.cidrs) {
    auto n = normalize_cidr(c);
    if (!n) return n.error();
    c = *n;
  }
  for (auto& d : p.domains) {
    std::string lower;
    for (char ch : d) lower += char(std::tolower(static_cast<unsigned char>(ch)));
    if (!lower.empty() && lower.back() == '.') lower.pop_back();
    bool ok = !lower.empty() && lower.size() <= 253;
    size_t label = 0;
    for (size_t i = 0; ok && i < lower.size(); ++i) {
      char ch = lower[i];
      if (ch == '.') {
        ok = label > 0 && lower[i - 1] != '-';
        label = 0;
      } else if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
                 (ch == '*' && i == 0 && lower.size() > 2 && lower[1] == '.')) {
        ok = ++label <= 63 && !(ch == '-' && label == 1);
      } else {
        ok = false;
      }
    }
    if (!ok || label == 0)
      return make_error(ErrorCode::invalid_argument, "not a domain name: '" + d + "'");
    d = lower;
  }
  std::sort(p.cidrs.begin(), p.cidrs.end());
  p.cidrs.erase(std::unique(p.cidrs.begin(), p.cidrs.end()), p.cidrs.end());
  std::sort(p.domains.begin(), p.domains.end());
  p.domains.erase(std::unique(p.domains.begin(), p.domains.end()), p.domains.end());
  return p;
}

Result<SubnetPool> SubnetPool::parse(const std::string& cidr) {
  auto n = normalize_cidr(cidr);
  if (!n) return n.error();
  auto slash = n->find('/');
  int prefix = std::stoi(n->substr(slash + 1));
  if (prefix > 30)
    return make_error(ErrorCode::invalid_argument, "a subnet pool needs at least a /30: " + cidr);
  in_addr a{};
  ::inet_pton(AF_INET, n->substr(0, slash).c_str(), &a);
  SubnetPool p;
  p.base_ = ntohl(a.s_addr);
  p.capacity_ = uint32_t((uint64_t(1) << (32 - prefix)) / 4);
  p.cidr_ = *n;
  return p;
}

std::string SubnetPool::host_address(uint32_t index) const {
  return ip_string(base_ + 4 * index + 1);
}
std::string SubnetPool::ns_address(uint32_t index) const {
  return ip_string(base_ + 4 * index + 2);
}

namespace {
// A normalized CIDR as [first, last] (host order).
std::pair<uint32_t, uint32_t> cidr_range(const std::string& cidr) {
  auto slash = cidr.find('/');
  in_addr a{};
  ::inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &a);
  int prefix = slash == std::string::npos ? 32 : std::stoi(cidr.substr(slash + 1));
  uint32_t first = ntohl(a.s_addr);
  uint32_t size_minus_1 = prefix == 0 ? ~uint32_t(0) : (uint32_t(1) << (32 - prefix)) - 1;
  return {first, first + size_minus_1};
}
}  // namespace

std::vector<std::string> NetworkSettings::default_reserved_ranges() {
  return {"0.0.0.0/8",    "10.0.0.0/8",     "100.64.0.0/10", "172.16.0.0/12",
          "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "240.0.0.0/4"};
}

std::vector<std::string> host_interface_prefixes(const std::string& skip_prefix) {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (auto* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_netmask) continue;
    std::string name = i->ifa_name ? i->ifa_name : "";
    if ((i->ifa_flags & IFF_LOOPBACK) || (!skip_prefix.empty() && name.rfind(skip_prefix, 0) == 0))
      continue;
    uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    uint32_t m = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr);
    int prefix = __builtin_popcount(m);
    out.push_back(ip_string(a & m) + "/" + std::to_string(prefix));
  }
  ::freeifaddrs(list);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool is_reserved(uint32_t addr, const std::vector<std::string>& reserved,
                 const std::vector<std::string>& allowed) {
  auto in = [addr](const std::vector<std::string>& list) {
    for (auto& c : list) {
      auto [first, last] = cidr_range(c);
      if (addr >= first && addr <= last) return true;
    }
    return false;
  };
  return in(reserved) && !in(allowed);
}

std::vector<std::string> merged_intervals(const std::vector<std::string>& cidrs) {
  std::vector<std::pair<uint32_t, uint32_t>> r;
  for (auto& c : cidrs) r.push_back(cidr_range(c));
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto& x : r) {
    if (!merged.empty() &&
        (merged.back().second == ~uint32_t(0) || x.first <= merged.back().second + 1))
      merged.back().second = std::max(merged.back().second, x.second);
    else
      merged.push_back(x);
  }
  std::vector<std::string> out;
  for (auto& [a, b] : merged)
    out.push_back(a == b ? ip_string(a) : ip_string(a) + "-" + ip_string(b));
  return out;
}

bool needs_resolver(const EgressPolicy& p) {
  return p.mode == EgressPolicy::Mode::allow_all ||
         (p.mode == EgressPolicy::Mode::allowlist && !p.domains.empty());
}

std::string first_nameserver(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key, addr;
    l >> key >> addr;
    in_addr a{};
    if (key == "nameserver" && ::inet_pton(AF_INET, addr.c_str(), &a) == 1) return addr;
  }
  return "";
}

std::string sandbox_ruleset(const NetworkSettings& settings, const EgressPolicy& policy,
                            bool egress_proxy) {
  std::string r;
  // Replace the table in one transaction: add (no-op if present), delete, define.
  r += std::string("table inet ") + kTable + "\ndelete table inet " + kTable + "\n";
  r += std::string("table inet ") + kTable + " {\n";
  r += "  set allow {\n    type ipv4_addr\n    flags interval\n    auto-merge\n";
  if (policy.mode == EgressPolicy::Mode::allowlist && !policy.cidrs.empty()) {
    r += "    elements = { ";
    for (size_t i = 0; i < policy.cidrs.size(); ++i) r += (i ? ", " : "") + policy.cidrs[i];
    r += " }\n";
  }
  r += "  }\n";
  // Addresses the sandbox's resolver found for allowed names (each for its answer's TTL).
  r += "  set dns_allow {\n    type ipv4_addr\n    flags timeout\n  }\n";
  // Every refusal goes through one of these: its first packets (rate-limited per reason) are
  // logged to the egress watcher (NFLOG, the reason as prefix), then rejected.
  for (const char* reason : {"policy", "reserved", "internal"})
    r += std::string("  chain deny_") + reason +
         " {\n    limit rate 20/second burst 40 packets log prefix \"" + reason + "\" group " +
         std::to_string(kEgressLogGroup) + "\n" +
         "    reject with icmpx type admin-prohibited\n  }\n";
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
    return out;
  };
  // What leaves through `from` (the guest's packets: iifname "tap0"; the egress proxy's own
  // connections, made in this namespace: oifname "eth0") may reach.
  auto egress_rules = [&](const std::string& from) {
    std::string c;
    // Never: other sandboxes and the host's veth ends (the pool), loopback, link-local (cloud
    // metadata), multicast, broadcast -- whatever the policy says.
    c += "    " + from + " ip daddr { " + settings.pool_cidr +
         ", 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/4, 255.255.255.255 } jump deny_internal\n";
    // Nor the host's private networks and reserved ranges, unless the operator allowed a range.
    if (!settings.reserved.empty()) {
      c += "    " + from + " ip daddr { " + join(merged_intervals(settings.reserved)) + " }";
      if (!settings.reserved_allowed.empty())
        c += " ip daddr != { " + join(merged_intervals(settings.reserved_allowed)) + " }";
      c += " jump deny_reserved\n";
    }
    switch (policy.mode) {
      case EgressPolicy::Mode::allow_all:
        c += "    " + from + " oifname \"eth0\" accept\n";
        break;
      case EgressPolicy::Mode::allowlist:
        c += "    " + from + " oifname \"eth0\" ip daddr @allow accept\n";
        c += "    " + from + " oifname \"eth0\" ip daddr @dns_allow accept\n";
        break;
      case EgressPolicy::Mode::deny_all:
        break;
    }
    c += "    " + from + " jump deny_policy\n";
    return c;
  };
  r += "  chain forward {\n    type filter hook forward priority filter; policy drop;\n";
  r += "    ct state established,related accept\n";
  r += egress_rules("iifname \"tap0\"") + "  }\n";
  // The namespace's own connections out (the egress proxy's, on the guest's behalf): the same
  // rules. (The resolver's upstream socket lives in the host's namespace; port forwards reach the
  // guest through tap0.)
  r += "  chain output {\n    type filter hook output priority filter; policy accept;\n";
  r += "    ct state established,related accept\n";
  r += egress_rules("oifname \"eth0\"") + "  }\n";
  r += "  chain input {\n    type filter hook input priority filter; policy drop;\n";
  r += "    ct state established,related accept\n    iifname \"lo\" accept\n";
  r += "    iifname \"tap0\" icmp type echo-request accept\n";
  r += std::string("    iifname \"tap0\" ip daddr ") + kGuestGateway + " udp dport 53 accept\n";
  if (egress_proxy)
    r += std::string("    iifname \"tap0\" ip daddr ") + kGuestGateway + " tcp dport { " +
         std::to_string(kEgressProxyTlsPort) + ", " + std::to_string(kEgressProxyPlainPort) +
         " } accept\n";
  r += "    iifname \"tap0\" jump deny_internal\n  }\n";
  if (egress_proxy) {
    // The guest's HTTPS and HTTP go to the egress proxy (its listeners on the gateway address).
    r += "  chain prerouting {\n    type nat hook prerouting priority dstnat; policy accept;\n";
    r += "    iifname \"tap0\" tcp dport 443 redirect to :" + std::to_string(kEgressProxyTlsPort) +
         "\n";
    r += "    iifname \"tap0\" tcp dport 80 redirect to :" + std::to_string(kEgressProxyPlainPort) +
         "\n  }\n";
  }
  r += "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n";
  r += "    oifname \"eth0\" masquerade\n  }\n}\n";
  return r;
}

std::string host_ruleset(const NetworkSettings& settings) {
  std::string t = std::string(kTable) + "_" + settings.prefix;
  std::string links = "\"" + settings.prefix + "*\"";
  std::string r = "table inet " + t + "\ndelete table inet " + t + "\n";
  r += "table inet " + t + " {\n";
  // A sandbox never talks to the host itself: not the gateway, not RPC, not any host address.
  r += "  chain input {\n    type filter hook input priority filter - 10; policy accept;\n";
  r += "    iifname " + links + " drop\n  }\n";
  // Nor to another sandbox.
  r += "  chain forward {\n    type filter hook forward priority filter - 10; policy accept;\n";
  r += "    iifname " + links + " oifname " + links + " drop\n";
  r += "    iifname " + links + " ip daddr " + settings.pool_cidr + " drop\n  }\n";
  r += "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n";
  r += "    ip saddr " + settings.pool_cidr + " oifname != " + links + " masquerade\n  }\n}\n";
  return r;
}

Status apply_nft(const std::string& rules, int netns_fd) {
  // libnftables in-process (no fork/exec of nft): its netlink socket belongs to the namespace of
  // the thread that creates the context, so a short-lived thread enters the namespace first.
  std::string error;
  std::string entering = in_netns(netns_fd, [&] {
    nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
    if (!ctx) {
      error = "nft_ctx_new failed";
      return;
    }
    nft_ctx_buffer_output(ctx);
    nft_ctx_buffer_error(ctx);
    if (nft_run_cmd_from_buffer(ctx, rules.c_str()) != 0) {
      const char* e = nft_ctx_get_error_buffer(ctx);
      error = std::string("nft: ") + (e && *e ? e : "failed");
    }
    nft_ctx_free(ctx);
  });
  if (!entering.empty()) error = entering;
  if (!error.empty()) return make_error(ErrorCode::spawn_failed, error);
  return Ok{};
}

Status run_net_tool(const std::vector<std::string>& argv, const std::string& input, int netns_fd) {
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0)
    return make_error(ErrorCode::io_error, errno_text("pipe", errno));
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return make_error(ErrorCode::io_error, errno_text("pipe", errno));
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) ::_exit(125);
    ::dup2(in_pipe[0], 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(out_pipe[1], 2);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (pid < 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return make_error(ErrorCode::spawn_failed, errno_text("fork", errno));
  }
  size_t off = 0;
  while (off < input.size()) {
    ssize_t w = ::write(in_pipe[1], input.data() + off, input.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += size_t(w);
  }
  ::close(in_pipe[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Ok{};
  std::string cmd;
  for (auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  return make_error(ErrorCode::spawn_failed,
                    cmd + " failed (status " + std::to_string(status) + "): " + out);
}

Result<std::shared_ptr<Network>> Network::create(const NetworkSettings& settings, uint32_t index,
                                                 const EgressPolicy& policy) {
  auto pool = SubnetPool::parse(settings.pool_cidr);
  if (!pool) return pool.error();
  if (index >= pool->capacity())
    return make_error(ErrorCode::invalid_argument,
                      "subnet " + std::to_string(index) + " is outside " + pool->cidr());
  auto dir = ensure_netns_dir();
  if (!dir) return dir.error();
  std::shared_ptr<Network> n(new Network());
  n->settings_ = settings;
  n->index_ = index;
  n->netns_ = settings.prefix + "-" + std::to_string(index);
  n->host_link_ = settings.prefix + std::to_string(index);
  n->policy_ = policy;

  // A fresh namespace made by a short-lived thread (unshare affects only the calling thread),
  // and the tap created inside it. The tap is not persistent: it lives while QEMU holds it.
  std::string failed;
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0) {
      failed = errno_text("unshare(CLONE_NEWNET)", errno);
      return;
    }
    n->netns_fd_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (n->netns_fd_ < 0) {
      failed = errno_text("opening the new namespace", errno);
      return;
    }
    int tap = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (tap < 0) {
      failed = errno_text("opening /dev/net/tun", errno);
      return;
    }
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "tap0", IFNAMSIZ - 1);
    // No vnet header: the device state of a template baked without a tap must load here.
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (::ioctl(tap, TUNSETIFF, &ifr) != 0) {
      failed = errno_text("creating tap0", errno);
      ::close(tap);
      return;
    }
    n->tap_fd_ = tap;
    // Forwarding inside the namespace (its own sysctl); no IPv6 at all.
    for (auto [path, value] : {std::pair{"/proc/sys/net/ipv4/ip_forward", "1"},
                               std::pair{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"},
                               std::pair{"/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"}}) {
      int fd = ::open(path, O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        ssize_t w = ::write(fd, value, 1);
        (void)w;
        ::close(fd);
      }
    }
  }).join();
  if (!failed.empty()) return make_error(ErrorCode::spawn_failed, "sandbox network: " + failed);

  // Name it under /run/netns (recovery finds it there; `ip -n` works on it).
  auto path = std::string(kNetnsDir) + "/" + n->netns_;
  unmount_netns(n->netns_);  // a stale name from a crash
  int f = ::open(path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (f < 0) return make_error(ErrorCode::io_error, errno_text("creating " + path, errno));
  ::close(f);
  auto self = "/proc/self/fd/" + std::to_string(n->netns_fd_);
  if (::mount(self.c_str(), path.c_str(), "none", MS_BIND, nullptr) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    return make_error(ErrorCode::io_error, errno_text("bind-mounting " + path, err));
  }
  // From here on the destructor removes whatever exists.
  if (fs::exists("/sys/class/net/" + n->host_link_))  // a stale link from a crash
    (void)run_net_tool({"ip", "link", "del", n->host_link_});
  auto st = run_net_tool({"ip", "-batch", "-"},
                         "link add " + n->host_link_ + " type veth peer name eth0 netns " +
                             n->netns_ + "\naddr add " + pool->host_address(index) + "/30 dev " +
                             n->host_link_ + "\nlink set " + n->host_link_ + " up\n");
  if (!st) return st.error();
  st = run_net_tool(
      {"ip", "-batch", "-"},
      "link set lo up\naddr add " + pool->ns_address(index) + "/30 dev eth0\nlink set eth0 up\n" +
          "addr add " + kGuestGateway + "/30 dev tap0\nlink set tap0 address " + kGatewayMac +
          "\nlink set tap0 up\nroute add default via " + pool->host_address(index) + "\n",
      n->netns_fd_);
  if (!st) return st.error();
  st = apply_nft(sandbox_ruleset(settings, policy, false), n->netns_fd_);
  if (!st) return st.error();
  st = n->sync_resolver();
  if (!st) return st.error();
  return n;
}

Result<std::shared_ptr<Network>> Network::adopt(const NetworkSettings& settings, uint32_t index) {
  std::shared_ptr<Network> n(new Network());
  n->settings_ = settings;
  n->index_ = index;
  n->netns_ = settings.prefix + "-" + std::to_string(index);
  n->host_link_ = settings.prefix + std::to_string(index);
  auto path = std::string(kNetnsDir) + "/" + n->netns_;
  n->netns_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (n->netns_fd_ < 0) {
    n->netns_.clear();  // nothing to remove
    return make_error(ErrorCode::not_found, errno_text("sandbox network " + path, errno));
  }
  n->policy_.mode = EgressPolicy::Mode::deny_all;  // the caller re-applies the recorded policy
  return n;
}

Status Network::set_policy(const EgressPolicy& policy) {
  std::lock_guard lock(rules_mu_);
  auto st = apply_nft(sandbox_ruleset(settings_, policy, egress_proxy_ != nullptr), netns_fd_);
  if (!st) return st;
  policy_ = policy;
  return sync_resolver();
}

Status Network::set_egress_proxy(std::shared_ptr<void> proxy) {
  std::lock_guard lock(rules_mu_);
  auto st = apply_nft(sandbox_ruleset(settings_, policy_, proxy != nullptr), netns_fd_);
  if (!st) return st;
  egress_proxy_ = std::move(proxy);
  return Ok{};
}

bool Network::egress_proxy() const {
  std::lock_guard lock(rules_mu_);
  return egress_proxy_ != nullptr;
}

Status Network::sync_resolver() {
  bool allow_all = policy_.mode == EgressPolicy::Mode::allow_all;
  if (!needs_resolver(policy_) || settings_.dns_upstream.empty()) {
    dns_.reset();
    return Ok{};
  }
  if (dns_) {
    dns_->update(allow_all, policy_.domains);
    return Ok{};
  }
  auto d =
      DnsServer::start(netns_fd_, settings_.dns_upstream, allow_all, policy_.domains, egress_log_,
                       settings_.dns_max_names, settings_.reserved, settings_.reserved_allowed);
  if (!d) return d.error();
  dns_ = std::move(*d);
  return Ok{};
}

void Network::close_tap() {
  if (tap_fd_ >= 0) ::close(tap_fd_);
  tap_fd_ = -1;
}

void Network::destroy() {
  egress_watch_.reset();  // (its sockets hold the namespace)
  {
    std::lock_guard lock(rules_mu_);
    egress_proxy_.reset();  // (its listeners too)
  }
  close_tap();
  if (!host_link_.empty() && fs::exists("/sys/class/net/" + host_link_)) {
    // Deleting one end deletes the pair now (the namespace itself goes when its last user does).
    auto st = run_net_tool({"ip", "link", "del", host_link_});
    if (!st) spdlog::warn("network {}: {}", netns_, st.error().message);
  }
  if (!netns_.empty()) unmount_netns(netns_);
  if (netns_fd_ >= 0) ::close(netns_fd_);
  netns_fd_ = -1;
}

Result<uint16_t> Network::expose(uint16_t port, const std::string& bind_host) {
  std::lock_guard lock(forwards_mu_);
  auto it = forwards_.find(port);
  if (it != forwards_.end()) return it->second->host_port();
  auto f = PortForward::start(netns_fd_, port, bind_host);
  if (!f) return f.error();
  uint16_t host = (*f)->host_port();
  forwards_[port] = std::move(*f);
  return host;
}

void Network::unexpose(uint16_t port) {
  std::unique_ptr<PortForward> gone;
  {
    std::lock_guard lock(forwards_mu_);
    auto it = forwards_.find(port);
    if (it == forwards_.end()) return;
    gone = std::move(it->second);
    forwards_.erase(it);
  }
}

std::map<uint16_t, uint16_t> Network::exposed() const {
  std::lock_guard lock(forwards_mu_);
  std::map<uint16_t, uint16_t> out;
  for (auto& [g, f] : forwards_) out[g] = f->host_port();
  return out;
}

Network::~Network() {
  {
    std::lock_guard lock(forwards_mu_);
    forwards_.clear();
  }
  dns_.reset();
  destroy();
  if (on_release_) on_release_(index_);
}

Status Network::install_host_rules(const NetworkSettings& settings) {
  bool good =
      !settings.prefix.empty() && settings.prefix.size() <= 5 && std::islower(settings.prefix[0]);
  for (char c : settings.prefix) good = good && (std::islower(c) || std::isdigit(c));
  if (!good)
    return make_error(
        ErrorCode::invalid_argument,
        "network prefix must be 1-5 lowercase letters or digits, starting with a letter: " +
            settings.prefix);
  auto pool = SubnetPool::parse(settings.pool_cidr);
  if (!pool) return pool.error();
  {
    std::ofstream f("/proc/sys/net/ipv4/ip_forward");
    f << "1";
    if (!f)
      return make_error(ErrorCode::io_error,
                        "cannot enable IPv4 forwarding (/proc/sys/net/ipv4/ip_forward)");
  }
  return apply_nft(host_ruleset(settings));
}

void Network::remove_host_rules(const NetworkSettings& settings) {
  auto t = std::string(kTable) + "_" + settings.prefix;
  (void)apply_nft("table inet " + t + "\ndelete table inet " + t + "\n");
}

std::vector<std::string> Network::list_namespaces(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(kNetnsDir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind(prefix + "-", 0) == 0 && all_digits(name.substr(prefix.size() + 1)))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int Network::remove_leftovers(const NetworkSettings& settings, const std::set<uint32_t>& keep) {
  int removed = 0;
  for (auto& name : list_namespaces(settings.prefix)) {
    uint32_t i = uint32_t(std::stoul(name.substr(settings.prefix.size() + 1)));
    if (keep.count(i)) continue;
    unmount_netns(name);
    ++removed;
  }
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/sys/class/net", ec)) {
    auto name = e.path().filename().string();
    if (name.rfind(settings.prefix, 0) != 0 || !all_digits(name.substr(settings.prefix.size())))
      continue;
    if (keep.count(uint32_t(std::stoul(name.substr(settings.prefix.size()))))) continue;
    (void)run_net_tool({"ip", "link", "del", name});
    ++removed;
  }
  return removed;
}

}  // namespace pandastack::vmm
