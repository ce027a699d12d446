// `pandastack-bench recovery --sandboxes N --daemon PATH [--images DIR] [--n ROUNDS]`: the outage
// a crash costs. Starts a daemon (its own data and state folders, network prefix and pool), makes
// N running sandboxes (and lets its pools fill), SIGKILLs it, starts it again on the same data
// and measures, per round: the time from the new process's start to /healthz answering, to every
// sandbox answering an exec, and how many were adopted. JSON: p50/p99 of each over the rounds.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/http_client.h"
#include "tools/stats.h"
#include "wire/json.h"

namespace pandastack::tools {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using wire::Json;

struct Daemon {
  pid_t pid = -1;
  std::string url;
};

// Starts pandastackd; returns once its banner says where it listens.
Daemon start(const std::string& daemon, const std::vector<std::string>& args) {
  int out[2];
  if (::pipe(out) != 0) std::exit(1);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);
    std::vector<char*> argv{const_cast<char*>(daemon.c_str())};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(daemon.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  Daemon d;
  d.pid = pid;
  FILE* f = ::fdopen(out[0], "r");
  char line[1024];
  while (std::fgets(line, sizeof line, f)) {
    std::string l = line;
    if (auto p = l.find("URL:"); p != std::string::npos) {
      d.url = l.substr(p + 4);
      d.url.erase(0, d.url.find_first_not_of(' '));
      d.url.erase(d.url.find_first_of(" \n"));
    }
    if (l.find("(key file") != std::string::npos) break;
  }
  std::thread([f] {  // keep reading so the daemon never blocks on stdout
    char buf[256];
    while (std::fgets(buf, sizeof buf, f)) {
    }
    std::fclose(f);
  })
      .detach();
  return d;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

int recovery_bench(const std::string& daemon, const std::string& images, int sandboxes, int rounds,
                   bool json) {
  auto base = fs::path("/var/tmp") / ("pandastack-bench-recovery-" + std::to_string(::getpid()));
  fs::create_directories(base);
  std::vector<std::string> args = {"--data",           (base / "data").string(),
                                   "--state-dir",      "/dev/shm/pandastack-bench-recovery-state",
                                   "--images",         images,
                                   "--listen",         "127.0.0.1:0",
                                   "--rpc-listen",     "127.0.0.1:0",
                                   "--accel",          "tcg",
                                   "--network-prefix", "pbr",
                                   "--subnet-pool",    "10.254.0.0/22",
                                   "--dns-upstream",   "off"};
  auto d = start(daemon, args);
  std::string key;
  std::ifstream(base / "data" / "api-key") >> key;
  std::vector<std::string> ids;
  {
    HttpClient http(d.url, key);
    for (int i = 0; i < sandboxes; ++i) {
      auto r = http.request("POST", "/v1/sandboxes", "{}");
      auto j = Json::parse(r.body);
      if (r.status != 201 || !j) {
        std::fprintf(stderr, "pandastack-bench: create failed: %d %s\n", r.status, r.body.c_str());
        ::kill(d.pid, SIGKILL);
        return 1;
      }
      ids.push_back((*j)["id"].as_string());
    }
  }
  std::vector<double> health, all_answer, adopted;
  for (int round = 0; round < rounds; ++round) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // the pools fill (more to kill)
    ::kill(d.pid, SIGKILL);
    ::waitpid(d.pid, nullptr, 0);
    auto t0 = Clock::now();
    d = start(daemon, args);
    HttpClient http(d.url, key);
    while (http.request("GET", "/healthz", "").status != 200)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    health.push_back(ms_since(t0));
    size_t answering = 0;
    for (auto& id : ids) {
      // Each sandbox in turn: a call waits while its VM is being adopted.
      while (true) {
        auto r = http.request("POST", "/v1/sandboxes/" + id + "/exec", R"({"argv":["true"]})");
        if (r.status == 200) {
          ++answering;
          break;
        }
        if (r.status == 409 || ms_since(t0) > 60000) break;  // failed: not adopted
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    all_answer.push_back(ms_since(t0));
    adopted.push_back(double(answering));
  }
  ::kill(d.pid, SIGTERM);
  ::waitpid(d.pid, nullptr, 0);
  fs::remove_all(base);
  fs::remove_all("/dev/shm/pandastack-bench-recovery-state");
  auto h = summarize(health), a = summarize(all_answer), n = summarize(adopted);
  if (json) {
    std::printf(
        "{\"scenario\":\"recovery\",\"sandboxes\":%d,\"rounds\":%d,\"healthz_p50_ms\":%.1f,"
        "\"healthz_p99_ms\":%.1f,\"all_answer_p50_ms\":%.1f,\"all_answer_p99_ms\":%.1f,"
        "\"adopted_min\":%.0f}\n",
        sandboxes, rounds, h.p50_ms, h.p99_ms, a.p50_ms, a.p99_ms, n.min_ms);
  } else {
    std::printf(
        "recovery: %d sandboxes, %d rounds: /healthz after %.1f ms p50 (%.1f p99); all answering "
        "after %.1f ms p50 (%.1f p99); adopted at least %.0f\n",
        sandboxes, rounds, h.p50_ms, h.p99_ms, a.p50_ms, a.p99_ms, n.min_ms);
  }
  return 0;
}

}  // namespace pandastack::tools
