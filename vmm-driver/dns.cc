#include "vmm-driver/dns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "vmm-driver/netns.h"
#include "vmm-driver/network.h"

namespace pandastack::vmm {

namespace dns {
namespace {
// Skips a (possibly compressed) name starting at `at`; returns the offset after it, or 0.
size_t skip_name(const std::string& p, size_t at) {
  for (int hops = 0; at < p.size() && hops < 128; ++hops) {
    uint8_t len = uint8_t(p[at]);
    if (len == 0) return at + 1;
    if ((len & 0xC0) == 0xC0) return at + 2 <= p.size() ? at + 2 : 0;
    at += 1 + len;
  }
  return 0;
}
uint16_t u16(const std::string& p, size_t at) {
  return uint16_t(uint8_t(p[at]) << 8 | uint8_t(p[at + 1]));
}
}  // namespace

bool plain_query(const std::string& p) {
  if (p.size() < 12) return false;
  uint8_t flags = uint8_t(p[2]);
  bool qr = flags & 0x80;
  int opcode = (flags >> 3) & 0x0F;
  return !qr && opcode == 0 && u16(p, 4) == 1 && u16(p, 6) == 0 && u16(p, 8) == 0 &&
         u16(p, 10) <= 1;
}

std::optional<std::string> question_name(const std::string& p) {
  if (p.size() < 12 || u16(p, 4) == 0) return std::nullopt;
  std::string name;
  size_t at = 12;
  while (at < p.size()) {
    uint8_t len = uint8_t(p[at]);
    if (len == 0) {
      if (at + 5 > p.size()) return std::nullopt;
      return name;
    }
    if (len > 63 || at + 1 + len > p.size()) return std::nullopt;  // no compression in a question
    if (!name.empty()) name += '.';
    for (size_t i = 0; i < len; ++i)
      name += char(std::tolower(static_cast<unsigned char>(p[at + 1 + i])));
    at += 1 + len;
    if (name.size() > 253) return std::nullopt;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, uint32_t>> a_records(const std::string& p) {
  std::vector<std::pair<std::string, uint32_t>> out;
  if (p.size() < 12) return out;
  size_t at = 12;
  for (uint16_t q = u16(p, 4); q > 0; --q) {
    at = skip_name(p, at);
    if (at == 0 || at + 4 > p.size()) return out;
    at += 4;
  }
  for (uint16_t a = u16(p, 6); a > 0; --a) {
    at = skip_name(p, at);
    if (at == 0 || at + 10 > p.size()) return out;
    uint16_t type = u16(p, at), cls = u16(p, at + 2);
    uint32_t ttl = uint32_t(u16(p, at + 4)) << 16 | u16(p, at + 6);
    uint16_t len = u16(p, at + 8);
    at += 10;
    if (at + len > p.size()) return out;
    if (type == 1 && cls == 1 && len == 4) {
      char buf[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, p.data() + at, buf, sizeof buf);
      out.emplace_back(buf, ttl);
    }
    at += len;
  }
  return out;
}

std::string refused(const std::string& q) {
  std::string r = q.substr(0, 12);
  if (r.size() < 12) return "";
  r[2] = char(uint8_t(r[2]) | 0x80);               // QR: a response
  r[3] = char((uint8_t(r[3]) & 0xF0) | 0x80 | 5);  // RA, RCODE 5 (REFUSED)
  r[6] = r[7] = r[8] = r[9] = r[10] = r[11] = 0;   // no answer, authority or additional records
  // Keep the question (only it) so the client matches the response.
  size_t end = 12;
  if (u16(q, 4) >= 1) {
    end = skip_name(q, 12);
    if (end == 0 || end + 4 > q.size()) return r;  // QDCOUNT stays as sent; body cut
    end += 4;
    r[4] = 0;
    r[5] = 1;
  }
  return r + q.substr(12, end - 12);
}

std::string question_type(const std::string& p) {
  if (p.size() < 12 || u16(p, 4) == 0) return "";
  size_t at = skip_name(p, 12);
  if (at == 0 || at + 2 > p.size()) return "";
  switch (uint16_t t = u16(p, at)) {
    case 1:
      return "A";
    case 2:
      return "NS";
    case 5:
      return "CNAME";
    case 6:
      return "SOA";
    case 12:
      return "PTR";
    case 15:
      return "MX";
    case 16:
      return "TXT";
    case 28:
      return "AAAA";
    case 33:
      return "SRV";
    case 64:
      return "SVCB";
    case 65:
      return "HTTPS";
    default:
      return std::to_string(t);
  }
}

bool allowed(const std::string& name, const std::vector<std::string>& patterns) {
  for (auto& p : patterns) {
    if (p.rfind("*.", 0) == 0) {
      std::string suffix = p.substr(1);  // ".example.com"
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return true;
    } else if (name == p) {
      return true;
    }
  }
  return false;
}
}  // namespace dns

Result<std::unique_ptr<DnsServer>> DnsServer::start(
    int netns_fd, const std::string& upstream, bool allow_all, std::vector<std::string> domains,
    std::shared_ptr<EgressLog> log, size_t max_names, std::vector<std::string> reserved,
    std::vector<std::string> reserved_allowed) {
  std::unique_ptr<DnsServer> d(new DnsServer());
  d->log_ = log ? std::move(log) : std::make_shared<EgressLog>();
  d->max_names_ = max_names;
  d->allow_all_ = allow_all;
  d->domains_ = std::move(domains);
  d->reserved_ = std::move(reserved);
  d->reserved_allowed_ = std::move(reserved_allowed);
  // The upstream socket lives in the host's namespace (made here), the guest's in the sandbox's.
  auto colon = upstream.rfind(':');
  std::string host = colon == std::string::npos ? upstream : upstream.substr(0, colon);
  int port = colon == std::string::npos ? 53 : std::atoi(upstream.c_str() + colon + 1);
  sockaddr_in up{};
  up.sin_family = AF_INET;
  up.sin_port = htons(uint16_t(port));
  if (::inet_pton(AF_INET, host.c_str(), &up.sin_addr) != 1 || port <= 0 || port > 65535)
    return make_error(ErrorCode::invalid_argument,
                      "bad DNS upstream '" + upstream + "' (IPv4[:port])");
  d->upstream_fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (d->upstream_fd_ < 0 ||
      ::connect(d->upstream_fd_, reinterpret_cast<sockaddr*>(&up), sizeof up) != 0)
    return make_error(ErrorCode::io_error, std::string("DNS upstream socket: ") + strerror(errno));
  d->netns_fd_ = ::fcntl(netns_fd, F_DUPFD_CLOEXEC, 0);  // (dup() would clear close-on-exec)
  std::string failed;
  std::string entering = in_netns(netns_fd, [&] {
    d->guest_fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(53);
    ::inet_pton(AF_INET, kGuestGateway, &a.sin_addr);
    if (d->guest_fd_ < 0 || ::bind(d->guest_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      failed = std::string("binding the sandbox resolver: ") + strerror(errno);
  });
  if (!entering.empty()) failed = entering;
  if (!failed.empty()) return make_error(ErrorCode::io_error, failed);
  if (::pipe2(d->stop_, O_CLOEXEC | O_NONBLOCK) != 0)
    return make_error(ErrorCode::io_error, std::string("pipe: ") + strerror(errno));
  d->thread_ = std::thread([p = d.get()] { p->loop(); });
  return d;
}

DnsServer::~DnsServer() {
  if (stop_[1] >= 0) {
    ssize_t w = ::write(stop_[1], "x", 1);
    (void)w;
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {guest_fd_, upstream_fd_, stop_[0], stop_[1], netns_fd_})
    if (fd >= 0) ::close(fd);
}

void DnsServer::update(bool allow_all, std::vector<std::string> domains) {
  std::lock_guard lock(mu_);
  allow_all_ = allow_all;
  domains_ = std::move(domains);
}

void DnsServer::loop() {
  using Clock = std::chrono::steady_clock;
  struct Pending {
    sockaddr_in client;
    uint16_t id;
    Clock::time_point sent;
    std::string name, qtype;
  };
  std::map<uint16_t, Pending> pending;  // upstream id -> the guest's query
  uint16_t next_id = uint16_t(::getpid() ^ uintptr_t(this));
  // DNS is a way out even when every address is closed (a name can carry data to whoever
  // answers for its domain): queries are rate-limited and the distinct names forwarded capped.
  double tokens = kDnsBurst;
  auto refilled = Clock::now();
  Clock::time_point last_limit_logged{};
  std::set<std::string> names;
  auto log_query = [&](const std::string& name, const std::string& qtype, bool ok,
                       const char* reason, std::vector<std::string> answers = {}) {
    EgressEntry e;
    e.kind = EgressEntry::Kind::dns;
    e.time_ms = egress::now_ms();
    e.allowed = ok;
    e.reason = ok ? "" : reason;
    e.name = name;
    e.qtype = qtype;
    e.answers = std::move(answers);
    log_->add(std::move(e));
  };
  char buf[4096];
  for (;;) {
    pollfd fds[3] = {{stop_[0], POLLIN, 0}, {guest_fd_, POLLIN, 0}, {upstream_fd_, POLLIN, 0}};
    if (::poll(fds, 3, 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    auto now = Clock::now();
    std::erase_if(pending, [&](auto& kv) {
      if (now - kv.second.sent <= std::chrono::seconds(10)) return false;
      log_query(kv.second.name, kv.second.qtype, true, "", {});  // (no answer came)
      return true;
    });
    tokens = std::min(kDnsBurst, tokens + std::chrono::duration<double>(now - refilled).count() *
                                              kDnsQueriesPerSecond);
    refilled = now;
    if (fds[1].revents & POLLIN) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      ssize_t n =
          ::recvfrom(guest_fd_, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n >= 12) {
        std::string q(buf, size_t(n));
        auto name = dns::question_name(q);
        std::string qtype = dns::question_type(q);
        const char* denied = nullptr;
        {
          std::lock_guard lock(mu_);
          if (!name || !dns::plain_query(q))
            denied = "malformed";
          else if (!(allow_all_ || dns::allowed(*name, domains_)))
            denied = "policy";
        }
        if (!denied && tokens < 1) denied = "rate_limit";
        if (!denied && !names.count(*name) && names.size() >= max_names_) denied = "unique_names";
        if (!denied && pending.size() >= 1024) denied = "rate_limit";
        if (denied) {
          auto r = dns::refused(q);
          ::sendto(guest_fd_, r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
          // A flood is one entry a second, not one per query.
          bool limited = std::string_view(denied) == "rate_limit";
          if (!limited || now - last_limit_logged >= std::chrono::seconds(1)) {
            log_query(name.value_or(""), qtype, false, denied);
            if (limited) last_limit_logged = now;
          }
        } else {
          tokens -= 1;
          names.insert(*name);
          uint16_t id = next_id++;
          pending[id] =
              Pending{from, uint16_t(uint8_t(q[0]) << 8 | uint8_t(q[1])), now, *name, qtype};
          q[0] = char(id >> 8);
          q[1] = char(id & 0xFF);
          ssize_t w = ::send(upstream_fd_, q.data(), q.size(), 0);
          (void)w;
        }
      }
    }
    if (fds[2].revents & POLLIN) {
      ssize_t n = ::recv(upstream_fd_, buf, sizeof buf, 0);
      if (n < 12) continue;
      std::string r(buf, size_t(n));
      uint16_t id = uint16_t(uint8_t(r[0]) << 8 | uint8_t(r[1]));
      auto it = pending.find(id);
      if (it == pending.end()) continue;
      Pending p = it->second;
      pending.erase(it);
      bool allow_all;
      {
        std::lock_guard lock(mu_);
        allow_all = allow_all_;
      }
      // Admit the answer's addresses before the guest can use them.
      auto records = dns::a_records(r);
      std::string elems;
      std::vector<std::string> answered;
      for (auto& [addr, ttl] : records) {
        if (answered.size() < 16) answered.push_back(addr);
        log_->learn_name(addr, p.name);
        if (allow_all) continue;
        in_addr a{};
        ::inet_pton(AF_INET, addr.c_str(), &a);
        if (is_reserved(ntohl(a.s_addr), reserved_, reserved_allowed_)) {
          spdlog::info("sandbox resolver: not admitting {} (a private or reserved address)", addr);
          continue;
        }
        // At least a minute (clients cache), at most a day (the set does not grow for good).
        elems += (elems.empty() ? "" : ", ") + addr + " timeout " +
                 std::to_string(std::clamp<uint32_t>(ttl, 60, 86400)) + "s";
      }
      if (!elems.empty()) {
        auto st = apply_nft("add element inet pandastack dns_allow { " + elems + " }\n", netns_fd_);
        if (!st) {
          spdlog::warn("sandbox resolver: cannot admit {}: {}", elems, st.error().message);
          r = dns::refused(r);
          answered.clear();
        }
      }
      log_query(p.name, p.qtype, true, "", std::move(answered));
      r[0] = char(p.id >> 8);
      r[1] = char(p.id & 0xFF);
      ::sendto(guest_fd_, r.data(), r.size(), 0, reinterpret_cast<const sockaddr*>(&p.client),
               sizeof p.client);
    }
  }
}

}  // namespace pandastack::vmm
