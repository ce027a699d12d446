// Registry actor: owns the id space (sbx_ + 16 random base32 characters), spawns sandbox actors
// and routes to them after a tenant check (another tenant's id is sandbox_not_found), keeps a
// cache of every sandbox's info for get/list, runs the TTL reaper (a tick every
// reaper_interval), spawns template actors on first use, creates fork children, and drives the
// graceful shutdown. When it ends, every sandbox actor ends with it.
#pragma once

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
};

using RegistrySelf = caf::stateful_actor<RegistryState>;

caf::behavior registry_actor(RegistrySelf* self, Env* env);

}  // namespace pandastack::actors
