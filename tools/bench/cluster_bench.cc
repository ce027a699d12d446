// `pandastack-bench cluster route|fork|migrate --url A --via B --n N` (both daemons hosts of one
// cluster):
//   route    what routing through a host that does not own a sandbox costs. A sandbox is created
//            on A's host, then the same requests (GET the sandbox; exec `true`) go N times to A and
//            N times to B, which forwards them over Cap'n Proto: p50/p99 of each, and the
//            difference of the p50s (the target: at most 2 ms).
//   fork     a fork of a sandbox on A with its child on B's host, to the child answering an exec,
//            against a same-host fork in the same run (target: cross-host <= 1.0 s p50); the
//            transfer's MB/s and bytes.
//   migrate  a sandbox moved A -> B -> A ..., to it answering an exec on its new host.
//   migrate-volume
//            the same with a 256 MiB volume holding 64 MiB of data, which moves with it.
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

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void report(const std::string& name, const std::vector<double>& ms, bool json,
            const std::vector<std::pair<std::string, std::string>>& extra) {
  auto s = summarize(ms);
  if (json) {
    std::printf("%s\n", summary_json(name, s, "daemon", extra).c_str());
  } else {
    std::printf("%-24s n=%-5zu p50=%9.3f ms p99=%9.3f ms", name.c_str(), s.n, s.p50_ms, s.p99_ms);
    for (auto& [k, v] : extra) std::printf("  %s=%s", k.c_str(), v.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

// A sandbox on host `self` (through `a`, a host of that host) with some state in its memory (a
// tmpfs file of 16 MiB): its id, or "". `volume`: with a 256 MiB volume at /data holding 64 MiB.
std::string sandbox_with_state(HttpClient& a, const std::string& self, bool volume = false) {
  std::string volumes;
  if (volume) {
    Json v;
    if (!call(a, "POST", "/v1/volumes", R"({"name":"bench","size_mib":256})", &v)) return "";
    volumes = R"(,"volumes":[{"volume":")" + v["id"].as_string() + R"(","mount":"/data"}])";
  }
  Json created;
  if (!call(a, "POST", "/v1/sandboxes",
            R"({"network":false,"placement":{"host":")" + self + R"("})" + volumes + "}", &created))
    return "";
  std::string id = created["id"].as_string();
  if (!call(a, "POST", "/v1/sandboxes/" + id + "/exec",
            R"({"cmd":"head -c 16777216 /dev/urandom > /tmp/state"})"))
    return "";
  if (volume && !call(a, "POST", "/v1/sandboxes/" + id + "/exec",
                      R"({"cmd":"head -c 67108864 /dev/urandom > /data/state && sync"})"))
    return "";
  return id;
}

// Forks of a sandbox on `a`'s host: count 1 on its own host and on `b`'s, alternately; each to
// its child answering `true` (asked through a, routed when the child is elsewhere), then killed.
int fork_bench(HttpClient& a, const std::string& other_host, const std::string& self, int n,
               bool json) {
  std::string id = sandbox_with_state(a, self);
  if (id.empty()) return 1;
  std::vector<double> same, cross, mbps, bytes, transfer, snapshot;
  int rc = 0;
  for (int i = 0; i < n + 1; ++i) {  // (the first round of each warms the connections, caches)
    for (bool remote : {false, true}) {
      std::string body =
          remote ? R"({"count":1,"hosts":[")" + other_host + R"("]})" : R"({"count":1})";
      auto t0 = Clock::now();
      Json r;
      if (!call(a, "POST", "/v1/sandboxes/" + id + "/fork", body, &r)) {
        rc = 1;
        continue;
      }
      std::string child = r["sandboxes"].as_array()[0]["id"].as_string();
      if (!call(a, "POST", "/v1/sandboxes/" + child + "/exec", R"({"cmd":"true"})")) rc = 1;
      double ms = ms_since(t0);
      call(a, "DELETE", "/v1/sandboxes/" + child, "");
      if (i == 0) continue;
      (remote ? cross : same).push_back(ms);
      if (remote && r["transfers"].is_array()) {
        auto& t = r["transfers"].as_array()[0];
        mbps.push_back(t["mb_per_s"].as_double());
        bytes.push_back(t["bytes"].as_double());
        transfer.push_back(t["transfer_ms"].as_double());
        snapshot.push_back(r["snapshot_ms"].as_double());
      }
    }
  }
  call(a, "DELETE", "/v1/sandboxes/" + id, "");
  auto p50 = [](std::vector<double> v) { return v.empty() ? 0.0 : summarize(v).p50_ms; };
  report("cluster-fork-same-host", same, json, {});
  report("cluster-fork-cross-host", cross, json,
         {{"same_host_p50_ms", fmt(p50(same))},
          {"snapshot_p50_ms", fmt(p50(snapshot))},
          {"transfer_p50_ms", fmt(p50(transfer))},
          {"transfer_p50_mb_per_s", fmt(p50(mbps))},
          {"transfer_p50_bytes", fmt(p50(bytes))}});
  return rc;
}

// A sandbox migrated between a's host and b's, n times, each to it answering `true` there.
int migrate_bench(HttpClient& a, const std::string& self, const std::string& other_host, int n,
                  bool json, bool volume) {
  std::string id = sandbox_with_state(a, self, volume);
  if (id.empty()) return 1;
  std::vector<double> ms, hibernate, transfer, bytes;
  int rc = 0;
  for (int i = 0; i < n; ++i) {
    std::string to = i % 2 == 0 ? other_host : self;
    auto t0 = Clock::now();
    Json r;
    if (!call(a, "POST", "/v1/sandboxes/" + id + "/migrate", R"({"host":")" + to + R"("})", &r)) {
      rc = 1;
      break;
    }
    if (!call(a, "POST", "/v1/sandboxes/" + id + "/exec", R"({"cmd":"true"})")) rc = 1;
    ms.push_back(ms_since(t0));
    hibernate.push_back(r["hibernate_ms"].as_double());
    transfer.push_back(r["transfer"]["transfer_ms"].as_double());
    bytes.push_back(r["transfer"]["bytes"].as_double());
  }
  Json info;
  call(a, "GET", "/v1/sandboxes/" + id, "", &info);
  call(a, "DELETE", "/v1/sandboxes/" + id, "");
  if (volume && info["volumes"].is_array() && info["volumes"].size() > 0)
    call(a, "DELETE", "/v1/volumes/" + info["volumes"].as_array()[0]["volume"].as_string(), "");
  report(volume ? "cluster-migrate-volume" : "cluster-migrate", ms, json,
         {{"hibernate_p50_ms", fmt(summarize(hibernate).p50_ms)},
          {"transfer_p50_ms", fmt(summarize(transfer).p50_ms)},
          {"transfer_p50_bytes", fmt(summarize(bytes).p50_ms)}});
  return rc;
}

}  // namespace

int cluster_bench(const std::string& scenario, const std::string& url, const std::string& via,
                  const std::string& key, int n, bool json) {
  if ((scenario != "route" && scenario != "fork" && scenario != "migrate" &&
       scenario != "migrate-volume") ||
      url.empty() || via.empty()) {
    std::fprintf(
        stderr,
        "usage: pandastack-bench cluster route|fork|migrate|migrate-volume --url A --via B "
        "[--n N]\n");
    return 2;
  }
  if (scenario != "route") {
    HttpClient a(url, key), b(via, key);
    Json ha, hb;
    if (!call(a, "GET", "/v1/hosts", "", &ha) || !call(b, "GET", "/v1/hosts", "", &hb)) return 1;
    std::string self = ha["self"].as_string(), other = hb["self"].as_string();
    return scenario == "fork"
               ? fork_bench(a, other, self, n, json)
               : migrate_bench(a, self, other, n, json, scenario == "migrate-volume");
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
