#include "actors/env.h"

#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>

#include <fstream>

#include "actors/custom_template.h"
#include "vmm-driver/accel.h"
#include "vmm-driver/images.h"
#include "vmm-driver/memory_base.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

std::optional<uint32_t> Env::take_subnet() {
  std::lock_guard lock(subnets_mu);
  for (uint32_t i = 0; i < subnet_capacity; ++i) {
    uint32_t idx = (subnet_next + i) % subnet_capacity;
    if (subnets_used.insert(idx).second) {
      subnet_next = (idx + 1) % subnet_capacity;
      return idx;
    }
  }
  return std::nullopt;
}

void Env::release_subnet(uint32_t idx) {
  std::lock_guard lock(subnets_mu);
  subnets_used.erase(idx);
}

void Env::own(vmm::Network& n) {
  n.set_on_release([this](uint32_t idx) { release_subnet(idx); });
  if (!egress_watcher) return;
  auto watch = egress_watcher->watch(n.netns_fd(), n.egress_log());
  if (watch)
    n.set_egress_watch(std::move(*watch));
  else  // (the sandbox works; its log lacks connections)
    spdlog::warn("network {}: connections are not logged: {}", n.netns(), watch.error().message);
}

std::shared_ptr<vmm::EgressLog> Env::egress_log(const std::string& id, bool create) {
  std::lock_guard l(egress_mu);
  auto it = egress_logs.find(id);
  if (it != egress_logs.end()) return it->second;
  if (!create) return nullptr;
  return egress_logs[id] = std::make_shared<vmm::EgressLog>();
}

void Env::forget_egress_log(const std::string& id) {
  std::lock_guard l(egress_mu);
  egress_logs.erase(id);
}

vmm::Result<std::shared_ptr<vmm::Network>> Env::make_network(const Egress& egress) {
  auto idx = take_subnet();
  if (!idx)
    return vmm::make_error(vmm::ErrorCode::invalid_argument,
                           "subnet pool " + config.net.pool_cidr + " is exhausted");
  auto n = vmm::Network::create(config.net, *idx, to_policy(egress));
  if (!n) {
    release_subnet(*idx);
    return n.error();
  }
  own(**n);
  return n;
}

vmm::EgressPolicy Env::to_policy(const Egress& e) {
  vmm::EgressPolicy p;
  p.mode = vmm::egress_mode_from_string(e.mode).value_or(vmm::EgressPolicy::Mode::deny_all);
  p.cidrs = e.cidrs;
  p.domains = e.domains;
  return p;
}

std::pair<std::string, vmm::VmPool::NetworkFactory> Env::pool_mode(bool networked) {
  if (!config.network) return {"", nullptr};
  if (!networked) return {"-nonet", nullptr};
  return {"", [this] { return make_network(Egress{}); }};
}

std::shared_ptr<const vmm::MemoryBase> Env::memory_base_of(const vmm::Snapshot& snap) {
  if (!config.share_memory || !snap.memory) return nullptr;
  // One per snapshot: the template's networked and network-less pools share it.
  for (auto& [name, entry] : pools)
    if (entry.second && entry.first == snap.dir.string() && entry.second->memory_base())
      return entry.second->memory_base();
  auto made = vmm::MemoryBase::make(snap.mem(), config.state_dir / "ram-copies");
  if (made) return *made;
  spdlog::warn("no memory base for {}: its sandboxes copy its RAM file: {}", snap.dir.string(),
               made.error().message);
  return nullptr;
}

vmm::RestorePool* Env::pool_for(const std::string& template_name, const vmm::Snapshot& snap,
                                bool networked) {
  // A warm member's guest runs before it has a sandbox: one whose snapshot has volumes mounted
  // (a template's baked data volume) would run on an empty slot. Those restore into spares.
  if (config.pool_size == 0 || !snap.volume_slots.empty()) return nullptr;
  auto [suffix, factory] = pool_mode(networked);
  std::lock_guard lock(pools_mu);
  auto& [dir, pool] = pools[template_name + suffix];
  if (!pool || dir != snap.dir.string()) {
    auto base = vm_config(template_name, "pool", "pool-" + template_name + suffix);
    pool = std::make_unique<vmm::RestorePool>(io, snap, base, config.pool_size, factory,
                                              vmm::PoolDemand{}, memory_base_of(snap));
    dir = snap.dir.string();
  }
  return pool.get();
}

vmm::SparePool* Env::spares_for(const std::string& template_name, bool networked) {
  if (config.spare_pool_size == 0) return nullptr;
  auto [suffix, factory] = pool_mode(networked);
  std::lock_guard lock(pools_mu);
  auto& pool = spares[template_name + suffix];
  if (!pool) {
    auto base = vm_config(template_name, "spare", "spare-" + template_name + suffix);
    pool = std::make_unique<vmm::SparePool>(io, base, config.spare_pool_size, factory);
  }
  return pool.get();
}

fs::path Env::run_dir(const std::string& name) const { return config.state_dir / "run" / name; }

fs::path Env::snapshot_dir(const std::string& snap) const {
  return config.state_dir / "snapshots" / snap;
}

fs::path Env::hibernated_dir(const std::string& id) const {
  return config.state_dir / "hibernated" / id;
}

fs::path Env::disk_twin(const fs::path& state_folder) const {
  return config.disk_dir / state_folder.lexically_relative(config.state_dir);
}

vmm::VmConfig Env::vm_config(const std::string& template_name, const std::string& id,
                             const std::string& run_name) const {
  auto c = templates->config(template_name, run_dir(run_name));
  c.accel = config.accel;
  auto shape = template_shape(template_name);
  c.vcpus = shape.vcpus;
  c.memory_mib = shape.memory_mib;
  c.jail = config.jail;
  c.disk_dir = disk_twin(c.run_dir);
  c.die_with_parent = !config.vms_outlive_host;
  c.cpu_weight = config.vm_cpu_weight;
  c.cpu_max_percent = config.vm_cpu_max_percent;
  c.hostname = id;
  for (auto& ch : c.hostname)
    if (ch == '_') ch = '-';
  return c;
}

Env::Shape Env::template_shape(const std::string& template_name) const {
  Shape s{config.memory_mib, config.vcpus};
  std::ifstream f(vmm::template_dir(config.images_dir, config.custom_templates_dir, template_name) /
                  "shape");
  uint32_t mib = 0, vcpus = 0;
  // (the daemon's own file; bounded anyway: a bad one is the host's shape, and logged)
  if (f >> mib >> vcpus) {
    if (mib >= 64 && mib <= (1u << 20) && vcpus >= 1 && vcpus <= 1024) return {mib, vcpus};
    spdlog::warn("template {}: its shape file says {} MiB and {} vCPUs: the host's shape is used",
                 template_name, mib, vcpus);
  }
  return s;
}

std::optional<Rejection> Env::shape_admits(const Shape& shape, uint32_t memory_mib, uint32_t vcpus,
                                           const std::string& template_name) {
  auto name = template_display_name(template_name);
  if (memory_mib > shape.memory_mib)
    return Rejection{Code::exceeds_template,
                     "template " + name + " is baked with " + std::to_string(shape.memory_mib) +
                         " MiB of memory: a sandbox of it may not ask for " +
                         std::to_string(memory_mib)};
  if (vcpus > shape.vcpus)
    return Rejection{Code::exceeds_template,
                     "template " + name + " is baked with " + std::to_string(shape.vcpus) +
                         " vCPUs: a sandbox of it may not ask for " + std::to_string(vcpus)};
  return std::nullopt;
}

std::optional<Env::DataVolume> Env::template_data_volume(const std::string& template_name) const {
  std::ifstream spec(
      vmm::template_dir(config.images_dir, config.custom_templates_dir, template_name) /
      "data_volume");
  DataVolume d;
  if (!(spec >> d.mib >> d.mount)) return std::nullopt;
  return d;
}

void Env::forget_template(const std::string& template_name) {
  std::vector<std::unique_ptr<vmm::RestorePool>> gone_pools;  // (stopped outside the lock)
  std::vector<std::unique_ptr<vmm::SparePool>> gone_spares;
  {
    std::lock_guard lock(pools_mu);
    for (auto networked : {true, false}) {  // (keyed by template and network mode: pool_mode)
      auto key = template_name + pool_mode(networked).first;
      if (auto p = pools.find(key); p != pools.end()) {
        gone_pools.push_back(std::move(p->second.second));
        pools.erase(p);
      }
      if (auto s = spares.find(key); s != spares.end()) {
        gone_spares.push_back(std::move(s->second));
        spares.erase(s);
      }
    }
  }
  std::lock_guard lock(staged_mu);
  if (auto it = staged.find(template_name); it != staged.end()) {
    vmm::remove_snapshot(it->second.dir, it->second.disk_dir);
    staged.erase(it);
  }
}

vmm::Result<vmm::Snapshot> Env::template_snapshot(const std::string& template_name) {
  {
    std::lock_guard lock(staged_mu);
    auto it = staged.find(template_name);
    if (it != staged.end() && fs::exists(it->second.dir / "meta.json")) return it->second;
  }
  auto baked = templates->baked(template_name, vm_config(template_name, "shape", "shape"));
  if (!baked) return baked.error();
  auto staged_dir = config.state_dir / "templates" / baked->dir.filename();
  auto s = vmm::stage_snapshot(*baked, staged_dir, disk_twin(staged_dir));
  if (!s) return s.error();
  std::lock_guard lock(staged_mu);
  staged[template_name] = *s;
  return *s;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_base32(size_t n) {
  static const char* a = "abcdefghijklmnopqrstuvwxyz234567";
  std::string raw(n, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), int(n));
  std::string out;
  for (unsigned char c : raw) out += a[c & 31];
  return out;
}

SandboxInfo info_of(const SandboxState& s) {
  SandboxInfo i;
  i.id = s.id;
  i.tenant = s.tenant;
  i.template_name = s.template_name;
  i.parent = s.parent;
  i.status = s.status;
  i.metadata = s.metadata;
  i.created_at_ms = s.created_at_ms;
  i.expires_at_ms = s.expires_at_ms;
  i.persistent = s.persistent;
  i.auto_wake = s.auto_wake;
  i.ttl_seconds = s.ttl_seconds;
  i.idle_timeout_seconds = s.idle_timeout_seconds;
  i.on_timeout = s.on_timeout;
  i.snapshots = s.snapshots;
  i.snapshot_names = s.snapshot_names;
  i.durable_snapshots = s.durable_snapshots;
  i.snapshot_manifests = s.snapshot_manifests;
  i.timeout_disk_only = s.timeout_disk_only;
  i.hibernated_disk_only = s.hibernated_disk_only;
  i.hibernation_durable = s.hibernation_durable;
  i.hibernation_remote = !s.hibernation_manifest.empty();
  i.hibernation_manifest = s.hibernation_manifest;
  i.failure_reason = s.failure_reason;
  i.version = s.version;
  i.network = s.network;
  i.egress = s.egress;
  i.ports = s.ports;
  i.volumes = s.volumes;
  i.previews = s.previews;
  i.moved_to = s.moved_to;
  i.vcpus = s.vcpus;
  i.memory_mib = s.memory_mib;
  return i;
}

Rejection not_found(const std::string& id) {
  return Rejection{Code::sandbox_not_found, "no sandbox " + id};
}

void expose_ports(vmm::Network& n, const std::set<uint32_t>& ports, const std::string& host,
                  const std::string& id) {
  for (auto p : ports) {
    auto e = n.expose(uint16_t(p), host);
    if (!e) spdlog::warn("sandbox {}: port {} not exposed: {}", id, p, e.error().message);
  }
}

std::string new_sandbox_id() { return "sbx_" + random_base32(16); }

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t value = 0;
  while (in >> key >> value >> unit) {
    if (key == "MemTotal:") m.total_kib = value;
    if (key == "MemAvailable:") m.available_kib = value;
  }
  return m;
}

void settle_host(RuntimeConfig& config, const std::string& accel, const std::string& dns) {
  std::string upstream = dns;
  if (upstream.empty()) {
    std::ifstream rc("/etc/resolv.conf");
    std::string text((std::istreambuf_iterator<char>(rc)), std::istreambuf_iterator<char>());
    upstream = vmm::first_nameserver(text);
  }
  config.net.dns_upstream = upstream == "off" ? "" : upstream;
  // The probe's VM runs in the data folder (root's, not a shared /tmp); its answer is cached
  // there (DATA/accel.json): only the first start on a host waits for it.
  auto probe = vmm::config_for_template(config.images_dir, "base", config.data_dir / "kvm-probe");
  probe.memory_mib = config.memory_mib;
  config.accel =
      vmm::detect_accel_cached(probe, std::chrono::seconds(10), accel == "auto" ? "" : accel,
                               config.data_dir / "accel.json");
}

const char* accel_name(const RuntimeConfig& config) {
  return config.accel == vmm::Accel::kvm ? "kvm" : "tcg";
}

Quotas Env::quotas_of(const std::string& tenant) {
  std::lock_guard l(quotas_mu);
  auto it = tenant_quotas.find(tenant);
  return it == tenant_quotas.end() ? config.quotas : it->second;
}

std::optional<Rejection> Env::host_admits(uint64_t memory_mib) const {
  uint32_t headroom = config.host_headroom_percent;
  if (headroom == 0) return std::nullopt;
  auto [total_kib, available_kib] = host_memory();
  uint64_t need_kib = memory_mib * 1024;
  if (total_kib > 0 && available_kib < need_kib + total_kib * headroom / 100)
    return Rejection{Code::host_full, "the host has " + std::to_string(available_kib / 1024) +
                                          " MiB of memory available; " +
                                          std::to_string(memory_mib) +
                                          " MiB more would leave less than its " +
                                          std::to_string(headroom) + "% headroom: try again later"};
  // The file systems a new VM writes to: guest RAM on the state folder; its disk layers on the disk
  // folder; its events on the data folder (the store: a full store disk fails every write, so
  // creates stop well before that).
  auto folder_admits = [&](const std::filesystem::path& dir, const char* what,
                           uint64_t need) -> std::optional<Rejection> {
    struct statvfs v {};
    if (dir.empty() || ::statvfs(dir.c_str(), &v) != 0 || v.f_blocks == 0) return std::nullopt;
    uint64_t size = uint64_t(v.f_blocks) * v.f_frsize, free = uint64_t(v.f_bavail) * v.f_frsize;
    if (free >= need + size / 100 * headroom) return std::nullopt;
    return Rejection{Code::host_full,
                     std::string("the ") + what + " " + dir.string() + " has " +
                         std::to_string(free >> 20) + " MiB free; " +
                         (need ? std::to_string(need >> 20) + " MiB more" : "a sandbox") +
                         " would leave less than its " + std::to_string(headroom) + "% headroom"};
  };
  if (auto r = folder_admits(config.state_dir, "state folder", memory_mib << 20)) return r;
  if (auto r = folder_admits(config.disk_dir, "disk folder", 0)) return r;
  if (auto r = folder_admits(config.data_dir, "data folder", 0)) return r;
  return std::nullopt;
}

}  // namespace pandastack::actors
