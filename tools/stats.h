// Latency statistics for the benchmark tool: percentiles over samples, and the one-line JSON
// object every scenario prints.
#pragma once

#include <string>
#include <vector>

namespace pandastack::tools {

struct Summary {
  size_t n = 0;
  double p50_ms = 0, p99_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
};

// Nearest-rank percentiles of `samples_ms` (need not be sorted). Empty input gives zeros.
Summary summarize(std::vector<double> samples_ms);

// {"scenario":..,"n":..,"p50_ms":..,"p99_ms":..,"min_ms":..,"max_ms":..,"accel":..} plus `extra`
// members (already-encoded JSON values keyed by name).
std::string summary_json(const std::string& scenario, const Summary& s, const std::string& accel,
                         const std::vector<std::pair<std::string, std::string>>& extra = {});

}  // namespace pandastack::tools
