// Recovery at start, before any actor runs: every sandbox stream is replayed (from its newest
// state snapshot), running sandboxes whose VM outlived the previous host process are re-adopted
// (VM and network, into Env::adopted), sandboxes whose VM is gone or that were caught
// mid-transition are recorded failed(host_restart), hibernated ones whose snapshot is gone
// failed(hibernation_snapshot_lost); then every VM, run folder, snapshot folder and network
// that no sandbox owns is removed.
#pragma once

#include <vector>

#include "actors/env.h"

namespace pandastack::actors {

struct Recovered {
  std::vector<SandboxState> sandboxes;
  size_t from_snapshots = 0, adopted = 0;
};

Reply<Recovered> recover(Env& env);

}  // namespace pandastack::actors
