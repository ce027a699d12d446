// What every actor of the runtime shares (no CAF here): the configuration, the event store, the
// VMM driver's I/O thread, template bakes, warm pools and spares, the host subnet book-keeping,
// and VMs re-adopted at recovery. Owned by Runtime::Impl, which outlives the actor system.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <stop_token>
#include <string>
#include <utility>

#include "actors/runtime.h"
#include "storage/event_store.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/pool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/templates.h"
#include "vmm-driver/vm_watcher.h"

namespace pandastack::storage {
class ObjectStore;
}

namespace pandastack::actors {

class Secrets;  // (actors/secrets.h)
class Cluster;  // (actors/cluster.h)
}  // namespace pandastack::actors
namespace pandastack::vmm {
class ProxyHost;  // (vmm-driver/egress_proxy_host.h)
}  // namespace pandastack::vmm
namespace pandastack::actors {

// One sandbox's VM, shared by its VM worker (which creates, snapshots and destroys it under the
// exclusive lock) and the callers of agent operations (exec, files, processes), which run
// concurrently under the shared lock on their own threads. Hibernate and kill first cancel the
// calls in flight, so they never wait for a long command.
struct VmHandle {
  std::shared_mutex mu;
  std::unique_ptr<vmm::Vm> vm;  // guarded by mu
  // Which VM incarnation runs (bumped by the VM worker for every VM it installs): a report that
  // a VM died names its incarnation, so a report about an earlier VM is ignored.
  std::atomic<uint64_t> generation{0};
  uint64_t watch_token = 0;  // the VM watcher's, for the current VM (VM worker only)
  // Activity, for the idle timeout: agent calls in flight, and when the last one ended.
  std::atomic<int> calls_in_flight{0};
  std::atomic<int64_t> last_call_ms{0};

  // Cancels every agent call in flight (their stop tokens fire).
  void cancel_calls() {
    std::lock_guard l(stop_mu_);
    stop_->request_stop();
    stop_ = std::make_shared<std::stop_source>();
  }
  std::shared_ptr<std::stop_source> calls_stop() {
    std::lock_guard l(stop_mu_);
    return stop_;
  }

 private:
  std::mutex stop_mu_;
  std::shared_ptr<std::stop_source> stop_ = std::make_shared<std::stop_source>();
};

struct Env {
  RuntimeConfig config;
  std::unique_ptr<storage::EventStore> store;
  vmm::IoThread io;
  std::unique_ptr<vmm::TemplateStore> templates;
  std::mutex staged_mu;
  std::map<std::string, vmm::Snapshot> staged;  // template -> baked snapshot staged in state_dir
  // Adoption after a restart (VMs that outlived the previous host process): at most this many at
  // once (each has its own deadline), and where it stands, for /healthz.
  static constexpr int kAdoptAtOnce = 8;
  std::mutex adopt_mu;
  std::condition_variable adopt_cv;
  int adopting_now = 0;
  std::atomic<uint64_t> to_adopt{0}, adopted{0}, adopt_failed{0};
  // Pre-spawned QEMU processes per template, for the staged snapshot they wait for. (Declared
  // after `io`: destroyed first, killing the idle processes.)
  std::mutex pools_mu;
  std::map<std::string, std::pair<std::string, std::unique_ptr<vmm::RestorePool>>> pools;
  // Spare QEMU processes per template (and per template without network).
  std::map<std::string, std::unique_ptr<vmm::SparePool>> spares;

  // Watches every sandbox network's connections and denials (for the egress logs); each
  // sandbox's egress log, which outlives its VMs (hibernate, wake), dropped with the sandbox.
  std::unique_ptr<vmm::EgressWatcher> egress_watcher = std::make_unique<vmm::EgressWatcher>();
  std::mutex egress_mu;
  std::map<std::string, std::shared_ptr<vmm::EgressLog>> egress_logs;
  // The sandbox's log (made when `create`; else null when it has none).
  std::shared_ptr<vmm::EgressLog> egress_log(const std::string& id, bool create);
  void forget_egress_log(const std::string& id);

  // Tenant secrets (Runtime::Impl's; null in tests without them) and the egress proxies that put
  // bound secrets into sandboxes' requests (one thread, made at the first sandbox with secrets).
  Secrets* secrets = nullptr;
  // The object store hibernations go to (RuntimeConfig::object_store), or null.
  std::shared_ptr<storage::ObjectStore> object_store;
  // Cluster mode (set by Runtime::join_cluster, after recovery started the actors): where the
  // snapshot uploader parks hibernations (actors/parked.h). Null without a cluster.
  std::shared_ptr<Cluster> cluster() {
    std::lock_guard l(cluster_mu);
    return cluster_;
  }
  void set_cluster(std::shared_ptr<Cluster> c) {
    std::lock_guard l(cluster_mu);
    cluster_ = std::move(c);
  }
  std::mutex proxy_mu;
  std::shared_ptr<vmm::ProxyHost> proxies;
  std::shared_ptr<vmm::ProxyHost> proxy_host();

  // Reports VMs that die on their own (VmHandle::generation says which); null once shut down.
  std::unique_ptr<vmm::VmWatcher> watcher = std::make_unique<vmm::VmWatcher>();
  std::atomic<uint64_t> vm_exits{0};  // VMs that died on their own, for metrics
  MetricsStore metrics;               // each sandbox's resource use over time

  // Quotas: tenants an admin gave their own (the others have config.quotas; loaded from the store
  // at start), and commands running per tenant (the execs quota).
  std::mutex quotas_mu;
  std::map<std::string, Quotas> tenant_quotas;
  std::map<std::string, uint32_t> execs_running;
  Quotas quotas_of(const std::string& tenant);
  // The host's answer to `memory_mib` more guest RAM: 503 host_full when it would leave less than
  // config.host_headroom_percent of host memory (MemAvailable) or of the state folder's file
  // system free.
  std::optional<Rejection> host_admits(uint64_t memory_mib) const;

  // Host subnets in use (by sandboxes' VMs and waiting pool members). Persisted through the
  // sandboxes' network_attached events: recovery marks the adopted VMs' subnets used again.
  std::mutex subnets_mu;
  std::set<uint32_t> subnets_used;

  uint32_t subnet_capacity = 0, subnet_next = 0;

  std::optional<uint32_t> take_subnet();
  void release_subnet(uint32_t idx);
  // Makes `n` give its subnet back to this pool when it is released.
  void own(vmm::Network& n);
  // A new sandbox network on a free subnet, with `egress`.
  vmm::Result<std::shared_ptr<vmm::Network>> make_network(const Egress& egress);
  static vmm::EgressPolicy to_policy(const Egress& e);

  // Pools (warm and spare) are per template and network mode. With networking on, members wait
  // on networks of their own (deny_all until claimed), and sandboxes without a network have pools
  // of their own, made on first use. The mode's name suffix ("" or "-nonet") and its factory.
  std::pair<std::string, vmm::VmPool::NetworkFactory> pool_mode(bool networked);
  // The template's warm pool for `snap` (a new one when the template was baked again), or null.
  vmm::RestorePool* pool_for(const std::string& template_name, const vmm::Snapshot& snap,
                             bool networked);
  // The sealed copy of `snap`'s RAM its pools' VMs map (config.share_memory; one per snapshot),
  // or null: each VM copies the RAM file.
  std::shared_ptr<const vmm::MemoryBase> memory_base_of(const vmm::Snapshot& snap);
  // The template's spares (made on first use), or null.
  vmm::SparePool* spares_for(const std::string& template_name, bool networked);

  // Volume files (actors/volume_files.h): data_dir/volumes, on a real disk.
  std::filesystem::path volumes_dir() const { return config.data_dir / "volumes"; }
  std::filesystem::path run_dir(const std::string& name) const;
  std::filesystem::path snapshot_dir(const std::string& snap) const;
  std::filesystem::path hibernated_dir(const std::string& id) const;
  // A hibernation's durable copy (vmm::persist_snapshot): data_dir/hibernations/<id>, on a real
  // disk; what a wake after a host reboot (tmpfs emptied) restores.
  std::filesystem::path persisted_dir(const std::string& id) const {
    return config.data_dir / "hibernations" / id;
  }
  // A named snapshot's durable copy: data_dir/snapshots/<id> (its layers hard links of those in
  // its disk twin); what recovery stages back after a host reboot emptied tmpfs.
  std::filesystem::path persisted_snapshot_dir(const std::string& snap) const {
    return config.data_dir / "snapshots" / snap;
  }
  // The disk twin of a state_dir folder (config.disk_dir, same layout): where its disks live.
  std::filesystem::path disk_twin(const std::filesystem::path& state_folder) const;

  // A template's guest shape: a custom template's own (IMAGES/<template>/shape: "<memory MiB>
  // <vCPUs>", written by its build or publish), else the host's (--memory-mib, --vcpus).
  struct Shape {
    uint32_t memory_mib = 0, vcpus = 0;
  };
  Shape template_shape(const std::string& template_name) const;
  // Why a create asking for `memory_mib` and `vcpus` (0: not asked) may not have a sandbox of
  // `shape`: exceeds_template when it asks for more than the template was baked with.
  static std::optional<Rejection> shape_admits(const Shape& shape, uint32_t memory_mib,
                                               uint32_t vcpus, const std::string& template_name);

  // `run_name`: the VM's run folder (one per VM incarnation, so a VM still being torn down never
  // shares files with its successor). Its memory and vCPUs are the template's (template_shape).
  vmm::VmConfig vm_config(const std::string& template_name, const std::string& id,
                          const std::string& run_name) const;

  // A deleted custom template: its warm pools and spares stop, its staged snapshot goes.
  void forget_template(const std::string& template_name);
  // The template's baked snapshot, staged next to the run folders (bakes once; blocking).
  vmm::Result<vmm::Snapshot> template_snapshot(const std::string& template_name);
  // A template baked with a data volume (its recipe's data_volume_mib/mount): each sandbox of it
  // gets a copy of the baked volume at slot 0. Read from IMAGES/<template>/data_volume.
  struct DataVolume {
    uint64_t mib = 0;
    std::string mount;
  };
  std::optional<DataVolume> template_data_volume(const std::string& template_name) const;

 private:
  std::mutex cluster_mu;
  std::shared_ptr<Cluster> cluster_;
};

int64_t now_ms();
std::string random_base32(size_t n);
SandboxInfo info_of(const SandboxState& s);
Rejection not_found(const std::string& id);

// Forwards a sandbox's recorded guest ports on its (new or adopted) network; a port that cannot
// be forwarded is logged and stays recorded (GET .../ports shows it without a host port).
void expose_ports(vmm::Network& n, const std::set<uint32_t>& ports, const std::string& host,
                  const std::string& id);

}  // namespace pandastack::actors
