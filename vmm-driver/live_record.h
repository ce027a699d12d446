// A VM's live record (run_dir/vm.json): what a restarted host needs to adopt a QEMU that
// outlived its host, or to kill it and clean up after it. Written by the driver (root-owned
// folder, 0600, never through a symlink); read back here with every field checked, because what
// it names gets killed and removed: a record that does not parse, or names a path outside the
// expected shapes, is refused as a whole.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

struct LiveRecord {
  int pid = 0;
  uint64_t start_ticks = 0;
  std::string name, hostname, kernel, initramfs, rootfs, accel, cpu_model, qemu_binary,
      qemu_version;
  unsigned vcpus = 0, memory_mib = 0, tsc_khz = 0;
  unsigned machine = 0;  // its machine revision (none recorded: 0, a VM started before them)
  bool jail = false;
  uint32_t jail_uid = 0;
  std::vector<std::string> layers;  // plain file names in the disk folder
  int overlay_seq = 0;
  std::string active_overlay;  // a plain file name in the disk folder
  std::string disk_dir;        // "" or an absolute path without "." or ".." segments
  bool cgroup_v2 = false;
  std::vector<std::string> cgroups;  // ours: absolute, under /sys/fs/cgroup/, a pandastack/ folder
  // The volume files bound to its slots (Vm::bind_volumes): an adopted VM snapshots and forks
  // them like any other. Only opened (by root, O_NOFOLLOW, a regular file), never removed.
  struct Volume {
    uint32_t slot = 0;
    std::string file;  // absolute, no "." / ".." segments
    bool read_only = false;
  };
  std::vector<Volume> volumes;
  // A VM mapping a memory base copy-on-write (MemoryBase): the RAM file the base is a copy of
  // (absolute, no "." / ".." segments; only read, by root, when the VM is saved) and the base's
  // memfd name ("pst-base-N-N"). Both empty for a VM with a RAM file of its own.
  std::string memory_base_file, memory_base_memfd;
};

// Parses and checks a record's text (at most 1 MiB). invalid_argument with the reason otherwise.
Result<LiveRecord> parse_live_record(std::string_view text);

}  // namespace pandastack::vmm
