// A snapshot's RAM shared copy-on-write by every VM restored from it (a template's warm pool and
// its direct restores): one sealed in-memory copy of the RAM file, which each QEMU maps privately
// (`memory-backend-file,share=off` over the descriptor it inherits). A VM then costs the host the
// pages its guest wrote, not its own copy of everything the template's guest had touched.
//
// The copy is a memfd sealed against writes, growth and shrinking before any QEMU sees it: a
// compromised QEMU can map it privately (its writes stay its own) but never change a page another
// tenant's VM reads. (QEMU 7.2 opens a memory file read-write and punches holes in it for the
// balloon; a plain shared file would let one VM zero the memory of every other.)
//
// Saving such a VM (a snapshot, a hibernation) writes an ordinary RAM file: the base's file
// copied (data extents only, in the kernel) and the pages the guest changed written over it, read
// from QEMU's memory where /proc/PID/pagemap says they are its own (present and not the file's,
// or swapped out). Everything downstream (forks, wakes, transfers, the object store) sees today's
// snapshot format.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

class MemoryBase {
 public:
  // A sealed copy of `ram_file` (a snapshot's RAM), its holes filled: a VM's fault never
  // allocates a page in it (which its memory limit would pay for); the base costs the RAM's size
  // once. Its memfd is named `memfd_name()`, which is how a VM's mapping of it is found in
  // /proc/PID/maps.
  static Result<std::shared_ptr<const MemoryBase>> make(const std::filesystem::path& ram_file);
  ~MemoryBase();
  MemoryBase(const MemoryBase&) = delete;
  MemoryBase& operator=(const MemoryBase&) = delete;

  int fd() const { return fd_; }  // close-on-exec; a QEMU inherits it by Vm::spawn
  const std::filesystem::path& source() const { return source_; }
  uint64_t size() const { return size_; }
  const std::string& memfd_name() const { return name_; }

 private:
  MemoryBase(int fd, std::filesystem::path source, uint64_t size, std::string name)
      : fd_(fd), source_(std::move(source)), size_(size), name_(std::move(name)) {}
  int fd_;
  std::filesystem::path source_;
  uint64_t size_;
  std::string name_;
};

// What a VM mapped over a base has of its own: the guest RAM pages QEMU holds privately.
struct PrivateMemory {
  uint64_t pages = 0;  // 4 KiB pages
  uint64_t bytes() const { return pages * 4096; }
};

// Counts the private pages of `pid`'s mapping of the memfd `memfd_name` (`size` bytes of guest
// RAM). not_found when the process maps no such memfd.
Result<PrivateMemory> private_memory(pid_t pid, const std::string& memfd_name, uint64_t size);

// Writes the (paused) guest's RAM to `to` (a new file): `base_file` copied (or, when it is gone,
// the memfd `pid` maps, through /proc/PID/map_files), then every private page of `pid`'s mapping
// of `memfd_name` over it (all-zero pages as holes). Bounded by `size`: a mapping QEMU shows
// beyond it is ignored, a base of another size refused.
Status save_private_memory(pid_t pid, const std::string& memfd_name, uint64_t size,
                           const std::filesystem::path& base_file, const std::filesystem::path& to);

// QEMU's device state without RAM (`xen-save-devices-state`) made loadable by `-incoming` with
// x-ignore-shared on, as a migration stream of `machine_type` would be: the configuration section
// QEMU requires after the header (the machine type and the validated capability x-ignore-shared)
// and the (empty) description QEMU expects after the end. invalid_argument when `devices` does
// not start with QEMU's header.
Result<std::string> incoming_state_of_devices(const std::string& devices,
                                              const std::string& machine_type);

}  // namespace pandastack::vmm
