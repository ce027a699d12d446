// The actor runtime: one CAF actor per sandbox (event-sourced through the event store), a
// registry that owns the id space and supervises them, a TTL reaper, template bakes through the
// VMM driver, recovery by replay on start and a graceful shutdown. This header is the blocking
// facade the daemon and tests use; CAF stays inside runtime.cc.
//
// Every sandbox command is decided purely (sandbox.h), its events are appended to the sandbox's
// stream with the expected version, applied, and only then are side effects (VMM driver) run, on
// detached workers, never on CAF's shared threads. Replies come when the effect is done: create
// returns a running sandbox, hibernate a hibernated one.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/custom_template.h"
#include "actors/database.h"
#include "actors/metrics.h"
#include "actors/quotas.h"
#include "actors/sandbox.h"
#include "actors/snapshot_exchange.h"
#include "actors/volume.h"
#include "storage/header_rule.h"
#include "vmm-driver/agent_client.h"
#include "vmm-driver/network.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors {

class Cluster;
class Secrets;

// How many volumes a sandbox can have (its VM's block slots).
inline constexpr uint32_t kVolumeSlots = vmm::kVolumeSlots;
struct BuildProgress;
struct ImageUpload;
struct BuildContextInfo;

struct RuntimeConfig {
  std::filesystem::path data_dir;    // the event store lives in data_dir/store
  std::filesystem::path images_dir;  // guest images (make guest)
  // VM run folders, snapshots and hibernated sandboxes (RAM files): tmpfs, kept across restarts
  // of the host process. Empty: /dev/shm/pandastack-<hash of data_dir>.
  std::filesystem::path state_dir;
  // Guest disks (every VM's overlays, snapshots' and hibernations' disk layers): a folder on a
  // real disk mirroring state_dir's layout, so disk writes are not host RAM. Empty: data_dir/disks.
  std::filesystem::path disk_dir;
  // Custom templates' images (actors/custom_template.h). Empty: data_dir/templates.
  std::filesystem::path custom_templates_dir;
  // Custom template builds (actors/template_builds.h): offered (false: 501), each within this
  // time (its builder VM and its package downloads), fetching at most this many MiB of .deb
  // files; the host's package cache keeps at most cache MiB (pruned oldest first).
  bool template_builds = true;
  std::chrono::seconds template_build_timeout{1800};
  uint64_t template_packages_max_mib = 2048;
  uint64_t template_cache_max_mib = 2048;
  uint32_t max_template_builds = 1;  // at once on this host (more: 429)
  uint32_t max_templates = 10;       // custom templates per tenant (built, building or failed)
  // Image imports (actors/image_import.h): an archive's size at most (413 beyond), its root disk
  // at most; the static busybox an image without a /bin/sh gets as its shell.
  uint64_t template_image_max_mib = 4096;
  uint64_t template_image_disk_max_mib = 65536;
  std::filesystem::path busybox = "/bin/busybox";
  // Dockerfile build contexts as archives (actors/build_context.h): one's size at most (413
  // beyond), the archives a tenant keeps (the least recently used go first beyond it).
  uint64_t build_context_max_mib = 1024;
  uint32_t max_build_contexts = 64;
  // Registries an image pull may reach over plain http (host:port; loopback ones always may).
  std::vector<std::string> insecure_registries;
  // The object store hibernations are uploaded to (storage/object_store.h: a URL and a
  // credentials file); "" = none (hibernations stay on this host's data disk).
  std::string object_store, object_store_credentials;
  // How long after a manifest is removed its unreferenced chunks are collected (removals within
  // it are collected together).
  std::chrono::seconds object_store_gc_delay{60};
  vmm::Accel accel = vmm::Accel::tcg;
  unsigned vcpus = 1;
  unsigned memory_mib = 256;
  Limits limits;
  std::chrono::milliseconds reaper_interval{1000};
  // An ended sandbox (stopped or failed) answers get, list and kill for this long after it
  // ended, then it is retired: forgotten by the registry, skipped by recovery (its events stay in
  // the audit log). At most kMaxEndedRecords are kept however young. Sandboxes holding named
  // snapshots, running a database or moved to another host are kept while they do.
  std::chrono::seconds ended_retention{900};
  static constexpr size_t kMaxEndedRecords = 1000;
  // A state snapshot of a sandbox every this many events; recovery replays only the tail after it.
  uint32_t snapshot_every = 64;
  // QEMU processes kept pre-spawned per template (waiting for the baked state: they hold no guest
  // state, so no sandbox is reused); creates from a template take one. 0 = restore from scratch.
  uint32_t pool_size = 2;
  // Spare QEMU processes kept per template (Vm::spare: for any snapshot of its shape) for the
  // restores a template pool cannot serve: fork children, wakes, creates from named snapshots.
  // 0 = those start a QEMU process of their own.
  uint32_t spare_pool_size = 1;
  // Sandboxes created from a template map its RAM copy-on-write from one sealed copy
  // (vmm::MemoryBase) and cost the host the pages their guests write; off: each copies the RAM
  // file (and gives back the memory its guest frees, which a shared mapping cannot on QEMU 7.2).
  bool share_memory = true;
  bool jail = true;
  // VMs keep running when the host process dies (a crash); the next start re-adopts the VMs of
  // running sandboxes. Off: QEMU gets the parent-death signal and dies with its host.
  bool vms_outlive_host = true;
  // Sandbox networking (vmm-driver/network.h; needs root, ip and nft). Off: every sandbox is
  // created without a network and asking for one is refused (network_disabled).
  bool network = false;
  vmm::NetworkSettings net;
  // Certificates (PEM) the egress proxy trusts for upstream hosts besides the system's store
  // (--egress-trust-ca: a corporate CA, a test's own).
  std::vector<std::string> egress_trusted_cas;
  Egress default_egress;  // for creates that name no policy (deny_all unless configured)
  std::string ports_host = "127.0.0.1";  // where exposed guest ports listen on the host
  // Each VM's cgroup: CPU (and IO) weight against the daemon's 100, and a CPU ceiling in percent
  // of one CPU (0 = none). See vmm::VmConfig.
  uint32_t vm_cpu_weight = 50;
  uint32_t vm_cpu_max_percent = 0;
  // How often each running sandbox's resource use is sampled (actors/metrics.h; 0: never).
  std::chrono::milliseconds metrics_interval{5000};
  // How often a sandbox's egress log is summed up into its audit log (an `egress-summary` event,
  // when it reached anything in the period); its last period is recorded when it ends.
  std::chrono::milliseconds egress_summary_interval{300'000};
  // Quotas every tenant gets unless an admin set its own (PUT /v1/quotas/{tenant}).
  Quotas quotas;
  // Creates, forks and wakes are refused (503 host_full) when they would leave less than this
  // share of host memory, or of the state folder's file system, free.
  uint32_t host_headroom_percent = 10;
  VolumeLimits volume_limits;
};

struct SandboxInfo {
  std::string id, tenant, template_name, parent;
  SandboxStatus status = SandboxStatus::none;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0, expires_at_ms = 0;
  bool persistent = false, auto_wake = false;
  uint32_t ttl_seconds = 0, idle_timeout_seconds = 0;
  ReapAction on_timeout = ReapAction::kill;
  bool timeout_disk_only = false;     // a hibernation at its timeout keeps only the disk
  bool hibernated_disk_only = false;  // hibernated with its disk only (a wake boots on it)
  // Hibernated, and its hibernation has a synced copy on the data disk: it survives a reboot.
  bool hibernation_durable = false;
  bool hibernation_remote = false;   // and in the object store (hibernation_uploaded)
  std::string hibernation_manifest;  // (remote) its manifest's key there
  std::vector<std::string> snapshots;
  std::map<std::string, std::string> snapshot_names;  // snapshot id -> the name it was taken with
  std::set<std::string> durable_snapshots;  // of `snapshots`: a synced copy is on the data disk
  std::map<std::string, std::string> snapshot_manifests;  // of those: in the object store
  std::string failure_reason;
  uint64_t version = 0;  // events applied (the stream's length)
  bool network = false;
  Egress egress;
  std::set<uint32_t> ports;              // exposed guest ports
  std::map<uint32_t, Preview> previews;  // guest port -> preview URL (gateway/previews.h)
  std::vector<SandboxVolume> volumes;
  std::string moved_to;                // ended here by a migration to this host (cluster mode)
  uint32_t vcpus = 0, memory_mib = 0;  // its guest's shape (its template's)
};

// Adds what sandbox `i` holds to `u` (its tenant's quota use): its memory per VM (`memory_mib`
// when its record has none).
void count_use(const SandboxInfo& i, uint64_t memory_mib, QuotaUse& u);

// An exposed guest port: where the host forwards it from (host_port 0 while the VM is not running).
struct PortInfo {
  uint32_t port = 0;
  std::string host;
  uint16_t host_port = 0;
};

struct CreateRequest {
  std::string tenant, template_name = "base";
  uint32_t ttl_seconds = 0;  // 0 = the default
  std::map<std::string, std::string> metadata;
  bool persistent = false, auto_wake = false;
  uint32_t idle_timeout_seconds = 0;     // 0 = none
  std::optional<ReapAction> on_timeout;  // nullopt: hibernate when persistent, else kill
  bool timeout_disk_only = false;        // a hibernation at its timeout keeps only the disk
  std::string from_snapshot;             // a snapshot id taken from one of the tenant's sandboxes
  std::optional<bool> network;           // nullopt: on when the runtime has networking
  std::optional<Egress> egress;          // nullopt: RuntimeConfig::default_egress
  // Volumes to attach (up to kVolumeSlots), mounted in the guest when the create returns.
  struct Volume {
    std::string volume, mount;
    bool read_only = false;
  };
  std::vector<Volume> volumes;
  // The guest shape asked for (0: not asked). A sandbox has its template's (baked into its
  // snapshot): asking for more is refused (exceeds_template); asking for less gets the template's.
  uint32_t memory_mib = 0, vcpus = 0;
  // Tenant secrets the sandbox's requests may carry (actors/secrets.h): its processes get a
  // placeholder for each, its egress proxy puts the values into requests to their hosts.
  std::vector<std::string> secrets;
  // Headers its HTTPS requests to some hosts get (E2B's network rules; actors/header_rules.h),
  // their values naming secrets as ${e2b.secrets.NAME}. They do not open the egress policy.
  std::vector<storage::HeaderRule> header_rules;
};
// A volume (actors/volume.h): a file on the data disk that outlives sandboxes.
struct VolumeInfo {
  std::string id, tenant, name;
  std::string origin;  // "" (made empty), or what it is a copy of: "fork:<sandbox>:<volume>",
                       // "snapshot:<snapshot>:<volume>"
  std::string status;  // available | deleted
  uint64_t size_mib = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0;
  std::vector<VolumeAttachment> attachments;
  std::vector<VolumeSnapshot> snapshots;
  uint64_t version = 0;
  // Its file's copy in the object store (VolumeState::manifest), and whether it is of the file as
  // it is (`stored`: detached since it was made).
  std::string manifest;
  bool stored = false;
};

// Adds what volume `v` holds of its tenant's disk to `u` (quotas' volumes and volume_mib): its
// size, its snapshots' copies, and for each read-only attachment the throwaway overlay its guest
// may fill up to the volume's size (security review 3, M6). Deleted and moved volumes hold none.
void count_volume_use(const VolumeInfo& v, QuotaUse& u);
// Database backups' bytes in whole MiB (they count against volume_mib too).
uint64_t backups_mib(const std::vector<DatabaseBackup>& backups);
// A volume that came with a migrated sandbox: recorded here as it was on the host it left
// (`volume`: its id, tenant, name, origin, size, metadata, creation time and snapshots), its
// files (`<id>.img`, one per snapshot `<snapshot id>.img`) received in ImportRequest::received,
// then attached to the sandbox at `mount` in slot `slot` (as there).
struct VolumeArrival {
  VolumeInfo volume;
  std::string mount;
  bool read_only = false;
  uint32_t slot = 0;
};

// Sandboxes made from a snapshot another host sent (Runtime::start_imported): a cross-host fork's
// children (`parent` lives on the sending host) or a migrated sandbox (its own id).
struct ImportRequest {
  CreateRequest create;          // the source sandbox's settings (template, TTL, metadata, ...)
  std::string parent;            // a fork's parent, "" for a migration
  std::string snapshot_id;       // the received snapshot (Runtime::import_folders)
  std::vector<std::string> ids;  // one per sandbox: "" = a new id
  std::string from_host;         // the sending host
  // A fork: the parent's read-write volumes (the snapshot holds copies of them; each child gets
  // its own copy, as on one host).
  std::vector<SandboxVolume> fork_volumes;
  // A migration: the sandbox's volumes, which moved with it (their files in `received`).
  std::vector<VolumeArrival> arrivals;
  std::string received;
};

struct VolumeRequest {
  std::string tenant, name;
  uint64_t size_mib = 0;  // from a snapshot: 0 = the snapshot's size, else at least that
  std::map<std::string, std::string> metadata;
  std::string from_snapshot;  // a volume snapshot (vsnap_...) of one of the tenant's volumes
  std::string origin;         // set by the runtime: what the new volume is a copy of
};

// A managed database (actors/database.h): PostgreSQL in a sandbox of the postgres template.
struct DatabaseRequest {
  std::string tenant, name;
  std::map<std::string, std::string> metadata;
  std::string from_backup;  // bk_...: a backup of one of the tenant's databases, restored into it
};
struct DatabaseInfo {
  std::string id, tenant, name;
  // From its sandbox's real state, not only from what was asked: running, hibernated, starting
  // (its sandbox is being made), failed (its sandbox was stopped or failed: failure_reason),
  // deleted.
  std::string status;
  std::string failure_reason;  // failed: why
  std::map<std::string, std::string> metadata;
  std::string sandbox, volume;  // the sandbox it runs in, its data volume
  std::string user, database;   // its login role and database
  std::string host;             // where it listens on the host (an exposed port): while running
  uint16_t port = 0;
  std::string password;  // only in the answers of create and rotate_password, never stored
  int64_t created_at_ms = 0;
  uint64_t version = 0;
  std::vector<DatabaseBackup> backups;
  std::string restored_from;  // create from_backup: the backup restored
  // postgresql://user[:password]@host:port/database (the password only when known).
  std::string connection_uri() const;
};

// One of a tenant's named snapshots.
// Why `name` cannot name a snapshot (1-64 of [A-Za-z0-9._-], not starting with `snap_`), or none.
std::optional<std::string> check_snapshot_name(const std::string& name);

struct SnapshotInfo {
  std::string id, sandbox, template_name;
  // The name it was taken with ("" = none). A name stands for the newest of the tenant's
  // snapshots taken with it (Runtime::resolve_snapshot); `current`: this is that one.
  std::string name;
  bool current = false;
  int64_t created_at_ms = 0;
  uint64_t size_bytes = 0;    // host storage it holds (RAM file + its own disk layers)
  uint64_t memory_bytes = 0;  // of which host memory (the RAM file, on tmpfs)
  // A synced copy is on the data disk (made in the background after it was taken): it survives a
  // host reboot. Until then it lives on tmpfs only.
  bool durable = false;
  // And it is in the object store (after its copy on the data disk): it survives the loss of the
  // host's disk.
  bool remote = false;
};

// The snapshot of `all` (`tenant`'s, Runtime::snapshots) that `ref` names: its id, or its name
// as `name`, `TENANT/name`, `name:default` or `TENANT/name:default` (the newest snapshot taken
// with that name; an id may carry `:default` too). Null when none does.
const SnapshotInfo* find_snapshot(const std::vector<SnapshotInfo>& all, const std::string& tenant,
                                  const std::string& ref);

// One entry of the audit log.
struct AuditEvent {
  std::string stream;       // the entity (sandbox id)
  uint64_t version = 0;     // position in its stream, from 1
  uint64_t global_seq = 0;  // position in the whole log, from 1
  int64_t time_ms = 0;
  std::string type;  // the event's kind
  std::string json;  // the event (event_to_json)
};

struct AuditQuery {
  std::string tenant;  // empty: every tenant (admin)
  std::string stream;  // empty: every sandbox
  uint64_t after_seq = 0;
  uint64_t after_version = 0;      // with a stream: only its events after this version
  int64_t from_ms = 0, to_ms = 0;  // to_ms 0 = no upper bound
  size_t limit = 1000;
};

// An API key's record (the token itself is never stored).
struct KeyInfo {
  std::string id, tenant;
  bool admin = false;
  int64_t created_ms = 0;
};

struct TemplateInfo {
  std::string name;
  bool baked = false;  // a baked snapshot exists (for some shape); the first create bakes one
};

// Where the adoption of VMs after a restart stands (the API answers meanwhile).
struct RecoveryStatus {
  uint64_t to_adopt = 0, adopted = 0, failed = 0;
  bool done() const { return adopted + failed >= to_adopt; }
};

// Counts for metrics.
struct RuntimeCounts {
  std::map<std::string, uint64_t> by_status;  // live sandboxes by status name
  uint64_t vm_exits = 0;  // VMs that died on their own (crash, OOM kill, kill -9), since start
};

// The host's memory (/proc/meminfo; zeros when it cannot be read): admission and what a cluster
// host publishes.
struct HostMemory {
  uint64_t total_kib = 0, available_kib = 0;
};
HostMemory host_memory();

// Settles what `config` takes from this host, before Runtime::start: the accelerator (`accel`:
// "auto", "kvm" or "tcg"; "auto" probes with a VM of the base template once and caches the answer
// in DATA/accel.json) and the guests' DNS upstream (`dns`: an address, "off", or "" for
// /etc/resolv.conf's first nameserver).
void settle_host(RuntimeConfig& config, const std::string& accel, const std::string& dns);
// "kvm" or "tcg".
const char* accel_name(const RuntimeConfig& config);

class Runtime {
 public:
  // Opens the store and rebuilds every sandbox from its events: hibernated ones come back
  // hibernated; ones whose VM did not survive are recorded failed(host_restart) and cleaned up.
  static Reply<std::unique_ptr<Runtime>> start(RuntimeConfig config);
  // Graceful shutdown: persistent running sandboxes are hibernated, the others killed, all
  // recorded in their streams.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Reply<SandboxInfo> create(const CreateRequest& request);
  Reply<SandboxInfo> get(const std::string& tenant, const std::string& id);
  // Filters: status (nullopt = any) and metadata entries that must all match.
  Reply<std::vector<SandboxInfo>> list(const std::string& tenant,
                                       std::optional<SandboxStatus> status = std::nullopt,
                                       const std::map<std::string, std::string>& metadata = {});
  // Runs a command to completion. Commands of one sandbox run concurrently (up to
  // Limits::max_concurrent_execs); each is recorded (exec-started, exec-finished). A stop request
  // kills the command in the guest (code `cancelled`).
  Reply<vmm::ExecResult> exec(const std::string& tenant, const std::string& id,
                              const vmm::ExecRequest& request, std::stop_token stop = {});
  // Like exec, but the output goes to `on_output` as it is produced (on a driver thread: the
  // callback must be quick and must not call the runtime).
  Reply<vmm::ExecResult> exec_stream(const std::string& tenant, const std::string& id,
                                     const vmm::ExecRequest& request, vmm::OutputCallback on_output,
                                     std::stop_token stop = {});

  // Background processes (they outlive the request; killed with the sandbox).
  Reply<uint32_t> start_process(const std::string& tenant, const std::string& id,
                                const vmm::ExecRequest& request);
  Reply<std::vector<vmm::ProcessInfo>> list_processes(const std::string& tenant,
                                                      const std::string& id);
  Reply<bool> kill_process(const std::string& tenant, const std::string& id, uint32_t pid,
                           int signal = 0);
  // Stdin of a process started with keep_stdin_open.
  Reply<bool> write_stdin(const std::string& tenant, const std::string& id, uint32_t pid,
                          std::string_view data, bool close);
  // Output of a background process from its start, then its exit.
  Reply<vmm::ExecResult> stream_process(const std::string& tenant, const std::string& id,
                                        uint32_t pid, vmm::OutputCallback on_output,
                                        std::stop_token stop = {});

  // The terminal size of a process started with `pty`.
  Reply<bool> resize_pty(const std::string& tenant, const std::string& id, uint32_t pid,
                         uint16_t cols, uint16_t rows);

  // Watches a guest directory (vmm::AgentClient::watch): `on_ready` once in place, then batches
  // of events (on a driver thread: quick, no runtime calls), until `stop` (code `cancelled`), the
  // directory goes, or the sandbox stops. Holds an exec slot, as a stream does. Errors:
  // file_not_found, not_a_directory, too_many_directories.
  // `include_entry`: each event carries its entry (vmm::WatchEvent::entry).
  Reply<bool> watch(const std::string& tenant, const std::string& id, const std::string& path,
                    bool recursive, std::function<void()> on_ready, vmm::WatchCallback on_events,
                    std::stop_token stop, bool include_entry = false);

  // Files in the guest. Errors: file_not_found, file_too_large, invalid_argument, agent_error.
  Reply<std::string> read_file(const std::string& tenant, const std::string& id,
                               const std::string& path, uint64_t max_bytes);
  // `offset` > 0: a later part of a file written in parts: `data` goes at its end when it is
  // exactly `offset` bytes long (offset_mismatch, naming its size, otherwise: a client resumes
  // there); 0 replaces the file. `owner` (an account of the guest's, "" = root): what the write
  // creates (the file, parent folders) belongs to it. `metadata` (offset 0 only): the file's
  // metadata afterwards (vmm::check_file_metadata); none: it keeps what it had.
  Reply<bool> write_file(const std::string& tenant, const std::string& id, const std::string& path,
                         std::string_view data, uint32_t mode = 0, uint64_t offset = 0,
                         const std::string& owner = "",
                         const std::optional<std::map<std::string, std::string>>& metadata = {});
  // Up to `length` bytes from `offset`, and the file's size (a file read in parts).
  Reply<vmm::FileRange> read_file_range(const std::string& tenant, const std::string& id,
                                        const std::string& path, uint64_t offset, uint64_t length);
  Reply<std::vector<vmm::FileStat>> list_dir(const std::string& tenant, const std::string& id,
                                             const std::string& path);
  Reply<vmm::FileStat> stat(const std::string& tenant, const std::string& id,
                            const std::string& path);
  Reply<bool> remove(const std::string& tenant, const std::string& id, const std::string& path,
                     bool recursive);
  Reply<bool> rename(const std::string& tenant, const std::string& id, const std::string& from,
                     const std::string& to);
  Reply<bool> mkdir(const std::string& tenant, const std::string& id, const std::string& path,
                    bool parents, const std::string& owner = "");
  // `keep_memory` false: only its disk is kept (its RAM is freed; the guest syncs first), and a
  // wake boots the guest afresh on it: files stay, processes and /tmp (a tmpfs) do not.
  Reply<SandboxInfo> hibernate(const std::string& tenant, const std::string& id,
                               bool keep_memory = true);
  Reply<SandboxInfo> wake(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> kill(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> set_ttl(const std::string& tenant, const std::string& id,
                             uint32_t ttl_seconds);
  Reply<SandboxInfo> set_metadata(const std::string& tenant, const std::string& id,
                                  const std::map<std::string, std::string>& metadata);
  // Exposes guest TCP `port` on the host (RuntimeConfig::ports_host, a free port): recorded, so
  // it is exposed again after a wake or a host restart (possibly on another host port).
  Reply<std::vector<PortInfo>> expose_port(const std::string& tenant, const std::string& id,
                                           uint32_t port);
  Reply<std::vector<PortInfo>> unexpose_port(const std::string& tenant, const std::string& id,
                                             uint32_t port);
  Reply<std::vector<PortInfo>> ports(const std::string& tenant, const std::string& id);
  // The sandbox's resource use over time (actors/metrics.h), samples between from_ms and to_ms.
  Reply<std::vector<MetricSample>> metrics(const std::string& tenant, const std::string& id,
                                           int64_t from_ms, int64_t to_ms);
  // Tenant secrets (actors/secrets.h): create, list, rotate, delete; values never answered.
  Secrets& secrets();
  // What the sandbox's network answered, let out and refused since the daemon started
  // (vmm-driver/egress_log.h; kept across hibernate and wake, bounded). network_disabled for a
  // sandbox without a network.
  Reply<vmm::EgressPage> egress(const std::string& tenant, const std::string& id,
                                const vmm::EgressQuery& q);
  // Preview URLs (gateway/previews.h): guest `port` served through the daemon's HTTP server.
  // Opening a port's preview again replaces it (a new nonce: the old URLs stop working).
  // `ttl_seconds` 0: the default (Limits::default_preview_ttl_seconds).
  Reply<Preview> open_preview(const std::string& tenant, const std::string& id, uint32_t port,
                              bool is_public, uint32_t ttl_seconds);
  Reply<std::vector<Preview>> previews(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> close_preview(const std::string& tenant, const std::string& id, uint32_t port);
  // The proxy's two calls. `preview_target`: sandbox `id` whoever owns it (its tenant, status
  // and previews are in the answer), for a caller that checks access itself (a preview token).
  Reply<SandboxInfo> preview_target(const std::string& id);
  // A TCP connection to guest `port` of the tenant's running sandbox (a hibernated one with
  // auto_wake wakes first), made from inside its network namespace; counts as use for its idle
  // timeout. The caller owns the socket (blocking mode). upstream_unreachable when nothing
  // accepts within `timeout`.
  Reply<int> connect_guest(const std::string& tenant, const std::string& id, uint32_t port,
                           std::chrono::milliseconds timeout);
  // Replaces the egress policy (applied at once to a running VM, at wake to a hibernated one).
  Reply<SandboxInfo> set_egress(const std::string& tenant, const std::string& id,
                                const Egress& egress);
  // Replaces the header rules of the tenant's sandbox (E2B's updateNetwork; empty clears them),
  // applied from its next request. A sandbox with no secrets binding gets one (its egress proxy
  // started, its CA added to the guest's trust store: it must be running with a network). True
  // when it has rules or a binding now.
  Reply<bool> set_header_rules(const std::string& tenant, const std::string& id,
                               const std::vector<storage::HeaderRule>& rules);
  // A snapshot of a running sandbox; returns its id (usable as CreateRequest::from_snapshot).
  // `name` (check_snapshot_name; "" = none): the name then stands for this snapshot, the newest
  // taken with it (an older one keeps its id).
  Reply<std::string> snapshot(const std::string& tenant, const std::string& id,
                              const std::string& name = "");
  // The id of the tenant's snapshot `ref` names (find_snapshot over snapshots(tenant));
  // snapshot_not_found when there is none. (A caller that lists them anyway: find_snapshot.)
  Reply<std::string> resolve_snapshot(const std::string& tenant, const std::string& ref);
  // Deletes one of the tenant's named snapshots (whatever state the sandbox that took it is in):
  // recorded on that sandbox (`snapshot-deleted`), then its files are removed. Creates from it
  // are refused afterwards (`snapshot_not_found`); sandboxes restored from it keep running.
  Reply<SandboxInfo> delete_snapshot(const std::string& tenant, const std::string& snapshot_id);
  // The tenant's named snapshots (of its sandboxes, alive or ended), oldest first.
  Reply<std::vector<SnapshotInfo>> snapshots(const std::string& tenant);
  // Whether `egress` is a valid policy for the sandbox (normalized in place), without applying it.
  Reply<bool> check_egress(const std::string& tenant, const std::string& id, Egress& egress);
  // `count` children of a running sandbox; the parent keeps running. `inherit_secrets`: the
  // children's requests carry the parent's secrets too (else a placeholder they hold is useless).
  Reply<std::vector<SandboxInfo>> fork(const std::string& tenant, const std::string& id,
                                       uint32_t count, bool inherit_secrets = false);

  // Volumes. Errors: volume_not_found, invalid_argument, volume_attached (delete or resize while
  // a running or hibernated sandbox holds it), quota_exceeded.
  Reply<VolumeInfo> create_volume(const VolumeRequest& request);
  Reply<VolumeInfo> get_volume(const std::string& tenant, const std::string& id);
  Reply<std::vector<VolumeInfo>> list_volumes(
      const std::string& tenant, const std::map<std::string, std::string>& metadata = {});
  // Grows the volume (size_mib, only larger; while detached) and/or replaces its metadata.
  Reply<VolumeInfo> update_volume(const std::string& tenant, const std::string& id,
                                  std::optional<uint64_t> size_mib,
                                  std::optional<std::map<std::string, std::string>> metadata);
  // Deletes it and its snapshots.
  Reply<VolumeInfo> delete_volume(const std::string& tenant, const std::string& id);
  // A point-in-time copy of the volume (a reflink, else a sparse copy of its data). Held
  // read-write by a running sandbox: its guest's file system is frozen (fsfreeze, which flushes
  // it) for the copy and thawed after, so the copy is clean; by a hibernated one: its file is
  // still. Errors: volume_not_found, volume_attached (its sandbox is mid-transition, or could not
  // freeze), quota_exceeded (VolumeLimits::max_snapshots, or the tenant's volume MiB: a snapshot
  // counts its volume's size).
  Reply<VolumeSnapshot> snapshot_volume(const std::string& tenant, const std::string& id);
  Reply<VolumeInfo> delete_volume_snapshot(const std::string& tenant, const std::string& id,
                                           const std::string& snapshot_id);
  // Managed databases (runtime_databases.cc). A create is a sandbox of the postgres template
  // (a restore: its server runs already) with a copy of the baked data volume, a login role and
  // database named after it with a fresh random password (set through psql's stdin: in no event
  // and no command line), its port 5432 exposed on the host, deny-all egress, no TTL; then
  // database-created is recorded. Errors: invalid_argument, network_disabled, template_not_found,
  // quota_exceeded, database_not_found, database_hibernated, start_failed.
  Reply<DatabaseInfo> create_database(const DatabaseRequest& request);
  Reply<DatabaseInfo> get_database(const std::string& tenant, const std::string& id);
  Reply<std::vector<DatabaseInfo>> list_databases(const std::string& tenant);
  // Kills its sandbox and deletes its data volume, then records database-deleted.
  Reply<DatabaseInfo> delete_database(const std::string& tenant, const std::string& id);
  Reply<DatabaseInfo> hibernate_database(const std::string& tenant, const std::string& id);
  Reply<DatabaseInfo> wake_database(const std::string& tenant, const std::string& id);
  // A new random password for its role (the old one stops working at once).
  Reply<DatabaseInfo> rotate_database_password(const std::string& tenant, const std::string& id);
  // The last `lines` lines of its server log.
  // A logical backup (pg_dump, custom format) kept on the host under data_dir/backups, at most
  // kMaxBackupBytes; restored by create_database {from_backup}. Deleted with the database.
  static constexpr uint64_t kMaxBackupBytes = 256ull << 20;
  Reply<DatabaseBackup> backup_database(const std::string& tenant, const std::string& id);
  Reply<DatabaseInfo> delete_database_backup(const std::string& tenant, const std::string& id,
                                             const std::string& backup);
  Reply<std::string> database_logs(const std::string& tenant, const std::string& id,
                                   uint32_t lines);
  // The audit log (read from the event store), oldest first.
  Reply<std::vector<AuditEvent>> audit(const AuditQuery& query);
  // Live sandboxes by status, across tenants.
  RuntimeCounts counts();
  RecoveryStatus recovery() const;

  // API keys. authenticate() fails with `unauthorized` for unknown, revoked or malformed keys.
  Reply<KeyInfo> authenticate(const std::string& token);
  // Key `key_id` while it exists (unauthorized once revoked): credentials issued under a key
  // (E2B access tokens) end with it.
  Reply<KeyInfo> key_by_id(const std::string& key_id);
  // The token is returned once and never stored.
  Reply<std::pair<std::string, KeyInfo>> create_key(const std::string& tenant, bool admin);
  Reply<bool> revoke_key(const std::string& key_id);
  Reply<std::vector<KeyInfo>> list_keys();

  // A tenant's quota limits (its own, else the defaults): cheap, for every request.
  Quotas quota_limits(const std::string& tenant);
  // A tenant's quotas (its own, else the defaults) and what it uses of them.
  Reply<std::pair<Quotas, QuotaUse>> quotas(const std::string& tenant);
  // Sets a tenant's own quotas (the fields of `changes` over its current ones; persisted).
  Reply<Quotas> set_quotas(const std::string& tenant, const wire::Json& changes);
  // Forgets a tenant's own quotas: the defaults apply again.
  Reply<Quotas> reset_quotas(const std::string& tenant);

  // Templates whose image is built (IMAGES/<name>/rootfs.qcow2).
  std::vector<TemplateInfo> templates();

  // Custom templates (actors/template_builds.h): a build starts at once, and runs on.
  Reply<TemplateState> build_template(const std::string& tenant, const std::string& name,
                                      const TemplateSpec& spec);
  // An image archive (a file in template_upload_dir(), taken over) imported as a template:
  // starts at once, and runs on (actors/image_import.h).
  Reply<TemplateState> import_template(const std::string& tenant, const std::string& name,
                                       const TemplateSpec& shape, const ImageUpload& upload);
  std::filesystem::path template_upload_dir() const;
  // A Dockerfile build's context archive (a file in template_upload_dir(), taken over; never
  // opened here) kept for the tenant's builds under `key` ("": the sha256 of its bytes; E2B
  // names its archives by a hash of its own). actors/build_context.h.
  Reply<BuildContextInfo> put_build_context(const std::string& tenant,
                                            const std::filesystem::path& upload,
                                            const std::string& key = "");
  Reply<BuildContextInfo> build_context(const std::string& tenant, const std::string& key);
  std::optional<Rejection> delete_build_context(const std::string& tenant, const std::string& key);
  // An image pulled by reference (actors/image_pull.h) imported as a template: starts at once.
  // `registry_secret`: a secret of the tenant's ("user:password", or a token) whose hosts name
  // the registry ("" = anonymous). invalid_argument (a reference, a secret not for the
  // registry), secret_not_found.
  Reply<TemplateState> pull_template(const std::string& tenant, const std::string& name,
                                     const TemplateSpec& shape, const std::string& ref,
                                     const std::string& registry_secret, uint64_t disk_mib,
                                     bool start);
  Reply<TemplateState> custom_template(const std::string& tenant, const std::string& name);
  std::vector<TemplateState> custom_templates(const std::string& tenant);
  // Makes the tenant's running sandbox `id` (its disk and memory, at this instant) its template
  // `name`: ready at once, every sandbox of it a restore of that instant.
  Reply<TemplateState> publish_template(const std::string& tenant, const std::string& id,
                                        const std::string& name);
  // Refused (template_in_use) while the tenant has sandboxes of it that have not ended.
  Reply<TemplateState> delete_template(const std::string& tenant, const std::string& name);
  // Its latest build's progress since this start (null: none).
  std::shared_ptr<BuildProgress> template_build(const std::string& tenant, const std::string& name);

  const RuntimeConfig& config() const;

  // Cluster mode (actors/cluster.h): API keys move to etcd, and every sandbox, snapshot, volume
  // and database this host creates is recorded as its own. Set once, right after start(). Its
  // hibernations in the object store are parked (again); a hibernated sandbox another host took
  // over while this one was down (Runtime::wake_parked) is ended here (recorded as moved).
  void join_cluster(std::shared_ptr<Cluster> cluster);
  Cluster* cluster() const;

  // Moving sandboxes between hosts (cluster mode; gateway/peer_snapshots.h moves the bytes).
  // What this host offers another of the tenant's named snapshot `snapshot_id`.
  Reply<SnapshotOffer> offer_snapshot(const std::string& tenant, const std::string& snapshot_id);
  // What this host offers of the tenant's sandbox `id`'s hibernation (it must be hibernated),
  // with files `carried` along (its volumes' files: volume_files).
  Reply<SnapshotOffer> offer_hibernation(const std::string& tenant, const std::string& id,
                                         const std::vector<std::filesystem::path>& carried);
  // Receives `offer` from another host for `tenant` (staged in import_folders(tenant); the
  // offer's bounds are checked before anything is written).
  Reply<std::unique_ptr<SnapshotIntake>> receive_snapshot(const std::string& tenant,
                                                          const SnapshotOffer& offer);
  // Where a snapshot of `tenant`'s received from another host is staged: a new snapshot id, its
  // folder, its disk layers' folder, the cache of the tenant's received layers (a layer is
  // linked into a snapshot of the tenant it arrived for only: a peer that names another
  // tenant's layer by its hash gets nothing), this host's guest RAM size.
  struct ImportFolders {
    std::string snapshot_id;
    std::filesystem::path dir, disk_dir, layer_cache;
    unsigned memory_mib = 0;
  };
  ImportFolders import_folders(const std::string& tenant);
  // Starts sandboxes from a received snapshot (all or none), then removes it. `claim`: records
  // them as this host's in the cluster (fork children; a migrated id is handed over instead).
  // The sender's settings are checked as a create's are: invalid_argument for a template name
  // that is not one (it becomes a path here), template_not_found for one this host lacks or
  // another tenant's custom template, and the create's own limits (metadata, TTL, egress).
  Reply<std::vector<SandboxInfo>> start_imported(const ImportRequest& request, bool claim);
  // Removes a received snapshot that will not be started.
  void discard_import(const std::string& snapshot_id);
  // Wake anywhere (cluster mode with an object store, issue 39; actors/parked.h). The host and
  // template of the tenant's sandbox (or snapshot) `id` parked by a host now down
  // (Cluster::parked): host_unavailable when none is parked for the tenant, conflict when its owner
  // is up.
  struct ParkedSandbox {
    std::string host, template_name;
  };
  Reply<ParkedSandbox> parked(const std::string& tenant, const std::string& id);
  // Fetches its hibernation from the down host's prefix of the store (verified chunk by chunk,
  // then checked as a peer's snapshot), takes it over (Cluster::adopt: one etcd transaction, only
  // while that host is down) and starts it here; its manifest leaves the store. Nothing changes
  // when it fails (a failed start gives the sandbox back to its host's record).
  Reply<SandboxInfo> wake_parked(const std::string& tenant, const std::string& id);
  // A create from the tenant's named snapshot (by id) parked by a host that is now down: its
  // copy is fetched from that host's prefix of the store and checked as a wake's is, and a new
  // sandbox starts from it here (recorded as this host's; the snapshot stays its host's). The
  // request's settings apply as a create's, on the snapshot's template. host_unavailable when the
  // snapshot is not parked for the tenant, conflict when its host is up; not_implemented for
  // secrets, network rules or volumes (a create through the snapshot's host has them).
  Reply<SandboxInfo> create_from_parked(const CreateRequest& request);
  // The files of volume `v` (as get_volume answered it: the tenant's): its own, then its
  // snapshots' (a migration ships them).
  std::vector<std::string> volume_files(const VolumeInfo& v);
  // Records sandboxes made here (and their own volumes) as this host's in the cluster: why not.
  std::optional<Rejection> claim_all(const std::vector<SandboxInfo>& made);
  // The tenant's volume `id` went to host `host` with sandbox `sandbox` (recorded as
  // volume-migrated; its files are removed here).
  Reply<VolumeInfo> volume_left(const std::string& tenant, const std::string& id,
                                const std::string& host, const std::string& sandbox);
  // Ends the tenant's hibernated sandbox `id` here: host `host` runs it now (recorded, its
  // hibernation removed).
  Reply<SandboxInfo> migrated_away(const std::string& tenant, const std::string& id,
                                   const std::string& host);

  struct Impl;

 private:
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "sbx_" + 16 random base32 characters.
std::string new_sandbox_id();

}  // namespace pandastack::actors
