// What one sandbox reached: every name its resolver answered or refused and every connection it
// opened or was denied, in a bounded in-memory log with a cursor (`seq`).
//
// Writers are the sandbox resolver (dns.h) and the host's egress watcher (egress_watcher.h), on
// their own threads; readers are API calls. A network is made before its sandbox is known (pools),
// so a network's log can be pointed at the sandbox's log (`forward_to`): what it held and
// everything written later goes there, and the sandbox's log outlives its VMs (hibernate, wake).
//
// The netlink parsers below are pure (tested on their own): they take the kernel's messages as
// bytes and never trust a length they did not check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "vmm-driver/egress_summary.h"

namespace pandastack::vmm {

struct EgressEntry {
  // secret: a request through the sandbox's egress proxy that carried a secret's placeholder.
  enum class Kind { dns, connection, secret };
  uint64_t seq = 0;     // 1, 2, ... per sandbox: the cursor
  int64_t time_ms = 0;  // wall clock, when seen
  Kind kind = Kind::dns;
  bool allowed = false;
  // Why it was denied: dns: "policy", "rate_limit", "unique_names", "malformed";
  // connection: "policy", "reserved" (private and reserved ranges), "internal" (the host,
  // other sandboxes, loopback, link-local, multicast). Empty when allowed.
  std::string reason;
  // dns: the question's name and type ("A", "AAAA", ... or the number); connection: the name the
  // sandbox's resolver last answered with this destination, when it did.
  std::string name;
  std::string qtype;
  std::vector<std::string> answers;      // dns: the IPv4 addresses answered (at most 16)
  std::string protocol;                  // connection: "tcp", "udp", "icmp" or the number
  std::string destination;               // connection: IPv4 address
  uint16_t port = 0;                     // connection: destination port (tcp/udp)
  uint64_t bytes_out = 0, bytes_in = 0;  // connection: so far (final once ended)
  int64_t ended_ms = 0;                  // connection: when it ended (0: open or unknown)
  // secret: the request's method, and the secrets put in / not put in (the host is not theirs,
  // or the request was plain HTTP: reason "not_secret_host" / "plain_http"). `name` is the host,
  // `protocol` "https" or "http".
  std::string method;
  std::vector<std::string> injected, refused;
};
// Parses "dns", "connection", "secret".
std::optional<EgressEntry::Kind> egress_kind_from_string(const std::string& s);
const char* to_string(EgressEntry::Kind k);

struct EgressQuery {
  uint64_t after = 0;  // entries with seq > after
  size_t limit = 100;
  std::optional<EgressEntry::Kind> kind;
  std::optional<bool> allowed;
};

struct EgressPage {
  std::vector<EgressEntry> entries;
  uint64_t next_after = 0;  // the cursor for the next page (the last entry's seq, or `after`)
  uint64_t dropped = 0;     // entries evicted (the log keeps the newest `capacity`)
  uint64_t lost = 0;        // events the kernel dropped before we read them (socket overrun)
};

class EgressLog {
 public:
  static constexpr size_t kDefaultCapacity = 1000;
  explicit EgressLog(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  // Appends `e` (its seq and, for a connection, its name are set here). Returns its seq.
  uint64_t add(EgressEntry e);
  // The connection the kernel knows as `ct_id` opened (an allowed one) / ended with its counters.
  void connection_opened(uint32_t ct_id, EgressEntry e);
  void connection_ended(uint32_t ct_id, uint64_t bytes_out, uint64_t bytes_in, int64_t when_ms);
  // Names for destinations (from the resolver's answers), to label connections. Bounded.
  void learn_name(const std::string& address, const std::string& name);
  void count_lost(uint64_t n);

  EgressPage read(const EgressQuery& q) const;
  // What was logged since the previous take (or the log began), summed up; the sums start again.
  // `now_ms` ends the period.
  EgressSummary take_summary(int64_t now_ms);
  // From now on this log's writes go to `target`; what it holds moves there first.
  void forward_to(std::shared_ptr<EgressLog> target);

 private:
  uint64_t add_locked(EgressEntry e);
  void ended_locked(uint32_t ct_id, uint64_t out, uint64_t in, int64_t when_ms);
  void count_locked(const EgressEntry& e);
  void track_open_locked(uint32_t ct_id, uint64_t seq);

  mutable std::mutex mu_;
  size_t capacity_;
  std::deque<EgressEntry> entries_;
  uint64_t next_seq_ = 1;
  uint64_t dropped_ = 0, lost_ = 0;
  // Open connections: conntrack id -> seq of its entry (at most `capacity_`, the oldest goes).
  std::map<uint32_t, uint64_t> open_;
  std::map<std::string, std::string> names_;  // address -> name
  std::shared_ptr<EgressLog> forward_;
  // The sums since the last take_summary (its destinations are kept in `per_name_`, bounded).
  static constexpr size_t kMaxTrackedNames = 256;
  EgressSummary sums_;
  std::map<std::string, EgressCount> per_name_;
};

// Parsers of the kernel's netlink messages (one message: header included).
namespace egress {
// A conntrack message (IPv4): an event (NEW, an update, DELETE) or the answer to a GET.
struct ConntrackEvent {
  enum class Type { created, updated, destroyed };
  Type type = Type::created;
  uint32_t seq = 0;  // 0: an event; else the answer to our request `seq`
  uint32_t id = 0;
  uint8_t protocol = 0;
  uint32_t src = 0, dst = 0;                 // network order
  uint16_t sport = 0, dport = 0;             // host order
  uint8_t tcp_state = 0xff;                  // TCP_CONNTRACK_* when the message carries it
  uint64_t bytes_orig = 0, bytes_reply = 0;  // (in a DELETE and a GET's answer, with accounting)
};
std::optional<ConntrackEvent> parse_conntrack(const uint8_t* msg, size_t len);
// Has a TCP connection in `tcp_state` ended (TIME_WAIT or CLOSE: both sides closed, or a reset)?
bool tcp_ended(uint8_t tcp_state);
// The request for the current state (counters included) of the connection `ev` names.
std::string conntrack_get(const ConntrackEvent& ev, uint32_t seq);

// A packet the ruleset logged as denied (NFLOG): its prefix (the reason) and its IPv4 header.
struct DeniedPacket {
  std::string prefix;
  uint8_t protocol = 0;
  uint32_t dst = 0;  // network order
  uint16_t dport = 0;
};
std::optional<DeniedPacket> parse_nflog(const uint8_t* msg, size_t len);
// The protocol, destination and port (tcp/udp) of an IPv4 packet.
std::optional<DeniedPacket> parse_ipv4(const uint8_t* p, size_t len);

// The wall clock in ms: entries' times (the resolver's and the watcher's).
int64_t now_ms();
std::string protocol_name(uint8_t protocol);
std::string address(uint32_t net_order);
}  // namespace egress

}  // namespace pandastack::vmm
