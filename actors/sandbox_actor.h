// Sandbox actor: one per sandbox. Commands queue; one at a time is decided (sandbox.h), its
// events appended to the sandbox's stream with the expected version (append_async: no CAF
// worker blocks on fsync), applied, and only then are effects started (on the sandbox's VM
// worker) and replies given. Transitions answer when they end; execs get a lease on the VM
// once exec-started is recorded.
//   cmd_atom, Command -> Answer         exec_atom, command line -> Answer{vm lease, exec id}
//   lease_atom -> Answer{vm lease}      get_atom -> Answer{info}
#pragma once

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "actors/messages.h"

namespace pandastack::actors {

struct SandboxActorState {
  Env* env = nullptr;
  caf::actor registry, worker;
  SandboxState s;
  bool persisting = false;
  std::deque<std::pair<Command, caf::response_promise>> queue;
  Command current;
  caf::response_promise current_rp;
  // Callers waiting for the end of a transition, and which: each gets an answer by how it ended
  // (a failed snapshot, fork, hibernate or wake is an error to its caller, never a success).
  enum class Awaits { create, snapshot, fork, hibernate, wake };
  std::vector<std::pair<Awaits, caf::response_promise>> waiting;
  std::string transition_failure;  // why the last transition failed ("" = it did not)
  std::vector<std::pair<Command, caf::response_promise>> after_wake;  // execs that woke the sandbox
  std::vector<caf::response_promise> leases_after_wake;  // agent operations that woke it
  std::shared_ptr<VmHandle> handle = std::make_shared<VmHandle>();
  std::vector<SandboxInfo> fork_children;
  std::vector<Event> pending_events;  // being persisted
  uint64_t exec_seq = 0;
  uint64_t snapshot_version = 0;  // version of the newest state snapshot stored
  // The idle timeout: the last command, lease or start (agent calls report to the handle).
  int64_t last_active_ms = 0;
  bool idle_checking = false;
  // The previous resource sample (actors/metrics.h): CPU time is reported as its change.
  int64_t sampled_ms = 0;
  uint64_t sampled_cpu_usec = 0;
  int sampled_pid = -1;  // asking the worker whether background processes run
  // The VM died on its own while a transition ran: failed once the transition ends.
  bool vm_dead = false;
  bool vm_dead_reported = false;  // asking the worker why (once)
  bool adopting = false;          // taking over the VM after a restart: commands wait
  bool retired = false;           // ended and gone (see maybe_retire)
  // A fork's snapshot and children are being made: a sandbox killed meanwhile stays until they
  // are (its children are killed then, its fork snapshot dropped), never leaving them unknown.
  bool fork_in_flight = false;
  // The VM is being destroyed (a kill, a failure, a move): the callers of the kill hear of it,
  // and the registry lets the volumes go, only once it is gone (its last writes reached them).
  bool releasing = false;
  std::vector<caf::response_promise> after_release;
};

using SandboxSelf = caf::stateful_actor<SandboxActorState>;

// `adopt_dir`: a recovered running sandbox whose VM outlived the previous host process (its run
// folder): the actor adopts it first; commands wait meanwhile (at most the adoption's deadline).
caf::behavior sandbox_actor(SandboxSelf* self, Env* env, caf::actor registry, SandboxState initial,
                            std::string adopt_dir);

}  // namespace pandastack::actors
