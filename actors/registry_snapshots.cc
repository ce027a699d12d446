// The registry's part in durable named snapshots: it owns the host's snapshot persister and
// routes what it made to the sandbox that records it.
#include "actors/registry.h"
#include "actors/snapshot_persister.h"

namespace pandastack::actors::registry_snapshots {

namespace {
caf::actor persister(RegistrySelf* self) {
  auto& p = self->state.persister;
  if (!p)
    p = self->spawn<caf::detached + caf::linked>(snapshot_persister, self->state.env,
                                                 caf::actor_cast<caf::actor>(self));
  return p;
}
}  // namespace

void persist(RegistrySelf* self, const std::string& sandbox, const std::string& snap) {
  caf::anon_send(persister(self), persist_atom::value, sandbox, snap);
}

void persist_missing(RegistrySelf* self, const SandboxState& s) {
  for (auto& snap : s.snapshots)
    if (!s.durable_snapshots.count(snap)) persist(self, s.id, snap);
}

void unpersist(RegistrySelf* self, const std::string& snap) {
  caf::anon_send(persister(self), unpersist_atom::value, snap);
}

void persisted(RegistrySelf* self, const std::string& sandbox, const std::string& snap) {
  auto actor = actor_to_record(self, sandbox);
  if (!actor) return unpersist(self, snap);
  caf::anon_send(actor, cmd_atom::value, Command{cmd::SnapshotPersisted{snap}});
}

}  // namespace pandastack::actors::registry_snapshots
