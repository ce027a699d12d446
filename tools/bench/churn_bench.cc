// `pandastack-bench api churn --n N [--window W] [--daemon-pid PID]`: creates and kills N
// sandboxes one after another against a running daemon (a long uptime in minutes) and reports,
// every W of them (default N/10, at least 1), the create p50/p99 of that window and the daemon's
// RSS, threads and descriptors: a host whose cost grows with its history shows as a create p50 or
// an RSS that climbs from window to window. The last line compares the last window with the
// first. (Start-up time after N is tests/reliability/churn_bench.py's: it restarts the daemon.)
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/daemon_process.h"
#include "tools/http_client.h"
#include "tools/stats.h"
#include "wire/json.h"

namespace pandastack::tools {

namespace {

using Clock = std::chrono::steady_clock;

struct Window {
  int done = 0;
  Summary create;
  ProcSample proc;
};

std::string window_json(const Window& w) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"done\":%d,\"create_p50_ms\":%.3f,\"create_p99_ms\":%.3f,"
                "\"daemon_rss_mib\":%.1f,\"daemon_threads\":%d,\"daemon_fds\":%d}",
                w.done, w.create.p50_ms, w.create.p99_ms, w.proc.rss_mib, w.proc.threads,
                w.proc.fds);
  return buf;
}

}  // namespace

int churn_bench(const std::string& url, const std::string& key, const std::string& create_body,
                int n, int window, pid_t daemon) {
  HttpClient http(url, key);
  if (!http.valid_url()) {
    std::fprintf(stderr, "pandastack-bench: --url must look like http://HOST:PORT\n");
    return 2;
  }
  if (n < 1) n = 1;
  if (window < 1) window = std::max(1, n / 10);
  if (daemon <= 0) daemon = find_daemon();
  std::vector<Window> windows;
  std::vector<double> create_ms;
  int errors = 0;
  for (int i = 1; i <= n; ++i) {
    auto t = Clock::now();
    auto r = http.request("POST", "/v1/sandboxes", create_body);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    auto j = r.status == 201 ? wire::Json::parse(r.body) : std::nullopt;
    if (!j || !(*j)["id"].is_string()) {
      std::fprintf(stderr, "pandastack-bench: create %d -> %d %s%s\n", i, r.status, r.error.c_str(),
                   r.body.c_str());
      if (++errors > 10) return 1;  // a benchmark on errors measures nothing
      continue;
    }
    create_ms.push_back(ms);
    auto k = http.request("DELETE", "/v1/sandboxes/" + (*j)["id"].as_string(), "");
    if (k.status != 200) {
      std::fprintf(stderr, "pandastack-bench: kill -> %d %s%s\n", k.status, k.error.c_str(),
                   k.body.c_str());
      return 1;
    }
    if (i % window == 0 || i == n) {
      Window w;
      w.done = i;
      w.create = summarize(create_ms);
      if (daemon > 0) w.proc = sample(daemon);
      create_ms.clear();
      std::printf("{\"scenario\":\"api-churn-window\",\"window\":%s}\n", window_json(w).c_str());
      std::fflush(stdout);
      windows.push_back(w);
    }
  }
  if (windows.empty()) return 1;
  const auto &first = windows.front(), &last = windows.back();
  std::printf(
      "{\"scenario\":\"api-churn\",\"accel\":\"daemon\",\"n\":%d,\"errors\":%d,\"first\":%s,"
      "\"last\":%s,\"create_p50_ratio\":%.3f,\"rss_ratio\":%.3f}\n",
      n, errors, window_json(first).c_str(), window_json(last).c_str(),
      first.create.p50_ms > 0 ? last.create.p50_ms / first.create.p50_ms : 0.0,
      first.proc.rss_mib > 0 ? last.proc.rss_mib / first.proc.rss_mib : 0.0);
  return errors ? 1 : 0;
}

}  // namespace pandastack::tools
