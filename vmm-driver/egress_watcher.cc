#include "vmm-driver/egress_watcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_compat.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "vmm-driver/netns.h"
#include "vmm-driver/network.h"

namespace pandastack::vmm {

struct EgressWatcher::Subscription::Core {
  struct Entry {
    int ct_fd = -1, log_fd = -1;
    std::shared_ptr<EgressLog> log;
  };
  int epoll = -1, wake = -1;
  mutable std::mutex mu;  // held while a namespace's messages are read: unwatch waits for it
  std::map<uint64_t, Entry> entries;
  uint64_t next = 1;
  bool stop = false;

  void remove(uint64_t token) {
    std::lock_guard l(mu);
    auto it = entries.find(token);
    if (it == entries.end()) return;
    for (int fd : {it->second.ct_fd, it->second.log_fd}) {
      ::epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nullptr);
      ::close(fd);
    }
    entries.erase(it);
  }
};

namespace {

using Core = EgressWatcher::Subscription::Core;

// Sends one NFULNL config message (with its attribute) and waits for the kernel's answer.
Status nflog_config(int fd, uint16_t group, uint16_t attr_type, const void* attr, size_t attr_len) {
  alignas(nlmsghdr) uint8_t buf[128] = {};
  auto* h = reinterpret_cast<nlmsghdr*>(buf);
  h->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
  h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  h->nlmsg_seq = 1;
  auto* g = reinterpret_cast<nfgenmsg*>(buf + NLMSG_HDRLEN);
  g->nfgen_family = AF_UNSPEC;
  g->version = NFNETLINK_V0;
  g->res_id = htons(group);
  size_t at = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg));
  auto* a = reinterpret_cast<nlattr*>(buf + at);
  a->nla_type = attr_type;
  a->nla_len = uint16_t(NLA_HDRLEN + attr_len);
  std::memcpy(buf + at + NLA_HDRLEN, attr, attr_len);
  h->nlmsg_len = uint32_t(at + NLA_ALIGN(a->nla_len));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd, buf, h->nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return make_error(ErrorCode::io_error, std::string("nflog config: ") + strerror(errno));
  alignas(nlmsghdr) uint8_t reply[256];
  ssize_t n = ::recv(fd, reply, sizeof reply, 0);
  if (n < ssize_t(NLMSG_HDRLEN + sizeof(nlmsgerr)))
    return make_error(ErrorCode::io_error, "nflog config: no answer from the kernel");
  auto* rh = reinterpret_cast<nlmsghdr*>(reply);
  if (rh->nlmsg_type == NLMSG_ERROR) {
    auto* e = reinterpret_cast<nlmsgerr*>(reply + NLMSG_HDRLEN);
    if (e->error != 0)
      return make_error(ErrorCode::io_error, std::string("nflog config: ") + strerror(-e->error));
  }
  return Ok{};
}

// The two sockets of one namespace (made on a thread that entered it), or an error.
Result<std::pair<int, int>> open_sockets(int netns_fd) {
  int ct = -1, lg = -1;
  std::string failed;
  std::string entering = in_netns(netns_fd, [&] {
    // Byte counters on this namespace's connections (a per-namespace setting; off by default).
    if (int f = ::open("/proc/sys/net/netfilter/nf_conntrack_acct", O_WRONLY | O_CLOEXEC); f >= 0) {
      if (::write(f, "1", 1) != 1) spdlog::warn("egress watcher: nf_conntrack_acct not set");
      ::close(f);
    }
    ct = ::socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_NETFILTER);
    sockaddr_nl a{};
    a.nl_family = AF_NETLINK;
    a.nl_groups =
        NF_NETLINK_CONNTRACK_NEW | NF_NETLINK_CONNTRACK_UPDATE | NF_NETLINK_CONNTRACK_DESTROY;
    if (ct < 0 || ::bind(ct, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      failed = std::string("conntrack events: ") + strerror(errno);
      return;
    }
    lg = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    sockaddr_nl b{};
    b.nl_family = AF_NETLINK;
    if (lg < 0 || ::bind(lg, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0) {
      failed = std::string("nflog socket: ") + strerror(errno);
      return;
    }
    timeval tv{2, 0};
    ::setsockopt(lg, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    nfulnl_msg_config_cmd cmd{NFULNL_CFG_CMD_BIND};
    auto st = nflog_config(lg, kEgressLogGroup, NFULA_CFG_CMD, &cmd, sizeof cmd);
    nfulnl_msg_config_mode mode{};
    mode.copy_range = htonl(kDeniedCopyBytes);
    mode.copy_mode = NFULNL_COPY_PACKET;
    if (st) st = nflog_config(lg, kEgressLogGroup, NFULA_CFG_MODE, &mode, sizeof mode);
    // Each packet as it comes (the kernel's default batches 100, or for a second).
    uint32_t one = htonl(1);
    if (st) st = nflog_config(lg, kEgressLogGroup, NFULA_CFG_QTHRESH, &one, sizeof one);
    if (!st) failed = st.error().message;
  });
  if (!entering.empty()) failed = entering;
  if (failed.empty()) {
    int fl = ::fcntl(lg, F_GETFL);
    ::fcntl(lg, F_SETFL, fl | O_NONBLOCK);
    return std::make_pair(ct, lg);
  }
  for (int fd : {ct, lg})
    if (fd >= 0) ::close(fd);
  return make_error(ErrorCode::io_error, failed);
}

void on_conntrack(int fd, EgressLog& log, const egress::ConntrackEvent& ev) {
  static const uint32_t guest = [] {
    in_addr a{};
    ::inet_pton(AF_INET, kGuestAddress, &a);
    return a.s_addr;
  }();
  static const uint32_t gateway = [] {
    in_addr a{};
    ::inet_pton(AF_INET, kGuestGateway, &a);
    return a.s_addr;
  }();
  // Only what the guest opened to the outside (its resolver queries are in the DNS entries).
  if (ev.src != guest || ev.dst == gateway) return;
  using T = egress::ConntrackEvent::Type;
  // The end: a DELETE (the entry expired: UDP, ICMP, or TCP long after its close), or the answer
  // to our GET once TCP closed (conntrack keeps a TIME_WAIT entry for two minutes, and only its
  // DELETE and a GET carry the counters).
  if (ev.type == T::destroyed || ev.seq != 0) {
    log.connection_ended(ev.id, ev.bytes_orig, ev.bytes_reply, egress::now_ms());
    return;
  }
  if (ev.type == T::updated) {
    if (ev.protocol == IPPROTO_TCP && egress::tcp_ended(ev.tcp_state)) {
      static std::atomic<uint32_t> seq{1};
      uint32_t s = seq.fetch_add(1);
      if (s == 0) s = seq.fetch_add(1);
      auto req = egress::conntrack_get(ev, s);
      sockaddr_nl kernel{};
      kernel.nl_family = AF_NETLINK;
      if (::sendto(fd, req.data(), req.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                   sizeof kernel) < 0)
        log.connection_ended(ev.id, 0, 0, egress::now_ms());  // (the end, without its counters)
    }
    return;
  }
  EgressEntry e;
  e.time_ms = egress::now_ms();
  e.protocol = egress::protocol_name(ev.protocol);
  e.destination = egress::address(ev.dst);
  e.port = ev.dport;
  log.connection_opened(ev.id, std::move(e));
}

void on_denied(EgressLog& log, const egress::DeniedPacket& d) {
  EgressEntry e;
  e.kind = EgressEntry::Kind::connection;
  e.time_ms = egress::now_ms();
  e.allowed = false;
  e.reason = d.prefix.empty() ? "policy" : d.prefix;
  e.protocol = egress::protocol_name(d.protocol);
  e.destination = egress::address(d.dst);
  e.port = d.dport;
  log.add(std::move(e));
}

// Reads every message waiting on `fd` into `log` (called with the core's lock held).
void drain(int fd, bool conntrack, EgressLog& log) {
  alignas(nlmsghdr) static thread_local uint8_t buf[65536];
  for (int rounds = 0; rounds < 64; ++rounds) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == ENOBUFS) {  // the kernel dropped events: say so, keep reading
        log.count_lost(1);
        continue;
      }
      return;  // EAGAIN (all read) or an error
    }
    if (n == 0) return;
    size_t len = size_t(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
      auto* m = reinterpret_cast<const uint8_t*>(h);
      if (conntrack) {
        if (auto ev = egress::parse_conntrack(m, h->nlmsg_len)) on_conntrack(fd, log, *ev);
      } else if (auto d = egress::parse_nflog(m, h->nlmsg_len)) {
        on_denied(log, *d);
      }
    }
  }
}

void run(std::shared_ptr<Core> core) {
  epoll_event events[64];
  for (;;) {
    int n = ::epoll_wait(core->epoll, events, 64, -1);
    if (n < 0 && errno != EINTR) return;
    std::lock_guard l(core->mu);
    if (core->stop) return;
    for (int i = 0; i < n; ++i) {
      uint64_t token = events[i].data.u64 >> 1;
      bool conntrack = (events[i].data.u64 & 1) == 0;
      auto it = core->entries.find(token);
      if (it == core->entries.end()) continue;  // (the wake-up eventfd has token 0)
      drain(conntrack ? it->second.ct_fd : it->second.log_fd, conntrack, *it->second.log);
    }
  }
}

}  // namespace

EgressWatcher::EgressWatcher() : core_(std::make_shared<Core>()) {
  core_->epoll = ::epoll_create1(EPOLL_CLOEXEC);
  core_->wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  ::epoll_ctl(core_->epoll, EPOLL_CTL_ADD, core_->wake, &ev);
  thread_ = std::thread(run, core_);
}

EgressWatcher::~EgressWatcher() {
  {
    std::lock_guard l(core_->mu);
    core_->stop = true;
  }
  uint64_t one = 1;
  ssize_t w = ::write(core_->wake, &one, sizeof one);
  (void)w;
  if (thread_.joinable()) thread_.join();
  std::lock_guard l(core_->mu);
  for (auto& [token, e] : core_->entries)
    for (int fd : {e.ct_fd, e.log_fd}) ::close(fd);
  core_->entries.clear();
  ::close(core_->wake);
  ::close(core_->epoll);
  core_->epoll = core_->wake = -1;
}

Result<std::unique_ptr<EgressWatcher::Subscription>> EgressWatcher::watch(
    int netns_fd, std::shared_ptr<EgressLog> log) {
  auto fds = open_sockets(netns_fd);
  if (!fds) return fds.error();
  std::lock_guard l(core_->mu);
  uint64_t token = core_->next++;
  auto& e = core_->entries[token];
  e.ct_fd = fds->first;
  e.log_fd = fds->second;
  e.log = std::move(log);
  for (int which = 0; which < 2; ++which) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = token << 1 | uint64_t(which);
    ::epoll_ctl(core_->epoll, EPOLL_CTL_ADD, which ? e.log_fd : e.ct_fd, &ev);
  }
  return std::unique_ptr<Subscription>(new Subscription(core_, token));
}

size_t EgressWatcher::watched() const {
  std::lock_guard l(core_->mu);
  return core_->entries.size();
}

EgressWatcher::Subscription::~Subscription() {
  if (auto core = core_.lock()) core->remove(token_);
}

}  // namespace pandastack::vmm
