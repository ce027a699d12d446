// The snapshot uploader: a detached actor (one thread for the host) that puts hibernations and
// named snapshots into the host's object store (storage/snapshot_chunks.h), one at a time, in the
// order asked, once their copy is on the data disk (issue 39). Spawned by the registry when
// --object-store is set.
//   upload_atom, sandbox id, snapshot id, copy (SandboxState::hibernation_persisted_at): uploads
//       Env::persisted_dir(sandbox); once the manifest is in the store, tells the registry
//       (uploaded_atom, sandbox id, snapshot id, copy, manifest),
//       which has the sandbox record it (`durable: "remote"`). A failure (the store unreachable,
//       full, refusing) is retried with a growing delay (5 s to 5 min) while the copy is there.
//   upsnap_atom, sandbox id, snapshot id: uploads the named snapshot's copy on the data disk
//       (Env::persisted_snapshot_dir); once its manifest is in the store, tells the registry
//       (snapup_atom, sandbox id, snapshot id, manifest), which has the sandbox record it. Retried
//       like a hibernation's while the copy is there.
//   upvol_atom, volume id, file version: uploads the volume's file (detached: read through a
//       hard link in a folder of its own, data_dir/volumes/.upload/<id>, synced first, with a
//       volume.json naming the volume and the version: its manifest is its own); once the
//       manifest is in the store, tells the registry (volup_atom, volume id, file version,
//       manifest), which has the volume record it if nothing changed its file meanwhile.
//   park_atom, sandbox or snapshot id, tenant, manifest, settings (JSON): cluster mode, the
//       sandbox recorded the upload: its Parked record goes to etcd (actors/parked.h), so that
//       another host can wake it (create from it) from the store once this host is gone.
//   forget_atom, manifest, sandbox or snapshot id: removes its parked record (if it names that
//       manifest), then that manifest from the store (the hibernation was woken or the sandbox
//       ended; the named snapshot was deleted); RuntimeConfig::object_store_gc_delay
//       later (one collection for every removal meanwhile) the chunks no manifest names go
//       (storage::collect_garbage: serial with the uploads here, so the store's prefix must be this
//       host's alone).
#pragma once

#include "actors/messages.h"

namespace pandastack::actors {

using upload_atom = caf::atom_constant<caf::atom("upload")>;
using uploaded_atom = caf::atom_constant<caf::atom("uploaded")>;
using forget_atom = caf::atom_constant<caf::atom("forgetman")>;
using objgc_atom = caf::atom_constant<caf::atom("objgc")>;
using park_atom = caf::atom_constant<caf::atom("park")>;
using upsnap_atom = caf::atom_constant<caf::atom("upsnap")>;
using snapup_atom = caf::atom_constant<caf::atom("snapup")>;
using upvol_atom = caf::atom_constant<caf::atom("upvol")>;
using volup_atom = caf::atom_constant<caf::atom("volup")>;

// Reads only Env::persisted_dir of a well-formed sandbox id, Env::persisted_snapshot_dir of a
// well-formed snapshot id and the volume file of a well-formed volume id; writes only the object
// store (and its hard link to a volume file).
caf::behavior snapshot_uploader(caf::event_based_actor* self, Env* env, caf::actor registry);

}  // namespace pandastack::actors
