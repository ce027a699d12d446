// Recovery at start, before any actor runs: every sandbox stream is replayed (from its newest
// state snapshot) but those of retired sandboxes; running sandboxes whose VM outlived the previous
// host process are listed for adoption (their actors take the VM and its network over once the API
// is up: a restart does not wait for VMs); sandboxes whose VM is gone or that were caught
// mid-transition are recorded failed(host_restart), hibernated ones whose snapshot is gone
// failed(hibernation_snapshot_lost); then every other VM is killed by its record (no QMP), and
// every run folder, snapshot folder, hibernation and network that no sandbox owns is removed.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/database.h"
#include "actors/env.h"
#include "actors/volume.h"

namespace pandastack::actors {

struct Recovered {
  std::vector<SandboxState> sandboxes;
  std::vector<DatabaseState> databases;
  size_t from_snapshots = 0;
  size_t retired = 0;  // streams skipped: retired sandboxes (RuntimeConfig::ended_retention)
  // Hibernations whose tmpfs copy was gone (a reboot), brought back from the data disk.
  size_t hibernations_restored = 0;
  size_t snapshots_restored = 0;  // named snapshots likewise
  // Running sandboxes whose VM may still run: their actors adopt it (run folder by sandbox id).
  std::map<std::string, std::filesystem::path> to_adopt;
  // Every volume (deleted ones too); files no volume names are removed, and a file a crash left
  // smaller than its record is grown.
  std::vector<VolumeState> volumes;
  // Copies recovery found unusable and removed from the object store, as (sandbox or snapshot id,
  // manifest): in cluster mode their parked records go too once the host joins
  // (Runtime::join_cluster), so no other host tries to wake or create from them.
  std::vector<std::pair<std::string, std::string>> dropped_manifests;
};

Reply<Recovered> recover(Env& env);

}  // namespace pandastack::actors
