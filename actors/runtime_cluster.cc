// The runtime's cluster side: joining a cluster, ownership claims, and the sandboxes this host
// receives from another one (a cross-host fork's children, a migrated sandbox; the snapshots
// travel over Cap'n Proto, gateway/peer_snapshots.h).
#include <caf/all.hpp>

#include "actors/cluster.h"
#include "actors/env.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/runtime_impl.h"
#include "actors/volume_files.h"
#include "storage/api_keys.h"
#include "storage/etcd.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/snapshot_transfer.h"

namespace pandastack::actors {

void Runtime::join_cluster(std::shared_ptr<Cluster> cluster) {
  auto& c = cluster->config();
  impl_->keys->share(std::make_unique<storage::Etcd>(c.etcd, etcd_tls(c)),
                     c.tls ? c.tls->records_key : std::string());
  impl_->cluster = std::move(cluster);
}

Cluster* Runtime::cluster() const { return impl_->cluster.get(); }

std::optional<Rejection> Runtime::Impl::claim(const std::string& id) {
  if (!cluster) return std::nullopt;
  auto r = cluster->claim(id);
  if (!r)
    return Rejection{"cluster_unavailable",
                     "cannot record " + id + " in the cluster's etcd: " + r.error().message};
  if (!*r) return Rejection{"conflict", id + " is owned by another host"};
  return std::nullopt;
}

Reply<std::string> Runtime::snapshot_folder(const std::string& tenant,
                                            const std::string& snapshot_id) {
  auto all = list(tenant);
  if (!all) return all.error();
  for (auto& sbx : *all)
    for (auto& s : sbx.snapshots)
      if (s == snapshot_id) return impl_->env->snapshot_dir(s).string();
  return Rejection{"snapshot_not_found", "no snapshot " + snapshot_id};
}

Reply<std::string> Runtime::hibernation_folder(const std::string& tenant, const std::string& id) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  if (info->status != Status::hibernated)
    return Rejection{"conflict", "sandbox " + id + " is not hibernated"};
  return impl_->env->hibernated_dir(id).string();
}

std::vector<std::string> Runtime::volume_files(const VolumeInfo& v) {
  const auto dir = impl_->env->volumes_dir();
  std::vector<std::string> out{volume_file(dir, v.id).string()};
  for (auto& sn : v.snapshots) out.push_back(volume_snapshot_file(dir, sn.id).string());
  return out;
}

Runtime::ImportFolders Runtime::import_folders() {
  auto& env = *impl_->env;
  ImportFolders f;
  f.snapshot_id = "imp_" + random_base32(16);
  f.dir = env.snapshot_dir(f.snapshot_id);
  f.disk_dir = env.disk_twin(f.dir);
  f.layer_cache = env.config.disk_dir / "layer-cache";
  f.memory_mib = env.config.memory_mib;
  return f;
}

Reply<std::vector<SandboxInfo>> Runtime::start_imported(const ImportRequest& request, bool claim) {
  auto dir = impl_->env->snapshot_dir(request.snapshot_id);
  ImportRequest ir = request;
  // The files carried with it (a migration's volumes) are in the received snapshot's disk
  // folder: this host's path, never one a peer names.
  auto snap = vmm::Snapshot::load(dir);
  if (!snap) return Rejection{"internal", "the received snapshot: " + snap.error().message};
  ir.received = vmm::carried_dir(*snap).string();
  auto started =
      to_reply<std::vector<SandboxInfo>>(impl_->ask(caf::make_message(import_atom::value, ir)),
                                         [](const Answer& a) { return a.infos; });
  // Every restore has its own copy of the RAM file and links to the layers: the snapshot goes.
  vmm::remove_snapshot(dir, snap->disk_dir);
  if (started && claim)
    if (auto no = claim_all(*started)) {
      for (auto& k : *started) (void)kill(request.create.tenant, k.id);
      return *no;
    }
  return started;
}

std::optional<Rejection> Runtime::claim_all(const std::vector<SandboxInfo>& made) {
  for (auto& c : made) {
    if (auto no = impl_->claim(c.id)) return no;
    for (auto& v : c.volumes)  // (a fork's child has volumes of its own: copies)
      if (!v.read_only)
        if (auto no = impl_->claim(v.volume)) return no;
  }
  return std::nullopt;
}

Reply<VolumeInfo> Runtime::volume_left(const std::string& tenant, const std::string& id,
                                       const std::string& host, const std::string& sandbox) {
  return to_reply<VolumeInfo>(
      impl_->ask(caf::make_message(volroute_atom::value, tenant, id,
                                   VolumeCommand{vcmd::Leave{host, sandbox}})),
      [](const Answer& a) { return a.volume; });
}

Reply<SandboxInfo> Runtime::migrated_away(const std::string& tenant, const std::string& id,
                                          const std::string& host) {
  return to_reply<SandboxInfo>(impl_->ask(caf::make_message(route_atom::value, tenant, id,
                                                            Command{cmd::MigratedAway{host}})),
                               [](const Answer& a) { return a.info; });
}

}  // namespace pandastack::actors
