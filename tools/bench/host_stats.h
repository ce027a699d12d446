// What the host has and spends, read from /proc, for the density benchmarks: memory available
// (what a sandbox costs is how much less of it there is) and the CPU busy share over a window.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pandastack::tools {

// MemAvailable in KiB (0 when /proc/meminfo cannot be read).
inline uint64_t mem_available_kib() {
  uint64_t kib = 0;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "MemAvailable: %lu kB", &kib) == 1) break;
    std::fclose(f);
  }
  return kib;
}

// The host's CPU busy share over `window`, in percent of one core (200 = two cores busy), from
// /proc/stat's aggregate line (busy = everything but idle and iowait). -1 when unreadable.
inline double cpu_busy_percent(std::chrono::milliseconds window) {
  struct Ticks {
    uint64_t busy = 0, total = 0;
  };
  auto read = [] {
    Ticks t;
    uint64_t v[10] = {};
    if (FILE* f = std::fopen("/proc/stat", "r")) {
      if (std::fscanf(f, "cpu %lu %lu %lu %lu %lu %lu %lu %lu %lu %lu", &v[0], &v[1], &v[2], &v[3],
                      &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
        for (int i = 0; i < 8; ++i) t.total += v[i];  // guest time is already in user/nice
        t.busy = t.total - v[3] - v[4];
      }
      std::fclose(f);
    }
    return t;
  };
  auto a = read();
  std::this_thread::sleep_for(window);
  auto b = read();
  if (b.total <= a.total) return -1;
  double cores = double(std::thread::hardware_concurrency());
  return 100.0 * cores * double(b.busy - a.busy) / double(b.total - a.total);
}

// The 1-minute load average (-1 when unreadable).
inline double load_average_1m() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

// The density scenarios (driver and api) stop making sandboxes below this much MemAvailable.
constexpr uint64_t kDensityFloorKib = 1024 * 1024;

// The density scenarios' report fields: MemAvailable `before_kib` and `after_kib` the sandboxes
// were made, as MiB per sandbox; the host's CPU while they idled and the load after.
inline std::vector<std::pair<std::string, std::string>> density_fields(
    size_t sandboxes, size_t answering, uint64_t before_kib, uint64_t after_kib, double cpu,
    int idle_seconds, double load) {
  char mem[32], c[32], l[32];
  std::snprintf(
      mem, sizeof mem, "%.1f",
      double(before_kib > after_kib ? before_kib - after_kib : 0) / 1024.0 / double(sandboxes));
  std::snprintf(c, sizeof c, "%.1f", cpu);
  std::snprintf(l, sizeof l, "%.2f", load);
  return {{"sandboxes", std::to_string(sandboxes)},
          {"answering", std::to_string(answering)},
          {"mem_per_sandbox_mib", mem},
          {"idle_cpu_percent", c},
          {"idle_seconds", std::to_string(idle_seconds)},
          {"load_1m", l}};
}

}  // namespace pandastack::tools
