// What a VM costs the host, read from /proc and the file system (no QMP, no guest call: reading it
// does not count as use of the sandbox): QEMU's CPU time and resident memory, and the space the
// guest's writable disk layer holds.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

struct ProcessUsage {
  uint64_t cpu_usec = 0;   // user + system time of every thread, since the process started
  uint64_t rss_bytes = 0;  // resident memory (anonymous, file and shared pages: the guest's RAM
                           // pages it touched included)
};

// not_found when `pid` is gone.
Result<ProcessUsage> process_usage(pid_t pid);
// The bytes `file` occupies on its file system (allocated blocks, not its apparent size); 0 when
// it cannot be read.
uint64_t allocated_bytes(const std::filesystem::path& file);

}  // namespace pandastack::vmm
