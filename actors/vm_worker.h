// VM worker: a detached actor (its own thread) per sandbox, owning the sandbox's vmm::Vm through
// its VmHandle. Every request blocks (restore, snapshot, hibernate, destroy, egress changes), so
// none of it runs on CAF's shared threads; the sandbox actor asks and gets a WorkerResult.
//   restore_atom, snapshot dir, consume, pooled, NetSpec -> WorkerResult (the subnet it got)
//   snapshot_atom, dir / hibernate_atom, dir / destroy_atom / egress_atom, Egress -> WorkerResult
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
};

caf::behavior vm_worker(caf::stateful_actor<WorkerState>* self, Env* env, std::string id,
                        std::string template_name, std::shared_ptr<VmHandle> handle);

}  // namespace pandastack::actors
