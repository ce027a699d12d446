// The runtime's cluster side: joining a cluster, ownership claims, and the sandboxes this host
// receives from another one (a cross-host fork's children, a migrated sandbox; the snapshots
// travel over Cap'n Proto, gateway/peer_snapshots.h).
#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <filesystem>

#include "actors/cluster.h"
#include "actors/custom_template.h"
#include "actors/env.h"
#include "actors/messages.h"
#include "actors/parked.h"
#include "actors/runtime.h"
#include "actors/runtime_impl.h"
#include "actors/volume_files.h"
#include "storage/api_keys.h"
#include "storage/etcd.h"
#include "storage/object_store.h"
#include "vmm-driver/images.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/snapshot_transfer.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

void Runtime::join_cluster(std::shared_ptr<Cluster> cluster) {
  auto& c = cluster->config();
  impl_->keys->share(std::make_unique<storage::Etcd>(c.etcd, etcd_tls(c)),
                     c.tls ? c.tls->records_key : std::string());
  impl_->cluster = cluster;
  impl_->env->set_cluster(cluster);
  // What a wake from the store was fetching when the previous process ended is not whole.
  std::error_code ec;
  fs::remove_all(fetched_dir(*impl_->env), ec);
  // Copies recovery lost (their manifests are gone): their parked records go.
  for (auto& [id, manifest] : impl_->dropped_manifests)
    if (auto r = cluster->unpark(id, manifest); !r)
      spdlog::warn("cluster: the parked record of {} (lost at recovery) stays in etcd: {}", id,
                   r.error().message);
    else
      spdlog::info("cluster: {} was lost at recovery: unparked", id);
  impl_->dropped_manifests.clear();
  auto all = list("*");
  if (!all) return;
  // Parks `id` (sandbox `s`'s hibernation or one of its named snapshots) at `manifest` again.
  auto park = [&](const std::string& id, const SandboxInfo& s, const std::string& manifest) {
    Parked p;
    p.id = id;
    p.tenant = s.tenant;
    p.prefix = impl_->env->object_store->prefix();
    p.manifest = manifest;
    p.settings = parked_settings(s);
    if (auto r = cluster->park(p); !r)
      spdlog::warn("cluster: {} is not parked (no other host can wake it or create from it): {}",
                   id, r.error().message);
  };
  for (auto& s : *all) {
    // Its named snapshots in the store (records lost with etcd, or never made).
    if (impl_->env->object_store && s.volumes.empty())
      for (auto& [snap, manifest] : s.snapshot_manifests) park(snap, s, manifest);
    if (s.status != SandboxStatus::hibernated) continue;
    auto owner = cluster->owner(s.id, /*fresh=*/true);
    if (owner.kind == Owner::Kind::peer || owner.kind == Owner::Kind::down) {
      // Woken elsewhere from the store while this host was down: it is that host's now.
      spdlog::info("cluster: {} was taken over by host {} while this host was down: ended here",
                   s.id, owner.host);
      if (auto r = migrated_away(s.tenant, s.id, owner.host); !r)
        spdlog::warn("cluster: {} could not be ended here: {}", s.id, r.error().message);
      continue;
    }
    if (owner.kind != Owner::Kind::self || unparkable(s) || !impl_->env->object_store) continue;
    park(s.id, s, s.hibernation_manifest);
  }
}

Cluster* Runtime::cluster() const { return impl_->cluster.get(); }

std::optional<Rejection> Runtime::Impl::claim(const std::string& id) {
  if (!cluster) return std::nullopt;
  auto r = cluster->claim(id);
  if (!r)
    return Rejection{Code::cluster_unavailable,
                     "cannot record " + id + " in the cluster's etcd: " + r.error().message};
  if (!*r) return Rejection{Code::conflict, id + " is owned by another host"};
  return std::nullopt;
}

namespace {
// What a host offers of the snapshot in `dir` (files `carried` along).
Reply<SnapshotOffer> offer_of_folder(const fs::path& dir, const std::vector<fs::path>& carried) {
  auto snap = vmm::Snapshot::load(dir);
  if (!snap) return Rejection{Code::internal, snap.error().message};
  auto offer = vmm::offer_of(*snap, carried);
  if (!offer) return Rejection{Code::internal, offer.error().message};
  return std::move(*offer);
}
}  // namespace

Reply<SnapshotOffer> Runtime::offer_snapshot(const std::string& tenant,
                                             const std::string& snapshot_id) {
  auto all = list(tenant);
  if (!all) return all.error();
  for (auto& sbx : *all)
    for (auto& s : sbx.snapshots)
      if (s == snapshot_id) return offer_of_folder(impl_->env->snapshot_dir(s), {});
  return Rejection{Code::snapshot_not_found, "no snapshot " + snapshot_id};
}

Reply<SnapshotOffer> Runtime::offer_hibernation(const std::string& tenant, const std::string& id,
                                                const std::vector<fs::path>& carried) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  if (info->status != SandboxStatus::hibernated)
    return Rejection{Code::conflict, "sandbox " + id + " is not hibernated"};
  if (info->hibernated_disk_only)
    return Rejection{Code::not_implemented,
                     "sandbox " + id + " is hibernated with its disk only: wake it to move it"};
  return offer_of_folder(impl_->env->hibernated_dir(id), carried);
}

Reply<std::unique_ptr<SnapshotIntake>> Runtime::receive_snapshot(const std::string& tenant,
                                                                 const SnapshotOffer& offer) {
  auto f = import_folders(tenant);
  auto r = vmm::SnapshotReceiver::open(offer, f.dir, f.disk_dir, f.layer_cache, f.memory_mib);
  if (!r) return Rejection{Code::invalid_argument, r.error().message};
  return std::make_unique<SnapshotIntake>(f.snapshot_id, std::move(*r));
}

std::vector<std::string> Runtime::volume_files(const VolumeInfo& v) {
  const auto dir = impl_->env->volumes_dir();
  std::vector<std::string> out{volume_file(dir, v.id).string()};
  for (auto& sn : v.snapshots) out.push_back(volume_snapshot_file(dir, sn.id).string());
  return out;
}

Runtime::ImportFolders Runtime::import_folders(const std::string& tenant) {
  auto& env = *impl_->env;
  ImportFolders f;
  f.snapshot_id = "imp_" + random_base32(16);
  f.dir = env.snapshot_dir(f.snapshot_id);
  f.disk_dir = env.disk_twin(f.dir);
  // (the template id's tenant hash: a folder name for any tenant name)
  auto tag = template_id(tenant, "t");
  f.layer_cache = env.config.disk_dir / "layer-cache" / tag.substr(2);
  f.memory_mib = env.config.memory_mib;
  return f;
}

void Runtime::discard_import(const std::string& snapshot_id) {
  auto dir = impl_->env->snapshot_dir(snapshot_id);
  vmm::remove_snapshot(dir, impl_->env->disk_twin(dir));
}

Reply<std::vector<SandboxInfo>> Runtime::start_imported(const ImportRequest& request, bool claim) {
  auto dir = impl_->env->snapshot_dir(request.snapshot_id);
  ImportRequest ir = request;
  // The sender's template name becomes paths here (its folder, bound into the jail): only a
  // shipped template's name or this tenant's own template id, and one this host has.
  const auto& name = ir.create.template_name;
  const auto& cfg = impl_->env->config;
  std::optional<Rejection> bad;
  auto dot = name.find('.');
  if (!vmm::safe_template_name(name))
    bad = Rejection{Code::invalid_argument, "the sender's template name is not one"};
  else if (dot != std::string::npos && template_id(ir.create.tenant, name.substr(0, dot)) != name)
    bad = Rejection{Code::template_not_found,
                    "template " + name + " is not tenant " + ir.create.tenant + "'s"};
  else if (!fs::exists(vmm::template_dir(cfg.images_dir, cfg.custom_templates_dir, name) /
                       "rootfs.qcow2"))
    bad = Rejection{Code::template_not_found, "this host has no template " + name};
  else if (ir.create.network.value_or(false) && !cfg.network)
    bad = Rejection{Code::network_disabled, "sandbox networking is off on this host"};
  else if (ir.create.network.value_or(false) && ir.create.egress)
    bad = validate_egress(*ir.create.egress, !cfg.net.dns_upstream.empty());
  if (bad) {
    discard_import(request.snapshot_id);
    return *bad;
  }
  // The files carried with it (a migration's volumes) are in the received snapshot's disk
  // folder: this host's path, never one a peer names.
  auto snap = vmm::Snapshot::load(dir);
  if (!snap) return Rejection{Code::internal, "the received snapshot: " + snap.error().message};
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
