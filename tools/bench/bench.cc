// pandastack-bench: latency benchmarks, p50/p99 over many runs, one JSON object per scenario.
//
//   pandastack-bench driver SCENARIO [--n N] [--json] [--images DIR] [--memory MIB] [--run-dir DIR]
//
// `driver` scenarios measure in-process through the VMM driver:
//   boot         cold boot to agent answering (spawn QEMU, kernel, initramfs, agent)
//   ping         agent health() round trip (the channel alone)
//   exec         `true` round trip through the agent, on one booted VM
//   exec-output  a command writing 1 MiB to stdout (adds throughput_mb_s)
// Scenarios that need parts not built yet exit with status 2 and say so.

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tools/stats.h"
#include "vmm-driver/images.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/vm.h"

using namespace pandastack;
using namespace std::chrono;

namespace {

struct Options {
  std::string mode, scenario;
  int n = 20;
  bool json = false;
  std::string images = "var/images";
  unsigned memory = 256;
  std::string run_dir = "/dev/shm";  // VM run folders (RAM files): tmpfs avoids file-page faults
};

int usage() {
  std::fprintf(stderr,
               "usage: pandastack-bench driver boot|ping|exec|exec-output [--n N] [--json] [--images DIR] "
               "[--memory MIB] [--run-dir DIR]\n");
  return 2;
}

double ms_since(steady_clock::time_point t) { return duration<double, std::milli>(steady_clock::now() - t).count(); }

class DriverBench {
 public:
  explicit DriverBench(const Options& o) : o_(o) {
    base_ = vmm::config_for_template(std::filesystem::absolute(o.images), "base", run_dir("probe"));
    base_.memory_mib = o.memory;
    base_.accel = vmm::detect_accel(io_, base_, seconds(10));
  }

  std::filesystem::path run_dir(const std::string& tag) {
    return o_.run_dir + "/psb-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(seq_++);
  }

  vmm::VmConfig config(const std::string& tag) {
    auto c = base_;
    c.run_dir = run_dir(tag);
    c.name = c.run_dir.filename();
    return c;
  }

  void report(const std::string& scenario, const std::vector<double>& samples,
              const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    auto s = tools::summarize(samples);
    if (o_.json) {
      std::printf("%s\n", tools::summary_json(scenario, s, vmm::to_string(base_.accel), extra).c_str());
    } else {
      std::printf("%-12s n=%-5zu p50=%9.3f ms  p99=%9.3f ms  min=%9.3f ms  max=%9.3f ms  accel=%s", scenario.c_str(),
                  s.n, s.p50_ms, s.p99_ms, s.min_ms, s.max_ms, vmm::to_string(base_.accel));
      for (auto& [k, v] : extra) std::printf("  %s=%s", k.c_str(), v.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  int boot() {
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      auto t = steady_clock::now();
      auto vm = vmm::Vm::boot(io_, config("boot"));
      if (!vm) return fail(vm.error());
      samples.push_back(ms_since(t));
    }
    report("boot", samples);
    return 0;
  }

  int exec(bool big_output) {
    auto vm = vmm::Vm::boot(io_, config("exec"));
    if (!vm) return fail(vm.error());
    vmm::ExecRequest req;
    if (big_output) {
      req.argv = {"head", "-c", "1048576", "/dev/zero"};
    } else {
      req.argv = {"true"};
    }
    // Warm up: the first exec pages the binary in.
    for (int i = 0; i < 3; ++i) (void)(*vm)->agent().exec(req);
    std::vector<double> samples, in_guest;
    for (int i = 0; i < o_.n; ++i) {
      auto t = steady_clock::now();
      auto r = (*vm)->agent().exec(req);
      if (r) in_guest.push_back(double(r->duration_us) / 1000.0);
      if (!r) return fail(r.error());
      if (r->exit_code != 0 || (big_output && r->stdout_data.size() != 1048576)) {
        std::fprintf(stderr, "pandastack-bench: unexpected exec result (exit %d, %zu bytes)\n", r->exit_code,
                     r->stdout_data.size());
        return 1;
      }
      samples.push_back(ms_since(t));
    }
    if (big_output) {
      auto s = tools::summarize(samples);
      char mbs[32];
      std::snprintf(mbs, sizeof mbs, "%.2f", 1.048576 / (s.p50_ms / 1000.0));
      report("exec-output", samples, {{"throughput_mb_s", mbs}, {"bytes", "1048576"}});
    } else {
      char g[32];
      std::snprintf(g, sizeof g, "%.3f", tools::summarize(in_guest).p50_ms);
      report("exec", samples, {{"in_guest_p50_ms", g}});
    }
    return 0;
  }

  int ping() {
    auto vm = vmm::Vm::boot(io_, config("ping"));
    if (!vm) return fail(vm.error());
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      auto t = steady_clock::now();
      auto r = (*vm)->agent().health(seconds(10));
      if (!r) return fail(r.error());
      samples.push_back(ms_since(t));
    }
    report("ping", samples);
    return 0;
  }

  static int fail(const vmm::Error& e) {
    std::fprintf(stderr, "pandastack-bench: %s: %s\n", vmm::to_string(e.code), e.message.c_str());
    return 1;
  }

 private:
  const Options& o_;
  vmm::IoThread io_;
  vmm::VmConfig base_;
  int seq_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  Options o;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--n" && i + 1 < argc) o.n = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json") o.json = true;
    else if (a == "--images" && i + 1 < argc) o.images = argv[++i];
    else if (a == "--memory" && i + 1 < argc) o.memory = unsigned(std::atoi(argv[++i]));
    else if (a == "--run-dir" && i + 1 < argc) o.run_dir = argv[++i];
    else if (a.rfind("--", 0) == 0) return usage();
    else pos.push_back(a);
  }
  if (pos.size() != 2 || pos[0] != "driver") return usage();
  o.mode = pos[0];
  o.scenario = pos[1];
  static const std::vector<std::string> later = {"create", "create-pool", "fork", "fork4", "snapshot",
                                                 "hibernate", "wake", "concurrent-create", "compare"};
  if (std::find(later.begin(), later.end(), o.scenario) != later.end()) {
    std::fprintf(stderr, "pandastack-bench: scenario '%s' needs the snapshot path, which is not built yet\n",
                 o.scenario.c_str());
    return 2;
  }
  DriverBench b(o);
  if (o.scenario == "boot") return b.boot();
  if (o.scenario == "exec") return b.exec(false);
  if (o.scenario == "ping") return b.ping();
  if (o.scenario == "exec-output") return b.exec(true);
  return usage();
}
