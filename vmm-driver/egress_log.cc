#include "vmm-driver/egress_log.h"

#include <arpa/inet.h>
#include <linux/netfilter/nf_conntrack_tcp.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace pandastack::vmm {

const char* to_string(EgressEntry::Kind k) {
  switch (k) {
    case EgressEntry::Kind::dns:
      return "dns";
    case EgressEntry::Kind::connection:
      return "connection";
    case EgressEntry::Kind::secret:
      return "secret";
  }
  return "?";
}

std::optional<EgressEntry::Kind> egress_kind_from_string(const std::string& s) {
  for (auto k : {EgressEntry::Kind::dns, EgressEntry::Kind::connection, EgressEntry::Kind::secret})
    if (s == to_string(k)) return k;
  return std::nullopt;
}

namespace {
constexpr size_t kMaxNames = 512;
}  // namespace

uint64_t EgressLog::add(EgressEntry e) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->add(std::move(e));
  }
  return add_locked(std::move(e));
}

uint64_t EgressLog::add_locked(EgressEntry e) {
  e.seq = next_seq_++;
  if (e.kind == EgressEntry::Kind::connection && e.name.empty())
    if (auto it = names_.find(e.destination); it != names_.end()) e.name = it->second;
  count_locked(e);
  entries_.push_back(std::move(e));
  // (An open connection whose entry goes stays in `open_`: its bytes still count when it ends.)
  while (entries_.size() > capacity_) {
    entries_.pop_front();
    ++dropped_;
  }
  return entries_.back().seq;
}

void EgressLog::connection_opened(uint32_t ct_id, EgressEntry e) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->connection_opened(ct_id, std::move(e));
  }
  e.kind = EgressEntry::Kind::connection;
  e.allowed = true;
  uint64_t seq = add_locked(std::move(e));
  track_open_locked(ct_id, seq);
}

void EgressLog::track_open_locked(uint32_t ct_id, uint64_t seq) {
  if (open_.size() >= capacity_ && !open_.count(ct_id))  // the oldest goes (its end was missed)
    open_.erase(std::min_element(open_.begin(), open_.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; }));
  open_[ct_id] = seq;
}

void EgressLog::connection_ended(uint32_t ct_id, uint64_t out, uint64_t in, int64_t when_ms) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->connection_ended(ct_id, out, in, when_ms);
  }
  ended_locked(ct_id, out, in, when_ms);
}

void EgressLog::ended_locked(uint32_t ct_id, uint64_t out, uint64_t in, int64_t when_ms) {
  auto it = open_.find(ct_id);
  if (it == open_.end()) return;
  uint64_t seq = it->second;
  open_.erase(it);
  sums_.bytes_out += out;
  sums_.bytes_in += in;
  if (entries_.empty() || seq < entries_.front().seq) return;
  auto& e = entries_[size_t(seq - entries_.front().seq)];
  e.bytes_out = out;
  e.bytes_in = in;
  e.ended_ms = when_ms;
}

void EgressLog::learn_name(const std::string& address, const std::string& name) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->learn_name(address, name);
  }
  if (names_.size() >= kMaxNames && !names_.count(address)) names_.erase(names_.begin());
  names_[address] = name;
}

void EgressLog::count_lost(uint64_t n) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->count_lost(n);
  }
  lost_ += n;
}

EgressPage EgressLog::read(const EgressQuery& q) const {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->read(q);
  }
  EgressPage page;
  page.next_after = q.after;
  page.dropped = dropped_;
  page.lost = lost_;
  for (auto& e : entries_) {
    if (page.entries.size() >= q.limit) break;
    if (e.seq <= q.after) continue;
    page.next_after = e.seq;  // (filtered-out entries are passed, too)
    if (q.kind && e.kind != *q.kind) continue;
    if (q.allowed && e.allowed != *q.allowed) continue;
    page.entries.push_back(e);
  }
  return page;
}

void EgressLog::count_locked(const EgressEntry& e) {
  if (sums_.from_ms == 0) sums_.from_ms = e.time_ms ? e.time_ms : egress::now_ms();
  auto& kind = e.kind == EgressEntry::Kind::dns          ? sums_.dns
               : e.kind == EgressEntry::Kind::connection ? sums_.connections
                                                         : sums_.secret_requests;
  ++(e.allowed ? kind.allowed : kind.denied);
  const std::string& name = e.name.empty() ? e.destination : e.name;
  if (name.empty()) return;
  auto it = per_name_.find(name);
  if (it == per_name_.end()) {
    if (per_name_.size() >= kMaxTrackedNames) {
      ++sums_.other_destinations;  // (a name past the bound is counted once per request)
      return;
    }
    it = per_name_.emplace(name, EgressCount{}).first;
  }
  ++(e.allowed ? it->second.allowed : it->second.denied);
}

EgressSummary EgressLog::take_summary(int64_t now_ms) {
  std::unique_lock l(mu_);
  if (auto t = forward_) {
    l.unlock();
    return t->take_summary(now_ms);
  }
  EgressSummary out = std::exchange(sums_, EgressSummary{});
  auto names = std::exchange(per_name_, {});
  if (out.empty()) return EgressSummary{};
  out.to_ms = now_ms;
  if (out.from_ms == 0 || out.from_ms > now_ms) out.from_ms = now_ms;
  std::vector<EgressDestination> all;
  all.reserve(names.size());
  for (auto& [name, n] : names) all.push_back({name, n});
  auto total = [](const EgressDestination& d) {
    return uint64_t(d.requests.allowed) + d.requests.denied;
  };
  std::stable_sort(all.begin(), all.end(),
                   [&](const auto& a, const auto& b) { return total(a) > total(b); });
  size_t keep = std::min(all.size(), EgressSummary::kMaxDestinations);
  out.other_destinations += uint32_t(all.size() - keep);
  all.resize(keep);
  out.destinations = std::move(all);
  return out;
}

void EgressLog::forward_to(std::shared_ptr<EgressLog> to) {
  if (!to || to.get() == this) return;
  std::scoped_lock both(mu_, to->mu_);
  std::map<uint64_t, uint32_t> open_by_seq;  // (entry -> its connection's id)
  for (auto& [id, s] : open_) open_by_seq[s] = id;
  for (auto& e : entries_) {
    auto open = open_by_seq.find(e.seq);
    uint64_t seq = to->add_locked(std::move(e));
    if (open != open_by_seq.end()) to->track_open_locked(open->second, seq);
  }
  for (auto& [addr, name] : names_)
    if (to->names_.size() < kMaxNames) to->names_[addr] = name;
  to->lost_ += lost_;
  entries_.clear();
  open_.clear();
  names_.clear();
  forward_ = std::move(to);
}

namespace egress {
namespace {

// Netlink attributes in [p, end): calls f(type, payload, payload_len) for each well-formed one.
template <typename F>
void attrs(const uint8_t* p, const uint8_t* end, F&& f) {
  while (end - p >= ptrdiff_t(sizeof(nlattr))) {
    nlattr a;
    std::memcpy(&a, p, sizeof a);
    if (a.nla_len < sizeof(nlattr) || a.nla_len > end - p) return;
    f(uint16_t(a.nla_type & NLA_TYPE_MASK), p + NLA_HDRLEN, size_t(a.nla_len - NLA_HDRLEN));
    size_t step = NLA_ALIGN(a.nla_len);
    if (step > size_t(end - p)) return;
    p += step;
  }
}

uint64_t be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}

// The netfilter payload (after nlmsghdr and nfgenmsg) of a message of `subsys`, or false.
bool body(const uint8_t* msg, size_t len, uint8_t subsys, uint8_t* type, const uint8_t** start,
          const uint8_t** end) {
  if (len < NLMSG_HDRLEN + sizeof(nfgenmsg)) return false;
  nlmsghdr h;
  std::memcpy(&h, msg, sizeof h);
  if (h.nlmsg_len < NLMSG_HDRLEN + sizeof(nfgenmsg) || h.nlmsg_len > len) return false;
  if (NFNL_SUBSYS_ID(h.nlmsg_type) != subsys) return false;
  *type = uint8_t(NFNL_MSG_TYPE(h.nlmsg_type));
  nfgenmsg g;
  std::memcpy(&g, msg + NLMSG_HDRLEN, sizeof g);
  if (g.nfgen_family != AF_INET) return false;
  *start = msg + NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg));
  *end = msg + h.nlmsg_len;
  return *start <= *end;
}

}  // namespace

std::optional<ConntrackEvent> parse_conntrack(const uint8_t* msg, size_t len) {
  uint8_t type;
  const uint8_t *p, *end;
  if (!body(msg, len, NFNL_SUBSYS_CTNETLINK, &type, &p, &end)) return std::nullopt;
  if (type != IPCTNL_MSG_CT_NEW && type != IPCTNL_MSG_CT_DELETE) return std::nullopt;
  nlmsghdr h;
  std::memcpy(&h, msg, sizeof h);
  ConntrackEvent ev;
  ev.seq = h.nlmsg_seq;
  ev.type = type == IPCTNL_MSG_CT_DELETE     ? ConntrackEvent::Type::destroyed
            : (h.nlmsg_flags & NLM_F_CREATE) ? ConntrackEvent::Type::created
                                             : ConntrackEvent::Type::updated;
  bool have_tuple = false;
  attrs(p, end, [&](uint16_t t, const uint8_t* v, size_t n) {
    if (t == CTA_TUPLE_ORIG) {
      attrs(v, v + n, [&](uint16_t t2, const uint8_t* v2, size_t n2) {
        if (t2 == CTA_TUPLE_IP)
          attrs(v2, v2 + n2, [&](uint16_t t3, const uint8_t* v3, size_t n3) {
            if (n3 != 4) return;
            if (t3 == CTA_IP_V4_SRC) std::memcpy(&ev.src, v3, 4);
            if (t3 == CTA_IP_V4_DST) {
              std::memcpy(&ev.dst, v3, 4);
              have_tuple = true;
            }
          });
        if (t2 == CTA_TUPLE_PROTO)
          attrs(v2, v2 + n2, [&](uint16_t t3, const uint8_t* v3, size_t n3) {
            if (t3 == CTA_PROTO_NUM && n3 >= 1) ev.protocol = v3[0];
            if (t3 == CTA_PROTO_SRC_PORT && n3 >= 2) ev.sport = uint16_t(be(v3, 2));
            if (t3 == CTA_PROTO_DST_PORT && n3 >= 2) ev.dport = uint16_t(be(v3, 2));
          });
      });
    } else if (t == CTA_PROTOINFO) {
      attrs(v, v + n, [&](uint16_t t2, const uint8_t* v2, size_t n2) {
        if (t2 == CTA_PROTOINFO_TCP)
          attrs(v2, v2 + n2, [&](uint16_t t3, const uint8_t* v3, size_t n3) {
            if (t3 == CTA_PROTOINFO_TCP_STATE && n3 >= 1) ev.tcp_state = v3[0];
          });
      });
    } else if (t == CTA_ID && n >= 4) {
      ev.id = uint32_t(be(v, 4));
    } else if (t == CTA_COUNTERS_ORIG || t == CTA_COUNTERS_REPLY) {
      attrs(v, v + n, [&](uint16_t t2, const uint8_t* v2, size_t n2) {
        if (t2 != CTA_COUNTERS_BYTES || n2 != 8) return;
        (t == CTA_COUNTERS_ORIG ? ev.bytes_orig : ev.bytes_reply) = be(v2, 8);
      });
    }
  });
  if (!have_tuple) return std::nullopt;
  return ev;
}

bool tcp_ended(uint8_t state) {
  return state == TCP_CONNTRACK_TIME_WAIT || state == TCP_CONNTRACK_CLOSE;
}

std::string conntrack_get(const ConntrackEvent& ev, uint32_t seq) {
  std::string b(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)), '\0');
  auto attr = [&](uint16_t type, const void* v, size_t n) {
    nlattr a{};
    a.nla_type = type;
    a.nla_len = uint16_t(NLA_HDRLEN + n);
    b.append(reinterpret_cast<const char*>(&a), sizeof a);
    b.append(static_cast<const char*>(v), n);
    b.resize(NLA_ALIGN(b.size()));
  };
  std::vector<size_t> open;
  auto begin = [&](uint16_t type) {
    open.push_back(b.size());
    attr(uint16_t(type | NLA_F_NESTED), nullptr, 0);
  };
  auto end = [&] {
    uint16_t len = uint16_t(b.size() - open.back());
    std::memcpy(b.data() + open.back(), &len, 2);
    open.pop_back();
  };
  begin(CTA_TUPLE_ORIG);
  begin(CTA_TUPLE_IP);
  attr(CTA_IP_V4_SRC, &ev.src, 4);
  attr(CTA_IP_V4_DST, &ev.dst, 4);
  end();
  begin(CTA_TUPLE_PROTO);
  attr(CTA_PROTO_NUM, &ev.protocol, 1);
  uint16_t sport = htons(ev.sport), dport = htons(ev.dport);
  attr(CTA_PROTO_SRC_PORT, &sport, 2);
  attr(CTA_PROTO_DST_PORT, &dport, 2);
  end();
  end();
  nlmsghdr h{};
  h.nlmsg_len = uint32_t(b.size());
  h.nlmsg_type = uint16_t(NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET);
  h.nlmsg_flags = NLM_F_REQUEST;
  h.nlmsg_seq = seq;
  std::memcpy(b.data(), &h, sizeof h);
  nfgenmsg g{};
  g.nfgen_family = AF_INET;
  g.version = NFNETLINK_V0;
  std::memcpy(b.data() + NLMSG_HDRLEN, &g, sizeof g);
  return b;
}

std::optional<DeniedPacket> parse_ipv4(const uint8_t* p, size_t len) {
  if (len < 20 || (p[0] >> 4) != 4) return std::nullopt;
  size_t ihl = size_t(p[0] & 0x0F) * 4;
  if (ihl < 20 || ihl > len) return std::nullopt;
  DeniedPacket d;
  d.protocol = p[9];
  std::memcpy(&d.dst, p + 16, 4);
  bool first_fragment = (be(p + 6, 2) & 0x1FFF) == 0;
  if ((d.protocol == IPPROTO_TCP || d.protocol == IPPROTO_UDP) && first_fragment && len >= ihl + 4)
    d.dport = uint16_t(be(p + ihl + 2, 2));
  return d;
}

std::optional<DeniedPacket> parse_nflog(const uint8_t* msg, size_t len) {
  uint8_t type;
  const uint8_t *p, *end;
  if (!body(msg, len, NFNL_SUBSYS_ULOG, &type, &p, &end)) return std::nullopt;
  if (type != NFULNL_MSG_PACKET) return std::nullopt;
  std::optional<DeniedPacket> d;
  std::string prefix;
  attrs(p, end, [&](uint16_t t, const uint8_t* v, size_t n) {
    if (t == NFULA_PREFIX)
      prefix.assign(reinterpret_cast<const char*>(v),
                    strnlen(reinterpret_cast<const char*>(v), std::min<size_t>(n, 64)));
    if (t == NFULA_PAYLOAD) d = parse_ipv4(v, n);
  });
  if (d) d->prefix = prefix;
  return d;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string protocol_name(uint8_t protocol) {
  switch (protocol) {
    case IPPROTO_TCP:
      return "tcp";
    case IPPROTO_UDP:
      return "udp";
    case IPPROTO_ICMP:
      return "icmp";
    default:
      return std::to_string(protocol);
  }
}

std::string address(uint32_t net_order) {
  char buf[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = net_order;
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace egress
}  // namespace pandastack::vmm
