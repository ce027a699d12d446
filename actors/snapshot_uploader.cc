#include "actors/snapshot_uploader.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>

#include "actors/cluster.h"
#include "actors/env.h"
#include "actors/runtime_ids.h"
#include "actors/volume_files.h"
#include "storage/snapshot_chunks.h"

namespace pandastack::actors {

namespace {
std::string read_small(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string s(64 << 10, '\0');
  in.read(s.data(), std::streamsize(s.size()));
  s.resize(size_t(in.gcount()));
  return s;
}
}  // namespace

caf::behavior snapshot_uploader(caf::event_based_actor* self, Env* env, caf::actor registry) {
  // Failed uploads' attempts so far, by sandbox or snapshot id (the delay before the next grows).
  auto attempts = std::make_shared<std::map<std::string, int>>();
  auto gc_due = std::make_shared<bool>(false);            // a collection is scheduled
  auto known = std::make_shared<storage::KnownChunks>();  // chunks in the store (not asked again)
  // Uploads the copy at `dir` (`what` in the logs; `id` counts its attempts): its manifest's key,
  // or nullopt when it is gone, was replaced while uploaded (its meta.json before and after: a
  // wake and a new hibernation meanwhile is not reported as this one) or failed (`retry` is sent
  // to this actor again after a delay growing from 5 s to 5 min).
  // (`marker`: the file whose presence says the copy is there, and whose content says which copy:
  // meta.json; a volume's data.img, which is not compared.)
  auto upload = [=](const std::filesystem::path& dir, const std::string& what,
                    const std::string& id, caf::message retry,
                    const char* marker = "meta.json") -> std::optional<std::string> {
    if (!std::filesystem::exists(dir / marker)) {  // woken, deleted or ended meanwhile
      attempts->erase(id);
      spdlog::info("snapshot uploader: {} is gone, not uploaded", what);
      return std::nullopt;
    }
    bool compare = std::string_view(marker) == "meta.json";
    auto meta = compare ? read_small(dir / marker) : std::string();
    storage::ChunkStats st;
    auto key = storage::upload_folder(*env->object_store, dir, &st, known.get());
    if (key && compare && read_small(dir / marker) != meta) {
      spdlog::info("snapshot uploader: {} changed while uploaded", what);
      return std::nullopt;
    }
    if (!key) {
      int n = ++(*attempts)[id];
      auto delay =
          std::min(std::chrono::seconds(5) * (1 << std::min(n - 1, 6)), std::chrono::seconds(300));
      spdlog::warn(
          "snapshot uploader: {} is not in the object store (attempt {}, again in {} s): {}", what,
          n, delay.count(), key.error().message);
      self->delayed_send(self, delay, std::move(retry));
      return std::nullopt;
    }
    attempts->erase(id);
    spdlog::info(
        "snapshot uploader: {} is in the object store as {}: {} files, {} MiB, {} chunks ({} "
        "zero), {} sent ({} MiB) in {} ms",
        what, *key, st.files, st.bytes >> 20, st.chunks, st.zero_chunks, st.sent_chunks,
        st.sent_bytes >> 20, st.ms);
    return *key;
  };
  return {
      [=](upload_atom, std::string sandbox, std::string snap, uint64_t at) {
        if (!runtime_id(sandbox, "sbx_") || (!snap.empty() && !runtime_id(snap, "snap_")) ||
            !env->object_store) {
          spdlog::error("snapshot uploader: refused '{}' / '{}'", sandbox, snap);
          return;
        }
        auto key = upload(env->persisted_dir(sandbox), "the hibernation of " + sandbox, sandbox,
                          caf::make_message(upload_atom::value, sandbox, snap, at));
        if (key) caf::anon_send(registry, uploaded_atom::value, sandbox, snap, at, *key);
      },
      [=](upsnap_atom, std::string sandbox, std::string snap) {
        if (!runtime_id(sandbox, "sbx_") || !runtime_id(snap, "snap_") || !env->object_store) {
          spdlog::error("snapshot uploader: refused '{}' / '{}'", sandbox, snap);
          return;
        }
        auto key = upload(env->persisted_snapshot_dir(snap), "snapshot " + snap + " of " + sandbox,
                          snap, caf::make_message(upsnap_atom::value, sandbox, snap));
        if (key) caf::anon_send(registry, snapup_atom::value, sandbox, snap, *key);
      },
      [=](upvol_atom, std::string volume, uint64_t version) {
        if (!runtime_id(volume, "vol_") || !env->object_store) {
          spdlog::error("snapshot uploader: refused volume '{}'", volume);
          return;
        }
        // The file, detached, through a hard link in a folder of its own (what upload_folder
        // reads); synced first (what the store gets is what the disk has).
        namespace fs = std::filesystem;
        auto file = volume_file(env->volumes_dir(), volume);
        auto dir = env->volumes_dir() / ".upload" / volume;
        std::error_code ec;
        fs::remove_all(dir, ec);
        fs::create_directories(dir, ec);
        if (!ec) fs::create_hard_link(file, dir / "data.img", ec);
        // Whose file it is: two volumes with the same bytes (two empty ones) have manifests of
        // their own, so that one's removal never takes the other's.
        if (!ec) {
          std::ofstream tag(dir / "volume.json");
          tag << "{\"volume\":\"" << volume << "\",\"file_version\":" << version << "}\n";
          if (!tag.flush()) ec = std::make_error_code(std::errc::io_error);
        }
        if (ec) {
          spdlog::info("snapshot uploader: volume {} not uploaded: {}", volume, ec.message());
          fs::remove_all(dir, ec);
          return;
        }
        if (auto synced = sync_volume_file(file); !synced)
          spdlog::warn("snapshot uploader: volume {}: {}", volume, synced.error().message);
        auto key = upload(dir, "volume " + volume, volume,
                          caf::make_message(upvol_atom::value, volume, version), "data.img");
        fs::remove_all(dir, ec);
        if (key) caf::anon_send(registry, volup_atom::value, volume, version, *key);
      },
      [=](park_atom, std::string sandbox, std::string tenant, std::string manifest,
          std::string settings) {
        auto cluster = env->cluster();
        auto j = wire::Json::parse(settings);
        if (!cluster || !env->object_store || !j ||
            (!runtime_id(sandbox, "sbx_") && !runtime_id(sandbox, "snap_")))
          return;
        Parked p;
        p.id = sandbox;
        p.tenant = tenant;
        p.prefix = env->object_store->prefix();
        p.manifest = manifest;
        p.settings = *j;
        if (auto r = cluster->park(p); !r)
          spdlog::warn(
              "snapshot uploader: {} is in the object store but not parked in the cluster (no "
              "other host can wake it; recorded again at the next start): {}",
              sandbox, r.error().message);
      },
      [=](forget_atom, std::string manifest, std::string sandbox) {
        if (!storage::manifest_key(manifest) || !env->object_store) return;
        // Its parked record first: no host tries to wake it from a manifest that is gone.
        if (auto cluster = env->cluster();
            cluster && (runtime_id(sandbox, "sbx_") || runtime_id(sandbox, "snap_")))
          if (auto r = cluster->unpark(sandbox, manifest); !r)
            spdlog::warn("snapshot uploader: the parked record of {} stays in etcd: {}", sandbox,
                         r.error().message);
        if (auto r = env->object_store->remove(manifest); !r) {
          spdlog::warn("snapshot uploader: {} not removed from the object store: {}", manifest,
                       r.error().message);
          return;
        }
        if (!*gc_due) {
          *gc_due = true;
          self->delayed_send(self, env->config.object_store_gc_delay, objgc_atom::value);
        }
      },
      [=](objgc_atom) {
        *gc_due = false;
        auto gc = storage::collect_garbage(*env->object_store, known.get());
        if (!gc) {
          spdlog::warn("snapshot uploader: no garbage collected: {}", gc.error().message);
          return;
        }
        spdlog::info("snapshot uploader: garbage collection: {} manifests, {} chunks, {} deleted",
                     gc->manifests, gc->chunks, gc->deleted);
      },
  };
}

}  // namespace pandastack::actors
