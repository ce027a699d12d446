// pandastack-vm: boots one VM from a template through the driver, runs one command in it, prints
// its output and exits with its exit code. A debugging aid until the daemon exists.
//
//   pandastack-vm [--images DIR] [--template NAME] [--memory MIB] -- COMMAND [ARGS...]

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "vmm-driver/images.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/vm.h"
#include "vmm-driver/accel.h"

using namespace pandastack;

int main(int argc, char** argv) {
  std::string images = "var/images", tmpl = "base";
  unsigned memory = 256;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") { ++i; break; }
    if (a == "--images" && i + 1 < argc) images = argv[++i];
    else if (a == "--template" && i + 1 < argc) tmpl = argv[++i];
    else if (a == "--memory" && i + 1 < argc) memory = unsigned(std::stoul(argv[++i]));
    else {
      std::fprintf(stderr, "usage: pandastack-vm [--images DIR] [--template NAME] [--memory MIB] -- CMD...\n");
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "pandastack-vm: no command given\n");
    return 2;
  }
  vmm::IoThread io;
  auto cfg = vmm::config_for_template(std::filesystem::absolute(images), tmpl,
                                      "/tmp/pandastack-vm-" + std::to_string(::getpid()));
  cfg.memory_mib = memory;
  cfg.accel = vmm::detect_accel(io, cfg, std::chrono::seconds(10));
  auto vm = vmm::Vm::boot(io, cfg);
  if (!vm) {
    std::fprintf(stderr, "pandastack-vm: %s: %s\n", vmm::to_string(vm.error().code), vm.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "[pandastack-vm] %s booted in %lld ms (accel=%s)\n", tmpl.c_str(),
               (long long)((*vm)->boot_time().count() / 1000), vmm::to_string(cfg.accel));
  vmm::ExecRequest req;
  for (; i < argc; ++i) req.argv.push_back(argv[i]);
  req.timeout_ms = 60000;
  auto r = (*vm)->agent().exec_stream(req, [](vmm::StreamKind k, std::string_view d) {
    std::fwrite(d.data(), 1, d.size(), k == vmm::StreamKind::out ? stdout : stderr);
  });
  if (!r) {
    std::fprintf(stderr, "pandastack-vm: exec failed: %s\n", r.error().message.c_str());
    return 1;
  }
  if (!r->error.empty()) std::fprintf(stderr, "pandastack-vm: %s\n", r->error.c_str());
  return r->exit_code < 0 ? 128 - r->exit_code : r->exit_code;
}
