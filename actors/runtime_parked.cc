// Wake anywhere (issue 39): a sandbox hibernated on a host that is now down, woken on this one
// from the object store. The owner parked it (actors/cluster.h, Parked) once its hibernation's
// manifest was in the store; this host fetches that folder from the owner's prefix (every chunk
// verified by hash), takes it in as it would a peer's snapshot (vmm::SnapshotReceiver: sizes,
// layer hashes, the layer chain), takes the sandbox over in one etcd transaction (only while its
// host is down), and starts it as a migrated sandbox (its id, settings, ports). A named snapshot
// parked likewise serves creates while its host is down (Runtime::create_from_parked): the same
// fetch and take-in, then a new sandbox of this host's from it; nothing is taken over.
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

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The parked record of the tenant's `id` (a sandbox or a snapshot: `what`), whose owner is
// down: conflict when the owner is up (it serves it), host_unavailable when nothing of the
// tenant's is parked for it (as the routing answers any request for an id of a host that is down).
Reply<Parked> parked_while_down(Cluster* cluster, const std::string& tenant, const std::string& id,
                                const std::string& what = "sandbox") {
  if (cluster == nullptr)
    return Rejection{Code::cluster_disabled, "this daemon runs without --cluster"};
  auto owner = cluster->owner(id, /*fresh=*/true);
  if (owner.kind == Owner::Kind::error)
    return Rejection{Code::cluster_unavailable, "cannot reach etcd: " + owner.message};
  if (owner.kind != Owner::Kind::down)
    return Rejection{Code::conflict, what + " " + id + " is not on a host that is down (" +
                                         (owner.host.empty() ? "no owner" : owner.host) +
                                         "): that host serves it"};
  auto p = cluster->parked(id);
  if (!p) return Rejection{Code::cluster_unavailable, "cannot reach etcd: " + p.error().message};
  if (!*p || (**p).tenant != tenant || (**p).host != owner.host)
    return Rejection{Code::host_unavailable,
                     down_message(owner.host) + " (its copy is not in the object store)"};
  return std::move(**p);
}

// A folder the store sent (`what`: "hibernation", "snapshot"), taken in as a peer's snapshot
// would be (for `tenant`): the import's id. Failures are `failure` (wake_failed, start_failed).
Reply<std::string> take_in(Runtime& rt, const std::string& tenant, const fs::path& folder,
                           const std::string& what, Code failure) {
  auto snap = vmm::Snapshot::load(folder);
  if (!snap) return Rejection{failure, "the fetched " + what + ": " + snap.error().message};
  if (!snap->disk_dir.empty() && snap->disk_dir != folder)
    return Rejection{failure, "the fetched " + what + " names a disk folder elsewhere"};
  if (!snap->memory || !snap->volume_slots.empty())
    return Rejection{failure,
                     "the fetched " + what + " has no memory, or has volumes: it is not parkable"};
  auto offer = vmm::offer_of(*snap);
  if (!offer) return Rejection{failure, offer.error().message};
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
          return Rejection{failure, "cannot read " + (*f)->path().string()};
        if (auto w = (*intake)->write(i, off, buf.data(), n); !w) return w.error();
        off += n;
      }
  }
  if (auto c = (*intake)->commit(); !c) return c.error();
  return (*intake)->id();
}

// Parked copy `p` fetched from its host's prefix of the store onto the data disk (verified chunk
// by chunk, at most the host's guest RAM, device state and kMaxParkedDiskBytes), then taken in
// like a peer's snapshot: the import's id. `st`, `fetch_ms`: what the fetch took.
Reply<std::string> fetch_parked(Runtime& rt, Env& env, const Parked& p, const std::string& what,
                                Code failure, storage::ChunkStats& st, double& fetch_ms) {
  if (!env.object_store)
    return Rejection{Code::not_implemented, p.id + "'s " + what + " is in an object store " +
                                                "and this host has none (--object-store)"};
  auto store = env.object_store->under(p.prefix);
  if (!store) return Rejection{Code::internal, "not a key prefix: " + p.prefix};
  auto t0 = std::chrono::steady_clock::now();
  fs::path folder = fetched_dir(env) / ("fetch-" + random_base32(12));
  std::error_code ec;
  fs::create_directories(folder.parent_path(), ec);
  const uint64_t bound = (uint64_t(env.config.memory_mib) << 20) +
                         vmm::ReceiveLimits{}.max_state_bytes + kMaxParkedDiskBytes;
  auto fetched = storage::download_folder(*store, p.manifest, folder, &st, bound);
  fetch_ms = ms_since(t0);
  Reply<std::string> imported =
      fetched ? take_in(rt, p.tenant, folder, what, failure)
              : Reply<std::string>(Rejection{failure, "its " + what +
                                                          " could not be fetched from the object "
                                                          "store: " +
                                                          fetched.error().message});
  fs::remove_all(folder, ec);
  return imported;
}

// The template (its id) the parked sandbox, or the sandbox of the parked snapshot, was made of.
std::string parked_template(const Parked& p) {
  return p.settings["template"].is_string() ? p.settings["template"].as_string() : "base";
}

}  // namespace

Reply<Runtime::ParkedSandbox> Runtime::parked(const std::string& tenant, const std::string& id) {
  auto p = parked_while_down(impl_->cluster.get(), tenant, id);
  if (!p) return p.error();
  return ParkedSandbox{p->host, parked_template(*p)};
}

Reply<SandboxInfo> Runtime::wake_parked(const std::string& tenant, const std::string& id) {
  auto* cluster = impl_->cluster.get();
  auto p = parked_while_down(cluster, tenant, id);
  if (!p) return p.error();
  auto t0 = std::chrono::steady_clock::now();
  storage::ChunkStats st;
  double fetch_ms = 0;
  auto imported =
      fetch_parked(*this, *impl_->env, *p, "hibernation", Code::wake_failed, st, fetch_ms);
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
  if (auto store = impl_->env->object_store->under(p->prefix); store)
    if (auto r = store->remove(p->manifest); !r)
      spdlog::warn("cluster: {}: manifest {} left in the store: {}", id, p->manifest,
                   r.error().message);
  spdlog::info(
      "cluster: woke {} here, parked by host {} (down): {} MiB fetched in {:.0f} ms ({} chunks), "
      "running after {:.0f} ms",
      id, p->host, st.sent_bytes >> 20, fetch_ms, st.chunks, ms_since(t0));
  return get(tenant, id);
}

Reply<SandboxInfo> Runtime::create_from_parked(const CreateRequest& request) {
  if (!request.secrets.empty() || !request.header_rules.empty() || !request.volumes.empty())
    return Rejection{Code::not_implemented,
                     "a create from a snapshot whose host is down takes no secrets, network "
                     "rules or volumes yet: create through its host once it is back"};
  auto p =
      parked_while_down(impl_->cluster.get(), request.tenant, request.from_snapshot, "snapshot");
  if (!p) return p.error();
  auto& env = *impl_->env;
  // (Its network and egress policy as Runtime::create resolved them for a create from a
  // snapshot, which calls this; start_imported checks the policy again.)
  ImportRequest ir;
  ir.create = request;
  ir.create.from_snapshot.clear();
  ir.create.template_name = parked_template(*p);
  if (auto no = Env::shape_admits(env.template_shape(ir.create.template_name), request.memory_mib,
                                  request.vcpus, ir.create.template_name))
    return *no;
  auto t0 = std::chrono::steady_clock::now();
  storage::ChunkStats st;
  double fetch_ms = 0;
  auto imported = fetch_parked(*this, env, *p, "snapshot", Code::start_failed, st, fetch_ms);
  if (!imported) {
    spdlog::warn("cluster: no sandbox from snapshot {} (parked by host {}) here: {}", p->id,
                 p->host, imported.error().message);
    return imported.error();
  }
  ir.snapshot_id = *imported;
  ir.ids = {""};
  ir.from_host = p->host;
  auto started = start_imported(ir, /*claim=*/true);
  if (!started) return started.error();
  spdlog::info(
      "cluster: {} created here from snapshot {}, parked by host {} (down): {} MiB fetched in "
      "{:.0f} ms ({} chunks), running after {:.0f} ms",
      started->front().id, p->id, p->host, st.sent_bytes >> 20, fetch_ms, st.chunks, ms_since(t0));
  return started->front();
}

}  // namespace pandastack::actors
