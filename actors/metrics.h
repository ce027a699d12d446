// Per-sandbox resource figures over time: what each running sandbox's VM costs the host, sampled
// by its actor every RuntimeConfig::metrics_interval (vmm-driver/usage.h: from /proc and the file
// system, so sampling never counts as use of the sandbox), kept for the last kMaxSamples samples.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace pandastack::actors {

struct MetricSample {
  int64_t at_ms = 0;
  double cpu_used_pct = 0;  // of its vCPUs, over the interval before `at_ms` (QEMU's CPU time)
  uint32_t cpu_count = 0;
  uint64_t mem_used_bytes = 0;    // QEMU's resident memory (the guest RAM it touched included)
  uint64_t mem_total_bytes = 0;   // the guest's RAM
  uint64_t disk_used_bytes = 0;   // what its writable disk layer holds on the host (its writes)
  uint64_t disk_total_bytes = 0;  // the guest's root disk (its virtual size)
};

class MetricsStore {
 public:
  static constexpr size_t kMaxSamples = 720;  // an hour at the default 5 s
  void add(const std::string& id, const MetricSample& s);
  // Samples of `id` with from_ms <= at_ms <= to_ms, oldest first.
  std::vector<MetricSample> range(const std::string& id, int64_t from_ms, int64_t to_ms) const;
  void erase(const std::string& id);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::deque<MetricSample>> samples_;
};

// The share of `cpu_count` CPUs that `cpu_usec` of CPU time over `wall_usec` is, in percent.
double cpu_percent(uint64_t cpu_usec, uint64_t wall_usec, uint32_t cpu_count);

}  // namespace pandastack::actors
