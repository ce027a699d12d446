// Runs a short host tool (qemu-img, mkfs.ext4) on the host's own artifacts to completion, its
// output captured (16 KiB at most) and returned in the error when it fails. Every run has a
// deadline: a tool still running at it is killed (its process group) and the run fails.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

constexpr std::chrono::seconds kToolTimeout{120};

// `ok_up_to`: exit codes up to this are success.
Status run_tool(const std::vector<std::string>& argv, int ok_up_to = 0,
                std::chrono::milliseconds timeout = kToolTimeout);

// Runs a long host tool (an image build), in a process group of its own, handing each line of
// its output (stdout and stderr) to `on_line` as it comes; `env` entries ("K=V") are added to
// the daemon's environment. `cancelled` is polled (every 200 ms): when it answers true, the
// whole group is killed. Fails with the exit status when the tool does not exit 0.
Status run_logged(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  const std::function<void(const std::string&)>& on_line,
                  const std::function<bool()>& cancelled = {});

}  // namespace pandastack::vmm
