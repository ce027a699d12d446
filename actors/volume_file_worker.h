// The volume file worker: a detached actor (its own thread) that copies and removes volume files
// for the registry, whose own thread must never block on a disk. A fork's children and creates
// from snapshots get their volumes as copies of a snapshot's (vmm::clone_file: a reflink, or a
// sparse copy of the data).
//   volclone_atom, {from, to, from, to, ...}, move -> std::string ("" = every copy made; else
//       why not, and none of them is left). `move`: the sources are not needed afterwards, so
//       they are renamed where they can be (one file system) instead of copied.
//   volremove_atom, {file, ...}: removes them (missing ones are fine)
#pragma once

#include "actors/messages.h"

namespace pandastack::actors {

// Writes only below `env`'s volumes folder (a copy's target, a removal): nothing else, whatever
// it is asked.
caf::behavior volume_file_worker(caf::event_based_actor* self, Env* env);

}  // namespace pandastack::actors
