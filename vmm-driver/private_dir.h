// Folders the root daemon works in (its data, its state folder of guest RAM, its guest disks)
// must be its own alone: recovery removes and kills by what it finds in them. A folder another
// user made first, or a symlink in its place, would hand that user root's deletes and everyone's
// guest memory.
#pragma once

#include <filesystem>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// Makes `dir` (and missing parents) and checks it: a real directory (not a symlink), owned by
// this process's user, mode 0700 (tightened when it is ours and looser), in a parent that others
// cannot write to unless it is sticky (/dev/shm, /tmp: they cannot replace what is ours there).
// Refuses (invalid_argument, saying what is wrong) otherwise.
Status private_dir(const std::filesystem::path& dir);

}  // namespace pandastack::vmm
