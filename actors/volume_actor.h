// Volume actor: one per volume. Commands (create, attach, detach, resize, metadata, delete,
// snapshot, delete snapshot) are decided purely (volume.h), their events appended to the volume's
// stream `vol_...` (synced: every one is acknowledged to someone), applied, and only then is the
// file touched: removed after volume-deleted (with its snapshots), grown after volume-resized. A
// snapshot is the exception: its copy is made first (by the volume file worker, while the
// actor's queue waits, so no attach can come between), then volume-snapshotted is recorded.
// Every change is reported to the registry (its cache answers get and list). A deleted volume's
// actor ends. With an object store, a volume left detached with a file no copy in the store is of
// (made, detached, grown, or found so at start) is uploaded (actors/snapshot_uploader.h) and the
// copy recorded with volume-uploaded if nothing changed the file meanwhile; a copy replaced,
// deleted or moved away leaves the store.
#pragma once

#include <deque>
#include <utility>

#include "actors/messages.h"
#include "actors/volume.h"

namespace pandastack::actors {

struct VolumeActorState {
  Env* env = nullptr;
  caf::actor registry;
  caf::actor files;  // the volume file worker
  VolumeState s;
  bool persisting = false;
  std::deque<std::pair<VolumeCommand, caf::response_promise>> queue;
  caf::response_promise current_rp;
  std::vector<VolumeEvent> pending;
  // The file version its last upload was asked for (VolumeState::file_version; none: ~0).
  uint64_t upload_asked = ~uint64_t(0);
};

using VolumeSelf = caf::stateful_actor<VolumeActorState>;

caf::behavior volume_actor(VolumeSelf* self, Env* env, caf::actor registry, caf::actor files,
                           VolumeState initial);

// The info the API shows for `s`.
VolumeInfo volume_info_of(const VolumeState& s);

}  // namespace pandastack::actors
