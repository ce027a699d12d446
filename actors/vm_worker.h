// VM worker: a detached actor (its own thread) per sandbox, owning the sandbox's vmm::Vm through
// its VmHandle. Every request blocks (restore, snapshot, hibernate, destroy, egress changes), so
// none of it runs on CAF's shared threads; the sandbox actor asks and gets a WorkerResult.
//   restore_atom, snapshot dir, consume, pooled, NetSpec -> WorkerResult (the subnet it got)
//   snapshot_atom, dir, all_volumes / hibernate_atom, dir, keep_memory / destroy_atom /
//   egress_atom, Egress -> WorkerResult (a disk-only snapshot is restored by booting on its disk)
//   drop_atom, dir: removes a snapshot folder nobody names any more
#pragma once

#include <memory>
#include <string>

#include "actors/messages.h"

namespace pandastack::actors {

struct WorkerState {
  Env* env = nullptr;
  std::string id, template_name;
  std::shared_ptr<VmHandle> handle;
  caf::actor_addr owner;  // the sandbox actor: told (vm_exited_atom) when its VM dies
};

caf::behavior vm_worker(caf::stateful_actor<WorkerState>* self, Env* env, std::string id,
                        std::string template_name, std::shared_ptr<VmHandle> handle,
                        caf::actor_addr owner);

// Installs `vm` as the handle's VM: a new incarnation (VmHandle::generation), watched by the
// runtime's VM watcher, which tells `owner` (vm_exited_atom, generation) if it dies on its own.
void install_vm(Env& env, VmHandle& handle, std::unique_ptr<vmm::Vm> vm, caf::actor_addr owner,
                const std::string& id);
// Stops watching the handle's VM: before it is stopped on purpose (hibernate, kill).
void unwatch_vm(Env& env, VmHandle& handle);

}  // namespace pandastack::actors
