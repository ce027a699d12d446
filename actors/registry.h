// Registry actor: owns the id space (sbx_ + 16 random base32 characters), spawns sandbox actors
// and routes to them after a tenant check (another tenant's id is sandbox_not_found), keeps a
// cache of every sandbox's info for get/list, runs the TTL reaper (a tick every
// reaper_interval) and retires ended sandboxes (RuntimeConfig::ended_retention), spawns template
// actors on first use, creates fork children, and drives the graceful shutdown. When it ends, every
// sandbox actor ends with it. It also spawns the volume actors and attaches volumes to the
// sandboxes created with them (registry_volumes.cc), and detaches them when those sandboxes end.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "actors/messages.h"

namespace pandastack::actors {

struct RegistryState {
  Env* env = nullptr;
  std::map<std::string, caf::actor> templates;  // template actors, spawned on first use
  std::map<std::string, caf::actor> actors;
  std::map<std::string, SandboxInfo> infos;
  // The ids in `infos` by tenant: a tenant's quota tally and list read its own records only.
  std::map<std::string, std::set<std::string>> tenant_ids;
  // Sandboxes that ended (their actors retired, or they ended before this process started):
  // their state answers for them, and their actor is spawned again when a command must record
  // something (deleting one of their snapshots).
  std::map<std::string, SandboxState> ended;
  // When each entered `ended`, and the order they retire in (RuntimeConfig::ended_retention; a
  // queue entry whose time is not ended_since's any more is stale: the sandbox came back
  // meanwhile).
  std::map<std::string, int64_t> ended_since;
  std::deque<std::pair<int64_t, std::string>> ended_queue;
  // Volumes: an actor per volume not deleted, and every volume's info (deleted ones too, until
  // the next start) for get and list.
  std::map<std::string, caf::actor> volume_actors;
  std::map<std::string, VolumeInfo> volumes;
  caf::actor volume_files;  // volume_file_worker, spawned on first use
  caf::actor persister;     // snapshot_persister, spawned on first use
  caf::actor uploader;      // snapshot_uploader (with an object store), spawned on first use
  // Managed databases: an actor per database not deleted, every database's state for get/list.
  std::map<std::string, caf::actor> database_actors;
  std::map<std::string, DatabaseState> databases;
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
// The volumes a sandbox made from a snapshot gets (a fork's child, a create from a named
// snapshot), for `source` (the volumes of the snapshot's sandbox): a new volume of the tenant's
// for each one the snapshot holds a copy of (read-write ones; named snapshots copy read-only ones
// too), made from that copy and recorded with `origin_kind`:<snapshot's origin>:<volume>, and
// attached as the source was; the source itself for a read-only one it holds no copy of (a fork
// shares them). Counted against the volume quotas. `then` gets them in slot order, or why not;
// nothing is left of a failed one. `take_copies`: the last sandbox made from the snapshot (a
// fork's last child) takes the snapshot's copies instead of copying them again.
using Inherited = std::variant<std::vector<CreateRequest::Volume>, Rejection>;
void inherit(RegistrySelf* self, const std::string& tenant,
             const std::vector<SandboxVolume>& source, const std::string& snapshot_dir,
             const std::string& origin, bool take_copies, std::function<void(Inherited)> then);
// Records the volumes a migrated sandbox brought (ImportRequest::arrivals; their files in
// `received` are moved into place first), each as it was on the host it left. All or none: on a
// refusal, those recorded go back (volume-migrated to `from_host`). `then` gets them in slot
// order (to attach), or why not.
void arrive(RegistrySelf* self, const std::string& tenant,
            const std::vector<VolumeArrival>& arrivals, const std::string& received,
            const std::string& from_host, std::function<void(Inherited)> then);
// Sends volumes that arrived with sandbox `sandbox` back to `host` (its start failed).
void send_back(RegistrySelf* self, const std::vector<std::string>& ids, const std::string& host,
               const std::string& sandbox);
// Deletes volumes `inherit` made for a sandbox that did not start (after their detach).
void discard(RegistrySelf* self, const std::vector<std::string>& ids);
// A command for the tenant's volume `id` (another tenant's is volume_not_found).
caf::result<Answer> route(RegistrySelf* self, const std::string& tenant, const std::string& id,
                          VolumeCommand c);
Answer list(RegistrySelf* self, const ListQuery& q);
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

// The registry's managed databases (registry_databases.cc).
// The actor of sandbox `id` for a command that must record something: its actor, or for an
// ended sandbox its actor spawned again (its recorded state no longer answers for it); null when
// the registry no longer knows it (retired).
caf::actor actor_to_record(RegistrySelf* self, const std::string& id);

// The durable copies of named snapshots (registry_snapshots.cc): one snapshot persister
// (actors/snapshot_persister.h) for the host, spawned on first use, asked in order.
namespace registry_snapshots {
// Sandbox `sandbox` took named snapshot `snap`: its copy is made.
void persist(RegistrySelf* self, const std::string& sandbox, const std::string& snap);
// Its named snapshots without a recorded copy (a recovered sandbox's: cut short by a crash, or
// taken before snapshots were copied) are copied now; those with a copy but none recorded in the
// object store (if the host has one) are uploaded.
void persist_missing(RegistrySelf* self, const SandboxState& s);
// `snap` was deleted: its copy goes (after any copy of it still queued).
void unpersist(RegistrySelf* self, const std::string& snap);
// The persister synced `snap`'s copy: recorded by the sandbox that took it, whatever its state;
// for a sandbox retired meanwhile (its snapshots with it) the copy goes.
void persisted(RegistrySelf* self, const std::string& sandbox, const std::string& snap);
// Hibernations in the object store (actors/snapshot_uploader.h): sandbox `sandbox`'s hibernation
// `snap`, on the data disk, is uploaded (nothing without an object store); the uploader put it
// there as `manifest` (recorded by the sandbox, if still in it; in cluster mode then parked,
// actors/parked.h); `manifest` (of `sandbox`) is no longer needed.
// (`at`: SandboxState::hibernation_persisted_at, which copy it is.)
void upload(RegistrySelf* self, const std::string& sandbox, const std::string& snap, uint64_t at);
void uploaded(RegistrySelf* self, const std::string& sandbox, const std::string& snap, uint64_t at,
              const std::string& manifest);
void forget(RegistrySelf* self, const std::string& manifest, const std::string& sandbox);
// Named snapshots in the object store: `sandbox`'s snapshot `snap`, on the data disk, is
// uploaded; the uploader put it there as `manifest` (recorded by the sandbox if it still has the
// snapshot, else the manifest goes). persist_missing also uploads the recorded copies that are
// not recorded in the store.
void upload_snapshot(RegistrySelf* self, const std::string& sandbox, const std::string& snap);
// Cluster mode: `snap` of `taken_by`, recorded in the store, is parked (Cluster::park) so that
// other hosts create from it while this one is down (not a snapshot of a sandbox with volumes).
void park_snapshot(RegistrySelf* self, const SandboxInfo& taken_by, const std::string& snap);
void snapshot_uploaded(RegistrySelf* self, const std::string& sandbox, const std::string& snap,
                       const std::string& manifest);
// Volumes in the object store: volume `volume`'s file, detached at `file_version`, is uploaded;
// the uploader put it there as `manifest` (recorded by the volume if its file did not change
// since, else the manifest goes).
void upload_volume(RegistrySelf* self, const std::string& volume, uint64_t file_version);
void volume_uploaded(RegistrySelf* self, const std::string& volume, uint64_t file_version,
                     const std::string& manifest);
// The registry's messages for these: persist, unpersist, snapsaved, upload, uploaded, forget,
// upsnap, snapup, upvol, volup.
caf::message_handler handlers(RegistrySelf* self);
}  // namespace registry_snapshots

namespace registry_databases {
// A command for the tenant's database `id` (another tenant's is database_not_found); a Create
// spawns its actor.
caf::result<Answer> command(RegistrySelf* self, const std::string& tenant, const std::string& id,
                            DatabaseCommand c);
Answer list(RegistrySelf* self, const std::string& tenant, bool deleted_too);
void adopt(RegistrySelf* self, const DatabaseState& s);
void info(RegistrySelf* self, const DatabaseState& s);
// Ends every database actor (the daemon stops: they hold the registry, it holds them).
void shutdown(RegistrySelf* self);
}  // namespace registry_databases

}  // namespace pandastack::actors
