// A VM's live record (vm.json in its run folder: what QEMU runs, its pid and start time, its
// cgroups and folders), written at start; after a restart of the host process Vm::adopt takes the
// VM back from it, and Vm::kill_recorded ends one that no sandbox wants.
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
#include "vmm-driver/network.h"
#include "vmm-driver/qcow2.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"
#include "vmm-driver/vm_internal.h"
#include "wire/hex.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using namespace std::chrono;
using namespace detail;

Status Vm::save_record() const {
  using wire::Json;
  Json j = Json::object();
  j.set("format", 1);
  j.set("pid", int64_t(pid_));
  j.set("start_ticks", start_ticks_ ? start_ticks_ : process_start_ticks(pid_));
  j.set("name", config_.name);
  j.set("hostname", config_.hostname);
  j.set("kernel", config_.kernel.string());
  j.set("initramfs", config_.initramfs.string());
  j.set("rootfs", config_.rootfs.string());
  j.set("vcpus", config_.vcpus);
  j.set("memory_mib", config_.memory_mib);
  j.set("accel", to_string(config_.accel));
  j.set("cpu_model", config_.cpu_model);
  j.set("tsc_khz", config_.tsc_khz);
  j.set("machine", config_.machine);
  j.set("qemu_binary", config_.qemu_binary);
  j.set("jail", config_.jail);
  j.set("qemu_version", qemu_version_);
  Json layers = Json::array();
  for (auto& l : layers_) layers.push(l);
  j.set("layers", layers);
  j.set("overlay_seq", overlay_seq_);
  j.set("active_overlay", active_overlay_.filename().string());
  j.set("disk_dir", config_.disk_dir.string());
  j.set("jail_uid", int64_t(jail_uid_));
  Json groups = Json::array();
  if (cgroup_)
    for (auto& d : cgroup_->dirs()) groups.push(d.string());
  j.set("cgroup_v2", cgroup_ ? cgroup_->v2() : false);
  j.set("cgroups", groups);
  Json volumes = Json::array();
  for (auto& v : bound_) {
    Json x = Json::object();
    x.set("slot", int64_t(v.slot));
    x.set("file", v.file.string());
    x.set("read_only", v.read_only);
    volumes.push(x);
  }
  j.set("volumes", volumes);
  j.set("memory_base_file", memory_base_file_.string());
  j.set("memory_base_memfd", memory_base_memfd_);
  auto tmp = config_.run_dir / "vm.json.tmp";
  {
    // Never through a symlink, never readable by others: the record decides what recovery kills.
    std::string text = j.dump();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    if (fd >= 0) ::close(fd);
    if (!ok)
      return make_error(ErrorCode::io_error,
                        "cannot write " + tmp.string() + ": " + strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, config_.run_dir / "vm.json", ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot write vm.json: " + ec.message());
  return Ok{};
}

Result<std::unique_ptr<Vm>> Vm::adopt(IoThread& io, const fs::path& run_dir, milliseconds timeout) {
  std::ifstream in(run_dir / "vm.json");
  if (!in) return make_error(ErrorCode::not_found, "no live record in " + run_dir.string());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto parsed = parse_live_record(text);
  if (!parsed)
    return make_error(ErrorCode::invalid_argument,
                      parsed.error().message + " (in " + run_dir.string() + ")");
  const LiveRecord& r = *parsed;
  VmConfig c;
  c.name = r.name;
  c.hostname = r.hostname;
  c.run_dir = run_dir;
  c.kernel = r.kernel;
  c.initramfs = r.initramfs;
  c.rootfs = r.rootfs;
  c.vcpus = r.vcpus;
  c.memory_mib = r.memory_mib;
  c.accel = r.accel == "kvm" ? Accel::kvm : Accel::tcg;
  c.cpu_model = r.cpu_model;
  c.tsc_khz = r.tsc_khz;
  c.machine = r.machine;
  c.qemu_binary = r.qemu_binary;
  c.jail = r.jail;
  c.die_with_parent = false;
  c.disk_dir = r.disk_dir;
  std::unique_ptr<Vm> vm(new Vm(io, std::move(c)));
  vm->adopted_ = true;
  if (r.jail_uid > 0) {
    vm->jail_uid_ = r.jail_uid;
    JailUids::claim(vm->jail_uid_);
  }
  vm->pid_ = pid_t(r.pid);
  vm->start_ticks_ = r.start_ticks;
  vm->qemu_version_ = r.qemu_version;
  vm->layers_ = r.layers;
  vm->memory_base_file_ = r.memory_base_file;
  vm->memory_base_memfd_ = r.memory_base_memfd;
  vm->overlay_seq_ = r.overlay_seq;
  vm->active_overlay_ = vm->disks() / r.active_overlay;
  std::vector<fs::path> groups(r.cgroups.begin(), r.cgroups.end());
  vm->cgroup_ = Cgroup::adopt(r.cgroup_v2, std::move(groups));
  for (auto& v : r.volumes) {
    if (v.slot >= kVolumeSlots) continue;
    vm->bound_.push_back(VolumeBinding{v.slot, v.file, v.read_only});
  }
  vm->config_.volumes = vm->bound_;
  if (vm->pid_ <= 0 || !vm->alive()) {
    vm->pid_ = -1;  // nothing to kill; ~Vm cleans the folder
    return make_error(ErrorCode::not_found, "the VM of " + run_dir.string() + " is gone");
  }
  auto deadline = steady_clock::now() + timeout;
  RunDirRef dir(run_dir);
  auto qmp = QmpClient::connect(dir.socket("q/qmp.sock"), timeout, {}, vm->peer_uid());
  if (!qmp)
    return vm->failure(ErrorCode::qmp_error, "cannot reconnect QMP: " + qmp.error().message);
  vm->qmp_ = std::move(*qmp);
  // A new agent session (the agent ended the old host's when its end of the port hung up). The
  // agent ends a session only once the hang-up has lasted 300 ms (a reconnecting host must not
  // end it), so a host restarted faster than that would talk into the dead host's session: the
  // first agent connection of an adopting process waits until its own start is 600 ms behind.
  static const auto first_adopt = steady_clock::now();
  std::this_thread::sleep_until(first_adopt + milliseconds(600));
  auto attached = vm->wait_agent(deadline);
  if (!attached) return attached.error();
  spdlog::info("vm {}: adopted (pid {})", vm->config_.name, vm->pid_);
  return vm;
}

std::string Vm::cgroup_name(const fs::path& run_dir) {
  return run_dir.filename().string() + "-" + wire::fnv1a_hex(fs::absolute(run_dir).string());
}

bool Vm::kill_recorded(const fs::path& run_dir) {
  std::ifstream in(run_dir / "vm.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool killed = false;
  std::error_code ec;
  auto r = parse_live_record(text);
  if (!r && in)
    spdlog::warn("{}: {}: only the run folder goes", run_dir.string(), r.error().message);
  if (r) {
    pid_t pid = pid_t(r->pid);
    uint64_t ticks = r->start_ticks;
    if (ticks != 0 && process_start_ticks(pid) == ticks) {
      ::kill(pid, SIGKILL);
      killed = true;
      // Not our child: watch /proc until it is gone (its parent, init, reaps it). SIGKILL ends a
      // stopped process too.
      for (int i = 0; i < 500 && process_start_ticks(pid) == ticks; ++i)
        std::this_thread::sleep_for(milliseconds(2));
    }
    std::vector<fs::path> groups(r->cgroups.begin(), r->cgroups.end());
    Cgroup::adopt(r->cgroup_v2, std::move(groups));  // removed at once: empty now
    if (!r->disk_dir.empty()) fs::remove_all(r->disk_dir, ec);
  }
  fs::remove_all(run_dir, ec);
  fs::remove_all(run_dir.string() + ".jail", ec);
  return killed;
}

}  // namespace pandastack::vmm
