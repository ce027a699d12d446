// pandastack-bench: latency benchmarks, p50/p99 over many runs, one JSON object per scenario.
//
//   pandastack-bench driver SCENARIO [--n N] [--json] [--images DIR] [--memory MIB] [--run-dir DIR]
//
// `driver` scenarios measure in-process through the VMM driver:
//   boot         cold boot to agent answering (spawn QEMU, kernel, initramfs, agent)
//   ping         agent health() round trip (the channel alone)
//   exec         `true` round trip through the agent, on one booted VM
//   exec-output  a command writing 1 MiB to stdout (adds throughput_mb_s)
//   create       restore from the baked base template to agent answering (clock, RNG, hostname set)
//   create-pool  the same into a pre-spawned QEMU (pool of 2, refilled between creates)
//   concurrent-create  20 creates at once: time until all answer
//   snapshot     snapshot of a running VM (memory + disk), the VM runs on
//   fork, fork4  snapshot of a running parent + 1 (4) children restored from it, to all answering
//   hibernate    running VM to a snapshot on disk, QEMU gone
//   wake         restore of a hibernated VM to agent answering
//   compare      boot and create in one run, and the ratio of their p50s
//   density      N (--n) VMs restored and left idle: host memory per VM (MemAvailable), host CPU
//                while they idle (--idle-seconds), exec p50/p99 on one of them, how many answer
//
//   pandastack-bench proxy https|https-new [--n N]   (tools/bench/proxy_bench.cc: the egress
//   proxy's cost) pandastack-bench storage append|append16|recovery [--n N]
// `storage` scenarios measure the event store (RocksDB, synced writes):
//   append       one writer, N appends of one event each (adds appends_per_s)
//   append16     16 writers on 16 streams, N appends each (group commit)
//   recovery     10k entities x 100 events (1M events), then N times: open + replay every stream

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "storage/event_store.h"
#include "tools/bench/host_stats.h"
#include "tools/stats.h"
#include "vmm-driver/accel.h"
#include "vmm-driver/images.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/memory_base.h"
#include "vmm-driver/pool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/templates.h"
#include "vmm-driver/vm.h"

using namespace pandastack;
using namespace std::chrono;

namespace pandastack::tools {
int api_bench(const std::string& scenario, const std::string& url, const std::string& key,
              const std::string& create_body, const std::string& upstream, int n, int pause_ms,
              int idle_seconds, bool json);
int cluster_bench(const std::string& scenario, const std::string& url, const std::string& via,
                  const std::string& key, int n, bool json);
int soak_bench(const std::string& url, const std::string& key, const std::string& create_body,
               int sandboxes, int clients, int seconds);
int churn_bench(const std::string& url, const std::string& key, const std::string& create_body,
                int n, int window, pid_t daemon);
int proxy_bench(const std::string& scenario, int n, bool json);
}  // namespace pandastack::tools

namespace {

struct Options {
  std::string mode, scenario;
  int n = 20;
  bool json = false;
  std::string images = "var/images";
  unsigned memory = 256;
  std::string run_dir = "/dev/shm";  // VM run folders (RAM files): tmpfs avoids file-page faults
  std::string cpu;                   // QEMU -cpu model (empty = the driver's default)
  unsigned machine = vmm::kMachineRevision;  // the VMs' machine revision (0: before/after runs)
  bool memory_base = true;  // restores of the template share its RAM copy-on-write (MemoryBase)
  std::string url = "http://127.0.0.1:7070", key, via;  // api and cluster modes
  std::string create_body = "{}";                       // api mode: the body of every create
  std::string upstream;                                 // api net-throughput: the URL guests fetch
  int pause_ms = 1000;    // api create/fork/wake: untimed pause between requests (pools refill)
  int sandboxes = 5;      // recovery: running sandboxes at the crash; api soak: sandboxes used
  int clients = 16;       // api soak: client threads
  int seconds = 600;      // api soak: duration
  std::string daemon;     // recovery: the pandastackd binary
  int window = 0;         // api churn: creates per reported window (0: n/10)
  int daemon_pid = 0;     // api churn: the daemon's process (0: the one pandastackd)
  int idle_seconds = 15;  // density: the window the idle sandboxes' CPU use is measured over
};

int usage() {
  std::fprintf(
      stderr,
      "usage: pandastack-bench driver "
      "boot|ping|exec|exec-output|create|create-pool|concurrent-create|concurrent-create-"
      "pool|snapshot|fork|fork4|fork-pool|fork4-pool|hibernate|wake|wake-pool|compare|density "
      "[--n N] [--json] [--images DIR] [--idle-seconds S] "
      "[--memory MIB] [--run-dir DIR] [--cpu MODEL] [--machine REVISION] [--memory-base on|off]\n"
      "       pandastack-bench storage append|append16|recovery [--n N]\n"
      "       pandastack-bench proxy https|https-new [--n N] [--json]\n"
      "       pandastack-bench api "
      "create|create-volume|fork-volume|db-create|volume-throughput|exec|exec-user|code|fork|"
      "wake|wake-disk|kill|hibernate-durable|hibernate-remote|snapshot-durable|snapshot-remote|"
      "concurrent-create|density|net-throughput|preview [--url URL] "
      "[--key KEY (default $PANDASTACK_API_KEY)] [--create-body JSON] [--upstream URL] "
      "[--pause-ms MS] [--n N] [--json]\n"
      "       pandastack-bench api soak [--url URL] [--key KEY] [--sandboxes N] "
      "[--clients C] [--seconds S] [--create-body JSON]\n"
      "       pandastack-bench api churn [--url URL] [--key KEY] [--n N] [--window W] "
      "[--daemon-pid PID] [--create-body JSON]\n"
      "       pandastack-bench cluster route|fork|migrate|migrate-volume --url A --via B "
      "[--key KEY] [--n N] "
      "[--json]\n"
      "       pandastack-bench recovery --daemon PATH [--sandboxes N] [--images DIR] [--n "
      "ROUNDS] [--json]\n");
  return 2;
}

double ms_since(steady_clock::time_point t) {
  return duration<double, std::milli>(steady_clock::now() - t).count();
}

class DriverBench {
 public:
  explicit DriverBench(const Options& o) : o_(o), templates_(io_, o.images) {
    base_ = vmm::config_for_template(std::filesystem::absolute(o.images), "base", run_dir("probe"));
    base_.memory_mib = o.memory;
    base_.cpu_model = o.cpu;
    base_.machine = o.machine;
    base_.accel = vmm::detect_accel(io_, base_, seconds(10));
  }

  // The baked base template (baked on first use: one cold boot, reported on stderr).
  vmm::Result<vmm::Snapshot> baked() {
    auto t = steady_clock::now();
    auto s = templates_.baked("base", base_);
    if (!s) return s;
    // Stage it next to the VMs' run folders, so restores copy its RAM file in the kernel.
    auto staged = vmm::stage_snapshot(
        *s, o_.run_dir + "/pandastack-bench-template-" + s->dir.filename().string());
    if (staged)
      std::fprintf(stderr, "[bench] base template ready in %.0f ms (%s)\n", ms_since(t),
                   staged->dir.c_str());
    if (staged && o_.memory_base && !memory_base_) {
      auto base = vmm::MemoryBase::make(staged->mem(), o_.run_dir + "/pandastack-bench-ram-copies");
      if (!base) return base.error();
      memory_base_ = *base;
    }
    return staged;
  }

  // A config for restoring `s`: over the memory base when `s` is the template it is a copy of.
  vmm::VmConfig config_for(const vmm::Snapshot& s, const std::string& tag) {
    auto c = config(tag);
    if (memory_base_ && memory_base_->source() == std::filesystem::absolute(s.mem()))
      c.memory_base = memory_base_;
    return c;
  }

  std::unique_ptr<vmm::Vm> restore(const vmm::Snapshot& s, const std::string& tag,
                                   std::string* err) {
    auto vm = vmm::Vm::restore(io_, s, config_for(s, tag));
    if (!vm) {
      *err = vm.error().message;
      return nullptr;
    }
    return std::move(*vm);
  }

  int create() {
    auto s = baked();
    if (!s) return fail(s.error());
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      auto t = steady_clock::now();
      auto vm = vmm::Vm::restore(io_, *s, config_for(*s, "create"));
      if (!vm) return fail(vm.error());
      samples.push_back(ms_since(t));
    }
    report("create", samples);
    return 0;
  }

  int create_pool() {
    auto s = baked();
    if (!s) return fail(s.error());
    const size_t size = 2;
    vmm::RestorePool pool(io_, *s, config("pool"), size, nullptr, {}, memory_base_);
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      wait_full(pool,
                size);  // creates arrive spaced out; the pool refills between them (not timed)
      auto t = steady_clock::now();
      auto vm = pool.create("pool-" + std::to_string(i), "sbx-" + std::to_string(i));
      if (!vm) return fail(vm.error());
      samples.push_back(ms_since(t));
    }
    report("create-pool", samples, {{"pool_size", std::to_string(size)}});
    return 0;
  }

  int concurrent_create() {
    auto s = baked();
    if (!s) return fail(s.error());
    const int k = 20;
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      std::vector<std::unique_ptr<vmm::Vm>> vms(k);
      std::vector<std::string> errs(k);
      std::vector<std::thread> threads;
      auto t = steady_clock::now();
      for (int j = 0; j < k; ++j)
        threads.emplace_back([&, j] { vms[j] = restore(*s, "cc", &errs[j]); });
      for (auto& th : threads) th.join();
      double ms = ms_since(t);
      for (int j = 0; j < k; ++j)
        if (!vms[j]) {
          std::fprintf(stderr, "pandastack-bench: create %d failed: %s\n", j, errs[j].c_str());
          return 1;
        }
      samples.push_back(ms);
    }
    report("concurrent-create", samples, {{"sandboxes", std::to_string(k)}});
    return 0;
  }

  // concurrent-create against a warm pool sized for the burst (members made ahead, untimed).
  int concurrent_create_pool() {
    auto s = baked();
    if (!s) return fail(s.error());
    const size_t k = 20;
    vmm::RestorePool pool(io_, *s, config("ccpool"), k, nullptr, {}, memory_base_);
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      for (int w = 0; w < 12000 && pool.ready() < k; ++w)
        std::this_thread::sleep_for(milliseconds(10));
      if (pool.ready() < k)
        return fail(vmm::make_error(vmm::ErrorCode::timeout, "the pool did not fill"));
      std::vector<std::unique_ptr<vmm::Vm>> vms(k);
      std::vector<std::string> errs(k);
      std::vector<std::thread> threads;
      auto t = steady_clock::now();
      for (size_t j = 0; j < k; ++j)
        threads.emplace_back([&, j] {
          auto vm = pool.create("cc-" + std::to_string(j), "cc-" + std::to_string(j));
          if (vm)
            vms[j] = std::move(*vm);
          else
            errs[j] = vm.error().message;
        });
      for (auto& th : threads) th.join();
      double ms = ms_since(t);
      for (size_t j = 0; j < k; ++j)
        if (!vms[j]) {
          std::fprintf(stderr, "pandastack-bench: create %zu failed: %s\n", j, errs[j].c_str());
          return 1;
        }
      samples.push_back(ms);
    }
    report("concurrent-create-pool", samples,
           {{"sandboxes", std::to_string(k)}, {"pool_size", std::to_string(k)}});
    return 0;
  }

  int snapshot() {
    auto s = baked();
    if (!s) return fail(s.error());
    std::string err;
    auto vm = restore(*s, "snap", &err);
    if (!vm) return fail(vmm::make_error(vmm::ErrorCode::boot_failed, err));
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      auto dir = run_dir("snapshot");
      auto t = steady_clock::now();
      auto snap = vm->snapshot(dir);
      if (!snap) return fail(snap.error());
      samples.push_back(ms_since(t));
      vmm::remove_snapshot(dir);
    }
    report("snapshot", samples);
    return 0;
  }

  // Waits (untimed) until `pool` has `size` members ready: requests arrive spaced out.
  template <class Pool>
  static void wait_full(Pool& pool, size_t size) {
    for (int i = 0; i < 4000 && pool.ready() < size; ++i)
      std::this_thread::sleep_for(milliseconds(5));
  }

  // A restore into a spare of `spares` (when given and one is ready), else into a new process.
  std::unique_ptr<vmm::Vm> restore_spare(vmm::SparePool* spares, const vmm::Snapshot& s,
                                         const std::string& tag, bool consume, std::string* err) {
    auto vm = vmm::restore_with_spare(io_, spares, s, config(tag), consume, nullptr);
    if (!vm) {
      *err = vm.error().message;
      return nullptr;
    }
    return std::move(*vm);
  }

  // fork = snapshot of the running parent + `children` restores of it (in parallel); with
  // `spares`, into QEMU processes spawned ahead (a pool of `children`).
  int fork(int children, bool spares) {
    auto s = baked();
    if (!s) return fail(s.error());
    std::string err;
    auto parent = restore(*s, "parent", &err);
    if (!parent) return fail(vmm::make_error(vmm::ErrorCode::boot_failed, err));
    std::unique_ptr<vmm::SparePool> pool;
    if (spares) pool = std::make_unique<vmm::SparePool>(io_, config("spare"), size_t(children));
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      if (pool) wait_full(*pool, size_t(children));
      auto dir = run_dir("fork");
      auto t = steady_clock::now();
      auto snap = parent->snapshot(dir);
      if (!snap) return fail(snap.error());
      std::vector<std::unique_ptr<vmm::Vm>> kids(static_cast<size_t>(children));
      std::vector<std::string> errs(static_cast<size_t>(children));
      std::vector<std::thread> threads;
      for (int j = 0; j < children; ++j)
        threads.emplace_back([&, j] {
          kids[size_t(j)] = restore_spare(pool.get(), *snap, "child", false, &errs[size_t(j)]);
        });
      for (auto& th : threads) th.join();
      double ms = ms_since(t);
      for (int j = 0; j < children; ++j)
        if (!kids[size_t(j)])
          return fail(vmm::make_error(vmm::ErrorCode::boot_failed, errs[size_t(j)]));
      samples.push_back(ms);
      kids.clear();
      vmm::remove_snapshot(dir);
    }
    report((children == 1 ? "fork" : "fork" + std::to_string(children)) + (spares ? "-pool" : ""),
           samples,
           spares ? std::vector<std::pair<std::string, std::string>>{{"spares",
                                                                      std::to_string(children)}}
                  : std::vector<std::pair<std::string, std::string>>{});
    return 0;
  }

  int hibernate(bool measure_wake, bool spares = false) {
    auto s = baked();
    if (!s) return fail(s.error());
    std::unique_ptr<vmm::SparePool> pool;
    if (spares) pool = std::make_unique<vmm::SparePool>(io_, config("spare"), 1);
    std::vector<double> samples;
    for (int i = 0; i < o_.n; ++i) {
      if (pool) wait_full(*pool, 1);
      std::string err;
      auto vm = restore(*s, "hib", &err);
      if (!vm) return fail(vmm::make_error(vmm::ErrorCode::boot_failed, err));
      auto dir = run_dir("hibernated");
      auto t = steady_clock::now();
      auto snap = vm->hibernate(dir);
      if (!snap) return fail(snap.error());
      if (!measure_wake) samples.push_back(ms_since(t));
      vm.reset();
      t = steady_clock::now();
      auto woken = restore_spare(pool.get(), *snap, "wake", /*consume=*/true, &err);
      if (!woken) return fail(vmm::make_error(vmm::ErrorCode::boot_failed, err));
      if (measure_wake) samples.push_back(ms_since(t));
      woken.reset();
      vmm::remove_snapshot(dir);
    }
    report(std::string(measure_wake ? "wake" : "hibernate") + (spares ? "-pool" : ""), samples,
           spares ? std::vector<std::pair<std::string, std::string>>{{"spares", "1"}}
                  : std::vector<std::pair<std::string, std::string>>{});
    return 0;
  }

  // density: --n VMs restored from the baked base template and left idle. What each costs the
  // host (MemAvailable before and after, divided by N), the host's CPU use while they idle (over
  // --idle-seconds), exec latency on one of them (20 samples) and how many answer an exec. Stops
  // restoring when the host would have less than 1 GiB available (reported as "sandboxes").
  int density() {
    auto s = baked();
    if (!s) return fail(s.error());
    auto before = tools::mem_available_kib();
    std::vector<std::unique_ptr<vmm::Vm>> vms;
    auto t = steady_clock::now();
    for (int i = 0; i < o_.n; ++i) {
      if (tools::mem_available_kib() < tools::kDensityFloorKib) {
        std::fprintf(stderr, "[bench] stopped at %d VMs: less than 1 GiB available\n", i);
        break;
      }
      std::string err;
      auto vm = restore(*s, "dense", &err);
      if (!vm) return fail(vmm::make_error(vmm::ErrorCode::boot_failed, err));
      vms.push_back(std::move(vm));
    }
    double restore_s = ms_since(t) / 1000.0;
    if (vms.empty()) return 1;
    std::this_thread::sleep_for(seconds(5));  // the restores' page-cache churn and first answers
    auto after = tools::mem_available_kib();
    double cpu = tools::cpu_busy_percent(seconds(o_.idle_seconds));
    double load = tools::load_average_1m();
    vmm::ExecRequest req;
    req.argv = {"true"};
    size_t answering = 0;
    for (auto& vm : vms)
      if (auto r = vm->agent().exec(req); r && r->exit_code == 0) ++answering;
    std::vector<double> samples;
    auto& one = *vms[vms.size() / 2];
    for (int i = 0; i < 20; ++i) {
      auto t0 = steady_clock::now();
      auto r = one.agent().exec(req);
      if (!r) return fail(r.error());
      samples.push_back(ms_since(t0));
    }
    auto fields =
        tools::density_fields(vms.size(), answering, before, after, cpu, o_.idle_seconds, load);
    char rs[32];
    std::snprintf(rs, sizeof rs, "%.1f", restore_s);
    fields.emplace_back("restore_all_s", rs);
    if (memory_base_) {
      // What each VM holds of its own over the shared base (the pages its guest wrote).
      uint64_t own = 0;
      for (auto& vm : vms)
        if (auto p = vmm::private_memory(vm->pid(), vm->memory_base_memfd(),
                                         uint64_t(vm->config().memory_mib) << 20))
          own += p->bytes();
      std::snprintf(rs, sizeof rs, "%.1f", double(own) / double(vms.size()) / (1 << 20));
      fields.emplace_back("own_pages_mib_avg", rs);
    }
    report("density", samples, fields);
    return 0;
  }

  int compare() {
    auto s = baked();
    if (!s) return fail(s.error());
    std::vector<double> boots, creates;
    for (int i = 0; i < o_.n; ++i) {
      auto t = steady_clock::now();
      auto vm = vmm::Vm::boot(io_, config("cmp-boot"));
      if (!vm) return fail(vm.error());
      boots.push_back(ms_since(t));
      vm->reset();
      t = steady_clock::now();
      auto r = vmm::Vm::restore(io_, *s, config("cmp-create"));
      if (!r) return fail(r.error());
      creates.push_back(ms_since(t));
    }
    report("boot", boots);
    report("create", creates);
    auto b = tools::summarize(boots), c = tools::summarize(creates);
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.1f", b.p50_ms / c.p50_ms);
    if (o_.json)
      std::printf("{\"scenario\":\"compare\",\"boot_over_create_p50\":%s,\"accel\":\"%s\"}\n",
                  ratio, vmm::to_string(base_.accel));
    else
      std::printf("compare      create is %sx faster than a cold boot (p50)\n", ratio);
    return 0;
  }

  std::filesystem::path run_dir(const std::string& tag) {
    return o_.run_dir + "/psb-" + std::to_string(::getpid()) + "-" + tag + "-" +
           std::to_string(seq_++);
  }

  vmm::VmConfig config(const std::string& tag) {
    auto c = base_;
    c.run_dir = run_dir(tag);
    c.name = c.run_dir.filename();
    // Named as the daemon names a sandbox's guest (its id): the same guest work after a restore.
    c.hostname = c.name;
    return c;
  }

  void report(const std::string& scenario, const std::vector<double>& samples,
              const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    auto s = tools::summarize(samples);
    if (o_.json) {
      std::printf("%s\n",
                  tools::summary_json(scenario, s, vmm::to_string(base_.accel), extra).c_str());
    } else {
      std::printf("%-12s n=%-5zu p50=%9.3f ms  p99=%9.3f ms  min=%9.3f ms  max=%9.3f ms  accel=%s",
                  scenario.c_str(), s.n, s.p50_ms, s.p99_ms, s.min_ms, s.max_ms,
                  vmm::to_string(base_.accel));
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
        std::fprintf(stderr, "pandastack-bench: unexpected exec result (exit %d, %zu bytes)\n",
                     r->exit_code, r->stdout_data.size());
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
  vmm::TemplateStore templates_;
  vmm::VmConfig base_;
  std::shared_ptr<const vmm::MemoryBase> memory_base_;  // (--memory-base on: made by baked())
  int seq_ = 0;
};

// `storage` scenarios: the event store on a real RocksDB (synced writes) in a temporary folder.
int storage_bench(const Options& o) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::temp_directory_path() / ("pandastack-bench-store-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto open = [&] { return storage::EventStore::open({dir, true, 1024, {}}); };
  auto report = [&](const std::string& name, const std::vector<double>& samples,
                    std::vector<std::pair<std::string, std::string>> extra) {
    auto s = tools::summarize(samples);
    std::printf("%s\n", tools::summary_json(name, s, "n/a", extra).c_str());
  };
  auto ev = [](size_t n) {
    std::vector<storage::NewEvent> v;
    for (size_t i = 0; i < n; ++i) v.push_back({"exec-finished", 1, std::string(120, 'x')});
    return v;
  };
  int rc = 0;
  if (o.scenario == "append" || o.scenario == "append16") {
    auto store = open();
    if (!store) {
      std::fprintf(stderr, "pandastack-bench: %s\n", store.error().message.c_str());
      return 1;
    }
    int writers = o.scenario == "append" ? 1 : 16;
    std::vector<std::vector<double>> lat(static_cast<size_t>(writers));
    auto t0 = steady_clock::now();
    std::vector<std::thread> ts;
    for (int w = 0; w < writers; ++w)
      ts.emplace_back([&, w] {
        std::string stream = "bench-" + std::to_string(w);
        for (int i = 0; i < o.n; ++i) {
          auto t = steady_clock::now();
          auto r = (*store)->append(stream, uint64_t(i), ev(1));
          if (!r) std::_Exit(1);
          lat[size_t(w)].push_back(ms_since(t));
        }
      });
    for (auto& t : ts) t.join();
    double secs = ms_since(t0) / 1000.0;
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.0f", double(all.size()) / secs);
    report(o.scenario, all,
           {{"writers", std::to_string(writers)}, {"appends_per_s", rate}, {"synced", "true"}});
  } else if (o.scenario == "recovery") {
    const int entities = 10000, per = 100;
    {
      auto store = open();
      if (!store) return 1;
      std::vector<std::thread> ts;
      for (int w = 0; w < 4; ++w)
        ts.emplace_back([&, w] {
          for (int e = w; e < entities; e += 4)
            if (!(*store)->append("sbx_" + std::to_string(e), 0, ev(per))) std::_Exit(1);
        });
      for (auto& t : ts) t.join();
    }
    std::vector<double> samples;
    size_t events = 0;
    for (int i = 0; i < o.n; ++i) {
      auto t = steady_clock::now();
      auto store = open();
      if (!store) return 1;
      auto streams = (*store)->streams("sbx_");
      events = 0;
      for (auto& s : *streams) events += (*store)->read_stream(s)->size();
      samples.push_back(ms_since(t));
    }
    report("recovery", samples,
           {{"entities", std::to_string(entities)}, {"events", std::to_string(events)}});
  } else {
    rc = usage();
  }
  fs::remove_all(dir);
  return rc;
}

}  // namespace

namespace pandastack::tools {
int recovery_bench(const std::string& daemon, const std::string& images, int sandboxes, int rounds,
                   bool json);
}

int main(int argc, char** argv) {
  spdlog::set_level(std::getenv("PANDASTACK_DEBUG") ? spdlog::level::debug : spdlog::level::warn);
  Options o;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--n" && i + 1 < argc)
      o.n = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json")
      o.json = true;
    else if (a == "--images" && i + 1 < argc)
      o.images = argv[++i];
    else if (a == "--memory" && i + 1 < argc)
      o.memory = unsigned(std::atoi(argv[++i]));
    else if (a == "--run-dir" && i + 1 < argc)
      o.run_dir = argv[++i];
    else if (a == "--cpu" && i + 1 < argc)
      o.cpu = argv[++i];
    else if (a == "--memory-base" && i + 1 < argc)
      o.memory_base = std::string(argv[++i]) != "off";
    else if (a == "--machine" && i + 1 < argc)
      o.machine = unsigned(std::min(std::max(std::atoi(argv[++i]), 0), int(vmm::kMachineRevision)));
    else if (a == "--url" && i + 1 < argc)
      o.url = argv[++i];
    else if (a == "--key" && i + 1 < argc)
      o.key = argv[++i];
    else if (a == "--via" && i + 1 < argc)
      o.via = argv[++i];
    else if (a == "--create-body" && i + 1 < argc)
      o.create_body = argv[++i];
    else if (a == "--upstream" && i + 1 < argc)
      o.upstream = argv[++i];
    else if (a == "--pause-ms" && i + 1 < argc)
      o.pause_ms = std::atoi(argv[++i]);
    else if (a == "--sandboxes" && i + 1 < argc)
      o.sandboxes = std::atoi(argv[++i]);
    else if (a == "--daemon" && i + 1 < argc)
      o.daemon = argv[++i];
    else if (a == "--clients" && i + 1 < argc)
      o.clients = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seconds" && i + 1 < argc)
      o.seconds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--window" && i + 1 < argc)
      o.window = std::atoi(argv[++i]);
    else if (a == "--idle-seconds" && i + 1 < argc)
      o.idle_seconds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--daemon-pid" && i + 1 < argc)
      o.daemon_pid = std::atoi(argv[++i]);
    else if (a.rfind("--", 0) == 0)
      return usage();
    else
      pos.push_back(a);
  }
  if (pos.size() == 1 && pos[0] == "recovery") {
    if (o.daemon.empty()) return usage();
    return tools::recovery_bench(o.daemon, o.images, o.sandboxes, o.n, o.json);
  }
  // (api and cluster modes)
  if (o.key.empty() && std::getenv("PANDASTACK_API_KEY")) o.key = std::getenv("PANDASTACK_API_KEY");
  if (pos.size() == 2 && pos[0] == "proxy") return tools::proxy_bench(pos[1], o.n, o.json);
  if (pos.size() == 2 && pos[0] == "cluster")
    return tools::cluster_bench(pos[1], o.url, o.via, o.key, o.n, o.json);
  if (pos.size() != 2 || (pos[0] != "driver" && pos[0] != "storage" && pos[0] != "api"))
    return usage();
  if (pos[0] == "api") {
    if (pos[1] == "churn")
      return tools::churn_bench(o.url, o.key, o.create_body, o.n, o.window, o.daemon_pid);
    if (pos[1] == "soak")
      return tools::soak_bench(o.url, o.key, o.create_body, std::max(1, o.sandboxes), o.clients,
                               o.seconds);
    return tools::api_bench(pos[1], o.url, o.key, o.create_body, o.upstream, o.n, o.pause_ms,
                            o.idle_seconds, o.json);
  }
  o.mode = pos[0];
  o.scenario = pos[1];
  if (o.mode == "storage") return storage_bench(o);
  DriverBench b(o);
  if (o.scenario == "boot") return b.boot();
  if (o.scenario == "exec") return b.exec(false);
  if (o.scenario == "ping") return b.ping();
  if (o.scenario == "exec-output") return b.exec(true);
  if (o.scenario == "create") return b.create();
  if (o.scenario == "create-pool") return b.create_pool();
  if (o.scenario == "concurrent-create") return b.concurrent_create();
  if (o.scenario == "snapshot") return b.snapshot();
  if (o.scenario == "fork") return b.fork(1, false);
  if (o.scenario == "fork4") return b.fork(4, false);
  if (o.scenario == "concurrent-create-pool") return b.concurrent_create_pool();
  if (o.scenario == "fork-pool") return b.fork(1, true);
  if (o.scenario == "fork4-pool") return b.fork(4, true);
  if (o.scenario == "wake-pool") return b.hibernate(true, true);
  if (o.scenario == "hibernate") return b.hibernate(false);
  if (o.scenario == "wake") return b.hibernate(true);
  if (o.scenario == "compare") return b.compare();
  if (o.scenario == "density") return b.density();
  return usage();
}
