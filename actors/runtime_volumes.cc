// The runtime facade's volume calls: create (empty, or from a volume snapshot), get, list,
// change, delete, and volume snapshots. Blocking work (mkfs, copies) runs here, on the caller's
// thread, never on the actor system's.
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>

#include "actors/runtime_impl.h"
#include "actors/volume_files.h"
#include "vmm-driver/file_copy.h"

namespace pandastack::actors {

namespace {

// A new volume `request` asks for, as a copy of one of the tenant's volume snapshots.
Reply<VolumeInfo> create_from_snapshot(Runtime& rt, Runtime::Impl& impl,
                                       const VolumeRequest& request) {
  auto& env = *impl.env;
  const auto& lim = env.config.volume_limits;
  auto all = rt.list_volumes(request.tenant);
  if (!all) return all.error();
  const VolumeInfo* source = nullptr;
  const VolumeSnapshot* snap = nullptr;
  for (auto& v : *all)
    for (auto& sn : v.snapshots)
      if (sn.id == request.from_snapshot) {
        source = &v;
        snap = &sn;
      }
  if (!snap)
    return Rejection{Code::snapshot_not_found, "no volume snapshot " + request.from_snapshot};
  VolumeRequest req = request;
  if (req.size_mib == 0) req.size_mib = snap->size_mib;
  if (req.size_mib < snap->size_mib)
    return Rejection{Code::invalid_argument,
                     "size_mib must be at least the snapshot's, " + std::to_string(snap->size_mib)};
  if (req.name.empty()) req.name = source->name;
  req.origin = "volume-snapshot:" + snap->id + ":" + source->id;
  VolumeState none;
  none.id = "vol_";
  auto d = decide(
      none,
      VolumeCommand{vcmd::Create{req.tenant, req.name, req.size_mib, req.metadata, req.origin}},
      now_ms(), lim, env.config.limits);
  if (auto* r = std::get_if<Rejection>(&d)) return *r;
  Answer ok =
      impl.ask(caf::make_message(voladmit_atom::value, req.tenant, req.size_mib, uint32_t(1)));
  if (!ok.ok) return ok.error;
  std::string id = "vol_" + random_base32(16);
  if (auto no = impl.claim(id)) return *no;  // (cluster mode: before it exists)
  auto file = volume_file(env.volumes_dir(), id);
  auto cloned = vmm::clone_file(volume_snapshot_file(env.volumes_dir(), snap->id), file);
  if (!cloned)
    return Rejection{Code::storage_error, "cannot copy the snapshot: " + cloned.error().message};
  if (req.size_mib > snap->size_mib)
    if (auto grown = grow_volume_file(file, req.size_mib); !grown) {
      remove_volume_file(file);
      return Rejection{Code::storage_error, "cannot grow the copy: " + grown.error().message};
    }
  Answer a = impl.ask(caf::make_message(volcreate_atom::value, id, req));
  if (!a.ok) remove_volume_file(file);
  return to_reply<VolumeInfo>(a, [](const Answer& x) { return x.volume; });
}

}  // namespace

// A volume's file is sparse, but its guest may fill it: a new volume (or the MiB a grow adds) must
// fit in the volume folder's free space with the host's headroom left (exploratory test 3 #20:
// four 64 GiB volumes were accepted with 68 GB free, on the disk that also holds the events).
static std::optional<Rejection> disk_admits(const Env& env, uint64_t mib) {
  struct statvfs v {};
  auto dir = env.volumes_dir();
  if (::statvfs(dir.c_str(), &v) != 0 || v.f_blocks == 0) return std::nullopt;
  uint64_t size = uint64_t(v.f_blocks) * v.f_frsize, free = uint64_t(v.f_bavail) * v.f_frsize;
  uint64_t keep = size / 100 * env.config.host_headroom_percent;
  if (free >= (mib << 20) + keep) return std::nullopt;
  return Rejection{Code::host_full,
                   "the host's volume folder has " + std::to_string(free >> 20) + " MiB free: " +
                       std::to_string(mib) + " MiB more of volumes would leave less than its " +
                       std::to_string(env.config.host_headroom_percent) + "% headroom"};
}

Reply<VolumeInfo> Runtime::create_volume(const VolumeRequest& request) {
  if (!request.from_snapshot.empty()) return create_from_snapshot(*this, *impl_, request);
  auto& env = *impl_->env;
  const auto& lim = env.config.volume_limits;
  // What can be refused without the file is refused before it is made (mkfs is real work).
  VolumeState none;
  none.id = "vol_";
  auto d = decide(none,
                  VolumeCommand{vcmd::Create{request.tenant, request.name, request.size_mib,
                                             request.metadata, ""}},
                  now_ms(), lim, env.config.limits);
  if (auto* r = std::get_if<Rejection>(&d)) return *r;
  Answer ok = impl_->ask(
      caf::make_message(voladmit_atom::value, request.tenant, request.size_mib, uint32_t(1)));
  if (!ok.ok) return ok.error;
  if (auto no = disk_admits(env, request.size_mib)) return *no;
  std::string id = "vol_" + random_base32(16);
  if (auto no = impl_->claim(id)) return *no;
  auto file = volume_file(env.volumes_dir(), id);
  if (auto made = make_volume_file(file, request.size_mib); !made)
    return Rejection{Code::storage_error, "cannot make the volume's file: " + made.error().message};
  VolumeRequest req = request;
  req.origin.clear();
  Answer a = impl_->ask(caf::make_message(volcreate_atom::value, id, req));
  if (!a.ok) remove_volume_file(file);
  return to_reply<VolumeInfo>(a, [](const Answer& x) { return x.volume; });
}

Reply<VolumeInfo> Runtime::get_volume(const std::string& tenant, const std::string& id) {
  auto all = list_volumes(tenant);
  if (!all) return all.error();
  for (auto& v : *all)
    if (v.id == id) return v;
  return Rejection{Code::volume_not_found, "no volume " + id};
}

Reply<std::vector<VolumeInfo>> Runtime::list_volumes(
    const std::string& tenant, const std::map<std::string, std::string>& metadata) {
  return to_reply<std::vector<VolumeInfo>>(
      impl_->ask(caf::make_message(vollist_atom::value, ListQuery{tenant, std::nullopt, metadata})),
      [](const Answer& a) { return a.volumes; });
}

Reply<VolumeInfo> Runtime::update_volume(
    const std::string& tenant, const std::string& id, std::optional<uint64_t> size_mib,
    std::optional<std::map<std::string, std::string>> metadata) {
  Reply<VolumeInfo> out = get_volume(tenant, id);
  if (!out) return out;
  if (size_mib && *size_mib > out->size_mib) {
    auto r = impl_->ask(
        caf::make_message(voladmit_atom::value, tenant, *size_mib - out->size_mib, uint32_t(0)));
    if (!r.ok) return r.error;  // the size quota (the volume itself is counted already)
    if (auto no = disk_admits(*impl_->env, *size_mib - out->size_mib)) return *no;
  }
  if (size_mib) {
    out =
        to_reply<VolumeInfo>(impl_->ask(caf::make_message(volroute_atom::value, tenant, id,
                                                          VolumeCommand{vcmd::Resize{*size_mib}})),
                             [](const Answer& a) { return a.volume; });
    if (!out) return out;
  }
  if (metadata)
    out = to_reply<VolumeInfo>(
        impl_->ask(caf::make_message(volroute_atom::value, tenant, id,
                                     VolumeCommand{vcmd::SetMetadata{*metadata}})),
        [](const Answer& a) { return a.volume; });
  return out;
}

Reply<VolumeInfo> Runtime::delete_volume(const std::string& tenant, const std::string& id) {
  return to_reply<VolumeInfo>(impl_->ask(caf::make_message(volroute_atom::value, tenant, id,
                                                           VolumeCommand{vcmd::Delete{}})),
                              [](const Answer& a) { return a.volume; });
}

Reply<VolumeSnapshot> Runtime::snapshot_volume(const std::string& tenant, const std::string& id) {
  auto v = get_volume(tenant, id);
  if (!v) return v.error();
  Answer ok = impl_->ask(caf::make_message(voladmit_atom::value, tenant, v->size_mib, uint32_t(0)));
  if (!ok.ok) return ok.error;
  vcmd::Snapshot c{"vsnap_" + random_base32(16), ""};
  // Held read-write: by a hibernated sandbox (its file is still), or by a running one whose guest
  // freezes the file system for the copy.
  std::optional<std::pair<std::string, std::string>> frozen;  // sandbox, mount
  for (auto& a : v->attachments) {
    if (a.read_only) continue;
    auto sbx = get(tenant, a.sandbox);
    if (!sbx)
      return Rejection{Code::volume_attached, "volume " + id + " is attached to sandbox " +
                                                  a.sandbox + ", which is not answering"};
    if (sbx->status == SandboxStatus::hibernated) {
      c.quiesced_by = a.sandbox;
    } else if (sbx->status == SandboxStatus::running) {
      vmm::ExecRequest freeze;
      freeze.argv = {"fsfreeze", "--freeze", a.mount};
      freeze.timeout_ms = 30000;
      auto r = exec(tenant, a.sandbox, freeze);
      if (!r || r->exit_code != 0)
        return Rejection{Code::volume_attached,
                         "volume " + id + " is attached read-write to sandbox " + a.sandbox +
                             ", whose file system at " + a.mount + " could not be frozen: " +
                             (r ? r->stderr_data.substr(0, 300) : r.error().message)};
      frozen = std::make_pair(a.sandbox, a.mount);
      c.quiesced_by = a.sandbox;
    } else {
      return Rejection{Code::volume_attached,
                       "volume " + id + " is attached to sandbox " + a.sandbox + ", which is " +
                           to_string(sbx->status) + ": try again when it runs or is hibernated"};
    }
  }
  auto snap_id = c.snapshot_id;
  auto out = to_reply<VolumeInfo>(
      impl_->ask(caf::make_message(volroute_atom::value, tenant, id, VolumeCommand{c})),
      [](const Answer& a) { return a.volume; });
  if (frozen) {
    vmm::ExecRequest thaw;
    thaw.argv = {"fsfreeze", "--unfreeze", frozen->second};
    thaw.timeout_ms = 30000;
    auto r = exec(tenant, frozen->first, thaw);
    if (!r || r->exit_code != 0)
      spdlog::warn("volume {}: thawing {} in sandbox {} failed: {}", id, frozen->second,
                   frozen->first, r ? r->stderr_data.substr(0, 300) : r.error().message);
  }
  if (!out) return out.error();
  for (auto& sn : out->snapshots)
    if (sn.id == snap_id) return sn;
  return Rejection{Code::internal, "the snapshot is not recorded"};
}

Reply<VolumeInfo> Runtime::delete_volume_snapshot(const std::string& tenant, const std::string& id,
                                                  const std::string& snapshot_id) {
  return to_reply<VolumeInfo>(
      impl_->ask(caf::make_message(volroute_atom::value, tenant, id,
                                   VolumeCommand{vcmd::DeleteSnapshot{snapshot_id}})),
      [](const Answer& a) { return a.volume; });
}

}  // namespace pandastack::actors
