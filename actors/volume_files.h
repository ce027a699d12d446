// A volume's file: a sparse raw image with an ext4 file system, on a real disk (the data
// folder's volumes/), root's and private (0600 in a 0700 folder). QEMU never opens it by path:
// the daemon passes a descriptor (vmm::Vm::bind_volumes). Blocking (mkfs): call from
// threads that may block, never from CAF's shared threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "vmm-driver/error.h"

namespace pandastack::actors {

// The file of volume `id` under `dir`.
std::filesystem::path volume_file(const std::filesystem::path& dir, const std::string& id);
// The file of volume snapshot `id` (vsnap_...) under `dir` (in its snapshots/ folder).
std::filesystem::path volume_snapshot_file(const std::filesystem::path& dir, const std::string& id);
// Makes a `size_mib` file with an empty ext4 file system at `to` (written to a temporary name,
// synced, then renamed: a crash leaves no half-made volume under the final name).
vmm::Status make_volume_file(const std::filesystem::path& to, uint64_t size_mib);
// Grows the file to `size_mib` (sparsely, synced; idempotent: recovery re-runs it). Its file
// system grows in the guest at its next read-write mount: the host runs no file-system tool on
// what a guest wrote (security review 3, H4).
vmm::Status grow_volume_file(const std::filesystem::path& file, uint64_t size_mib);
// Syncs the file to the disk (its data and size).
vmm::Status sync_volume_file(const std::filesystem::path& file);
// Removes the file (a missing file is fine).
void remove_volume_file(const std::filesystem::path& file);

}  // namespace pandastack::actors
