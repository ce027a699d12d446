#include "actors/database_actor.h"

#include "actors/database_codec.h"
#include "actors/event_codec.h"

namespace pandastack::actors {

namespace {

Answer database_answer(const DatabaseState& s) {
  Answer a;
  a.database = s;
  return a;
}

void pump(DatabaseSelf* self) {
  auto& st = self->state;
  while (!st.persisting && !st.queue.empty()) {
    auto [c, rp] = std::move(st.queue.front());
    st.queue.pop_front();
    auto d = decide(st.s, c, now_ms(), st.env->config.limits);
    if (auto* r = std::get_if<Rejection>(&d)) {
      rp.deliver(Answer::fail(*r));
      continue;
    }
    auto events = std::get<std::vector<DatabaseEvent>>(d);
    if (events.empty()) {
      rp.deliver(database_answer(st.s));
      continue;
    }
    st.persisting = true;
    st.current_rp = rp;
    st.pending = events;
    std::vector<storage::NewEvent> ne;
    for (auto& e : events)
      ne.push_back({to_string(e.kind), event_format(), encode_database_event(e)});
    append_and_report(*st.env, st.s.id, st.s.version, std::move(ne),
                      caf::actor_cast<caf::actor>(self));
  }
}

}  // namespace

caf::behavior database_actor(DatabaseSelf* self, Env* env, caf::actor registry,
                             DatabaseState initial) {
  auto& st = self->state;
  st.env = env;
  st.registry = registry;
  st.s = std::move(initial);
  log_exceptions(self, "database " + st.s.id);
  return {
      [=](db_atom, DatabaseCommand c) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        self->state.queue.emplace_back(std::move(c), rp);
        pump(self);
        return rp;
      },
      [=](persisted_atom, bool ok, Code code, std::string err) {
        auto& st = self->state;
        st.persisting = false;
        auto rp = st.current_rp;
        auto events = std::move(st.pending);
        st.pending.clear();
        if (!ok) {
          spdlog::error("database {}: events not persisted: {}", st.s.id, err);
          rp.deliver(Answer::fail({code, err}));
        } else {
          for (auto& e : events) st.s = apply(st.s, e);
          rp.deliver(database_answer(st.s));
          self->send(st.registry, dbinfo_atom::value, st.s);
        }
        pump(self);
        if (st.s.status == DatabaseStatus::deleted && st.queue.empty() && !st.persisting)
          self->quit();
      },
  };
}

}  // namespace pandastack::actors
