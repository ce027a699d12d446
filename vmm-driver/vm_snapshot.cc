// vmm::Vm's snapshot half: restoring (prespawn, spares, restore_into, load), and saving (snapshot
// for forks and named snapshots, hibernate, bake). vm.cc has the process half (boot, spawn,
// adopt, kill).
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "vmm-driver/io_thread.h"
#include "vmm-driver/jail.h"
#include "vmm-driver/memory_base.h"
#include "vmm-driver/network.h"
#include "vmm-driver/qcow2.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"
#include "vmm-driver/vm_internal.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using namespace std::chrono;
using namespace detail;

namespace {

Status set_ignore_shared(QmpClient& q, bool on) {
  wire::Json cap = wire::Json::object();
  cap.set("capability", "x-ignore-shared");
  cap.set("state", on);
  wire::Json caps = wire::Json::array();
  caps.push(cap);
  wire::Json args = wire::Json::object();
  args.set("capabilities", caps);
  auto r = q.execute("migrate-set-capabilities", args);
  if (!r) return r.error();
  return Ok{};
}

// Polls query-migrate until the (outgoing or incoming) migration completed.
Status wait_migration(QmpClient& q, milliseconds timeout) {
  auto deadline = steady_clock::now() + timeout;
  for (;;) {
    auto r = q.execute("query-migrate");
    if (!r) return r.error();
    const std::string& status = (*r)["status"].as_string();
    if (status == "completed") return Ok{};
    if (status == "failed" || status == "cancelled")
      return make_error(ErrorCode::qmp_error,
                        "migration " + status + ": " + (*r)["error-desc"].as_string());
    if (steady_clock::now() > deadline)
      return make_error(ErrorCode::timeout, "migration did not complete (" + status + ")");
    std::this_thread::sleep_for(microseconds(500));
  }
}

Status pass_fd(QmpClient& q, const std::string& name, int fd) {
  wire::Json args = wire::Json::object();
  args.set("fdname", name);
  auto r = q.execute("getfd", args, seconds(10), fd);
  if (!r) return r.error();
  return Ok{};
}

Status migrate_to(QmpClient& q, const std::string& fdname) {
  wire::Json args = wire::Json::object();
  args.set("uri", "fd:" + fdname);
  auto r = q.execute("migrate", args);
  if (!r) return r.error();
  return Ok{};
}

// Saves the (stopped) VM's device state to `file` (RAM excluded when ignore-shared is on).
Status save_state(QmpClient& q, const fs::path& file) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "cannot create " + file.string() + ": " + strerror(errno));
  auto passed = pass_fd(q, "state", fd);
  ::close(fd);  // QEMU has its own copy now
  if (!passed) return passed;
  auto m = migrate_to(q, "state");
  if (!m) return m;
  return wait_migration(q, seconds(60));
}

// The fd set a device state is written through (volume slots use 100 and up).
constexpr int64_t kDeviceStateFdSet = 90;
// A device state is a few KiB; anything near this is not one.
constexpr size_t kMaxDeviceState = 16 << 20;

// Saves the (stopped) VM's device state to `file` without its RAM (`xen-save-devices-state`,
// through a descriptor of ours), in the form `-incoming` loads (incoming_state_of_devices): for a
// VM whose RAM is a private mapping, which a migration would copy whole.
Status save_devices(QmpClient& q, const fs::path& file) {
  auto raw = file.string() + ".devices";
  int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return make_error(ErrorCode::io_error, "cannot create " + raw + ": " + strerror(errno));
  wire::Json set = wire::Json::object();
  set.set("fdset-id", kDeviceStateFdSet);
  auto added = q.execute("add-fd", set, seconds(10), fd);
  ::close(fd);
  Status st = Ok{};
  if (!added) st = added.error();
  if (st) {
    wire::Json args = wire::Json::object();
    args.set("filename", "/dev/fdset/" + std::to_string(kDeviceStateFdSet));
    args.set("live", false);  // the guest runs on after it: its disks stay QEMU's
    auto saved = q.execute("xen-save-devices-state", args, seconds(60));
    if (!saved) st = saved.error();
    if (auto removed = q.execute("remove-fd", set); !removed && st) st = removed.error();
  }
  std::string devices;
  if (st) {
    std::ifstream in(raw, std::ios::binary);
    devices.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof())
      st = make_error(ErrorCode::io_error, "cannot read " + raw);
    else if (devices.size() > kMaxDeviceState)
      st = make_error(ErrorCode::qmp_error, "the device state is larger than 16 MiB");
  }
  ::unlink(raw.c_str());
  if (!st) return st;
  auto incoming = incoming_state_of_devices(devices, "microvm");
  if (!incoming) return incoming.error();
  fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  bool written =
      fd >= 0 && ::write(fd, incoming->data(), incoming->size()) == ssize_t(incoming->size());
  if (fd >= 0) ::close(fd);
  if (!written)
    return make_error(ErrorCode::io_error,
                      "cannot write " + file.string() + ": " + strerror(errno));
  return Ok{};
}

Status simple(QmpClient& q, const std::string& cmd) {
  auto r = q.execute(cmd);
  if (!r) return r.error();
  return Ok{};
}

// Runs the guest again after a save that failed: QEMU finishes a failed migration in steps of its
// own (the state becomes "postmigrate" a moment after the failure is reported), and a `cont`
// sent in between may not take. So: `cont` until QEMU says the guest runs (at most ~2 s).
Status resume_after_failed_save(QmpClient& q) {
  Status last = Ok{};
  for (int i = 0; i < 40; ++i) {
    auto st = q.execute("query-status");
    if (st && (*st)["status"].is_string() && (*st)["status"].as_string() == "running") return Ok{};
    last = simple(q, "cont");
    std::this_thread::sleep_for(milliseconds(50));
  }
  return last ? Status(make_error(ErrorCode::qmp_error, "the guest did not run again")) : last;
}

// Lets a guest paused for a save run on: nothing to do when it never stopped (`stopped` failed),
// `cont` after a save that worked, the patient resume above after one that failed.
Status resume_after_save(QmpClient& q, bool stopped, bool saved) {
  if (!stopped) return Ok{};
  return saved ? simple(q, "cont") : resume_after_failed_save(q);
}

// After end_session() when the guest runs on (a snapshot, a failed hibernate): a new session on
// the same channel, else a new connection; logged when neither works.
void restart_agent_session(Vm& vm) {
  auto restarted = vm.agent().start_session();
  if (restarted) return;
  spdlog::warn("vm {}: agent session restart failed ({}), connecting again", vm.config().name,
               restarted.error().message);
  if (auto again = vm.reconnect_agent(seconds(10)); !again)
    spdlog::error("vm {}: the agent does not answer: {}", vm.config().name, again.error().message);
}

Status move_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (!ec) return Ok{};
  auto s = link_or_copy(from, to);
  if (!s) return s;
  fs::remove(from, ec);
  return Ok{};
}

int64_t unix_ms() {
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<Vm>> Vm::prespawn(IoThread& io, const Snapshot& snap, VmConfig config,
                                         bool consume) {
  config.machine = snap.machine;  // a restore runs the machine the snapshot was taken on
  std::unique_ptr<Vm> vm(new Vm(io, std::move(config)));
  auto deadline = steady_clock::now() + vm->config_.boot_timeout;
  auto compatible = snap.check_compatible(vm->config_, "");
  if (!compatible) return compatible.error();
  auto t0 = steady_clock::now();
  auto prepared = vm->prepare(&snap);
  if (!prepared) return prepared.error();
  auto t1 = steady_clock::now();
  auto mem = vm->config_.run_dir / "mem";
  if (const auto& base = vm->config_.memory_base) {
    // Mapped copy-on-write: nothing to copy, the base must be this snapshot's RAM.
    if (consume || base->source() != fs::absolute(snap.mem()) ||
        base->size() != uint64_t(vm->config_.memory_mib) << 20)
      return make_error(ErrorCode::invalid_argument, "the memory base " + base->source().string() +
                                                         " is not the RAM of " + snap.dir.string());
    vm->memory_base_file_ = base->source();
    vm->memory_base_memfd_ = base->memfd_name();
  } else if (consume) {
    std::error_code ec;
    fs::rename(snap.mem(), mem, ec);
    if (ec)
      return make_error(ErrorCode::io_error,
                        "cannot take RAM file of " + snap.dir.string() + ": " + ec.message());
    vm->consumed_from_ = snap.dir;
  } else {
    auto copied = copy_ram_file(snap.mem(), mem);
    if (!copied) return copied.error();
  }
  auto t2 = steady_clock::now();
  auto spawned = vm->spawn(qemu_args(vm->config_, true), deadline);
  if (!spawned) return spawned.error();
  spdlog::debug("vm {}: prespawn: overlay {} us, RAM file {} us, qemu+qmp {} us", vm->config_.name,
                duration_cast<microseconds>(t1 - t0).count(),
                duration_cast<microseconds>(t2 - t1).count(),
                duration_cast<microseconds>(steady_clock::now() - t2).count());
  compatible = snap.check_compatible(vm->config_, vm->qemu_version_);
  if (!compatible) return compatible.error();
  auto ready = vm->await_state(deadline);
  if (!ready) return ready.error();
  return vm;
}

Status Vm::await_state(steady_clock::time_point deadline) {
  auto caps = set_ignore_shared(*qmp_, true);
  if (!caps) return caps;
  // Connect the agent channel before the state loads: the restored port then never sees a host
  // hang-up, and the preamble is waiting when the guest resumes.
  return connect_agent(deadline);
}

Result<std::unique_ptr<Vm>> Vm::spare(IoThread& io, VmConfig config) {
  std::unique_ptr<Vm> vm(new Vm(io, std::move(config)));
  auto deadline = steady_clock::now() + vm->config_.boot_timeout;
  auto prepared = vm->prepare(nullptr, /*spare=*/true);
  if (!prepared) return prepared.error();
  // An empty RAM file of the guest's size: restore_into fills it while QEMU has it mapped.
  auto mem = vm->config_.run_dir / "mem";
  int fd = ::open(mem.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, off_t(vm->config_.memory_mib) << 20) != 0) {
    auto e =
        make_error(ErrorCode::io_error, "cannot create " + mem.string() + ": " + strerror(errno));
    if (fd >= 0) ::close(fd);
    return e;
  }
  ::close(fd);
  auto spawned = vm->spawn(qemu_args(vm->config_, /*incoming=*/true, /*spare=*/true), deadline);
  if (!spawned) return spawned.error();
  auto ready = vm->await_state(deadline);
  if (!ready) return ready.error();
  return vm;
}

Status Vm::restore_into(const Snapshot& snap, bool consume) {
  RestoreActivity busy;
  auto started = steady_clock::now();
  auto compatible = snap.check_compatible(config_, qemu_version_);
  if (!compatible) return compatible;
  if (snap.layers.empty() || !layers_.empty())
    return make_error(ErrorCode::invalid_argument,
                      "restore_into needs a spare and a snapshot with disk layers");
  // (the chain QEMU opens is the one we made: Vm::prepare)
  auto chain = check_layer_chain(snap, config_.rootfs);
  if (!chain) return chain;
  for (auto& l : snap.layers) {
    auto linked = link_or_copy(snap.layer(l), disks() / l);
    if (!linked) return linked;
  }
  layers_ = snap.layers;
  // The overlay's header names the top layer (relative: the disk folder). QEMU reads the header
  // again when the incoming state activates the disk; the graph is switched here.
  auto named = qcow2::set_backing_file(active_overlay_, layers_.back());
  if (!named) return named;
  // QEMU attaches the disk chain while this thread copies the RAM (independent work).
  auto t_disk = steady_clock::now();
  auto attached = std::async(std::launch::async, [this] { return attach_layers(); });
  auto copied = copy_ram_file(snap.mem(), config_.run_dir / "mem", /*into_existing=*/true);
  auto t_ram = steady_clock::now();
  auto disk = attached.get();
  auto t_both = steady_clock::now();
  if (!disk) return disk;
  if (!copied) return copied;
  if (consume) consumed_from_ = snap.dir;  // removed by load() once the guest runs
  auto loaded = load(snap);
  if (!loaded) {
    consumed_from_.clear();
    return loaded;
  }
  boot_time_ = duration_cast<microseconds>(steady_clock::now() - started);
  spdlog::debug(
      "vm {}: restored from {} into a spare in {} us (links+header {} us, RAM {} us, disk "
      "chain {} us after it)",
      config_.name, snap.dir.string(), boot_time_.count(),
      duration_cast<microseconds>(t_disk - started).count(),
      duration_cast<microseconds>(t_ram - t_disk).count(),
      duration_cast<microseconds>(t_both - t_ram).count());
  if (!config_.die_with_parent) return save_record();
  return Ok{};
}

Status Vm::attach_layers() {
  using wire::Json;
  Json file = Json::object();
  file.set("driver", "file");
  file.set("filename", (disks() / layers_.back()).string());
  file.set("locking", "off");
  Json layer = Json::object();
  layer.set("driver", "qcow2");
  layer.set("node-name", "layers");
  layer.set("read-only", true);
  layer.set("file", file);
  auto added = qmp_->execute("blockdev-add", layer);
  if (!added)
    return failure(ErrorCode::qmp_error, "attaching the snapshot's disk: " + added.error().message);
  Json overlay = Json::object();
  overlay.set("driver", "qcow2");
  overlay.set("node-name", kSpareDiskNode);
  overlay.set("file", kSpareFileNode);
  overlay.set("backing", "layers");
  overlay.set("discard", "unmap");
  Json options = Json::array();
  options.push(overlay);
  Json reopen = Json::object();
  reopen.set("options", options);
  auto reopened = qmp_->execute("blockdev-reopen", reopen);
  if (!reopened)
    return failure(ErrorCode::qmp_error,
                   "switching the disk to the snapshot's layers: " + reopened.error().message);
  return Ok{};
}

Status Vm::load(const Snapshot& snap) {
  auto started = steady_clock::now();
  auto st = start_guest(snap);
  if (!st) return st;
  auto t_agent = steady_clock::now();
  st = personalize();
  if (!st) return st;
  auto t_end = steady_clock::now();
  spdlog::debug("vm {}: load: state+cont+agent {} us, fixups {} us", config_.name,
                duration_cast<microseconds>(t_agent - started).count(),
                duration_cast<microseconds>(t_end - t_agent).count());
  boot_time_ += duration_cast<microseconds>(t_end - started);
  if (!consumed_from_.empty()) {  // the woken guest runs: its hibernation snapshot is spent
    remove_snapshot(consumed_from_);
    consumed_from_.clear();
  }
  return Ok{};
}

Status Vm::start_guest(const Snapshot& snap) {
  auto started = steady_clock::now();
  auto deadline = started + config_.boot_timeout;
  int fd = ::open(snap.state().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "cannot open " + snap.state().string() + ": " + strerror(errno));
  auto passed = pass_fd(*qmp_, "state", fd);
  ::close(fd);
  if (!passed) return passed;
  wire::Json args = wire::Json::object();
  args.set("uri", "fd:state");
  auto incoming = qmp_->execute("migrate-incoming", args);
  if (!incoming) return failure(ErrorCode::qmp_error, incoming.error().message);
  auto done = wait_migration(*qmp_, seconds(60));
  if (!done) return failure(done.error().code, "loading snapshot state: " + done.error().message);
  auto t_loaded = steady_clock::now();
  // The guest's volumes are under its slots before it runs: it may have them mounted.
  if (!config_.volumes.empty()) {
    auto bound = bind_volumes(config_.volumes);
    if (!bound) return bound;
  }
  auto cont = simple(*qmp_, "cont");
  if (!cont) return cont;
  auto attached = wait_agent(deadline);
  if (!attached) return attached;
  // Over a memory base the guest stops reporting free memory at once (personalize says it
  // again), so that a warm pool member has done it before a create takes it.
  if (!memory_base_memfd_.empty())
    if (auto off = agent_->set_free_page_reporting(false); !off)
      spdlog::warn("vm {}: free page reporting left on: {}", config_.name, off.error().message);
  spdlog::debug("vm {}: start: state {} us, cont+agent {} us", config_.name,
                duration_cast<microseconds>(t_loaded - started).count(),
                duration_cast<microseconds>(steady_clock::now() - t_loaded).count());
  return Ok{};
}

Status Vm::personalize() {
  // A restored guest has the snapshot's clock and shares its random state with every other
  // restore of it: fix both (and the hostname) before anyone uses the guest.
  std::string entropy(64, '\0');
  if (::getrandom(entropy.data(), entropy.size(), 0) != ssize_t(entropy.size()))
    return make_error(ErrorCode::io_error, "getrandom failed");
  auto send = [&](milliseconds timeout) {
    return agent_->after_restore(
        duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count(), entropy,
        config_.hostname, config_.network != nullptr,
        /*free_page_reporting=*/memory_base_memfd_.empty(), timeout);
  };
  auto done = send(kPersonalizeWait);
  // The agent answered this session's health call, and yet may have ended the session since: a
  // restored guest can see the host's reconnect (wait_agent's, after a stale session) as a lasting
  // hang-up, end the session and wait for the next preamble, or for a host it thinks is gone (the
  // calls then time out, or fail as a channel error). They are idempotent: once, on a fresh
  // connection and session, they are sent again.
  if (!done && alive() &&
      (done.error().code == ErrorCode::timeout || done.error().code == ErrorCode::agent_error ||
       agent_->disconnected())) {
    spdlog::warn(
        "vm {}: the guest agent did not take its clock, entropy and name ({}); "
        "reconnecting and sending them again",
        config_.name, done.error().message);
    ++personalize_retries_;
    agent_.reset();
    auto attached = wait_agent(steady_clock::now() + config_.boot_timeout);
    if (!attached) return attached;
    done = send(AgentClient::kCallTimeout);
  }
  // With the guest console's tail: what the agent saw (a session it ended, a stall) says why.
  if (!done) return failure(done.error().code, done.error().message);
  return done;
}

Result<std::unique_ptr<Vm>> Vm::restore(IoThread& io, const Snapshot& snap, VmConfig config,
                                        bool consume) {
  RestoreActivity busy;
  auto started = steady_clock::now();
  auto vm = prespawn(io, snap, std::move(config), consume);
  if (!vm) return vm.error();
  auto loaded = (*vm)->load(snap);
  if (!loaded) return loaded.error();
  (*vm)->boot_time_ = duration_cast<microseconds>(steady_clock::now() - started);
  spdlog::debug("vm {}: restored from {} in {} us", (*vm)->config_.name, snap.dir.string(),
                (*vm)->boot_time_.count());
  if (!(*vm)->config_.die_with_parent) {
    auto saved = (*vm)->save_record();
    if (!saved) return saved.error();
  }
  return vm;
}

Status Vm::freeze_disk(const fs::path& dir) {
  // The active overlay becomes a layer: a unique name (a hard link to it), never written again.
  // Its successor is made here, already naming that layer by its relative name, and QEMU switches
  // to it as an existing image: QEMU writes no backing names (its own, for a deep chain opened with
  // options, is a json: name longer than qcow2 allows).
  std::string name = "layer-" + random_hex(8) + ".qcow2";
  auto linked = link_or_copy(active_overlay_, disks() / name);
  if (!linked) return linked;
  auto next = disks() / ("disk-" + std::to_string(++overlay_seq_) + ".qcow2");
  auto base = fs::absolute(config_.rootfs);
  auto made = overlay_from_cache(base.string() + ".overlay", base.string(), next);
  if (made) made = qcow2::set_backing_file(next, name);
  // A disk grown since it booted (a template build's builder, block_resize) keeps its size: its
  // next overlay is made that large (-u: nothing of the guest's is read), never the root file
  // system's, which would shrink the guest's disk under it.
  auto grown = qcow2::virtual_size(active_overlay_);
  auto made_size = made ? qcow2::virtual_size(next) : Result<uint64_t>(uint64_t(0));
  if (made && grown && made_size && *grown > *made_size)
    made = run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b", name,
                     next.string(), std::to_string(*grown)});
  if (made && config_.jail && jail_uid_ != 0) {
    // QEMU (the jail uid) writes the new overlay; the folder stays root's.
    if (::lchown(next.c_str(), jail_uid_, jail_uid_) != 0 || ::chmod(next.c_str(), 0600) != 0)
      made = make_error(ErrorCode::io_error, "cannot hand " + next.string() + " to the jail uid");
  }
  if (!made) {
    std::error_code ec;
    fs::remove(disks() / name, ec);
    return made;
  }
  wire::Json args = wire::Json::object();
  args.set("device", "root");
  args.set("snapshot-file", next.string());
  args.set("format", "qcow2");
  args.set("mode", "existing");
  auto r = qmp_->execute("blockdev-snapshot-sync", args);
  if (!r) return r.error();
  // The old overlay is a layer now, read-only for good: root's again, and readable by the QEMUs
  // of every sandbox restored from it (each its own uid; the folders above are private).
  if (config_.jail) {
    ::chown(active_overlay_.c_str(), 0, 0);
    ::chmod(active_overlay_.c_str(), 0644);
  }
  // Its header was QEMU's to write: the backing name is set again to the one we gave it (the
  // root file system, or the layer before it), never kept as QEMU left it (check_layer_chain).
  auto renamed = qcow2::set_backing_file(
      active_overlay_, layers_.empty() ? fs::absolute(config_.rootfs).string() : layers_.back());
  if (!renamed) return renamed;
  active_overlay_ = next;
  layers_.push_back(name);
  for (auto& l : layers_) {
    auto s = link_or_copy(disks() / l, dir / l);
    if (!s) return s;
  }
  return link_or_copy(disks() / name, dir / "disk.qcow2");
}

void Vm::describe(Snapshot& snap, std::string origin) const {
  snap.qemu_version = qemu_version_;
  snap.accel = config_.accel;
  snap.memory_mib = config_.memory_mib;
  snap.vcpus = config_.vcpus;
  snap.machine = config_.machine;
  snap.kernel = fs::absolute(config_.kernel).string();
  snap.initramfs = fs::absolute(config_.initramfs).string();
  snap.origin = std::move(origin);
  snap.layers = layers_;
  snap.created_unix_ms = unix_ms();
}

Status Vm::precopy_memory(const fs::path& to) {
  if (memory_base_memfd_.empty()) return Ok{};
  // (the base's copy made ahead, where this process made the base: not for a VM adopted after a
  // restart, which knows its base by name only)
  const auto& base = config_.memory_base;
  return copy_memory_base(pid_, memory_base_memfd_, uint64_t(config_.memory_mib) << 20,
                          memory_base_file_, to,
                          base && base->memfd_name() == memory_base_memfd_ ? base.get() : nullptr);
}

Status Vm::save_memory(const fs::path& to) {
  if (memory_base_memfd_.empty()) return copy_ram_file(config_.run_dir / "mem", to);
  return write_private_pages(pid_, memory_base_memfd_, uint64_t(config_.memory_mib) << 20, to);
}

Status Vm::save_paused(Snapshot& snap, const std::string& origin) {
  Status st = freeze_disk(snap.disks());
  if (st && !memory_base_memfd_.empty()) {
    st = save_devices(*qmp_, snap.state());
  } else {
    if (st) st = set_ignore_shared(*qmp_, true);
    if (st) st = save_state(*qmp_, snap.state());
  }
  if (!st) return st;
  describe(snap, origin + ":" + config_.name);
  return Ok{};
}

namespace {
// A new snapshot's folders (its disk folder too when it has one of its own).
Result<Snapshot> new_snapshot(const fs::path& dir, const fs::path& disk_dir) {
  std::error_code ec;
  for (auto& d : {dir, disk_dir}) {
    if (d.empty()) continue;
    if (fs::exists(d))
      return make_error(ErrorCode::invalid_argument, "snapshot folder exists: " + d.string());
    fs::create_directories(d, ec);
    if (ec)
      return make_error(ErrorCode::io_error, "cannot create " + d.string() + ": " + ec.message());
  }
  Snapshot snap;
  snap.dir = fs::absolute(dir);
  if (!disk_dir.empty()) snap.disk_dir = fs::absolute(disk_dir);
  return snap;
}
}  // namespace

Result<Snapshot> Vm::snapshot(const fs::path& dir, bool quiesce, const fs::path& disk_dir,
                              bool copy_read_only_volumes) {
  auto t0 = steady_clock::now();
  auto made = new_snapshot(dir, disk_dir);
  if (!made) return made.error();
  Snapshot snap = *made;
  // Over a memory base the base's part of the RAM file is written while the guest runs.
  if (auto pre = precopy_memory(snap.mem()); !pre) {
    remove_snapshot(dir, disk_dir);
    return pre.error();
  }
  auto t_pre = steady_clock::now();
  // With no call in flight, hand the agent's session back first: the snapshot then holds an agent
  // waiting for a new session, and restores attach without a retry. (With calls in flight the
  // session stays; restores end the stale copy of it and reconnect.)
  bool quiesced = false;
  if (quiesce && agent_ && agent_->in_flight() == 0) quiesced = bool(agent_->end_session());
  auto stopped = simple(*qmp_, "stop");
  Status st = stopped;
  auto t_stopped = steady_clock::now();
  if (st) st = save_paused(snap, "snapshot");
  auto t_state = steady_clock::now();
  // The guest is paused: its RAM is consistent with the device state just saved.
  if (st) st = save_memory(snap.mem());
  auto t_ram = steady_clock::now();
  // Stopped, QEMU has flushed every disk: the volume files are what the guest's memory expects.
  for (auto& v : bound_) {
    if (!st) break;
    snap.volume_slots.push_back(v.slot);
    if (v.read_only && !copy_read_only_volumes) continue;
    auto cloned = clone_file(v.file, snap.volume(v.slot));
    if (!cloned)
      st = cloned.error();
    else
      snap.volume_copies.push_back(v.slot);
  }
  auto t_vols = steady_clock::now();
  Status resumed = resume_after_save(*qmp_, bool(stopped), bool(st));
  if (quiesced) restart_agent_session(*this);
  if (st) st = resumed;
  if (st) st = snap.write_meta();
  if (st && !config_.die_with_parent) st = save_record();  // the disk layers changed
  if (!st) {
    remove_snapshot(dir, disk_dir);
    return st.error();
  }
  spdlog::debug(
      "vm {}: snapshot {}: base copy {} us, stop {} us, disk+state {} us, RAM {} us, {} volume "
      "copies {} us, total paused {} us",
      config_.name, dir.string(), duration_cast<microseconds>(t_pre - t0).count(),
      duration_cast<microseconds>(t_stopped - t_pre).count(),
      duration_cast<microseconds>(t_state - t_stopped).count(),
      duration_cast<microseconds>(t_ram - t_state).count(), snap.volume_copies.size(),
      duration_cast<microseconds>(t_vols - t_ram).count(),
      duration_cast<microseconds>(steady_clock::now() - t_stopped).count());
  return snap;
}

Result<Snapshot> Vm::checkpoint_disk(const fs::path& dir) {
  auto t0 = steady_clock::now();
  auto made = new_snapshot(dir, {});
  if (!made) return made.error();
  Snapshot snap = *made;
  snap.memory = false;
  auto stopped = simple(*qmp_, "stop");
  Status st = stopped;
  if (st) st = freeze_disk(snap.disks());
  Status resumed = resume_after_save(*qmp_, bool(stopped), bool(st));
  if (st) st = resumed;
  if (st) {
    describe(snap, "checkpoint:" + config_.name);
    st = snap.write_meta();
  }
  if (st && !config_.die_with_parent) st = save_record();  // the disk layers changed
  if (!st) {
    remove_snapshot(dir, {});
    return st.error();
  }
  spdlog::debug("vm {}: disk checkpoint {}: {} us", config_.name, dir.string(),
                duration_cast<microseconds>(steady_clock::now() - t0).count());
  return snap;
}

Result<Snapshot> Vm::hibernate(const fs::path& dir, const fs::path& disk_dir) {
  auto made = new_snapshot(dir, disk_dir);
  if (!made) return made.error();
  Snapshot snap = *made;
  // What the guest wrote to its volumes is in its page cache: out to the files first, so that a
  // volume snapshot taken while it sleeps (a copy of the file) holds it. A guest that does not
  // finish still hibernates (its memory image has the pages; a later wake writes them).
  if (auto synced = sync_volumes(kHibernateSync); !synced)
    spdlog::warn("vm {}: hibernating without a volume sync: {}", config_.name,
                 synced.error().message);
  // Over a memory base the base's part of the RAM file is written while the guest runs.
  auto t_pre = steady_clock::now();
  if (auto pre = precopy_memory(snap.mem()); !pre) {
    remove_snapshot(dir, disk_dir);
    return pre.error();
  }
  auto t_copied = steady_clock::now();
  // The guest's session dies with this QEMU anyway: hand it back so the wake attaches directly.
  bool ended = agent_ && agent_->end_session();
  auto t0 = steady_clock::now();
  Status st = simple(*qmp_, "stop");
  if (st) st = save_paused(snap, "hibernate");
  auto t1 = steady_clock::now();
  for (auto& v : bound_) snap.volume_slots.push_back(v.slot);  // they stay where they are
  // The paused guest writes nothing: its RAM file becomes the snapshot's while QEMU still maps it
  // (a rename in one file system). QEMU ends only once the snapshot is complete on disk: a move
  // or a record that fails (a full disk) gives the file back and the guest runs on, nothing lost.
  // A VM over a memory base writes its own pages over the base's copy made before the pause.
  bool moved = false;
  if (st && !memory_base_memfd_.empty())
    st = save_memory(snap.mem());
  else if (st)
    moved = bool(st = move_file(config_.run_dir / "mem", snap.mem()));
  auto t2 = steady_clock::now();
  if (st) st = snap.write_meta();
  if (!st) {
    std::error_code ec;
    if (moved) fs::rename(snap.mem(), config_.run_dir / "mem", ec);
    remove_snapshot(dir, disk_dir);
    if (alive()) {
      if (auto resumed = resume_after_failed_save(*qmp_); !resumed)
        spdlog::warn("vm {}: after a failed hibernate: {}", config_.name, resumed.error().message);
      // The guest runs on: its agent gets a session again (else every call is "null capability").
      if (ended) restart_agent_session(*this);
    }
    return st.error();
  }
  auto t3 = steady_clock::now();
  kill_and_clean();
  spdlog::debug(
      "vm {}: hibernate: base copy {} us, stop+devices {} us, RAM file {} us, record {} us, end "
      "{} us",
      config_.name, duration_cast<microseconds>(t_copied - t_pre).count(),
      duration_cast<microseconds>(t1 - t0).count(), duration_cast<microseconds>(t2 - t1).count(),
      duration_cast<microseconds>(t3 - t2).count(),
      duration_cast<microseconds>(steady_clock::now() - t3).count());
  return snap;
}

Result<Snapshot> Vm::bake(const fs::path& dir, const std::string& origin) {
  // Warm what every sandbox will use first, so it is in the snapshot's page cache.
  ExecRequest warm;
  warm.shell =
      "command -v python3 >/dev/null && python3 -c 'import os, sys, json, subprocess, pathlib' ; "
      "sync";
  warm.timeout_ms = 120000;
  auto w = agent_->exec(warm);
  if (!w) return w.error();
  // The guest's free memory zeroed (the agent, PID 1, in its --zero-free-memory mode), and the
  // RAM file's zero pages punched below: what every sandbox of the template copies is only what
  // its guest uses. An agent that cannot costs memory, not correctness: logged, baked anyway.
  ExecRequest zero;
  zero.argv = {"/proc/1/exe", "--zero-free-memory"};
  zero.timeout_ms = 120000;
  auto z = agent_->exec(zero);
  if (!z || z->exit_code != 0)
    spdlog::warn("vm {}: bake: free memory not zeroed: {}", config_.name,
                 !z ? z.error().message : z->error + z->stderr_data);
  auto ended = agent_->end_session();
  if (!ended) return ended.error();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(ErrorCode::io_error, "cannot create " + dir.string() + ": " + ec.message());
  Snapshot snap;
  snap.dir = fs::absolute(dir);
  Status st = precopy_memory(snap.mem());  // (over a memory base; nothing otherwise)
  if (st) st = simple(*qmp_, "stop");
  bool shared = memory_base_memfd_.empty();
  if (st && !shared) {
    // (over a memory base: its RAM is written out before QEMU, which holds its pages, ends)
    st = save_devices(*qmp_, snap.state());
    if (st) st = save_memory(snap.mem());
  } else {
    if (st) st = set_ignore_shared(*qmp_, true);
    if (st) st = save_state(*qmp_, snap.state());
  }
  if (!st) return st.error();
  kill_qemu();  // nothing writes the RAM file or the disk any more
  std::string layer = "layer-" + random_hex(8) + ".qcow2";
  if (shared) st = move_file(config_.run_dir / "mem", snap.mem());
  if (st) st = punch_zero_pages(snap.mem());
  if (st) st = move_file(active_overlay_, snap.dir / layer);
  // The layer is read-only for good, the backing file of every sandbox of this template (each
  // QEMU its own uid): root's, readable (the folders above are private).
  if (st && config_.jail &&
      (::chown((snap.dir / layer).c_str(), 0, 0) != 0 ||
       ::chmod((snap.dir / layer).c_str(), 0644) != 0))
    st = make_error(ErrorCode::io_error,
                    "cannot make the baked layer root's: " + std::string(strerror(errno)));
  // (its backing name as we gave it, whatever QEMU wrote into the header: check_layer_chain)
  if (st)
    st = qcow2::set_backing_file(
        snap.dir / layer, layers_.empty() ? fs::absolute(config_.rootfs).string() : layers_.back());
  if (st) st = link_or_copy(snap.dir / layer, snap.disk());
  // A template's baked data volume (TemplateStore): its file becomes the snapshot's copy, the
  // source of every sandbox's own copy.
  for (auto& v : bound_) {
    if (!st) break;
    snap.volume_slots.push_back(v.slot);
    if (v.read_only) continue;
    st = move_file(v.file, snap.volume(v.slot));
    if (st) snap.volume_copies.push_back(v.slot);
  }
  if (!st) return st.error();
  layers_ = {layer};
  describe(snap, origin);
  auto meta = snap.write_meta();
  if (!meta) return meta.error();
  kill_and_clean();
  return snap;
}

}  // namespace pandastack::vmm
