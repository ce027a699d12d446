// Database actor: one per managed database (`db_...`). Its commands (created, credentials
// rotated, hibernated, woken, deleted) are decided purely (database.h), their events appended to
// the database's own stream (synced), applied, and reported to the registry. The work they record
// (the sandbox, the role's password, hibernate, wake, kill) is the runtime's, done before the
// command is sent (runtime_databases.cc). A deleted database's actor ends.
#pragma once

#include <deque>
#include <utility>

#include "actors/database.h"
#include "actors/messages.h"

namespace pandastack::actors {

struct DatabaseActorState {
  Env* env = nullptr;
  caf::actor registry;
  DatabaseState s;
  bool persisting = false;
  std::deque<std::pair<DatabaseCommand, caf::response_promise>> queue;
  caf::response_promise current_rp;
  std::vector<DatabaseEvent> pending;
};

using DatabaseSelf = caf::stateful_actor<DatabaseActorState>;

caf::behavior database_actor(DatabaseSelf* self, Env* env, caf::actor registry,
                             DatabaseState initial);

}  // namespace pandastack::actors
