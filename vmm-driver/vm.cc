#include "vmm-driver/vm.h"

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

#include "vmm-driver/images.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/jail.h"
#include "vmm-driver/live_record.h"
#include "vmm-driver/memory_base.h"
#include "vmm-driver/network.h"
#include "vmm-driver/qcow2.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm_internal.h"
#include "wire/hex.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using namespace std::chrono;
using namespace detail;

const char* to_string(Accel a) { return a == Accel::kvm ? "kvm" : "tcg"; }

namespace {
struct Activity {
  std::mutex mu;
  int running = 0;
  steady_clock::time_point last_end{};
};
Activity& activity() {
  static Activity a;
  return a;
}
}  // namespace

RestoreActivity::RestoreActivity() {
  std::lock_guard lock(activity().mu);
  ++activity().running;
}

RestoreActivity::~RestoreActivity() {
  auto& a = activity();
  std::lock_guard lock(a.mu);
  --a.running;
  a.last_end = steady_clock::now();
}

bool RestoreActivity::quiet_for(milliseconds quiet) {
  auto& a = activity();
  std::lock_guard lock(a.mu);
  return a.running == 0 && steady_clock::now() >= a.last_end + quiet;
}

unsigned host_tsc_khz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return unsigned(std::stod(line.substr(colon + 1)) * 1000.0);
    }
  }
  return 0;
}

std::vector<std::string> qemu_args(const VmConfig& c, bool incoming, bool spare) {
  const std::string run = c.run_dir.string();
  const std::string disks = (c.disk_dir.empty() ? c.run_dir : c.disk_dir).string();
  const std::string mem = std::to_string(c.memory_mib) + "M";
  // mitigations=off: the guest kernel only isolates the sandbox's own processes from each other;
  // the security boundary is the VMM. Under TCG, PTI's CR3 switches flush the soft TLB on every
  // syscall and make fork+exec several times slower.
  std::string append =
      "console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1 random.trust_cpu=on mitigations=off";
  if (c.accel == Accel::tcg) {
    // Without a known TSC frequency about one TCG boot in five hangs calibrating the timer.
    unsigned khz = c.tsc_khz != 0 ? c.tsc_khz : host_tsc_khz();
    if (khz != 0) append += " tsc_early_khz=" + std::to_string(khz) + " tsc=reliable";
  }
  // The KVM and TCG paths differ only in these two flags.
  // TCG's translation cache is capped: its default (1 GiB, grown as code is translated) is
  // anonymous memory that a long-running guest fills and that the jail's memory limit (guest
  // RAM + overhead) does not leave room for.
  const std::string accel =
      c.accel == Accel::kvm ? "kvm" : "tcg,tb-size=" + std::to_string(kTcgCacheMib);
  std::string cpu = c.cpu_model;  // part of the bake key: snapshots only restore on the same model
  if (cpu.empty()) cpu = c.accel == Accel::kvm ? "host" : "max";
  // Guest RAM in a file of the run folder, shared: a snapshot is its device state plus this file.
  // Or a memory base's sealed memfd (inherited), mapped privately: the guest's writes are QEMU's
  // own pages, the rest is shared with every VM of the base.
  const std::string mem_backend =
      c.memory_base
          ? "memory-backend-file,id=mem,size=" + mem + ",mem-path=/proc/self/fd/" +
                std::to_string(c.memory_base->fd()) + ",share=off"
          : "memory-backend-file,id=mem,size=" + mem + ",mem-path=" + run + "/mem,share=on";
  std::vector<std::string> args = {
      c.qemu_binary,
      "-nodefaults",
      "-no-user-config",
      "-nographic",
      "-no-reboot",
      "-machine",
      c.machine >= 1 ? "microvm,memory-backend=mem,pit=off" : "microvm,memory-backend=mem",
      "-accel",
      accel,
      "-cpu",
      cpu,
      "-smp",
      std::to_string(c.vcpus),
      "-m",
      mem,
      // Guest RAM in a file: the snapshot path keeps it there and maps it copy-on-write.
      "-object",
      mem_backend,
      "-kernel",
      c.kernel.string(),
      "-initrd",
      c.initramfs.string(),
      "-append",
      append,
      // The driver alone decides who opens which image: QEMU's image locking would stop a snapshot
      // sink from opening the disk its source still holds.
      "-drive",
      // A write the host cannot store (its disk full) is an I/O error in the guest, not a paused
      // VM nobody resumes (QEMU's default for ENOSPC is to stop the guest).
      "id=root,file=" + disks +
          "/disk.qcow2,format=qcow2,if=none,discard=unmap,file.locking=off,werror=report,"
          "rerror=report" +
          // A spare's disk waits on a placeholder backing node (its header names `null-co://`);
          // restore_into() attaches the snapshot's layers under the named nodes.
          (spare ? ",node-name=" + std::string(kSpareDiskNode) + ",file.node-name=" +
                       kSpareFileNode + ",backing.driver=null-co,backing.read-zeroes=on"
                 : std::string()),
      "-device",
      "virtio-blk-device,drive=root",
  };
  // Volume slots: each an empty placeholder disk (4 KiB of zeros) that bind_volumes() puts a
  // volume file under; the guest finds a slot by its serial. After the root disk: it stays vda.
  for (uint32_t i = 0; i < kVolumeSlots; ++i) {
    std::string n = "vol" + std::to_string(i);
    for (auto& a : {std::string("-blockdev"),
                    "driver=null-co,node-name=" + n + "-empty,size=4096,read-zeroes=on",
                    std::string("-blockdev"), "driver=raw,node-name=" + n + ",file=" + n + "-empty",
                    std::string("-device"),
                    "virtio-blk-device,drive=" + n + ",serial=pds-" + n + ",id=" + n +
                        "-dev,werror=report,rerror=report"})
      args.push_back(a);
  }
  for (auto& a : std::initializer_list<std::string>{
           "-device",
           "virtio-serial-device",
           "-chardev",
           // Control sockets are relative to QEMU's working directory, its run folder (Vm::spawn):
           // a socket path must be < 108 bytes, and the folder's own path may be longer than that.
           // They are made in q/, the one folder QEMU may write to (the run folder itself is
           // root's).
           "socket,id=agent,path=" + std::string(kQemuDir) + "/agent.sock,server=on,wait=off",
           "-device",
           "virtserialport,chardev=agent,name=agent,id=agent",
           "-chardev",
           "file,id=console,path=" + run + "/" + kQemuDir + "/console.log",
           "-serial",
           "chardev:console",
           "-qmp",
           "unix:" + std::string(kQemuDir) + "/qmp.sock,server=on,wait=off",
           // One NIC, always (the device set is part of the snapshot): on the sandbox's tap, or on
           // a hub port that leads nowhere for a sandbox without network.
           "-netdev",
           c.network && c.network->tap_fd() >= 0
               ? "tap,id=net0,fd=" + std::to_string(c.network->tap_fd())
               : std::string("hubport,id=net0,hubid=0"),
           "-device",
           std::string("virtio-net-device,netdev=net0,mac=") + kGuestMac,
       })
    args.push_back(a);
  // Revision 1: the balloon, last, so every other device keeps its virtio-mmio slot. It never
  // inflates (nothing asks it to); it only takes the pages the guest reports free.
  if (c.machine >= 1) {
    args.push_back("-device");
    args.push_back("virtio-balloon-device,free-page-reporting=on");
  }
  if (incoming) {
    // Paused after the load whatever state it carries (a device state saved without RAM says
    // "running"): the driver binds volumes and lets it run (`cont`).
    args.push_back("-S");
    args.push_back("-incoming");
    args.push_back("defer");
  }
  return args;
}

namespace {

std::string tail_of(const fs::path& p, size_t bytes) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  auto size = size_t(in.tellg());
  size_t start = size > bytes ? size - bytes : 0;
  in.seekg(std::streamoff(start));
  std::string s(size - start, '\0');
  in.read(s.data(), std::streamsize(s.size()));
  return s;
}

}  // namespace

namespace detail {

// Field 22 of /proc/<pid>/stat (start time in clock ticks), 0 when the process is gone. A zombie
// is gone too: it runs nothing, holds no memory, and whoever reaps it (init, for a process whose
// parent died) may take its time.
uint64_t process_start_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return 0;
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

// Links `from` to `to` (same file system), else copies it.
Status link_or_copy(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_hard_link(from, to, ec);
  if (!ec) return Ok{};
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec)
    return make_error(ErrorCode::io_error,
                      "cannot copy " + from.string() + " to " + to.string() + ": " + ec.message());
  return Ok{};
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (::getrandom(raw.data(), raw.size(), 0) != ssize_t(raw.size())) raw.assign(bytes, '\x5a');
  return wire::hex_encode(raw);
}

}  // namespace detail

namespace {
using namespace detail;

// Copies `cache` to `to`, making `cache` first (atomically: `make` writes a temporary file that is
// renamed into place) when it does not exist yet. For the driver's empty overlays, which are the
// same few hundred KiB for every VM of an image or snapshot.
Status copy_from_cache(const fs::path& cache, const fs::path& to,
                       const std::function<Status(const fs::path& tmp)>& make) {
  std::error_code ec;
  if (!fs::exists(cache)) {
    fs::path tmp = cache.string() + ".tmp-" + random_hex(6);
    auto made = make(tmp);
    if (made) fs::rename(tmp, cache, ec);
    if (made && ec)
      made =
          make_error(ErrorCode::io_error, "cannot install " + cache.string() + ": " + ec.message());
    if (!made) {
      fs::remove(tmp, ec);
      return made;
    }
  }
  fs::copy_file(cache, to, fs::copy_options::overwrite_existing, ec);
  if (ec)
    return make_error(ErrorCode::io_error,
                      "cannot create overlay " + to.string() + ": " + ec.message());
  return Ok{};
}

}  // namespace

Status detail::overlay_from_cache(const fs::path& cache, const std::string& backing_name,
                                  const fs::path& to) {
  return copy_from_cache(cache, to, [&](const fs::path& tmp) {
    return run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing_name,
                     tmp.string()});
  });
}

namespace {
// A spare's empty overlay: the root filesystem's, its backing name replaced by the placeholder
// (QEMU opens it on a null node; restore_into names the real layer). Made once per image.
Status spare_overlay(const fs::path& rootfs, const fs::path& to) {
  return copy_from_cache(rootfs.string() + ".spare-overlay", to, [&](const fs::path& tmp) {
    auto made = overlay_from_cache(rootfs.string() + ".overlay", rootfs.string(), tmp);
    if (made) made = qcow2::set_backing_file(tmp, kSpareBacking);
    return made;
  });
}

}  // namespace

Status Vm::prepare(const Snapshot* snap, bool spare) {
  const VmConfig& c = config_;
  for (auto* p : {&c.kernel, &c.initramfs}) {
    if (!fs::exists(*p))
      return make_error(ErrorCode::invalid_argument, "missing guest image file: " + p->string());
  }
  std::error_code ec;
  for (auto& d : {c.run_dir, disks()}) {
    fs::remove_all(d, ec);
    fs::create_directories(d, ec);
    if (ec)
      return make_error(ErrorCode::io_error, "cannot create " + d.string() + ": " + ec.message());
  }
  fs::create_directories(c.run_dir / kQemuDir, ec);
  if (ec)
    return make_error(ErrorCode::io_error, "cannot create " + (c.run_dir / kQemuDir).string());
  active_overlay_ = disks() / "disk.qcow2";
  if (snap == nullptr) {
    auto base = fs::absolute(c.rootfs);
    if (!fs::exists(base))
      return make_error(ErrorCode::invalid_argument, "missing guest image file: " + base.string());
    layers_.clear();
    if (spare) return spare_overlay(base, active_overlay_);
    return overlay_from_cache(base.string() + ".overlay", base.string(), active_overlay_);
  }
  // The chain QEMU will open is the one we made: the template's root file system under the
  // snapshot's layers (a header QEMU or a peer rewrote is refused, never followed by root).
  auto chain = check_layer_chain(*snap, c.rootfs);
  if (!chain) return chain;
  for (auto& l : snap->layers) {
    auto linked = link_or_copy(snap->layer(l), disks() / l);
    if (!linked) return linked;
  }
  layers_ = snap->layers;
  // Every disk of a template has the root filesystem's size: the snapshot's empty overlay is the
  // root filesystem's, naming the snapshot's top layer as its backing file (no qemu-img run).
  return copy_from_cache(snap->disks() / "overlay.qcow2", active_overlay_,
                         [&](const fs::path& tmp) {
                           auto base = fs::absolute(c.rootfs).string();
                           auto made = overlay_from_cache(base + ".overlay", base, tmp);
                           if (made) made = qcow2::set_backing_file(tmp, layers_.back());
                           return made;
                         });
}

Status Vm::spawn(const std::vector<std::string>& args, steady_clock::time_point deadline) {
  const VmConfig& c = config_;
  auto t_start = steady_clock::now();
  int log_fd =
      ::open((c.run_dir / "qemu.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  // Descriptors QEMU inherits (named on its command line): the sandbox's tap.
  std::vector<int> inherit;
  if (c.network && c.network->tap_fd() >= 0) inherit.push_back(c.network->tap_fd());
  if (c.memory_base) inherit.push_back(c.memory_base->fd());  // its RAM (mem-path=/proc/self/fd/N)
  // A QEMU that may outlive this process is on record (vm.json) from its first moment, before QMP
  // answers: a host killed while a VM or a pool member starts must not leave it running
  // unaccounted. Jailed, the record is written while the child still waits to exec (a host killed
  // before that leaves no QEMU); unjailed, right after the fork. Rewritten once the VM runs.
  std::function<void(pid_t)> record;
  if (!c.die_with_parent)
    record = [this](pid_t pid) {
      pid_ = pid;
      auto saved = save_record();
      if (!saved) spdlog::warn("vm {}: {}", config_.name, saved.error().message);
    };
  if (c.jail) {
    const JailPolicy& policy = JailPolicy::builtin();
    // A uid of its own (no other live VM has it, adopted ones included): the peer check of its
    // sockets tells this QEMU from any other.
    if (jail_uid_ == 0) jail_uid_ = JailUids::acquire(policy.uid_base, policy.uid_count);
    if (jail_uid_ == 0)
      return make_error(ErrorCode::spawn_failed, "every jail uid of the policy's range is in use");
    uint32_t uid = jail_uid_;
    // The run and disk folders stay root's (0711: QEMU reaches what it is given, creates, renames
    // and replaces nothing there): a compromised QEMU cannot plant a symlink where the daemon
    // writes as root, nor rewrite the VM's record. QEMU owns only its files -- the RAM file (made
    // here when a cold boot has none), the active overlay -- and q/, where it makes its sockets.
    if (!c.memory_base && !fs::exists(c.run_dir / "mem")) {
      int fd = ::open((c.run_dir / "mem").c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (fd >= 0) ::close(fd);
    }
    for (auto& d : {c.run_dir, disks()})
      if (::chown(d.c_str(), 0, 0) != 0 || ::chmod(d.c_str(), 0711) != 0)
        return make_error(ErrorCode::spawn_failed,
                          "cannot make " + d.string() + " root's: " + strerror(errno));
    for (auto& p : {c.run_dir / kQemuDir, c.run_dir / "mem", active_overlay_})
      if (fs::exists(p) && (::lchown(p.c_str(), uid, uid) != 0 ||
                            ::chmod(p.c_str(), fs::is_directory(p) ? 0700 : 0600) != 0))
        return make_error(ErrorCode::spawn_failed,
                          "cannot hand " + p.string() + " to the jail uid: " + strerror(errno));
    std::vector<fs::path> images;
    for (auto& p : {c.kernel, c.initramfs, c.rootfs}) {
      // (a published template's root file system is a link to the one its disk chain ends in)
      std::error_code ec;
      auto real = fs::canonical(p, ec);
      for (auto& f : {fs::absolute(p), ec ? fs::absolute(p) : real}) {
        auto dir = f.parent_path();
        if (std::find(images.begin(), images.end(), dir) == images.end()) images.push_back(dir);
      }
    }
    // (a built template's root file system is a layer on the one it was built from: the files
    // its chain names, as the daemon wrote them, are QEMU's to read too; only a template's
    // folder in the images or custom templates folder is ever bound)
    std::error_code canon_ec;  // (a published template's root file system: a link to its own)
    auto layer = fs::canonical(c.rootfs, canon_ec);
    if (canon_ec) layer = fs::absolute(c.rootfs);
    const fs::path roots[] = {fs::absolute(c.kernel).parent_path().parent_path(),
                              fs::absolute(c.rootfs).parent_path().parent_path(),
                              layer.parent_path().parent_path()};
    // (a template built with a step cache: its root file system names its layers in its own
    // folder, the oldest the root file system it was built on)
    for (int depth = 0, local = 0; depth < 4 && local < 64;) {
      auto backing = qcow2::backing_file(layer);
      if (!backing || backing->empty()) break;
      if ((*backing)[0] != '/' &&
          (backing->find('/') != std::string::npos || *backing == "." || *backing == ".."))
        break;
      auto next = (*backing)[0] == '/' ? fs::path(*backing) : layer.parent_path() / *backing;
      if (next.lexically_normal() != next) break;
      if (next.parent_path() == layer.parent_path()) {  // (in a folder bound already)
        layer = next;
        ++local;
        continue;
      }
      ++depth;
      layer = next;
      auto dir = layer.parent_path();
      if (layer.lexically_normal() != layer || layer.filename() != "rootfs.qcow2" ||
          !safe_template_name(dir.filename().string()) ||
          std::find(std::begin(roots), std::end(roots), dir.parent_path()) == std::end(roots)) {
        spdlog::warn("vm {}: {}'s backing file {} is no template's: not bound into the jail",
                     c.name, c.rootfs.string(), layer.string());
        break;
      }
      if (std::find(images.begin(), images.end(), dir) == images.end()) images.push_back(dir);
    }
    auto argv = args;
    argv[0] =
        c.qemu_binary.find('/') == std::string::npos ? "/usr/bin/" + c.qemu_binary : c.qemu_binary;
    auto launch = JailLaunch::prepare(policy, images, c.run_dir, disks(), uid, std::move(argv),
                                      log_fd, c.die_with_parent, inherit);
    if (!launch) {
      if (log_fd >= 0) ::close(log_fd);
      return launch.error();
    }
    // Named after the run folder and a hash of its full path: folder names repeat across daemons
    // on one host (pool-base-0, spare-base-0), and two VMs must never share a group.
    cgroup_ = Cgroup::create(cgroup_name(c.run_dir),
                             uint64_t(c.memory_mib) * 1024 * 1024 + policy.memory_overhead_bytes,
                             policy.pids_max, c.cpu_weight, c.cpu_max_percent);
    // Spawn from the driver's long-lived IoThread: the parent-death signal follows the thread that
    // created the child, and callers' threads (pool refills, request workers) come and go.
    auto pid = io_.run([&] { return (*launch)->start(cgroup_.get(), c.nice, record); });
    if (log_fd >= 0) ::close(log_fd);
    if (!pid) return pid.error();
    pid_ = *pid;
  } else {
    std::vector<char*> argv;  // built before fork: the child only makes system calls
    const std::string cwd = c.run_dir.string();
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t parent = ::getpid();
    pid_t pid = io_.run([&] {  // the long-lived IoThread: see the jail branch
      pid_t child = ::fork();
      if (child == 0) {
        ::setsid();
        if (::chdir(cwd.c_str()) != 0) ::_exit(126);  // sockets are named relative to it
        if (c.nice != 0) (void)::setpriority(PRIO_PROCESS, 0, c.nice);
        if (c.die_with_parent) {
          ::prctl(PR_SET_PDEATHSIG, SIGKILL);
          if (::getppid() != parent) ::_exit(1);
        }
        int devnull = ::open("/dev/null", O_RDONLY);
        ::dup2(devnull, 0);
        for (int fd : inherit) ::fcntl(fd, F_SETFD, 0);
        if (log_fd >= 0) {
          ::dup2(log_fd, 1);
          ::dup2(log_fd, 2);
        }
        ::execvp(argv[0], argv.data());
        ::_exit(127);
      }
      return child;
    });
    if (log_fd >= 0) ::close(log_fd);
    if (pid < 0)
      return make_error(ErrorCode::spawn_failed, std::string("fork: ") + strerror(errno));
    pid_ = pid;
    if (record) record(pid);
  }
  // QEMU holds the tap now; ours would keep the interface alive after QEMU is gone.
  if (c.network) c.network->close_tap();
  auto t_spawned = steady_clock::now();
  // The whole boot deadline: a QEMU that is alive but starved of CPU (a loaded host, a host
  // restart re-creating many VMs at once) took 13 s to make its socket in tests; one that exited
  // is noticed within 0.5 ms by `alive()`.
  auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
  RunDirRef dir(c.run_dir);
  auto qmp = QmpClient::connect(
      dir.socket("q/qmp.sock"), std::max(milliseconds(1), left), [this] { return alive(); },
      peer_uid());
  if (!qmp) {
    if (!alive())
      return failure(ErrorCode::spawn_failed, "QEMU exited at start: " + qmp.error().message);
    return failure(ErrorCode::boot_failed, "QEMU did not answer QMP within " +
                                               std::to_string(c.boot_timeout.count()) +
                                               " ms: " + qmp.error().message);
  }
  qmp_ = std::move(*qmp);
  qemu_version_ = qmp_->qemu_version();
  spdlog::debug("vm {}: qemu pid {} accel={} jail={}: spawned in {} us, QMP after {} us", c.name,
                pid_, to_string(c.accel), c.jail,
                duration_cast<microseconds>(t_spawned - t_start).count(),
                duration_cast<microseconds>(steady_clock::now() - t_spawned).count());
  return Ok{};
}

Error Vm::failure(ErrorCode code, const std::string& what) {
  std::string msg = what;
  std::string qlog = tail_of(config_.run_dir / "qemu.log", 2048);
  if (!qlog.empty()) msg += "\n--- qemu ---\n" + qlog;
  msg += "\n--- guest console (tail) ---\n" + console_tail(3000);
  spdlog::warn("vm {}: failed: {}", config_.name, what);
  return make_error(code, msg);
}

Status Vm::connect_agent(steady_clock::time_point deadline) {
  auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
  RunDirRef dir(config_.run_dir);
  auto agent = AgentClient::connect(io_, dir.socket("q/agent.sock"), peer_uid(),
                                    std::max(milliseconds(1), std::min(left, milliseconds(5000))));
  if (!agent) return failure(ErrorCode::boot_failed, agent.error().message);
  agent_ = std::move(*agent);
  return Ok{};
}

Status Vm::wait_agent(steady_clock::time_point deadline) {
  auto left = [&] { return duration_cast<milliseconds>(deadline - steady_clock::now()); };
  for (int attempt = 0;; ++attempt) {
    if (!agent_) {
      auto c = connect_agent(deadline);
      if (!c) return c;
    }
    // Wait for the agent, watching that QEMU is still there (a panicking guest makes it exit).
    auto since = steady_clock::now();
    for (;;) {
      auto h = agent_->health(milliseconds(50));
      if (h) return Ok{};
      // A restored agent may have been mid-session: our preamble ended that stale session and
      // it now waits for a new one (it does not answer this one). Start again on a fresh
      // connection. (A booting guest's agent is not up yet: reconnecting costs it nothing.)
      bool unanswered = h.error().code == ErrorCode::timeout && attempt < 3 &&
                        !agent_->answered() &&
                        steady_clock::now() - since > AgentClient::kAnswerWait;
      if (h.error().code != ErrorCode::timeout || unanswered) {
        if (attempt < 3 && alive()) {
          spdlog::debug("vm {}: agent session dropped ({}), reconnecting", config_.name,
                        h.error().message);
          agent_.reset();
          break;
        }
        return failure(ErrorCode::boot_failed, h.error().message);
      }
      if (!alive())
        return failure(ErrorCode::boot_failed, "QEMU exited before the guest agent answered");
      if (left().count() <= 0)
        return failure(ErrorCode::boot_failed, "guest agent did not answer within " +
                                                   std::to_string(config_.boot_timeout.count()) +
                                                   " ms");
    }
  }
}

Result<std::unique_ptr<Vm>> Vm::cold_boot(IoThread& io, const Snapshot* disk_of, VmConfig config) {
  for (auto* p : {&config.kernel, &config.initramfs, &config.rootfs})
    if (!fs::exists(*p))
      return make_error(ErrorCode::invalid_argument, "missing guest image file: " + p->string());
  std::unique_ptr<Vm> vm(new Vm(io, std::move(config)));
  auto started = steady_clock::now();
  auto deadline = started + vm->config_.boot_timeout;
  // (On a snapshot's disk: its chain checked, the template's root under its layers.)
  auto prepared = vm->prepare(disk_of);
  if (!prepared) return prepared.error();  // ~Vm removes the run dir
  auto spawned = vm->spawn(qemu_args(vm->config_), deadline);
  if (!spawned) return spawned.error();
  auto attached = vm->wait_agent(deadline);
  if (!attached) return attached.error();
  vm->boot_time_ = duration_cast<microseconds>(steady_clock::now() - started);
  return vm;
}

Result<std::unique_ptr<Vm>> Vm::boot(IoThread& io, VmConfig config) {
  auto vm = cold_boot(io, nullptr, std::move(config));
  if (!vm) return vm.error();
  auto& v = **vm;
  spdlog::info("vm {}: booted in {} ms (accel={}, pid={})", v.config_.name,
               v.boot_time_.count() / 1000, to_string(v.config_.accel), v.pid_);
  return vm;
}

Result<std::unique_ptr<Vm>> Vm::boot_on(IoThread& io, const Snapshot& snap, VmConfig config) {
  auto started = steady_clock::now();
  auto vm = cold_boot(io, &snap, std::move(config));
  if (!vm) return vm.error();
  auto& v = **vm;
  auto own = v.personalize();
  if (!own) return own.error();
  v.boot_time_ = duration_cast<microseconds>(steady_clock::now() - started);
  spdlog::info("vm {}: booted on the disk of {} in {} ms (pid={})", v.config_.name,
               snap.dir.string(), v.boot_time_.count() / 1000, v.pid_);
  if (!v.config_.die_with_parent) {
    auto saved = v.save_record();
    if (!saved) return saved.error();
  }
  return vm;
}

Vm::Vm(IoThread& io, VmConfig config) : io_(io), config_(std::move(config)) {}

Vm::~Vm() { kill_and_clean(); }

void Vm::kill_qemu() {
  agent_.reset();
  qmp_.reset();
  if (pid_ > 0 && adopted_) {
    // Not our child: signal it and watch /proc until it is gone (its parent reaps it).
    if (process_start_ticks(pid_) == start_ticks_) ::kill(pid_, SIGKILL);
    for (int i = 0; i < 500 && process_start_ticks(pid_) == start_ticks_; ++i)
      std::this_thread::sleep_for(milliseconds(10));
    pid_ = -1;
  } else if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  cgroup_.reset();  // empty now: removable
}

void Vm::kill_and_clean() {
  kill_qemu();
  if (jail_uid_ != 0 && pid_ < 0) {
    JailUids::release(jail_uid_);
    jail_uid_ = 0;
  }
  std::error_code ec;
  if (!consumed_from_.empty()) {
    // A wake that failed: the hibernated RAM file goes back where it came from.
    fs::rename(config_.run_dir / "mem", consumed_from_ / "mem", ec);
    consumed_from_.clear();
  }
  fs::remove_all(config_.run_dir, ec);
  if (ec)
    spdlog::warn("vm {}: cannot remove {}: {}", config_.name, config_.run_dir.string(),
                 ec.message());
  fs::remove_all(config_.run_dir.string() + ".jail",
                 ec);  // the jail's root (its mounts died with QEMU)
  if (!config_.disk_dir.empty()) fs::remove_all(config_.disk_dir, ec);
  config_.network.reset();  // QEMU is gone: the namespace, veth and tap go with it
}

bool Vm::alive() {
  if (pid_ <= 0) return false;
  if (exit_status_ >= 0) return false;
  if (adopted_) return process_start_ticks(pid_) == start_ticks_;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = status;
    pid_ = -1;
    return false;
  }
  return true;
}

std::string Vm::exit_description() {
  if (alive()) return "";
  std::string what;
  if (adopted_) {
    what = "QEMU exited";
  } else if (WIFSIGNALED(exit_status_)) {
    int sig = WTERMSIG(exit_status_);
    what = "QEMU was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  } else if (exit_status_ >= 0) {
    what = "QEMU exited with status " + std::to_string(WEXITSTATUS(exit_status_));
  } else {
    what = "QEMU exited";
  }
  if (cgroup_ && cgroup_->oom_kills() > 0)
    what += "; the OOM killer acted on its memory limit (" + std::to_string(config_.memory_mib) +
            " MiB guest RAM + QEMU's overhead)";
  auto tail = console_tail(600);
  // The console's last lines say why a guest kernel stopped (a panic, "Attempted to kill init").
  if (!tail.empty()) what += "; console: " + tail;
  return what;
}

std::string Vm::console_tail(size_t bytes) const {
  return tail_of(config_.run_dir / kQemuDir / "console.log", bytes);
}

Status Vm::reconnect_agent(milliseconds timeout) {
  if (agent_) {
    // A session that is over already (end_session() was called) cannot end again: connect anew.
    if (auto ended = agent_->end_session(timeout); !ended)
      spdlog::debug("vm {}: ending the agent session before reconnecting: {}", config_.name,
                    ended.error().message);
  }
  agent_.reset();
  RunDirRef dir(config_.run_dir);
  auto deadline = steady_clock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    reconnect_retries_ = attempt;
    auto left =
        std::max(milliseconds(1), duration_cast<milliseconds>(deadline - steady_clock::now()));
    auto a = AgentClient::connect(io_, dir.socket("q/agent.sock"), peer_uid(), left);
    if (!a) return a.error();
    agent_ = std::move(*a);
    // The guest runs: an agent that does not answer the preamble soon ended a stale session of
    // ours with it (AgentClient::answered); it answers the next.
    auto h = agent_->health(std::min(left, AgentClient::kAnswerWait));
    if (h) return Ok{};
    bool unanswered = h.error().code == ErrorCode::timeout && !agent_->answered();
    if (h.error().code == ErrorCode::timeout && !unanswered && left > AgentClient::kAnswerWait)
      h = agent_->health(left - AgentClient::kAnswerWait);
    if (h) return Ok{};
    if ((h.error().code == ErrorCode::timeout && !unanswered) || attempt >= 3 || !alive())
      return h.error();
    spdlog::debug("vm {}: agent session dropped ({}), reconnecting", config_.name,
                  h.error().message);
    agent_.reset();
  }
}

void Vm::set_nice(int nice) {
  if (pid_ <= 0 || config_.nice == nice) return;
  std::error_code ec;
  for (auto& task : fs::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
    id_t tid = id_t(std::strtoul(task.path().filename().c_str(), nullptr, 10));
    if (tid != 0 && ::setpriority(PRIO_PROCESS, tid, nice) != 0 && errno != ESRCH)
      spdlog::warn("vm {}: cannot set the priority of thread {}: {}", config_.name, tid,
                   strerror(errno));
  }
  config_.nice = nice;
}

fs::path Vm::disks() const { return config_.disk_dir.empty() ? config_.run_dir : config_.disk_dir; }

}  // namespace pandastack::vmm
