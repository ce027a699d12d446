// One QEMU `microvm` process and the channels to it: the VMM driver's unit of ownership.
//
// A Vm is a non-copyable RAII handle: destroying it kills QEMU, reaps it, and removes its run
// folder (sockets, disk overlay, RAM file, console log). A failed boot leaves nothing behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vmm-driver/agent_client.h"
#include "vmm-driver/error.h"
#include "vmm-driver/file_copy.h"
#include "vmm-driver/qmp.h"

namespace pandastack::vmm {

class IoThread;

enum class Accel { tcg, kvm };
const char* to_string(Accel a);

class Network;

// The one folder of a run folder a jailed QEMU may write to (its sockets and console log). The
// run folder itself, its record (vm.json) and the disk folder are root's.
inline constexpr const char* kQemuDir = "q";

// TCG translation cache per VM, MiB (see qemu_args; inside the jail's memory overhead).
inline constexpr unsigned kTcgCacheMib = 128;

// The machine a VM is given: its devices and machine options, which a snapshot's device state
// must find again (a restore runs the machine the snapshot was taken on, Snapshot::machine).
//   0: microvm with its PIT (what snapshots made before revisions were recorded ran on).
//   1: no PIT (`pit=off`: the guest's clock events are the local APIC's; an idle QEMU wakes ~7
//      times a second instead of ~78), and a virtio balloon with free page reporting: memory the
//      guest frees (2 MiB blocks) is handed back to the host (a hole punched in its RAM file).
inline constexpr unsigned kMachineRevision = 1;

// Every VM has this many volume slots: virtio-blk disks on an empty placeholder (part of every
// snapshot's device set), bound to volume files on the restore path, never by a boot.
constexpr uint32_t kVolumeSlots = 4;

// A volume file bound to a slot. The daemon opens it and passes the descriptor to QEMU (QMP
// add-fd): QEMU never opens a volume by path. A read-only binding gets a throwaway copy-on-write
// overlay in the VM's disk folder, so nothing the guest does reaches the file.
struct VolumeBinding {
  uint32_t slot = 0;
  std::filesystem::path file;  // a raw ext4 image on a real disk
  bool read_only = false;
  bool operator==(const VolumeBinding&) const = default;
};

class MemoryBase;

struct VmConfig {
  std::string name;               // for logs
  std::string hostname;           // set in the guest after a restore (empty = leave as is)
  std::filesystem::path run_dir;  // created by boot(); removed with the Vm
  // Where its disk overlays live: a folder on a real disk (created and removed with the Vm), so
  // guest disk writes are not host RAM (the run folder is on tmpfs); empty = run_dir.
  std::filesystem::path disk_dir;
  std::filesystem::path kernel;  // uncompressed vmlinux (PVH)
  std::filesystem::path initramfs;
  std::filesystem::path rootfs;  // base qcow2; each Vm writes to its own overlay on it
  unsigned vcpus = 1;
  unsigned memory_mib = 256;
  Accel accel = Accel::tcg;
  // Its machine revision (kMachineRevision); a restore runs its snapshot's (Snapshot::machine).
  unsigned machine = kMachineRevision;
  std::string cpu_model;  // empty = "host" under KVM, TCG_DEFAULT_CPU under TCG
  unsigned tsc_khz = 0;   // TCG: host TSC kHz for the guest's timer (0 = read /proc/cpuinfo)
  std::string qemu_binary = "qemu-system-x86_64";
  std::chrono::milliseconds boot_timeout{60000};
  bool die_with_parent = true;  // QEMU gets SIGKILL when the owning process dies
  bool jail = true;             // run QEMU in the jail of vmm-driver/jail.policy (needs root)
  // The sandbox's network (its tap becomes the guest's virtio-net); none = the NIC is attached to
  // nothing. Owned with the Vm: released (namespace removed) when the Vm is.
  std::shared_ptr<Network> network;
  // Scheduling priority QEMU starts with: pools make their members in the background (nice > 0)
  // and raise a member to normal priority when they hand it out (Vm::set_nice).
  int nice = 0;
  // CPU and IO of the VM's cgroup: a weight against the daemon's own (cgroup v2 cpu.weight and
  // io.weight scale, 1..10000, the daemon has 100; v1 cpu.shares = weight * 1024 / 100) and a
  // ceiling in percent of one CPU (cpu.max; 0 = none). A guest spinning its vCPUs cannot starve
  // the API.
  uint32_t cpu_weight = 0;       // 0 = the kernel's default
  uint32_t cpu_max_percent = 0;  // 0 = no ceiling
  // Bound before the guest runs (a restore: between its state load and `cont`), or at once by
  // bind_volumes() on a running guest whose slots are unused (a warm pool member).
  std::vector<VolumeBinding> volumes;
  // Restores only (prespawn, restore): the snapshot's RAM as a sealed memory base this VM maps
  // copy-on-write with every other VM of it, instead of a RAM file of its own. Its source must be
  // the snapshot's RAM file. The VM costs the host the pages its guest writes; saving it writes
  // an ordinary RAM file (copy_memory_base, write_private_pages).
  std::shared_ptr<const MemoryBase> memory_base;
};

// The QEMU command line for `config`: a cold boot, or (`incoming`) a process waiting for device
// state (`-incoming defer`, paused after the load until `cont`). Guest RAM is the run folder's
// `mem` file, mapped shared (a restore puts the snapshot's RAM there first), or with a memory
// base that base's memfd, inherited, mapped privately. Restore differs from boot only in
// `-incoming`: the machine, devices and kernel must be identical for the state to load. A `spare`
// waits for any snapshot of its shape: its disk is an empty overlay on a placeholder backing node,
// replaced by the snapshot's layers when it is given one (Vm::restore_into).
std::vector<std::string> qemu_args(const VmConfig& config, bool incoming = false,
                                   bool spare = false);
inline std::vector<std::string> qemu_boot_args(const VmConfig& config) { return qemu_args(config); }

// Host TSC frequency in kHz from /proc/cpuinfo (0 when unknown).
unsigned host_tsc_khz();

struct Snapshot;
class Cgroup;

class Vm {
 public:
  // Boots the guest and returns once its agent answers (or an error with the console's tail).
  static Result<std::unique_ptr<Vm>> boot(IoThread& io, VmConfig config);
  // Boots `config`'s kernel afresh on `snapshot`'s disk (its layers under a new overlay: the
  // snapshot stays intact) and makes the guest this VM's own (personalize). For a disk-only
  // snapshot (Snapshot::memory false): what ran in it is gone, what it wrote to disk is there.
  static Result<std::unique_ptr<Vm>> boot_on(IoThread& io, const Snapshot& snapshot,
                                             VmConfig config);

  // Creates a VM from a snapshot: a copy of its RAM file (or the file itself, when `consume`:
  // a hibernated VM waking), a new overlay on its disk, its device state loaded; then the guest
  // clock is set, its RNG reseeded from host entropy and its hostname set (config.hostname), so
  // restores never share random state. Never boots. A consumed snapshot is removed once the VM
  // runs (on failure its RAM file is put back).
  static Result<std::unique_ptr<Vm>> restore(IoThread& io, const Snapshot& snapshot,
                                             VmConfig config, bool consume = false);

  // The first half of restore(): a QEMU process spawned and waiting for `snapshot`'s state
  // (`-incoming defer`) with its RAM file in place. For pools of pre-spawned processes.
  static Result<std::unique_ptr<Vm>> prespawn(IoThread& io, const Snapshot& snapshot,
                                              VmConfig config, bool consume = false);
  // The second half: loads the state into a prespawned VM and brings the guest up
  // (= start_guest + personalize).
  Status load(const Snapshot& snapshot);
  // Loads the state and resumes the guest until its agent answers; nothing is made unique yet:
  // the guest still has the snapshot's clock, random state and hostname. For warm pools only.
  Status start_guest(const Snapshot& snapshot);
  // Makes a started guest this VM's own: clock set, RNG reseeded from host entropy, hostname.
  // An agent that does not take them within kPersonalizeWait is reconnected to (a fresh
  // connection and session) and sent them once more.
  Status personalize();
  static constexpr std::chrono::milliseconds kPersonalizeWait{10000};
  // How long hibernate waits for the guest's volume sync (sync_volumes).
  static constexpr std::chrono::milliseconds kHibernateSync{30000};
  // How often personalize() had to reconnect (a test reads it).
  int personalize_retries() const { return personalize_retries_; }

  // A spare: a QEMU process of `config`'s shape spawned ahead for no snapshot in particular
  // (`-incoming defer`, an empty RAM file, its disk an empty overlay on a placeholder). It holds
  // no guest state: restore_into() gives it one, so forks, wakes and creates from named
  // snapshots skip QEMU's start-up (~100 ms under TCG). Same jail, network and record as any VM.
  static Result<std::unique_ptr<Vm>> spare(IoThread& io, VmConfig config);
  // Restores `snapshot` into this spare: its disk layers become the overlay's backing chain (QMP
  // blockdev-add + blockdev-reopen, header rewritten), its RAM is copied into the mapped RAM file,
  // then load(). `consume`: a hibernation snapshot, removed once the guest runs. A failed
  // restore_into leaves the snapshot intact; the spare is spent either way.
  Status restore_into(const Snapshot& snapshot, bool consume = false);
  // Names a prespawned VM before load() (logs, and the hostname set in the guest).
  void set_identity(std::string name, std::string hostname) {
    config_.name = std::move(name);
    config_.hostname = std::move(hostname);
  }

  // Binds `volumes` to their slots (those not bound already): each file is opened here, passed
  // to QEMU, put under the slot's disk and the slot grown to its size (the guest is told).
  Status bind_volumes(const std::vector<VolumeBinding>& volumes);
  // For a spare before restore_into(): the volumes its snapshot's guest had.
  void set_volumes(std::vector<VolumeBinding> volumes) { config_.volumes = std::move(volumes); }
  // Slots bound so far.
  const std::vector<VolumeBinding>& bound_volumes() const { return bound_; }
  // With a read-write volume bound: the guest writes its dirty pages out (`sync`) so that the
  // volume files hold what the guest has written. Hibernate does it first (a volume snapshot of
  // a hibernated sandbox copies the file); so does a sandbox's graceful end. Ok at once with no
  // read-write volume; an error when the guest does not finish within `timeout`.
  Status sync_volumes(std::chrono::milliseconds timeout);

  // Freezes the running guest into a new snapshot at `dir` (memory + disk) and lets it run on.
  // The guest pauses while its device state is saved and its RAM file copied.
  // `quiesce`: when no agent call is in flight, hand the agent's session back first (restores
  // attach at once); pass false when calls may start meanwhile (they would be cancelled).
  // `disk_dir`: where the snapshot's disk layers go (empty = `dir`).
  // Bound volumes: the read-write ones (and with `copy_read_only_volumes` the others too) are
  // copied into the snapshot while the guest is paused (clone_file: a reflink, or a sparse copy),
  // so each copy matches the memory image's page cache and mounted file system.
  Result<Snapshot> snapshot(const std::filesystem::path& dir, bool quiesce = true,
                            const std::filesystem::path& disk_dir = {},
                            bool copy_read_only_volumes = false);
  // A disk-only snapshot at `dir` (memory false: booted afresh by boot_on, never restored): the
  // guest pauses while its disk becomes a layer and runs on; no device state, no RAM copy, no
  // volume copies. For a guest whose file systems were synced just before (a template build's
  // step checkpoint): what a boot on it reads is what the guest had written.
  Result<Snapshot> checkpoint_disk(const std::filesystem::path& dir);
  // Saves the guest into a snapshot at `dir` and stops QEMU: its RAM file moves into the snapshot
  // (no copy). The Vm is dead afterwards (alive() is false); restore(..., consume=true) wakes it.
  Result<Snapshot> hibernate(const std::filesystem::path& dir,
                             const std::filesystem::path& disk_dir = {});
  // For a freshly booted template VM: quiesces the agent and saves a snapshot whose RAM file is
  // the VM's own (no copy). The Vm is dead afterwards.
  Result<Snapshot> bake(const std::filesystem::path& dir, const std::string& origin);
  // Takes over a VM that a previous host process started with die_with_parent=false and left
  // running (it crashed): reads the run folder's live record (vm.json, written after every
  // restore and snapshot), checks that the same QEMU process still runs, reconnects QMP and the
  // agent (a new agent session). Fails with not_found when there is no such live VM; the caller
  // then cleans the folder. An adopted QEMU is not our child: it is killed with SIGKILL and
  // awaited through /proc, its cgroup removed, like any other.
  static Result<std::unique_ptr<Vm>> adopt(IoThread& io, const std::filesystem::path& run_dir,
                                           std::chrono::milliseconds timeout);
  // Ends the VM a previous host process left in `run_dir` without talking to it (no QMP): the
  // recorded process, if it still runs with the recorded start time, gets SIGKILL and is awaited
  // (a stopped or wedged QEMU dies the same); its cgroups, run folder, jail root and disk folder
  // go. For VMs recovery does not keep (pool members, spares, orphans). True when one was killed.
  static bool kill_recorded(const std::filesystem::path& run_dir);
  // The name of the cgroup of the VM in `run_dir` (unique on the host: the folder's name and a
  // hash of its path). Recovery removes the group of a run folder that has no record.
  static std::string cgroup_name(const std::filesystem::path& run_dir);

  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  AgentClient& agent() { return *agent_; }
  // False after a reconnect_agent() that could not connect (agent() must not be used then).
  bool has_agent() const { return agent_ != nullptr; }
  QmpClient& qmp() { return *qmp_; }
  const VmConfig& config() const { return config_; }
  // The qcow2 the guest's root disk writes to (its run folder's overlay).
  const std::filesystem::path& disk_file() const { return active_overlay_; }
  const std::string& qemu_version() const { return qemu_version_; }
  pid_t pid() const { return pid_; }
  // The memfd name of the memory base this VM maps copy-on-write ("" when its RAM is a file of
  // its own): private_memory() counts what its guest made its own.
  const std::string& memory_base_memfd() const { return memory_base_memfd_; }
  // Time from spawning QEMU to the agent's first answer.
  std::chrono::microseconds boot_time() const { return boot_time_; }

  // Drops the agent connection and connects again (the agent must serve the new session). A
  // first health answered by a broken connection (a stale session in the guest aborted it) is
  // tried again on a fresh one, as at a restore.
  Status reconnect_agent(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // How many fresh connections the last reconnect_agent() needed beyond its first (0: the agent
  // answered the first preamble).
  int reconnect_retries() const { return reconnect_retries_; }
  // Closes the agent connection without ending the session, as a host process that dies does
  // (agent() must not be used until reconnect_agent()).
  void drop_agent() { agent_.reset(); }

  // Sets the priority of every QEMU thread (see VmConfig::nice).
  void set_nice(int nice);
  // True while the QEMU process runs.
  bool alive();
  // How QEMU ended, for a VM that died on its own: its exit status or signal (our child; an
  // adopted process's status is not ours to read), OOM kills its memory limit made, and the tail
  // of the guest console. Empty while it runs.
  std::string exit_description();
  // Writes run_dir/vm.json: what adopt() needs to take this VM over (pid and its start time,
  // config, disk layers, cgroup). restore() and snapshot() call it for VMs that outlive their
  // host (die_with_parent=false).
  Status save_record() const;
  // The last `bytes` of the guest's serial console.
  std::string console_tail(size_t bytes = 4096) const;
  // Gives an adopted VM its (adopted) network back; released with the Vm.
  void attach_network(std::shared_ptr<Network> network) { config_.network = std::move(network); }

 private:
  // boot and boot_on: QEMU started on `config`'s kernel and disks (`disk_of`: on the layers of
  // that snapshot instead of the template's root alone) until its agent answers.
  static Result<std::unique_ptr<Vm>> cold_boot(IoThread& io, const Snapshot* disk_of,
                                               VmConfig config);
  Vm(IoThread& io, VmConfig config);
  void kill_qemu();
  void kill_and_clean();
  // Run folder + the disk: an empty qcow2 overlay on the template's root filesystem (`snap` null)
  // or on a snapshot's disk layers (hard-linked into the run folder).
  // A `spare`'s overlay names a placeholder instead of the root filesystem (`snap` null).
  Status prepare(const Snapshot* snap, bool spare = false);
  // A spare's disk: the top layer (layers_.back(), in the run folder) attached with its chain and
  // made the overlay's backing node.
  Status attach_layers();
  // For a process spawned with `-incoming defer`: migration capabilities set, agent connected.
  Status await_state(std::chrono::steady_clock::time_point deadline);
  // Spawns QEMU with `args` and connects QMP.
  Status spawn(const std::vector<std::string>& args,
               std::chrono::steady_clock::time_point deadline);
  Error failure(ErrorCode code, const std::string& what);
  // Connects the agent channel (preamble and first health call sent; answered once the guest runs).
  Status connect_agent(std::chrono::steady_clock::time_point deadline);
  // Waits for the agent's answer, reconnecting when a stale session (restored from a snapshot
  // taken mid-session) drops the first attempt.
  Status wait_agent(std::chrono::steady_clock::time_point deadline);
  // Stops the guest and freezes its disk: the active overlay becomes immutable (hard-linked into
  // `disks`, a snapshot's disk folder, as disk.qcow2) and QEMU continues on a new overlay.
  Status freeze_disk(const std::filesystem::path& disks);
  // The folder of this VM's disk overlays and layers (VmConfig::disk_dir, else the run folder).
  std::filesystem::path disks() const;
  // Fills in `snap`'s metadata from this VM (shape, QEMU, kernel, disk layers, time).
  void describe(Snapshot& snap, std::string origin) const;
  // Saves the paused guest's device state and disk into `dir` and fills in `snap`'s metadata.
  Status save_paused(Snapshot& snap, const std::string& origin);

  IoThread& io_;
  VmConfig config_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  bool adopted_ = false;      // not our child: no waitpid
  uint64_t start_ticks_ = 0;  // /proc/<pid>/stat start time, to tell a reused pid apart
  std::unique_ptr<QmpClient> qmp_;
  std::unique_ptr<AgentClient> agent_;
  std::chrono::microseconds boot_time_{0};
  int personalize_retries_ = 0;
  int reconnect_retries_ = 0;
  std::string qemu_version_;
  // Frozen disk layers under the active overlay, oldest first, hard-linked in the run folder.
  std::vector<std::string> layers_;
  int overlay_seq_ = 0;
  std::filesystem::path consumed_from_;
  std::unique_ptr<Cgroup> cgroup_;  // a consumed snapshot's folder, removed once running
  std::filesystem::path active_overlay_;
  std::vector<VolumeBinding> bound_;
  uint32_t jail_uid_ = 0;  // jailed: QEMU's uid (its own among live VMs), else 0
  // Mapping a memory base (VmConfig::memory_base): the RAM file it is a copy of and its memfd's
  // name, kept for saves (and in the live record: an adopted VM saves the same way).
  std::filesystem::path memory_base_file_;
  std::string memory_base_memfd_;
  // Before a save pauses the guest: over a memory base, `to` becomes a copy of the base (the part
  // of the RAM file that needs no pause); nothing otherwise.
  Status precopy_memory(const std::filesystem::path& to);
  // Writes the paused guest's RAM into `to`: a copy of its own RAM file, or its private pages over
  // the base's copy precopy_memory made there.
  Status save_memory(const std::filesystem::path& to);
  // The uid the VM's sockets must be served by (a jailed QEMU's own), or -1 for any.
  int64_t peer_uid() const { return config_.jail && jail_uid_ != 0 ? int64_t(jail_uid_) : -1; }
};

// Restores in progress in this process (a scope per Vm::restore, Vm::restore_into and warm
// pool claim). Pools make new members only once no restore has run for a moment: on a small host
// a QEMU starting up next to a restore slows the restored guest's first answers by ~30%.
class RestoreActivity {
 public:
  RestoreActivity();
  ~RestoreActivity();
  RestoreActivity(const RestoreActivity&) = delete;
  RestoreActivity& operator=(const RestoreActivity&) = delete;
  // True when no restore runs and none ended within the last `quiet`.
  static bool quiet_for(std::chrono::milliseconds quiet);
};

}  // namespace pandastack::vmm
