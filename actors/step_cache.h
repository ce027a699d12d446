// A template build's step cache (issue 37): a build of an unchanged prefix restarts where the
// last build of that prefix was, instead of running it again. After its packages and files, and
// after each of its commands, a build checkpoints its builder's disk (a disk-only snapshot: the
// guest syncs, the driver freezes the overlay into a layer, vmm-driver/vm.h; no RAM kept), named
// by a key of everything that made that disk: the tenant, the root file system it builds on (its
// file's identity), the disk's size, the packages, files and environment, then each command in
// order (and the context archives' keys, from the first command that reads the context). The
// next build with the same keys boots its builder on the deepest checkpoint it finds and runs the
// rest; its template's root file system is then a chain of those layers (its own copies, each
// naming the one below by its absolute name: a checkpoint dropped later changes no template).
// Nothing of the guest's is parsed on the host: the layers are QEMU's own images, named by the
// daemon. A checkpoint is a disk-only snapshot whose empty overlay has the grown disk's size.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/custom_template.h"
#include "actors/runtime.h"
#include "vmm-driver/snapshot.h"

namespace pandastack::vmm {
class Vm;
}

namespace pandastack::actors {

// The keys of a build's checkpoints: [0] after its packages and files, [i] after run[i-1].
// `rootfs`: the root file system it builds on (its identity: path, inode, size, time).
std::vector<std::string> step_keys(const std::string& tenant, const std::filesystem::path& rootfs,
                                   uint64_t disk_bytes, const TemplateSpec& spec);

// The checkpoints kept on this host: DIR/<key>/ (a disk-only snapshot). Thread-safe enough for
// builds: a checkpoint appears by a rename; two builds making the same one keep the first.
class StepCache {
 public:
  StepCache(std::filesystem::path dir, size_t max_entries = 64)
      : dir_(std::move(dir)), max_entries_(max_entries) {}

  // The deepest checkpoint among `keys` (its index and snapshot), marked recently used.
  std::optional<std::pair<size_t, vmm::Snapshot>> deepest(const std::vector<std::string>& keys);
  // Checkpoints `vm`'s disk (of `disk_bytes`) as `key` (the guest has synced): a disk-only
  // snapshot (Vm::checkpoint_disk; no RAM is copied). The snapshot (its layers: every layer of
  // the disk so far), with the empty overlay of that size a builder booted on it starts from.
  Reply<vmm::Snapshot> keep(vmm::Vm& vm, const std::string& key, uint64_t disk_bytes);
  // Drops the least recently used beyond max_entries (and leftovers of interrupted ones).
  void trim();

 private:
  std::filesystem::path dir_;
  size_t max_entries_;
};

}  // namespace pandastack::actors
