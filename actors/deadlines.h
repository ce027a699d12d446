// How long one actor waits for another's answer, by kind of request: no request inside the
// runtime waits forever (issue 32), so a reply that is lost (an actor that died, an effect that
// hangs) becomes an error with a name instead of a caller that waits for ever and a promise that
// is never freed. They nest inside the runtime's own deadline for a call (Runtime::Impl::ask,
// kApiCall): an outer wait is longer than the waits inside it. The VMM driver bounds each of its
// steps with deadlines of its own (boot, QMP, agent calls); these are the backstops above them.
// Internal to actors/*.cc (includes CAF).
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <string>

#include "actors/sandbox.h"

namespace pandastack::actors::deadline {

struct Deadline {
  const char* what;  // who did not answer, for the error's message
  std::chrono::seconds limit;
};

// A caller of the runtime (REST, RPC, E2B, a peer): the whole call.
inline constexpr Deadline kApiCall{"the runtime", std::chrono::seconds(300)};
// A database command through its actor (create: its sandbox made and Postgres answering).
inline constexpr Deadline kDatabaseCommand{"the database's actor", std::chrono::seconds(290)};
// A sandbox command through its actor: create, fork (its children made), snapshot, hibernate,
// wake, kill; and the registry's fork of a parent's children.
inline constexpr Deadline kSandboxCommand{"the sandbox's actor", std::chrono::seconds(280)};
// A volume command through its actor (create, attach, detach, snapshot, grow, delete).
inline constexpr Deadline kVolumeCommand{"the volume's actor", std::chrono::seconds(280)};
// The effects a sandbox's VM worker runs: restore, snapshot, hibernate, adoption, egress.
inline constexpr Deadline kVmEffect{"the VM worker", std::chrono::seconds(240)};
// A template's bake (boot, settle, snapshot), shared by the creates that wait for it.
inline constexpr Deadline kBake{"the template's bake", std::chrono::seconds(240)};
// Copies of volume files (forks and snapshots of sandboxes with volumes, volume snapshots).
inline constexpr Deadline kVolumeCopy{"the volume file worker", std::chrono::seconds(240)};
// Questions answered from memory or /proc (how a VM died, its processes, a template's actor).
inline constexpr Deadline kQuery{"a query", std::chrono::seconds(30)};

// What a caller reports when its request failed: `d` passed (timeout, naming who and how long),
// or the other actor failed otherwise (internal).
inline Rejection missed(const caf::error& e, const Deadline& d, caf::actor_system& sys) {
  if (e == caf::sec::request_timeout)
    return {Code::timeout, std::string(d.what) + " did not answer within " +
                               std::to_string(d.limit.count()) + " s"};
  return {Code::internal, std::string(d.what) + ": " + sys.render(e)};
}

}  // namespace pandastack::actors::deadline
