// Copying the large files VMs are made of (RAM files, volume images) without reading them
// through user space where the kernel can do better: data extents only (holes stay holes), in
// the kernel (copy_file_range), or shared extents (a reflink) where the file system has them.
#pragma once

#include <filesystem>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// Copies a (sparse) RAM file: only its data extents, in the kernel (copy_file_range), so no page of
// the copy is faulted in through a mapping. Holes stay holes. `into_existing`: `to` exists with the
// same size and may be mapped (a spare QEMU's RAM): it is emptied (holes punched), never truncated.
Status copy_ram_file(const std::filesystem::path& from, const std::filesystem::path& to,
                     bool into_existing = false);

// Punches a hole wherever `file` has an allocated page of zeros (a baked RAM file: the guest
// zeroed its free memory before the bake), so the file and every copy of it hold only data.
Status punch_zero_pages(const std::filesystem::path& file);

// Makes `to` (a new file, 0600) a point-in-time copy of `from`: a reflink (FICLONE: the two share
// extents copy-on-write, so the copy is instant and costs no space) on file systems that have
// them (XFS, btrfs), else a sparse in-kernel copy of the data extents (ext4: time and space in
// proportion to the data). Written under a temporary name, fsynced, then renamed: a crash leaves
// no half-made `to`. Returns whether it was a reflink.
Result<bool> clone_file(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace pandastack::vmm
