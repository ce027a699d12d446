// The platform resolver of one sandbox: a DNS server on the sandbox's gateway address
// (172.31.255.1:53, inside its namespace) that answers only names the egress policy allows, by
// forwarding them to the upstream resolver, and admits the IPv4 addresses of each answer to the
// namespace's nftables set `dns_allow` (for the answer's TTL, at least 60 s) before the guest sees
// the answer. Names not allowed get REFUSED at once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vmm-driver/egress_log.h"
#include "vmm-driver/error.h"

namespace pandastack::vmm {

// Pure DNS helpers (tested on their own).
namespace dns {
// Is `packet` a plain query: QR 0, opcode QUERY, exactly one question, no answer or authority
// records (an EDNS OPT record is allowed)? Anything else (UPDATE, NOTIFY, a second question
// nobody checked) is refused, never forwarded from the host's address.
bool plain_query(const std::string& packet);
// The first question's name ("a.example.com", lowercase) of a query, or nullopt if malformed.
std::optional<std::string> question_name(const std::string& packet);
// (IPv4 address, TTL) of every A record in the answer section of a response.
std::vector<std::pair<std::string, uint32_t>> a_records(const std::string& packet);
// The query turned into a REFUSED response (same id and question, no answers).
std::string refused(const std::string& query);
// The first question's type ("A", "AAAA", "TXT", ... or its number), "" if malformed.
std::string question_type(const std::string& packet);
// Does `name` match a pattern ("example.com" exactly, "*.example.com" any name below it)?
bool allowed(const std::string& name, const std::vector<std::string>& patterns);
}  // namespace dns

// Per sandbox resolver: queries forwarded per second (and the burst allowed); past them, or past
// its distinct names (NetworkSettings::dns_max_names), a query is REFUSED (and logged as denied).
inline constexpr double kDnsQueriesPerSecond = 50;
inline constexpr double kDnsBurst = 200;

class DnsServer {
 public:
  // `allow_all`: every name is forwarded (and nothing is admitted: everything is allowed anyway).
  // Addresses in `reserved` but not in `reserved_allowed` (NetworkSettings) are never admitted:
  // an allowed name that resolves to a private address does not open it.
  // Every query, its answer or refusal goes to `log`.
  static Result<std::unique_ptr<DnsServer>> start(int netns_fd, const std::string& upstream,
                                                  bool allow_all, std::vector<std::string> domains,
                                                  std::shared_ptr<EgressLog> log, size_t max_names,
                                                  std::vector<std::string> reserved = {},
                                                  std::vector<std::string> reserved_allowed = {});
  ~DnsServer();
  // Changes what is answered (the policy changed).
  void update(bool allow_all, std::vector<std::string> domains);

 private:
  DnsServer() = default;
  void loop();
  int netns_fd_ = -1;
  int guest_fd_ = -1, upstream_fd_ = -1;
  int stop_[2] = {-1, -1};
  std::mutex mu_;
  bool allow_all_ = false;
  std::vector<std::string> domains_;
  std::vector<std::string> reserved_, reserved_allowed_;
  std::shared_ptr<EgressLog> log_;
  size_t max_names_ = 0;
  std::thread thread_;
};

}  // namespace pandastack::vmm
