// Shared set-up for the integration tests: where the guest images are, one IoThread, and
// run folders with short paths (unix socket paths are limited to 107 bytes).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "vmm-driver/io_thread.h"
#include "vmm-driver/vm.h"

namespace pandastack::testing {

std::filesystem::path images_dir();
vmm::IoThread& io();
// A fresh, unused run folder path under /tmp (not created).
std::filesystem::path fresh_run_dir(const std::string& tag);
// A config booting the `base` template in a fresh run folder.
vmm::VmConfig base_config(const std::string& tag);
// Boots `base`; fails the test (fatally) if it does not come up.
std::unique_ptr<vmm::Vm> boot_base(const std::string& tag);
// Number of processes whose command line contains `needle`.
int count_processes(const std::string& needle);

}  // namespace pandastack::testing
