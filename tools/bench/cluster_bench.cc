// `pandastack-bench cluster route --url OWNER --via OTHER --n N`: what routing through a host
// that does not own a sandbox costs. A sandbox is created on OWNER's host (placement pinned to it),
// then the same requests (GET the sandbox; exec `true`) go N times to OWNER and N times to OTHER,
// which forwards them over Cap'n Proto: p50/p99 of each, and the difference of the p50s (the
// target: at most 2 ms). Both daemons must be hosts of one cluster.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/http_client.h"
#include "tools/stats.h"
#include "wire/json.h"

namespace pandastack::tools {

namespace {

using Clock = std::chrono::steady_clock;
using wire::Json;

bool call(HttpClient& http, const std::string& method, const std::string& path,
          const std::string& body, Json* out = nullptr) {
  auto r = http.request(method, path, body);
  if (r.status < 200 || r.status >= 300) {
    std::fprintf(stderr, "pandastack-bench: %s %s -> %d %s%s\n", method.c_str(), path.c_str(),
                 r.status, r.error.c_str(), r.body.c_str());
    return false;
  }
  if (out) *out = Json::parse(r.body).value_or(Json());
  return true;
}

}  // namespace

int cluster_bench(const std::string& scenario, const std::string& url, const std::string& via,
                  const std::string& key, int n, bool json) {
  if (scenario == "fork" || scenario == "migrate") {
    std::fprintf(stderr, "pandastack-bench: cluster %s needs cross-host %s, not built yet\n",
                 scenario.c_str(), scenario.c_str());
    return 2;
  }
  if (scenario != "route" || url.empty() || via.empty()) {
    std::fprintf(stderr, "usage: pandastack-bench cluster route --url OWNER --via OTHER [--n N]\n");
    return 2;
  }
  HttpClient owner(url, key), other(via, key);
  Json hosts;
  if (!call(owner, "GET", "/v1/hosts", "", &hosts)) return 1;
  std::string self = hosts["self"].as_string();
  Json created;
  if (!call(other, "POST", "/v1/sandboxes",
            R"({"network":false,"placement":{"host":")" + self + R"("}})", &created))
    return 1;
  std::string id = created["id"].as_string();
  std::string get = "/v1/sandboxes/" + id, exec = get + "/exec";
  struct Case {
    const char* name;
    std::string method, path, body;
  };
  std::vector<Case> cases = {{"get", "GET", get, ""}, {"exec", "POST", exec, R"({"cmd":"true"})"}};
  int rc = 0;
  for (auto& c : cases) {
    std::vector<double> at_owner, routed;
    for (int i = 0; i < n + 2; ++i) {  // (the first two warm the connections)
      for (auto* h : {&owner, &other}) {
        auto t0 = Clock::now();
        if (!call(*h, c.method, c.path, c.body)) rc = 1;
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (i >= 2) (h == &owner ? at_owner : routed).push_back(ms);
      }
    }
    auto a = summarize(at_owner), b = summarize(routed);
    char delta[32], p50[32], p99[32];
    std::snprintf(delta, sizeof delta, "%.3f", b.p50_ms - a.p50_ms);
    std::snprintf(p50, sizeof p50, "%.3f", a.p50_ms);
    std::snprintf(p99, sizeof p99, "%.3f", a.p99_ms);
    std::string name = std::string("cluster-route-") + c.name;
    if (json)
      std::printf("%s\n", summary_json(name, b, "daemon",
                                       {{"owner_p50_ms", p50},
                                        {"owner_p99_ms", p99},
                                        {"routed_minus_owner_p50_ms", delta}})
                              .c_str());
    else
      std::printf(
          "%-20s n=%-5zu routed p50=%8.3f ms p99=%8.3f ms   owner p50=%s ms p99=%s ms   "
          "cost p50=%s ms\n",
          name.c_str(), b.n, b.p50_ms, b.p99_ms, p50, p99, delta);
    std::fflush(stdout);
  }
  call(owner, "DELETE", get, "");
  return rc;
}

}  // namespace pandastack::tools
