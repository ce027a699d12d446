// What vm.cc, vm_record.cc and vm_snapshot.cc (the parts of vmm::Vm) share: not part of the
// driver's API.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "vmm-driver/error.h"

namespace pandastack::vmm::detail {

namespace fs = std::filesystem;

// A control socket of a run folder, reachable whatever the folder path's length: named through
// /proc/self/fd/<an O_PATH descriptor of the folder>/<name> (a unix socket path must be < 108
// bytes; this one is ~30). The descriptor lives as long as this object: connect before it goes.
class RunDirRef {
 public:
  explicit RunDirRef(const fs::path& dir)
      : fd_(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)) {}
  ~RunDirRef() {
    if (fd_ >= 0) ::close(fd_);
  }
  RunDirRef(const RunDirRef&) = delete;
  RunDirRef& operator=(const RunDirRef&) = delete;
  std::string socket(const char* name) const {
    return "/proc/self/fd/" + std::to_string(fd_) + "/" + name;
  }

 private:
  int fd_;
};

// A spare's disk nodes (named on its command line) and the backing name its empty overlay holds
// until a snapshot's layers are attached.
inline constexpr const char* kSpareDiskNode = "root-fmt";
inline constexpr const char* kSpareFileNode = "root-file";
inline constexpr const char* kSpareBacking = "null-co://";

// Links `from` to `to` (same file system), else copies it.
Status link_or_copy(const fs::path& from, const fs::path& to);
// `bytes` random bytes as hex digits.
std::string random_hex(size_t bytes);
// An empty overlay on a given backing file: made once with qemu-img (`backing_name` as the header
// will name it, resolved from `cache`'s folder), then copied.
Status overlay_from_cache(const fs::path& cache, const std::string& backing_name,
                          const fs::path& to);

// Field 22 of /proc/<pid>/stat (start time in clock ticks), 0 when the process is gone (or a
// zombie): whether a recorded pid is still the same process.
uint64_t process_start_ticks(pid_t pid);

}  // namespace pandastack::vmm::detail
