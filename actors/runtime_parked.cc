// Wake anywhere (issue 39): a sandbox hibernated on a host that is now down, woken on this one
// from the object store. The owner parked it (actors/cluster.h, Parked) once its hibernation's
// manifest was in the store; this host fetches that folder from the owner's prefix (every chunk
// verified by hash), takes it in as it would a peer's snapshot (vmm::SnapshotReceiver: sizes,
// layer hashes, the layer chain), takes the sandbox over in one etcd transaction (only while its
// host is down), and starts it as a migrated sandbox (its id, settings, ports).
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <vector>

#include "actors/cluster.h"
#include "actors/env.h"
#include "actors/parked.h"
#include "actors/runtime.h"
#include "actors/runtime_impl.h"
#include "storage/object_store.h"
#include "storage/snapshot_chunks.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/snapshot_transfer.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

// The parked record of the tenant's `id`, whose owner is down: conflict when the owner is up (it
// wakes it), host_unavailable when nothing of the tenant's is parked for it (as the routing
// answers any request for a sandbox of a host that is down).
Reply<Parked> parked_while_down(Cluster* cluster, const std::string& tenant,
                                const std::string& id) {
  if (cluster == nullptr)
    return Rejection{Code::cluster_disabled, "this daemon runs without --cluster"};
  auto owner = cluster->owner(id, /*fresh=*/true);
  if (owner.kind == Owner::Kind::error)
    return Rejection{Code::cluster_unavailable, "cannot reach etcd: " + owner.message};
  if (owner.kind != Owner::Kind::down)
    return Rejection{Code::conflict, "sandbox " + id + " is not on a host that is down (" +
                                         (owner.host.empty() ? "no owner" : owner.host) +
                                         "): that host wakes it"};
  auto p = cluster->parked(id);
  if (!p) return Rejection{Code::cluster_unavailable, "cannot reach etcd: " + p.error().message};
  if (!*p || (**p).tenant != tenant || (**p).host != owner.host)
    return Rejection{Code::host_unavailable,
                     down_message(owner.host) + " (its hibernation is not in the object store)"};
  return std::move(**p);
}

// A folder the store sent, taken in as a peer's snapshot would be (for `tenant`): the import's id.
Reply<std::string> take_in(Runtime& rt, const std::string& tenant, const fs::path& folder) {
  auto snap = vmm::Snapshot::load(folder);
  if (!snap)
    return Rejection{Code::wake_failed, "the fetched hibernation: " + snap.error().message};
  if (!snap->disk_dir.empty() && snap->disk_dir != folder)
    return Rejection{Code::wake_failed, "the fetched hibernation names a disk folder elsewhere"};
  if (!snap->memory || !snap->volume_slots.empty())
    return Rejection{Code::wake_failed,
                     "the fetched hibernation has no memory, or has volumes: it is not parkable"};
  auto offer = vmm::offer_of(*snap);
  if (!offer) return Rejection{Code::wake_failed, offer.error().message};
  auto intake = rt.receive_snapshot(tenant, *offer);
  if (!intake) return intake.error();
  std::vector<char> buf(1 << 20);
  for (uint32_t i : (*intake)->missing()) {
    auto f = OfferedFile::open(*offer, i);
    if (!f) return f.error();
    for (auto& e : (*f)->extents())
      for (uint64_t off = e.offset; off < e.offset + e.length;) {
        size_t n = size_t(std::min<uint64_t>(buf.size(), e.offset + e.length - off));
        if (!(*f)->read(off, buf.data(), n))
          return Rejection{Code::wake_failed, "cannot read " + (*f)->path().string()};
        if (auto w = (*intake)->write(i, off, buf.data(), n); !w) return w.error();
        off += n;
      }
  }
  if (auto c = (*intake)->commit(); !c) return c.error();
  return (*intake)->id();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Reply<Runtime::ParkedSandbox> Runtime::parked(const std::string& tenant, const std::string& id) {
  auto p = parked_while_down(impl_->cluster.get(), tenant, id);
  if (!p) return p.error();
  return ParkedSandbox{p->host, p->settings["template"].is_string()
                                    ? p->settings["template"].as_string()
                                    : std::string("base")};
}

Reply<SandboxInfo> Runtime::wake_parked(const std::string& tenant, const std::string& id) {
  auto* cluster = impl_->cluster.get();
  auto p = parked_while_down(cluster, tenant, id);
  if (!p) return p.error();
  auto& env = *impl_->env;
  if (!env.object_store)
    return Rejection{Code::not_implemented, "sandbox " + id + "'s hibernation is in an object " +
                                                "store and this host has none (--object-store)"};
  auto store = env.object_store->under(p->prefix);
  if (!store) return Rejection{Code::internal, "not a key prefix: " + p->prefix};
  auto t0 = std::chrono::steady_clock::now();
  // Fetched onto the data disk (verified), then taken in onto tmpfs like a peer's snapshot.
  fs::path folder = fetched_dir(env) / ("wake-" + random_base32(12));
  std::error_code ec;
  fs::create_directories(folder.parent_path(), ec);
  storage::ChunkStats st;
  const uint64_t bound = (uint64_t(env.config.memory_mib) << 20) +
                         vmm::ReceiveLimits{}.max_state_bytes + kMaxParkedDiskBytes;
  auto fetched = storage::download_folder(*store, p->manifest, folder, &st, bound);
  double fetch_ms = ms_since(t0);
  const std::string not_fetched = "its hibernation could not be fetched from the object store: ";
  Reply<std::string> imported =
      fetched
          ? take_in(*this, tenant, folder)
          : Reply<std::string>(Rejection{Code::wake_failed, not_fetched + fetched.error().message});
  fs::remove_all(folder, ec);
  if (!imported) {
    spdlog::warn("cluster: {} (parked by host {}) not woken here: {}", id, p->host,
                 imported.error().message);
    return imported.error();
  }
  auto took = cluster->adopt(*p);
  if (!took || !*took) {
    discard_import(*imported);
    if (!took)
      return Rejection{Code::cluster_unavailable, "cannot reach etcd: " + took.error().message};
    return Rejection{Code::conflict, "sandbox " + id + " was taken over meanwhile (its host " +
                                         "is back, or another host woke it)"};
  }
  ImportRequest ir;
  std::vector<uint32_t> ports;
  ir.create = parked_create(tenant, p->settings, now_ms(), ports);
  ir.snapshot_id = *imported;
  ir.ids = {id};
  ir.from_host = p->host;
  auto started = start_imported(ir, /*claim=*/false);
  if (!started) {
    if (auto back = cluster->unadopt(*p); !back)
      spdlog::error("cluster: {} did not start here and could not be given back to host {}: {}", id,
                    p->host, back.error().message);
    return started.error();
  }
  for (auto port : ports)
    if (auto e = expose_port(tenant, id, port); !e)
      spdlog::warn("cluster: {}: port {} not exposed again: {}", id, port, e.error().message);
  // Woken: its copy in the store is spent (the chunks go with the owner's next collection).
  if (auto r = store->remove(p->manifest); !r)
    spdlog::warn("cluster: {}: manifest {} left in the store: {}", id, p->manifest,
                 r.error().message);
  spdlog::info(
      "cluster: woke {} here, parked by host {} (down): {} MiB fetched in {:.0f} ms ({} chunks), "
      "running after {:.0f} ms",
      id, p->host, st.sent_bytes >> 20, fetch_ms, st.chunks, ms_since(t0));
  return get(tenant, id);
}

}  // namespace pandastack::actors
