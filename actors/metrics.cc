#include "actors/metrics.h"

#include <algorithm>

namespace pandastack::actors {

void MetricsStore::add(const std::string& id, const MetricSample& s) {
  std::lock_guard l(mu_);
  auto& q = samples_[id];
  q.push_back(s);
  while (q.size() > kMaxSamples) q.pop_front();
}

std::vector<MetricSample> MetricsStore::range(const std::string& id, int64_t from_ms,
                                              int64_t to_ms) const {
  std::lock_guard l(mu_);
  std::vector<MetricSample> out;
  auto it = samples_.find(id);
  if (it == samples_.end()) return out;
  for (auto& s : it->second)
    if (s.at_ms >= from_ms && s.at_ms <= to_ms) out.push_back(s);
  return out;
}

void MetricsStore::erase(const std::string& id) {
  std::lock_guard l(mu_);
  samples_.erase(id);
}

double cpu_percent(uint64_t cpu_usec, uint64_t wall_usec, uint32_t cpu_count) {
  if (wall_usec == 0 || cpu_count == 0) return 0;
  double pct = 100.0 * double(cpu_usec) / (double(wall_usec) * cpu_count);
  return std::clamp(pct, 0.0, 100.0);
}

}  // namespace pandastack::actors
