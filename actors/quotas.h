// Per-tenant quotas: how much of the host one tenant may hold at once. Defaults come from the
// daemon's flags; an admin can set a tenant's own (persisted). Exceeding one is refused before
// anything starts (429 quota_exceeded, naming the quota, its limit and the current use).
//
// Use is computed from the registry's records of the tenant's sandboxes (a single actor, so two
// creates cannot both take the last slot); a snapshot's and a hibernated sandbox's bytes are
// counted at the guest memory size (their RAM file; disk layers are not counted).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/sandbox.h"

namespace pandastack::wire {
class Json;
}

namespace pandastack::actors {

struct Quotas {
  uint32_t sandboxes = 50;             // live (starting, running, changing; not hibernated)
  uint64_t memory_mib = 32768;         // guest memory of the live ones
  uint32_t snapshots = 100;            // named snapshots
  uint64_t snapshot_mib = 65536;       // their RAM
  uint32_t hibernated = 50;            // hibernated sandboxes, plus live persistent ones (each
                                       // hibernates when it expires)
  uint64_t hibernated_mib = 32768;     // their RAM
  uint32_t ports = 64;                 // exposed guest ports, all sandboxes together
  uint32_t execs = 32;                 // commands and output streams running at once, all
                                       // sandboxes together (each holds a gateway worker: one
                                       // tenant holds at most half of REST's 64)
  uint32_t requests_per_second = 500;  // per API key (a token bucket; bursts of twice this)
  uint32_t volumes = 100;              // volumes (not deleted)
  uint64_t volume_mib = 262144;        // their sizes together (disk, not RAM): 256 GiB

  bool operator==(const Quotas&) const = default;
};

// One tenant's current use, in the units of Quotas.
struct QuotaUse {
  uint32_t sandboxes = 0;
  uint64_t memory_mib = 0;
  uint32_t snapshots = 0;
  uint64_t snapshot_mib = 0;
  uint32_t hibernated = 0;
  uint64_t hibernated_mib = 0;
  uint32_t ports = 0;
  uint32_t execs = 0;
  uint32_t volumes = 0;
  uint64_t volume_mib = 0;
  uint32_t templates = 0;  // custom templates (built, building or failed): --quota-templates
};

// "quota 'sandboxes' exceeded: limit 5, in use 5, asked 1" (quota_exceeded). The gateway turns
// the message's numbers into fields of the error body.
Rejection quota_exceeded(const std::string& name, uint64_t limit, uint64_t used, uint64_t asked);

// What a request asks for on top of a use, in the same units (execs are counted apart).
using QuotaAsk = QuotaUse;
// The first quota `ask` would exceed, if any.
std::optional<Rejection> check_quotas(const Quotas& q, const QuotaUse& use, const QuotaAsk& ask);

// JSON (the API and the store): every field; from_json takes any subset over `base` and refuses
// unknown fields, wrong types and zeroes (a quota of 0 would refuse everything: say so instead
// by revoking the tenant's keys).
wire::Json quotas_json(const Quotas& q);
wire::Json use_json(const QuotaUse& u);
std::variant<Quotas, Rejection> quotas_from_json(const wire::Json& j, Quotas base);

}  // namespace pandastack::actors
