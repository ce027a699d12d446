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
// snapshot format. The base's copy is made ahead of time where it can be (copy_file_to): the
// guest is paused while a save runs, a rename is instant and a copy is not.
#pragma once

#include <sys/types.h>

#include <chrono>
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
  // `copies_dir` (optional): a folder of the caller's, on the file system its snapshots are
  // written to, where a copy of `ram_file` is kept ready for the next save (copy_file_to); kept
  // while saves come, removed after `copy_idle` without one. Copies a process that is gone left
  // there are removed.
  static Result<std::shared_ptr<const MemoryBase>> make(
      const std::filesystem::path& ram_file, const std::filesystem::path& copies_dir = {},
      std::chrono::milliseconds copy_idle = std::chrono::minutes(2));
  ~MemoryBase();
  MemoryBase(const MemoryBase&) = delete;
  MemoryBase& operator=(const MemoryBase&) = delete;

  int fd() const { return fd_; }  // close-on-exec; a QEMU inherits it by Vm::spawn
  const std::filesystem::path& source() const { return source_; }
  uint64_t size() const { return size_; }
  const std::string& memfd_name() const { return name_; }

  // Writes the base's RAM file (`source()`) to `to`, a new file: what a save of a VM over the base
  // starts from before its own pages are written over it. With a copies folder the copy made
  // ahead of time is renamed into place (with `base`, ~50 ms less of a paused guest here) and
  // the next is made in the background: one thread per base while saves come, at nice 10, begun
  // 0.5 s after the save that took the last, and only while the folder has twice the file's size
  // free. Else, or when none is ready yet (saves in a quick row) or `to` is on another file
  // system, the file is copied now, as without.
  Status copy_file_to(const std::filesystem::path& to) const;

 private:
  struct Copies;  // the copy kept ready and its maker's state (memory_base.cc)
  MemoryBase(int fd, std::filesystem::path source, uint64_t size, std::string name,
             std::shared_ptr<Copies> copies)
      : fd_(fd),
        source_(std::move(source)),
        size_(size),
        name_(std::move(name)),
        copies_(std::move(copies)) {}
  static void make_copies(std::shared_ptr<Copies> copies);
  int fd_;
  std::filesystem::path source_;
  uint64_t size_;
  std::string name_;
  std::shared_ptr<Copies> copies_;  // null without a copies folder
};

// What a VM mapped over a base has of its own: the guest RAM pages QEMU holds privately.
struct PrivateMemory {
  uint64_t pages = 0;  // 4 KiB pages
  uint64_t bytes() const { return pages * 4096; }
};

// Counts the private pages of `pid`'s mapping of the memfd `memfd_name` (`size` bytes of guest
// RAM). not_found when the process maps no such memfd.
Result<PrivateMemory> private_memory(pid_t pid, const std::string& memfd_name, uint64_t size);

// A guest's RAM is saved to a file in two halves, both bounded by `size` (a mapping QEMU shows
// beyond it is ignored, a base of another size refused). First, with no pause needed (the base
// never changes): `to` (a new file) becomes `base_file` copied (by `base`'s copy_file_to when
// `base` is the base of that file; or, when the file is gone, the memfd `pid` maps, through
// /proc/PID/map_files).
Status copy_memory_base(pid_t pid, const std::string& memfd_name, uint64_t size,
                        const std::filesystem::path& base_file, const std::filesystem::path& to,
                        const MemoryBase* base = nullptr);

// Then, once the guest is paused: every private page of `pid`'s mapping of
// `memfd_name` written over `to` (a copy of the base, `size` bytes; all-zero pages as holes).
// Pages that became private after the copy are there too: whatever is private at the pause is.
Status write_private_pages(pid_t pid, const std::string& memfd_name, uint64_t size,
                           const std::filesystem::path& to);

// QEMU's device state without RAM (`xen-save-devices-state`) made loadable by `-incoming` with
// x-ignore-shared on, as a migration stream of `machine_type` would be: the configuration section
// QEMU requires after the header (the machine type and the validated capability x-ignore-shared)
// and the (empty) description QEMU expects after the end. invalid_argument when `devices` does
// not start with QEMU's header.
Result<std::string> incoming_state_of_devices(const std::string& devices,
                                              const std::string& machine_type);

}  // namespace pandastack::vmm
