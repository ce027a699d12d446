// `pandastack-bench api soak --sandboxes N --clients C --seconds S`: a mixed load against a
// running daemon for S seconds: C client threads, each on its own connection, pick one of N
// sandboxes and one of: a command (exec), a file written then read back (4 KiB, checked), a
// streamed command (SSE, its lines counted). Reports throughput, p50/p99 per kind, errors, and the
// daemon's RSS, threads and open descriptors sampled every 5 s (start, end, max): a leak shows as
// an end far above the start.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/daemon_process.h"
#include "tools/http_client.h"
#include "tools/stats.h"
#include "wire/json.h"

namespace pandastack::tools {

namespace {

using Clock = std::chrono::steady_clock;
using wire::Json;

struct Kind {
  std::mutex mu;
  std::vector<double> ms;
  void add(double v) {
    std::lock_guard l(mu);
    ms.push_back(v);
  }
};

std::string stats_json(Kind& k) {
  auto s = summarize(k.ms);
  char buf[160];
  std::snprintf(buf, sizeof buf, "{\"n\":%zu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}", s.n,
                s.p50_ms, s.p99_ms, s.max_ms);
  return buf;
}

}  // namespace

int soak_bench(const std::string& url, const std::string& key, const std::string& create_body,
               int sandboxes, int clients, int seconds) {
  HttpClient setup(url, key);
  if (!setup.valid_url()) {
    std::fprintf(stderr, "pandastack-bench: --url must look like http://HOST:PORT\n");
    return 2;
  }
  pid_t daemon = find_daemon();
  std::vector<std::string> ids;
  for (int i = 0; i < sandboxes; ++i) {
    auto r = setup.request("POST", "/v1/sandboxes", create_body);
    auto j = Json::parse(r.body);
    if (r.status != 201 || !j) {
      std::fprintf(stderr, "pandastack-bench: create -> %d %s\n", r.status, r.body.c_str());
      for (auto& id : ids) setup.request("DELETE", "/v1/sandboxes/" + id);
      return 1;
    }
    ids.push_back((*j)["id"].as_string());
  }
  Kind exec, files, stream;
  std::atomic<uint64_t> errors{0}, ops{0};
  std::mutex err_mu;
  std::string first_error;
  auto fail = [&](const std::string& what) {
    ++errors;
    std::lock_guard l(err_mu);
    if (first_error.empty()) first_error = what;
  };
  std::vector<ProcSample> samples;
  if (daemon > 0) samples.push_back(sample(daemon));
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::seconds(seconds);
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      for (int i = 0; i < 50 && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (daemon > 0) samples.push_back(sample(daemon));
    }
  });
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      HttpClient http(url, key);
      std::mt19937 rng(unsigned(c) * 7919u + 1);
      std::string payload(4096, 'x');
      for (auto& ch : payload) ch = char('a' + rng() % 26);
      while (Clock::now() < deadline) {
        const std::string& id = ids[rng() % ids.size()];
        std::string base = "/v1/sandboxes/" + id;
        unsigned pick = rng() % 4;
        auto t = Clock::now();
        auto ms = [&] {
          return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
        };
        if (pick <= 1) {
          auto r = http.request("POST", base + "/exec", R"({"cmd":"echo soak"})");
          if (r.status != 200 || r.body.find("\"stdout\":\"soak\\n\"") == std::string::npos)
            fail("exec -> " + std::to_string(r.status) + " " + r.error + r.body.substr(0, 200));
          else
            exec.add(ms());
        } else if (pick == 2) {
          std::string path = base + "/files?path=/tmp/soak-" + std::to_string(c);
          auto w = http.request("PUT", path, payload, "application/octet-stream");
          auto r = http.request("GET", path);
          if (w.status != 204 && w.status != 200)
            fail("write -> " + std::to_string(w.status) + " " + w.body.substr(0, 200));
          else if (r.status != 200 || r.body != payload)
            fail("read -> " + std::to_string(r.status) + " " + r.body.substr(0, 200));
          else
            files.add(ms());
        } else {
          int lines = 0;
          auto r = http.stream(
              "POST", base + "/exec/stream", R"({"cmd":"for i in 1 2 3; do echo line$i; done"})",
              [&](const std::string& d) {
                for (size_t p = 0; (p = d.find("line", p)) != std::string::npos; ++p) ++lines;
              });
          if (r.status != 200 || lines < 3)
            fail("stream -> " + std::to_string(r.status) + " lines=" + std::to_string(lines) + " " +
                 r.error);
          else
            stream.add(ms());
        }
        ++ops;
      }
    });
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  sampler.join();
  if (daemon > 0) samples.push_back(sample(daemon));
  for (auto& id : ids) setup.request("DELETE", "/v1/sandboxes/" + id);
  auto proc = [&](auto get) {
    if (samples.empty()) return std::string("null");
    double mx = 0;
    for (auto& s : samples) mx = std::max(mx, double(get(s)));
    char buf[128];
    std::snprintf(buf, sizeof buf, "{\"start\":%.1f,\"end\":%.1f,\"max\":%.1f}",
                  double(get(samples.front())), double(get(samples.back())), mx);
    return std::string(buf);
  };
  std::printf(
      "{\"scenario\":\"api-soak\",\"seconds\":%.1f,\"sandboxes\":%d,\"clients\":%d,\"ops\":%llu,"
      "\"ops_per_s\":%.1f,\"errors\":%llu,\"exec\":%s,\"files\":%s,\"stream\":%s,"
      "\"daemon_rss_mib\":%s,\"daemon_threads\":%s,\"daemon_fds\":%s}\n",
      elapsed, sandboxes, clients, static_cast<unsigned long long>(ops.load()),
      double(ops) / elapsed, static_cast<unsigned long long>(errors.load()),
      stats_json(exec).c_str(), stats_json(files).c_str(), stats_json(stream).c_str(),
      proc([](const ProcSample& s) { return s.rss_mib; }).c_str(),
      proc([](const ProcSample& s) { return s.threads; }).c_str(),
      proc([](const ProcSample& s) { return s.fds; }).c_str());
  if (!first_error.empty())
    std::fprintf(stderr, "pandastack-bench: first error: %s\n", first_error.c_str());
  std::fflush(stdout);
  return errors == 0 ? 0 : 1;
}

}  // namespace pandastack::tools
