// The registry's managed databases: an actor per database, a cache of their states for get and
// list, routing with the tenant check, recovery's adoption.
#include "actors/database_actor.h"
#include "actors/deadlines.h"
#include "actors/registry.h"

namespace pandastack::actors::registry_databases {

namespace {

Rejection database_not_found(const std::string& id) {
  return {Code::database_not_found, "no database " + id};
}

caf::actor spawn_database(RegistrySelf* self, const DatabaseState& s) {
  // Ended by the registry's shutdown (registry_databases::shutdown).
  auto a = self->spawn(database_actor, self->state.env, caf::actor_cast<caf::actor>(self), s);
  self->state.database_actors[s.id] = a;
  return a;
}

}  // namespace

caf::result<Answer> command(RegistrySelf* self, const std::string& tenant, const std::string& id,
                            DatabaseCommand c) {
  caf::actor a;
  bool creating = std::holds_alternative<dbcmd::Create>(c);
  if (creating) {
    if (self->state.databases.count(id))
      return Answer::fail({Code::invalid_state, "database " + id + " exists"});
    DatabaseState s;
    s.id = id;
    s.tenant = tenant;
    a = spawn_database(self, s);
    self->state.databases[id] = s;
  } else {
    auto i = self->state.databases.find(id);
    auto f = self->state.database_actors.find(id);
    if (i == self->state.databases.end() || i->second.tenant != tenant ||
        f == self->state.database_actors.end())
      return Answer::fail(database_not_found(id));
    a = f->second;
  }
  auto rp = self->make_response_promise();
  self->request(a, deadline::kDatabaseCommand.limit, db_atom::value, std::move(c))
      .then(
          [self, rp, id, creating, a](Answer ans) mutable {
            if (creating && !ans.ok) {
              self->state.databases.erase(id);
              self->state.database_actors.erase(id);
              self->send_exit(a, caf::exit_reason::user_shutdown);
            } else if (ans.ok) {
              self->state.databases[id] = ans.database;
            }
            rp.deliver(ans);
          },
          [self, rp, id](const caf::error& e) mutable {
            if (e == caf::sec::request_receiver_down)
              return rp.deliver(Answer::fail(database_not_found(id)));
            rp.deliver(
                Answer::fail(deadline::missed(e, deadline::kDatabaseCommand, self->system())));
          });
  return rp;
}

Answer list(RegistrySelf* self, const std::string& tenant, bool deleted_too) {
  Answer a;
  for (auto& [id, s] : self->state.databases) {
    if (s.tenant != tenant || s.status == DatabaseStatus::none) continue;
    if (s.status == DatabaseStatus::deleted && !deleted_too) continue;
    a.databases.push_back(s);
  }
  return a;
}

void adopt(RegistrySelf* self, const DatabaseState& s) {
  self->state.databases[s.id] = s;
  if (s.status == DatabaseStatus::running || s.status == DatabaseStatus::hibernated)
    spawn_database(self, s);
}

void shutdown(RegistrySelf* self) {
  for (auto& [id, a] : self->state.database_actors)
    self->send_exit(a, caf::exit_reason::user_shutdown);
  self->state.database_actors.clear();
}

void info(RegistrySelf* self, const DatabaseState& s) {
  if (s.status == DatabaseStatus::deleted) self->state.database_actors.erase(s.id);
  self->state.databases[s.id] = s;
}

}  // namespace pandastack::actors::registry_databases
