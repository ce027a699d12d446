// Runs a short host tool (qemu-img, mkfs.ext4, e2fsck, resize2fs) to completion, its output
// captured (16 KiB at most) and returned in the error when it fails.
#pragma once

#include <string>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// `ok_up_to`: exit codes up to this are success (e2fsck's 1 = "errors corrected").
Status run_tool(const std::vector<std::string>& argv, int ok_up_to = 0);

}  // namespace pandastack::vmm
