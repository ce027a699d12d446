// Registry actor: owns the id space (sbx_ + 16 random base32 characters), spawns sandbox actors
// and routes to them after a tenant check (another tenant's id is sandbox_not_found), keeps a
// cache of every sandbox's info for get/list, runs the TTL reaper (a tick every
// reaper_interval), spawns template actors on first use, creates fork children, and drives the
// graceful shutdown. When it ends, every sandbox actor ends with it. It also spawns the volume
// actors and attaches volumes to the sandboxes created with them (registry_volumes.cc), and
// detaches them when those sandboxes end.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "actors/messages.h"

namespace pandastack::actors {

struct RegistryState {
  Env* env = nullptr;
  std::map<std::string, caf::actor> templates;  // template actors, spawned on first use
  std::map<std::string, caf::actor> actors;
  std::map<std::string, SandboxInfo> infos;
  // Sandboxes that ended (their actors retired, or they ended before this process started):
  // their state answers for them, and their actor is spawned again when a command must record
  // something (deleting one of their snapshots).
  std::map<std::string, SandboxState> ended;
  // Volumes: an actor per volume not deleted, and every volume's info (deleted ones too, until
  // the next start) for get and list.
  std::map<std::string, caf::actor> volume_actors;
  std::map<std::string, VolumeInfo> volumes;
};

using RegistrySelf = caf::stateful_actor<RegistryState>;

caf::behavior registry_actor(RegistrySelf* self, Env* env);

}  // namespace pandastack::actors

namespace pandastack::actors {

// The registry's volume handling (registry_volumes.cc), called from its behavior.
namespace registry_volumes {
// Admission against the tenant's volume quotas: `volumes` more volumes (1 for a create, 0 for a
// grow) and `size_mib` more MiB.
std::optional<Rejection> admit(RegistrySelf* self, const std::string& tenant, uint64_t size_mib,
                               uint32_t volumes = 1);
// Records a volume whose file is made (`id`): spawns its actor, which records volume-created.
caf::result<Answer> create(RegistrySelf* self, std::string id, VolumeRequest req);
// A command for the tenant's volume `id` (another tenant's is volume_not_found).
caf::result<Answer> route(RegistrySelf* self, const std::string& tenant, const std::string& id,
                          VolumeCommand c);
Answer list(RegistrySelf* self, const std::string& tenant,
            const std::map<std::string, std::string>& metadata);
// A recovered volume; attachments to sandboxes that are not live any more are detached.
void adopt(RegistrySelf* self, VolumeState s);
void info(RegistrySelf* self, VolumeInfo i);
// Attaches `wanted` to sandbox `sandbox` (all or none; slots in order): `then` gets the
// sandbox's volumes, or why not (volume_not_found, volume_in_use, invalid_argument).
using Attached = std::variant<std::vector<SandboxVolume>, Rejection>;
void attach(RegistrySelf* self, const std::string& tenant, const std::string& sandbox,
            const std::vector<CreateRequest::Volume>& wanted, std::function<void(Attached)> then);
// Detaches the sandbox from its volumes (idempotent); `then` runs once every detach is recorded.
void detach(RegistrySelf* self, const std::string& sandbox,
            const std::vector<SandboxVolume>& volumes, const std::string& reason,
            std::function<void()> then = {});
}  // namespace registry_volumes

}  // namespace pandastack::actors
