// The snapshot persister: a detached actor (one thread for the host) that copies named snapshots
// from tmpfs onto the data disk and syncs them (vmm::persist_snapshot), so that a host reboot,
// which empties tmpfs, loses none. A snapshot is answered once it is on tmpfs (the fast path);
// its copy follows in the background, one at a time, in the order asked.
//   persist_atom, sandbox id, snapshot id: copies Env::snapshot_dir(snapshot) to
//       Env::persisted_snapshot_dir(snapshot); once synced, tells the registry
//       (snapsaved_atom, sandbox id, snapshot id), which records it in the sandbox's events.
//   unpersist_atom, snapshot id: removes that copy (the snapshot was deleted). Asked after the
//       persist of the same snapshot, it runs after it: no copy outlives its snapshot.
#pragma once

#include "actors/messages.h"

namespace pandastack::actors {

// Reads and writes only the two folders Env names for a snapshot id (ids are checked: a
// `snap_` id of [a-z0-9], nothing that walks out of them).
caf::behavior snapshot_persister(caf::event_based_actor* self, Env* env, caf::actor registry);

}  // namespace pandastack::actors
