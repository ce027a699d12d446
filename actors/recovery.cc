#include "actors/recovery.h"

#include <spdlog/spdlog.h>

#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "actors/database_codec.h"
#include "actors/event_codec.h"
#include "actors/volume_codec.h"
#include "actors/volume_files.h"
#include "storage/object_store.h"
#include "storage/snapshot_chunks.h"
#include "vmm-driver/jail.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {
// Brings a snapshot whose tmpfs copy a reboot took back into `dir` (and its disk twin) from its
// durable copy at `copy`, when one was recorded (only then was it synced); else why not.
vmm::Result<vmm::Snapshot> restage(const Env& env, bool recorded, const fs::path& copy,
                                   const fs::path& dir) {
  if (!recorded) return vmm::make_error(vmm::ErrorCode::not_found, "no synced copy was recorded");
  auto durable = vmm::Snapshot::load(copy);
  if (!durable) return durable.error();
  return vmm::stage_snapshot(*durable, dir, env.disk_twin(dir));
}

// A durable copy (`what`: a hibernation's at Env::persisted_dir, a named snapshot's at
// Env::persisted_snapshot_dir) fetched into `dir` from the object store, verified chunk by chunk
// (storage/snapshot_chunks.h), in place of one the data disk no longer has.
storage::Status fetch_copy(Env& env, const std::string& what, const std::string& manifest,
                           const fs::path& dir) {
  if (!env.object_store)
    return storage::make_error(storage::ErrorCode::not_found,
                               "its copy is in an object store, and this host has none");
  std::error_code ec;
  fs::remove_all(dir, ec);  // (whatever is left of it is not whole: it has no meta.json)
  storage::ChunkStats st;
  auto r = storage::download_folder(*env.object_store, manifest, dir, &st);
  if (!r) {
    spdlog::warn("recovery: {} could not be fetched from the object store: {}", what,
                 r.error().message);
    return r;
  }
  spdlog::info(
      "recovery: {} came from the object store ({}): {} MiB in {} chunks ({} zero), {} MiB "
      "fetched in {} ms",
      what, manifest, st.bytes >> 20, st.chunks, st.zero_chunks, st.sent_bytes >> 20, st.ms);
  return r;
}

// Removes `manifest` of `id` (a sandbox's hibernation or a named snapshot: a copy that could not
// be used, and is of no use later either), and notes it in `out.dropped_manifests` (its parked
// record goes when the host joins its cluster).
void drop_manifest(Env& env, Recovered& out, const std::string& id, const std::string& what,
                   const std::string& manifest) {
  if (manifest.empty() || !env.object_store) return;
  out.dropped_manifests.emplace_back(id, manifest);
  if (auto r = env.object_store->remove(manifest); !r)
    spdlog::warn("recovery: {}: {} not removed from the object store: {}", what, manifest,
                 r.error().message);
}
}  // namespace

Reply<Recovered> recover(Env& env) {
  // Recovery: replay every sandbox's stream.
  const RuntimeConfig& config = env.config;
  auto streams = env.store->streams("sbx_");
  if (!streams) return Rejection{Code::storage_error, streams.error().message};
  Recovered out;
  std::vector<SandboxState>& recovered = out.sandboxes;
  std::set<std::string> keep_run;
  size_t& from_snapshots = out.from_snapshots;
  // Run folders of VMs the previous host process left (named <sandbox id>.<suffix>).
  std::map<std::string, fs::path> run_dirs;
  std::vector<fs::path> recorded;  // every folder with a live record
  {
    std::error_code ec;
    for (auto& d : fs::directory_iterator(config.state_dir / "run", ec)) {
      auto name = d.path().filename().string();
      if (!fs::exists(d.path() / "vm.json")) continue;
      recorded.push_back(d.path());
      // The VM's name (its sandbox id + "." + suffix; pooled VMs were renamed when taken).
      std::ifstream in(d.path() / "vm.json");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto record = wire::Json::parse(text);
      std::string vm_name =
          record && (*record)["name"].is_string() ? (*record)["name"].as_string() : name;
      run_dirs[vm_name.substr(0, vm_name.find('.'))] = d.path();
    }
  }
  // Retired sandboxes (ended long ago, forgotten: registry.h) are not replayed.
  std::set<std::string> retired;
  {
    auto marks = env.store->scan(kRetiredPrefix);
    if (!marks) return Rejection{Code::storage_error, marks.error().message};
    for (auto& [k, v] : *marks) retired.insert(k.substr(std::string_view(kRetiredPrefix).size()));
  }
  out.retired = retired.size();
  for (auto& id : *streams) {
    if (retired.count(id)) continue;
    SandboxState s;
    s.id = id;
    // The newest state snapshot, then the events after it.
    auto snap = env.store->load_snapshot(id);
    if (!snap) return Rejection{Code::storage_error, snap.error().message};
    if (*snap && (*snap)->format == state_format()) {
      if (auto decoded = decode_state((*snap)->state);
          decoded && decoded->id == id && decoded->version == (*snap)->version) {
        s = *decoded;
        ++from_snapshots;
      } else {
        spdlog::warn("recovery: {}: unreadable state snapshot, replaying all events", id);
      }
    }
    auto events = env.store->read_stream(id, s.version + 1);
    if (!events) return Rejection{Code::storage_error, events.error().message};
    for (auto& stored : *events) {
      auto e = decode_event(stored.payload);
      if (!e)
        return Rejection{Code::storage_error,
                         "undecodable event " + std::to_string(stored.version) + " of " + id};
      s = apply(s, *e);
    }
    // Appends `e` to the sandbox's stream (synced) and applies it.
    auto record = [&](Event e) -> std::optional<Rejection> {
      e.at_ms = now_ms();
      auto r =
          env.store->append(id, s.version, {{to_string(e.kind), event_format(), encode_event(e)}});
      if (!r) return Rejection{Code::storage_error, r.error().message};
      s = apply(s, e);
      return std::nullopt;
    };
    // A hibernation that completed on disk before the host died, but was not recorded: it is
    // one (the snapshot is whole: its metadata is written last).
    auto whole = s.status == SandboxStatus::hibernating && !s.pending_snapshot.empty()
                     ? vmm::Snapshot::load(env.hibernated_dir(id))
                     : vmm::Result<vmm::Snapshot>(vmm::make_error(vmm::ErrorCode::not_found, ""));
    if (whole) {
      Event h;
      h.kind = Event::Kind::hibernated;
      h.snapshot_id = s.pending_snapshot;
      h.disk_only = !whole->memory;  // as it is on disk (a disk-only one may not have got there)
      if (auto bad = record(h)) return *bad;
      spdlog::info("recovery: {}: its hibernation completed before the restart", id);
    }
    std::string lost;
    if (s.status == SandboxStatus::hibernated &&
        !fs::exists(env.hibernated_dir(id) / "meta.json")) {
      // Its tmpfs copy is gone (the host rebooted): the durable one on the data disk, if it was
      // made (recorded: only then was it synced), goes back to tmpfs (where a wake takes it from).
      auto staged =
          restage(env, s.hibernation_durable, env.persisted_dir(id), env.hibernated_dir(id));
      if (!staged && !s.hibernation_manifest.empty()) {
        // Not on the data disk either (a lost or replaced disk): from the object store.
        auto fetched = fetch_copy(env, id + ": its hibernation", s.hibernation_manifest,
                                  env.persisted_dir(id));
        if (fetched) {
          staged = restage(env, true, env.persisted_dir(id), env.hibernated_dir(id));
        } else {
          staged = vmm::make_error(vmm::ErrorCode::not_found, fetched.error().message);
          lost = "hibernation_snapshot_lost: " + fetched.error().message;
        }
      }
      if (staged) {
        ++out.hibernations_restored;
        spdlog::info("recovery: {}: its hibernation came back from the data disk", id);
      } else {
        if (lost.empty()) lost = "hibernation_snapshot_lost";
        spdlog::warn("recovery: {}: no hibernation on tmpfs nor on the data disk ({})", id,
                     staged.error().message);
      }
    } else if (s.status == SandboxStatus::running && run_dirs.count(id)) {
      // Its VM may have outlived the previous host process: its actor adopts it once the API
      // is up (in parallel with the others, each with its own deadline). Its folders and its
      // subnet are kept for it meanwhile.
      keep_run.insert(run_dirs[id].filename().string());
      out.to_adopt[id] = run_dirs[id];
      if (s.subnet && config.network) env.subnets_used.insert(*s.subnet);
      // Commands in flight died with the previous host's calls (their callers are gone).
      auto running = s.running_execs;
      for (auto& [exec_id, command] : running) {
        Event f;
        f.kind = Event::Kind::exec_finished;
        f.exec_id = exec_id;
        f.exit_code = -1;
        if (auto bad = record(f)) return *bad;
      }
    } else if (s.live() && s.status != SandboxStatus::hibernated) {
      lost = "host_restart";  // its VM died with the previous host process, or was mid-change
    }
    // Its named snapshots (they outlive it) likewise: a tmpfs copy gone with a reboot comes back
    // from the data disk, else from the object store; one that had no synced copy is lost, and
    // deleted with that reason (never listed as something a create could restore).
    for (auto snap : std::vector<std::string>(s.snapshots)) {
      auto dir = env.snapshot_dir(snap);
      if (fs::exists(dir / "meta.json")) continue;
      auto copy = env.persisted_snapshot_dir(snap);
      auto staged = restage(env, s.durable_snapshots.count(snap) > 0, copy, dir);
      auto manifest = s.snapshot_manifests.count(snap) ? s.snapshot_manifests[snap] : "";
      bool fetched_now = false;
      if (!staged && !manifest.empty()) {
        auto what = id + ": snapshot " + snap;
        auto fetched = fetch_copy(env, what, manifest, copy);
        staged = fetched ? restage(env, true, copy, dir)
                         : vmm::make_error(vmm::ErrorCode::not_found,
                                           "not in the object store: " + fetched.error().message);
        if (!staged) drop_manifest(env, out, snap, what, manifest);
        fetched_now = bool(staged);
      }
      if (staged) {
        ++out.snapshots_restored;
        spdlog::info("recovery: {}: snapshot {} came back from the {}", id, snap,
                     fetched_now ? "object store" : "data disk");
        continue;
      }
      spdlog::warn("recovery: {}: snapshot {} is lost: no copy on tmpfs nor on the data disk ({})",
                   id, snap, staged.error().message);
      Event d;
      d.kind = Event::Kind::snapshot_deleted;
      d.snapshot_id = snap;
      d.reason = "snapshot_lost";
      if (auto bad = record(d)) return *bad;
    }
    if (!lost.empty()) {
      drop_manifest(env, out, id, id, s.hibernation_manifest);
      Event f;
      f.kind = Event::Kind::failed;
      f.reason = lost;
      if (auto bad = record(f)) return *bad;
      spdlog::info("recovery: {} failed ({})", id, lost);
    }
    recovered.push_back(s);
  }
  // Every other VM the previous host left (pool members, spares, orphans) is killed by its
  // recorded pid and start time, without a word to it (no QMP: a stuck VM must not delay the
  // restart), and every other run folder (and jail root) goes.
  std::error_code ec;
  for (auto& dir : recorded) {
    if (keep_run.count(dir.filename().string())) continue;
    if (vmm::Vm::kill_recorded(dir))
      spdlog::info("recovery: killed the VM in {} (no running sandbox owns it)", dir.string());
  }
  for (auto& root : {config.state_dir / "run", config.disk_dir / "run"})
    for (auto& d : fs::directory_iterator(root, ec)) {
      auto name = d.path().filename().string();
      bool jail = name.size() > 5 && name.ends_with(".jail");
      bool keep = keep_run.count(name) || (jail && keep_run.count(name.substr(0, name.size() - 5)));
      if (keep) continue;
      // A folder without a record (its host died before writing one) may still have a cgroup.
      if (!jail && root == config.state_dir / "run" && !fs::exists(d.path() / "vm.json"))
        vmm::Cgroup::remove(vmm::Vm::cgroup_name(d.path()));
      fs::remove_all(d.path(), ec);
    }

  // Hibernation folders of sandboxes that are not hibernated (failed, killed meanwhile).
  {
    std::set<std::string> hibernated;
    for (auto& s : recovered)
      if (s.status == SandboxStatus::hibernated) hibernated.insert(s.id);
    for (auto& root : {config.state_dir / "hibernated", config.disk_dir / "hibernated",
                       config.data_dir / "hibernations"})
      for (auto& d : fs::directory_iterator(root, ec))
        if (!hibernated.count(d.path().filename().string())) {
          spdlog::info("recovery: removing {} (no hibernated sandbox owns it)", d.path().string());
          fs::remove_all(d.path(), ec);
        }
  }

  // Snapshot folders no sandbox names (a fork's that a crash left behind, one being taken when the
  // host died): tmpfs memory nobody can use any more. Named snapshots outlive their sandbox.
  {
    std::set<std::string> named;
    for (auto& s : recovered) named.insert(s.snapshots.begin(), s.snapshots.end());
    std::vector<fs::path> unnamed;
    for (auto& d : fs::directory_iterator(config.state_dir / "snapshots", ec))
      if (!named.count(d.path().filename().string())) unnamed.push_back(d.path());
    for (auto& d : unnamed) {
      spdlog::info("recovery: removing snapshot {} (no sandbox names it)", d.filename().string());
      vmm::remove_snapshot(d, env.disk_twin(d));
    }
    for (auto& root : {config.disk_dir / "snapshots", config.data_dir / "snapshots"})
      for (auto& d : fs::directory_iterator(root, ec))
        if (!named.count(d.path().filename().string())) fs::remove_all(d.path(), ec);
  }

  // Volumes: replayed; their files follow the records (a lost one comes back from the object
  // store when its copy there is of the file as it was).
  {
    fs::remove_all(env.volumes_dir() / ".upload", ec);  // (what an upload was reading)
    auto vstreams = env.store->streams("vol_");
    if (!vstreams) return Rejection{Code::storage_error, vstreams.error().message};
    std::set<std::string> files = {"snapshots", ".upload"}, snapshot_files;
    for (auto& id : *vstreams) {
      VolumeState v;
      v.id = id;
      auto events = env.store->read_stream(id);
      if (!events) return Rejection{Code::storage_error, events.error().message};
      for (auto& stored : *events) {
        auto e = decode_volume_event(stored.payload);
        if (!e)
          return Rejection{Code::storage_error,
                           "undecodable event " + std::to_string(stored.version) + " of " + id};
        v = apply(v, *e);
      }
      if (v.status == VolumeStatus::available) {
        for (auto& sn : v.snapshots) snapshot_files.insert(sn.id + ".img");
        auto f = volume_file(env.volumes_dir(), id);
        files.insert(f.filename().string());
        std::error_code fe;
        auto size = fs::file_size(f, fe);
        if (fe && v.stored) {
          auto dir = env.volumes_dir() / ".upload" / id;
          fs::create_directories(dir.parent_path(), ec);
          if (fetch_copy(env, "volume " + id, v.manifest, dir)) {
            // (its volume.json must name it: a manifest is never taken for another's file)
            std::ifstream tag(dir / "volume.json");
            std::string text((std::istreambuf_iterator<char>(tag)),
                             std::istreambuf_iterator<char>());
            auto j = wire::Json::parse(text);
            if (j && (*j)["volume"].is_string() && (*j)["volume"].as_string() == id) {
              fs::rename(dir / "data.img", f, fe);
              if (!fe) size = fs::file_size(f, fe);
            } else {
              spdlog::error("recovery: volume {}: the copy in the object store is not its own", id);
            }
          }
          fs::remove_all(dir, ec);
        }
        if (fe) {
          spdlog::error("recovery: volume {}: its file is missing ({})", id, f.string());
        } else if (size < (v.size_mib << 20)) {
          if (auto g = grow_volume_file(f, v.size_mib); !g)
            spdlog::error("recovery: volume {}: growing its file failed: {}", id,
                          g.error().message);
        }
      }
      out.volumes.push_back(std::move(v));
    }
    for (auto& d : fs::directory_iterator(env.volumes_dir(), ec))
      if (!files.count(d.path().filename().string())) {
        spdlog::info("recovery: removing {} (no volume owns it)", d.path().string());
        fs::remove(d.path(), ec);
      }
    for (auto& d : fs::directory_iterator(env.volumes_dir() / "snapshots", ec))
      if (!snapshot_files.count(d.path().filename().string())) {
        spdlog::info("recovery: removing {} (no volume has this snapshot)", d.path().string());
        fs::remove(d.path(), ec);
      }
  }

  // Managed databases: replayed (their sandboxes and volumes recovered above).
  {
    auto dstreams = env.store->streams("db_");
    if (!dstreams) return Rejection{Code::storage_error, dstreams.error().message};
    for (auto& id : *dstreams) {
      DatabaseState d;
      d.id = id;
      auto events = env.store->read_stream(id);
      if (!events) return Rejection{Code::storage_error, events.error().message};
      for (auto& stored : *events) {
        auto e = decode_database_event(stored.payload);
        if (!e)
          return Rejection{Code::storage_error,
                           "undecodable event " + std::to_string(stored.version) + " of " + id};
        d = apply(d, *e);
      }
      out.databases.push_back(std::move(d));
    }
  }

  if (config.network) {
    int removed = vmm::Network::remove_leftovers(config.net, env.subnets_used);
    if (removed) spdlog::info("recovery: removed {} leftover sandbox network parts", removed);
  }

  return out;
}

}  // namespace pandastack::actors
