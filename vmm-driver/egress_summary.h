// What one sandbox reached over a period, in numbers: the egress log (egress_log.h) summed up
// for the audit log (an `egress_summary` event of the sandbox, actors/sandbox.h). Plain data: the
// log fills it, the sandbox's events carry it, its codec persists it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pandastack::vmm {

// Requests of one kind (DNS queries, connections, requests that carried a secret's placeholder):
// how many went out and how many were refused.
struct EgressCount {
  uint32_t allowed = 0, denied = 0;
  bool operator==(const EgressCount&) const = default;
};

// A name (or an address, when no answer of the sandbox's resolver named it) and its requests of
// every kind.
struct EgressDestination {
  std::string name;
  EgressCount requests;
  bool operator==(const EgressDestination&) const = default;
};

struct EgressSummary {
  static constexpr size_t kMaxDestinations = 16;  // the most used; the rest are only counted
  int64_t from_ms = 0, to_ms = 0;                 // the period (wall clock)
  EgressCount dns, connections, secret_requests;
  uint64_t bytes_out = 0, bytes_in = 0;         // of the connections that ended in the period
  std::vector<EgressDestination> destinations;  // most requests first
  // Destinations beyond the list (past the log's bound of names tracked per period, each
  // request to a further name counts as one).
  uint32_t other_destinations = 0;
  bool empty() const {
    return dns == EgressCount{} && connections == EgressCount{} &&
           secret_requests == EgressCount{} && bytes_out == 0 && bytes_in == 0;
  }
  bool operator==(const EgressSummary&) const = default;
};

}  // namespace pandastack::vmm
