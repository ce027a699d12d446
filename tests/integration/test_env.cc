#include "tests/integration/test_env.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>

#include "tests/support/watchdog.h"
#include "vmm-driver/images.h"

namespace pandastack::testing {

std::filesystem::path images_dir() {
  if (const char* e = std::getenv("PANDASTACK_IMAGES")) return e;
  return std::filesystem::path(PANDASTACK_SOURCE_DIR) / "var" / "images";
}

vmm::IoThread& io() {
  static vmm::IoThread* t = new vmm::IoThread();  // lives until exit (VMs may outlive tests)
  return *t;
}

std::filesystem::path fresh_run_dir(const std::string& tag) {
  static std::atomic<int> n{0};
  return std::filesystem::path("/tmp") /
         ("pst-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++));
}

vmm::VmConfig base_config(const std::string& tag) {
  return vmm::config_for_template(images_dir(), "base", fresh_run_dir(tag));
}

std::unique_ptr<vmm::Vm> boot_base(const std::string& tag) {
  auto vm = vmm::Vm::boot(io(), base_config(tag));
  if (!vm) {
    ADD_FAILURE() << "boot failed: " << vm.error().message;
    return nullptr;
  }
  return std::move(*vm);
}

int count_processes(const std::string& needle) {
  int n = 0;
  DIR* d = ::opendir("/proc");
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find(needle) != std::string::npos) ++n;
  }
  ::closedir(d);
  return n;
}

}  // namespace pandastack::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  spdlog::set_level(std::getenv("PANDASTACK_DEBUG") ? spdlog::level::debug : spdlog::level::info);
  if (!std::filesystem::exists(pandastack::testing::images_dir() / "base" / "rootfs.qcow2")) {
    std::fprintf(stderr, "guest image missing under %s: run `make guest-base` first\n",
                 pandastack::testing::images_dir().c_str());
    return 1;
  }
  pandastack::testing::install_watchdog();
  return RUN_ALL_TESTS();
}
