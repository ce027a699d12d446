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
#include <vector>

#include "vmm-driver/agent_client.h"
#include "vmm-driver/error.h"
#include "vmm-driver/qmp.h"

namespace pandastack::vmm {

class IoThread;

enum class Accel { tcg, kvm };
const char* to_string(Accel a);

struct VmConfig {
  std::string name;                    // for logs
  std::filesystem::path run_dir;       // created by boot(); removed with the Vm
  std::filesystem::path kernel;        // uncompressed vmlinux (PVH)
  std::filesystem::path initramfs;
  std::filesystem::path rootfs;        // base qcow2; each Vm writes to its own overlay on it
  unsigned vcpus = 1;
  unsigned memory_mib = 256;
  Accel accel = Accel::tcg;
  std::string cpu_model;               // empty = "host" under KVM, TCG_DEFAULT_CPU under TCG
  unsigned tsc_khz = 0;                // TCG: host TSC kHz for the guest's timer (0 = read /proc/cpuinfo)
  std::string qemu_binary = "qemu-system-x86_64";
  std::chrono::milliseconds boot_timeout{60000};
  bool die_with_parent = true;         // QEMU gets SIGKILL when the owning process dies
};

// The QEMU command line for a cold boot of `config` (exposed for tests and logs).
std::vector<std::string> qemu_boot_args(const VmConfig& config);

// Host TSC frequency in kHz from /proc/cpuinfo (0 when unknown).
unsigned host_tsc_khz();

class Vm {
 public:
  // Boots the guest and returns once its agent answers (or an error with the console's tail).
  static Result<std::unique_ptr<Vm>> boot(IoThread& io, VmConfig config);
  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  AgentClient& agent() { return *agent_; }
  QmpClient& qmp() { return *qmp_; }
  const VmConfig& config() const { return config_; }
  pid_t pid() const { return pid_; }
  // Time from spawning QEMU to the agent's first answer.
  std::chrono::microseconds boot_time() const { return boot_time_; }

  // Drops the agent connection and connects again (the agent must serve the new session).
  Status reconnect_agent(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // True while the QEMU process runs.
  bool alive();
  // The last `bytes` of the guest's serial console.
  std::string console_tail(size_t bytes = 4096) const;

 private:
  Vm(IoThread& io, VmConfig config) : io_(io), config_(std::move(config)) {}
  void kill_and_clean();

  IoThread& io_;
  VmConfig config_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  std::unique_ptr<QmpClient> qmp_;
  std::unique_ptr<AgentClient> agent_;
  std::chrono::microseconds boot_time_{0};
};

// Picks the accelerator: `PANDASTACK_ACCEL=kvm|tcg` (or `override_accel`) wins; otherwise KVM
// when /dev/kvm opens and a probe boot of the given guest reaches its agent within `deadline`,
// else TCG. Logs the choice and the reason.
Accel detect_accel(IoThread& io, const VmConfig& probe, std::chrono::milliseconds deadline,
                   const std::string& override_accel = "");

}  // namespace pandastack::vmm
