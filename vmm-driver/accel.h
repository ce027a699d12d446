// The accelerator: KVM where the host has it and a guest kernel boots under it, else TCG. A probe
// boot decides (up to its deadline); its answer is kept in a cache file keyed by what decides it
// (kernel release, the QEMU binary, the /dev/kvm device, the kvm modules), so only the first start
// on a host waits for a probe: later starts read the cache, and a changed key is probed again in
// the background (the new answer is used from the next start on: snapshots are keyed by it).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include "vmm-driver/vm.h"

namespace pandastack::vmm {

// Picks the accelerator: `PANDASTACK_ACCEL=kvm|tcg` (or `override_accel`) wins; otherwise KVM
// when /dev/kvm opens and a probe boot of the given guest reaches its agent within `deadline`,
// else TCG. Logs the choice and the reason.
Accel detect_accel(IoThread& io, const VmConfig& probe, std::chrono::milliseconds deadline,
                   const std::string& override_accel = "");

// detect_accel with a cache (`cache_file`, JSON {key, accel}): see the file comment.
Accel detect_accel_cached(const VmConfig& probe, std::chrono::milliseconds deadline,
                          const std::string& override_accel,
                          const std::filesystem::path& cache_file);

// What decides whether KVM works here (kernel release, QEMU binary, /dev/kvm, kvm modules).
std::string accel_key(const std::string& qemu_binary);

}  // namespace pandastack::vmm
