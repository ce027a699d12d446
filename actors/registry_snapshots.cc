// The registry's part in durable named snapshots, hibernations and volume copies: it owns the
// host's snapshot persister and uploader, and routes what they made to the sandbox (or volume)
// that records it.
#include "actors/env.h"
#include "actors/parked.h"
#include "actors/registry.h"
#include "actors/snapshot_persister.h"
#include "actors/snapshot_uploader.h"

namespace pandastack::actors::registry_snapshots {

namespace {
caf::actor persister(RegistrySelf* self) {
  auto& p = self->state.persister;
  if (!p)
    p = self->spawn<caf::detached + caf::linked>(snapshot_persister, self->state.env,
                                                 caf::actor_cast<caf::actor>(self));
  return p;
}

caf::actor uploader(RegistrySelf* self) {
  auto& u = self->state.uploader;
  if (!u)
    u = self->spawn<caf::detached + caf::linked>(snapshot_uploader, self->state.env,
                                                 caf::actor_cast<caf::actor>(self));
  return u;
}
}  // namespace

void persist(RegistrySelf* self, const std::string& sandbox, const std::string& snap) {
  caf::anon_send(persister(self), persist_atom::value, sandbox, snap);
}

void persist_missing(RegistrySelf* self, const SandboxState& s) {
  for (auto& snap : s.snapshots)
    if (!s.durable_snapshots.count(snap))
      persist(self, s.id, snap);
    else if (!s.snapshot_manifests.count(snap))
      upload_snapshot(self, s.id, snap);
}

void unpersist(RegistrySelf* self, const std::string& snap) {
  caf::anon_send(persister(self), unpersist_atom::value, snap);
}

void persisted(RegistrySelf* self, const std::string& sandbox, const std::string& snap) {
  auto actor = actor_to_record(self, sandbox);
  if (!actor) return unpersist(self, snap);
  caf::anon_send(actor, cmd_atom::value, Command{cmd::SnapshotPersisted{snap}});
}

void upload(RegistrySelf* self, const std::string& sandbox, const std::string& snap, uint64_t at) {
  if (!self->state.env->object_store) return;
  caf::anon_send(uploader(self), upload_atom::value, sandbox, snap, at);
}

void uploaded(RegistrySelf* self, const std::string& sandbox, const std::string& snap, uint64_t at,
              const std::string& manifest) {
  auto actor = actor_to_record(self, sandbox);
  if (!actor) return forget(self, manifest, sandbox);
  // A sandbox no longer in that copy records nothing: the manifest goes again.
  self->request(actor, std::chrono::seconds(60), cmd_atom::value,
                Command{cmd::HibernationUploaded{snap, manifest, at}})
      .then(
          [self, manifest, sandbox](const Answer& a) {
            if (!a.ok || !a.info.hibernation_remote) return forget(self, manifest, sandbox);
            if (self->state.env->cluster() && !unparkable(a.info))
              caf::anon_send(uploader(self), park_atom::value, sandbox, a.info.tenant, manifest,
                             parked_settings(a.info).dump());
          },
          [](const caf::error&) {});  // (unknown: kept; the wake or kill removes it if recorded)
}

void park_snapshot(RegistrySelf* self, const SandboxInfo& taken_by, const std::string& snap) {
  auto m = taken_by.snapshot_manifests.find(snap);
  if (!self->state.env->cluster() || m == taken_by.snapshot_manifests.end()) return;
  if (!taken_by.volumes.empty()) return;  // (its copies of them are not parkable: not in etcd)
  caf::anon_send(uploader(self), park_atom::value, snap, taken_by.tenant, m->second,
                 parked_settings(taken_by).dump());
}

void upload_snapshot(RegistrySelf* self, const std::string& sandbox, const std::string& snap) {
  if (!self->state.env->object_store) return;
  caf::anon_send(uploader(self), upsnap_atom::value, sandbox, snap);
}

void snapshot_uploaded(RegistrySelf* self, const std::string& sandbox, const std::string& snap,
                       const std::string& manifest) {
  auto actor = actor_to_record(self, sandbox);
  if (!actor) return forget(self, manifest, snap);
  self->request(actor, std::chrono::seconds(60), cmd_atom::value,
                Command{cmd::SnapshotUploaded{snap, manifest}})
      .then(
          [self, manifest, snap](const Answer& a) {
            auto m = a.info.snapshot_manifests.find(snap);
            if (!a.ok || m == a.info.snapshot_manifests.end() || m->second != manifest)
              return forget(self, manifest, snap);  // (deleted meanwhile: not recorded)
            park_snapshot(self, a.info, snap);
          },
          [](const caf::error&) {});  // (unknown: kept; deleting the snapshot removes it)
}

void upload_volume(RegistrySelf* self, const std::string& volume, uint64_t file_version) {
  if (!self->state.env->object_store) return;
  caf::anon_send(uploader(self), upvol_atom::value, volume, file_version);
}

void volume_uploaded(RegistrySelf* self, const std::string& volume, uint64_t file_version,
                     const std::string& manifest) {
  auto a = self->state.volume_actors.find(volume);
  if (a == self->state.volume_actors.end()) return forget(self, manifest, "");  // (deleted)
  self->request(a->second, std::chrono::seconds(60), vol_atom::value,
                VolumeCommand{vcmd::Uploaded{manifest, file_version}})
      .then(
          [self, manifest](const Answer& ans) {
            if (!ans.ok || !ans.volume.stored || ans.volume.manifest != manifest)
              forget(self, manifest, "");  // (its file changed meanwhile: not recorded)
          },
          [](const caf::error&) {});  // (unknown: kept; its next copy or its deletion removes it)
}

void forget(RegistrySelf* self, const std::string& manifest, const std::string& sandbox) {
  if (!self->state.env->object_store) return;
  caf::anon_send(uploader(self), forget_atom::value, manifest, sandbox);
}

caf::message_handler handlers(RegistrySelf* self) {
  return {
      [=](persist_atom, std::string sandbox, std::string snap) { persist(self, sandbox, snap); },
      [=](unpersist_atom, std::string snap) { unpersist(self, snap); },
      [=](snapsaved_atom, std::string sandbox, std::string snap) {
        persisted(self, sandbox, snap);
      },
      [=](upload_atom, std::string sandbox, std::string snap, uint64_t at) {
        upload(self, sandbox, snap, at);
      },
      [=](uploaded_atom, std::string sandbox, std::string snap, uint64_t at, std::string manifest) {
        uploaded(self, sandbox, snap, at, manifest);
      },
      [=](forget_atom, std::string manifest, std::string sandbox) {
        forget(self, manifest, sandbox);
      },
      [=](upsnap_atom, std::string sandbox, std::string snap) {
        upload_snapshot(self, sandbox, snap);
      },
      [=](snapup_atom, std::string sandbox, std::string snap, std::string manifest) {
        snapshot_uploaded(self, sandbox, snap, manifest);
      },
      [=](upvol_atom, std::string volume, uint64_t file_version) {
        upload_volume(self, volume, file_version);
      },
      [=](volup_atom, std::string volume, uint64_t file_version, std::string manifest) {
        volume_uploaded(self, volume, file_version, manifest);
      },
  };
}

}  // namespace pandastack::actors::registry_snapshots
