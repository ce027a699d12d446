#include "tools/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "wire/json.h"

namespace pandastack::tools {

namespace {
double nearest_rank(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = size_t(std::ceil(p / 100.0 * double(sorted.size())));
  if (rank == 0) rank = 1;
  return sorted[std::min(rank, sorted.size()) - 1];
}
double round3(double v) { return std::round(v * 1000.0) / 1000.0; }
}  // namespace

Summary summarize(std::vector<double> samples) {
  Summary s;
  s.n = samples.size();
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.p50_ms = nearest_rank(samples, 50);
  s.p99_ms = nearest_rank(samples, 99);
  s.min_ms = samples.front();
  s.max_ms = samples.back();
  s.mean_ms = std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size());
  return s;
}

std::string summary_json(const std::string& scenario, const Summary& s, const std::string& accel,
                         const std::vector<std::pair<std::string, std::string>>& extra) {
  wire::Json o = wire::Json::object();
  o.set("scenario", scenario);
  o.set("n", uint64_t(s.n));
  o.set("p50_ms", round3(s.p50_ms));
  o.set("p99_ms", round3(s.p99_ms));
  o.set("min_ms", round3(s.min_ms));
  o.set("max_ms", round3(s.max_ms));
  o.set("accel", accel);
  for (auto& [k, v] : extra) {
    auto parsed = wire::Json::parse(v);
    o.set(k, parsed ? *parsed : wire::Json(v));
  }
  return o.dump();
}

}  // namespace pandastack::tools
