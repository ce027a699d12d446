// The few qcow2 header operations the driver does without qemu-img (which costs ~25 ms a run and
// cannot open an image another QEMU holds as a backing file).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "vmm-driver/error.h"

namespace pandastack::vmm::qcow2 {

// The backing file name recorded in `image`'s header ("" when it has none).
Result<std::string> backing_file(const std::filesystem::path& image);

// The disk size `image` presents (the header's size field).
Result<uint64_t> virtual_size(const std::filesystem::path& image);

// Replaces the backing file name recorded in `image` (an image with a backing file) without
// touching its data, like `qemu-img rebase -u`. The new name must fit in the header cluster.
Status set_backing_file(const std::filesystem::path& image, const std::string& backing);

}  // namespace pandastack::vmm::qcow2
