// `pandastack-bench api SCENARIO --url URL --key KEY`: latency through a running daemon's REST API.
// Reports the client's wall time (p50/p99) and the server-side time each response reports
// (Server-Timing), so network/HTTP overhead and runtime time can be told apart.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tools/bench/host_stats.h"
#include "tools/http_client.h"
#include "tools/stats.h"
#include "wire/json.h"

namespace pandastack::tools {

namespace {

using Clock = std::chrono::steady_clock;
using wire::Json;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Api {
  HttpClient http;
  Api(const std::string& url, const std::string& key) : http(url, key) {}

  // Fails loudly: a benchmark on errors measures nothing.
  Json call(const std::string& method, const std::string& path, const std::string& body,
            double* server_ms = nullptr) {
    auto r = http.request(method, path, body);
    if (r.status < 200 || r.status >= 300) {
      std::fprintf(stderr, "pandastack-bench: %s %s -> %d %s%s\n", method.c_str(), path.c_str(),
                   r.status, r.error.c_str(), r.body.c_str());
      std::exit(1);
    }
    if (server_ms) *server_ms = r.server_ms().value_or(0);
    auto j = Json::parse(r.body);
    return j ? *j : Json();
  }
  std::string create(const std::string& body = "{}", double* server_ms = nullptr) {
    return call("POST", "/v1/sandboxes", body, server_ms)["id"].as_string();
  }
  void kill(const std::string& id) { call("DELETE", "/v1/sandboxes/" + id, ""); }
};

void report(bool json, const std::string& scenario, const std::vector<double>& client,
            const std::vector<double>& server) {
  auto c = summarize(client), s = summarize(server);
  char p50[32], p99[32];
  std::snprintf(p50, sizeof p50, "%.3f", s.p50_ms);
  std::snprintf(p99, sizeof p99, "%.3f", s.p99_ms);
  if (json) {
    std::printf("%s\n", summary_json("api-" + scenario, c, "daemon",
                                     {{"server_p50_ms", p50}, {"server_p99_ms", p99}})
                            .c_str());
  } else {
    std::printf("api-%-10s n=%-5zu client p50=%9.3f ms p99=%9.3f ms   server p50=%s ms p99=%s ms\n",
                scenario.c_str(), c.n, c.p50_ms, c.p99_ms, p50, p99);
  }
  std::fflush(stdout);
}

}  // namespace

int api_bench(const std::string& scenario, const std::string& url, const std::string& key,
              const std::string& create_body, const std::string& upstream, int n, int pause_ms,
              int idle_seconds, bool json) {
  Api api(url, key);
  if (!api.http.valid_url()) {
    std::fprintf(stderr, "pandastack-bench: --url must look like http://HOST:PORT\n");
    return 2;
  }
  std::vector<double> client, server;
  // Requests spaced like an agent's (a burst is concurrent-create's scenario): the daemon's pools
  // refill in between. Not timed.
  auto pause = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms)); };
  auto sample = [&](auto&& f) {
    double srv = 0;
    auto t = Clock::now();
    f(&srv);
    client.push_back(ms_since(t));
    server.push_back(srv);
  };
  if (scenario == "create-volume") {
    // Creates without and with one volume (64 MiB, mounted at /data), interleaved in one run:
    // what attaching a volume adds to a create.
    auto vol = api.call("POST", "/v1/volumes", "{\"size_mib\": 64}")["id"].as_string();
    auto with = "{\"volumes\": [{\"volume\": \"" + vol + "\", \"mount\": \"/data\"}]}";
    api.kill(api.create("{}"));
    api.kill(api.create(with));
    std::vector<double> vclient, vserver;
    for (int i = 0; i < n; ++i) {
      std::string id;
      sample([&](double* s) { id = api.create("{}", s); });
      api.kill(id);
      pause();
      double srv = 0;
      auto t = Clock::now();
      id = api.create(with, &srv);
      vclient.push_back(ms_since(t));
      vserver.push_back(srv);
      api.kill(id);
      pause();
    }
    api.call("DELETE", "/v1/volumes/" + vol, "");
    report(json, "create", client, server);
    report(json, "create-volume", vclient, vserver);
    return 0;
  }
  if (scenario == "fork-volume") {
    // Forks of a sandbox without and of one with a volume (256 MiB, 64 MiB of data on it),
    // interleaved in one run: what copying the volume (a reflink, or a sparse copy on file
    // systems without them) adds to a fork. And snapshots of that attached volume (its guest's
    // file system frozen for the copy).
    auto vol = api.call("POST", "/v1/volumes", "{\"size_mib\": 256}")["id"].as_string();
    auto plain = api.create("{}");
    auto held = api.create("{\"volumes\": [{\"volume\": \"" + vol + "\", \"mount\": \"/data\"}]}");
    api.call(
        "POST", "/v1/sandboxes/" + held + "/exec",
        R"({"cmd":"head -c 67108864 /dev/urandom > /data/blob && sync","timeout_seconds":300})");
    Json kids;
    auto end_kids = [&] {  // not timed
      for (auto& k : kids["sandboxes"].as_array()) {
        auto vols = k["volumes"];
        api.kill(k["id"].as_string());
        for (auto& v : vols.as_array())
          api.call("DELETE", "/v1/volumes/" + v["volume"].as_string(), "");
      }
    };
    auto fork = [&](const std::string& id, double* s) {
      kids = api.call("POST", "/v1/sandboxes/" + id + "/fork", R"({"count":1})", s);
    };
    std::vector<double> vclient, vserver, sclient, sserver;
    for (int i = 0; i < n; ++i) {
      sample([&](double* s) { fork(plain, s); });
      end_kids();
      pause();
      double srv = 0;
      auto t = Clock::now();
      fork(held, &srv);
      vclient.push_back(ms_since(t));
      end_kids();
      vserver.push_back(srv);
      pause();
      t = Clock::now();
      auto snap = api.call("POST", "/v1/volumes/" + vol + "/snapshots", "{}", &srv);
      sclient.push_back(ms_since(t));
      sserver.push_back(srv);
      api.call("DELETE", "/v1/volumes/" + vol + "/snapshots/" + snap["id"].as_string(), "");
    }
    api.kill(plain);
    api.kill(held);
    api.call("DELETE", "/v1/volumes/" + vol, "");
    report(json, "fork", client, server);
    report(json, "fork-volume", vclient, vserver);
    report(json, "volume-snapshot", sclient, sserver);
    return 0;
  }
  if (scenario == "db-create") {
    // A managed database (POST /v1/databases: a restore of the postgres template, its role and
    // password set, its port exposed) to its first query from the host: the host's
    // `psql -c 'select 1'` through the connection URI the create answered with (retried until it
    // answers). Needs a daemon with networking and the host's psql (Debian postgresql-client).
    // Then hibernated (not timed) and woken: from POST .../wake to the first query answered,
    // through the address the wake answered with and the create's password.
    std::vector<double> create, total, wake;
    auto first_query = [](const std::string& uri) {
      std::string psql = "psql '" + uri + "' -Atqc 'select 1' >/dev/null 2>&1";
      for (int attempt = 0; attempt < 600; ++attempt) {
        if (std::system(psql.c_str()) == 0) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return false;
    };
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      double srv = 0;
      Json body = Json::object();
      body.set("name", "bench" + std::to_string(i));
      auto db = api.call("POST", "/v1/databases", body.dump(), &srv);
      create.push_back(ms_since(t0));
      bool ok = first_query(db["connection_uri"].as_string());
      total.push_back(ms_since(t0));
      auto id = db["id"].as_string();
      if (ok) {
        api.call("POST", "/v1/databases/" + id + "/hibernate", "{}");
        pause();
        auto t1 = Clock::now();
        auto w = api.call("POST", "/v1/databases/" + id + "/wake", "{}");
        std::string uri = "postgresql://" + db["user"].as_string() + ":" +
                          db["password"].as_string() + "@" + w["host"].as_string() + ":" +
                          std::to_string(w["port"].as_int()) + "/" + db["database"].as_string();
        ok = first_query(uri);
        wake.push_back(ms_since(t1));
      }
      api.call("DELETE", "/v1/databases/" + id, "");
      if (!ok) {
        std::fprintf(stderr, "pandastack-bench: no answer from database %s\n", id.c_str());
        return 1;
      }
      pause();
    }
    report(json, "db-create-api", create, create);
    report(json, "db-create", total, total);
    report(json, "db-wake", wake, wake);
    return 0;
  }
  if (scenario == "volume-throughput") {
    // Sequential write (fsynced) and read of 128 MiB on a volume from inside a guest, against the
    // same on the host (a file under /var/tmp, the data folder's disk here): MB/s each, n runs.
    constexpr int kMib = 128;
    auto vol = api.call("POST", "/v1/volumes", "{\"size_mib\": 512}")["id"].as_string();
    auto id = api.create("{\"volumes\": [{\"volume\": \"" + vol + "\", \"mount\": \"/data\"}]}");
    Json body = Json::object();
    body.set("cmd",
             "a=$(date +%s%N); dd if=/dev/zero of=/data/f bs=1M count=" + std::to_string(kMib) +
                 " conv=fsync 2>/dev/null; b=$(date +%s%N); echo 3 > /proc/sys/vm/drop_caches; "
                 "c=$(date +%s%N); dd if=/data/f of=/dev/null bs=1M 2>/dev/null; "
                 "d=$(date +%s%N); echo $((b-a)) $((d-c))");
    body.set("timeout_seconds", 600);
    std::vector<double> gw, gr, hw, hr;
    std::string host_file = "/var/tmp/pandastack-bench-volume." + std::to_string(::getpid());
    std::vector<char> block(1 << 20, 0);
    for (int i = 0; i < n; ++i) {
      auto r = api.call("POST", "/v1/sandboxes/" + id + "/exec", body.dump());
      double wns = 0, rns = 0;
      if (std::sscanf(r["stdout"].as_string().c_str(), "%lf %lf", &wns, &rns) != 2 || wns <= 0 ||
          rns <= 0) {
        std::fprintf(stderr, "pandastack-bench: guest dd failed: %s\n", r.dump().c_str());
        return 1;
      }
      gw.push_back(kMib * 1.048576 / (wns / 1e9));
      gr.push_back(kMib * 1.048576 / (rns / 1e9));
      auto t = Clock::now();
      int fd = ::open(host_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      for (int m = 0; m < kMib && fd >= 0; ++m)
        if (::write(fd, block.data(), block.size()) < 0) break;
      if (fd >= 0) ::fsync(fd);
      hw.push_back(kMib * 1.048576 / (ms_since(t) / 1e3));
      if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), ::close(fd);
      t = Clock::now();
      fd = ::open(host_file.c_str(), O_RDONLY | O_CLOEXEC);
      while (fd >= 0 && ::read(fd, block.data(), block.size()) > 0) {
      }
      if (fd >= 0) ::close(fd);
      hr.push_back(kMib * 1.048576 / (ms_since(t) / 1e3));
    }
    ::unlink(host_file.c_str());
    api.kill(id);
    api.call("DELETE", "/v1/volumes/" + vol, "");
    auto p50 = [](std::vector<double> v) { return summarize(v).p50_ms; };
    std::printf(
        "{\"scenario\":\"api-volume-throughput\",\"n\":%d,\"guest_write_mb_s\":%.1f,"
        "\"guest_read_mb_s\":%.1f,\"host_write_mb_s\":%.1f,\"host_read_mb_s\":%.1f,"
        "\"write_ratio\":%.2f,\"read_ratio\":%.2f}\n",
        n, p50(gw), p50(gr), p50(hw), p50(hr), p50(gw) / p50(hw), p50(gr) / p50(hr));
    return 0;
  }
  if (scenario == "preview") {
    // The preview proxy's cost: GETs of a small page from a web server in the guest (Python's
    // http.server), through the guest port exposed raw on the host and through its (public,
    // path-based) preview URL, interleaved in one run; then requests per second with 4 clients
    // for 5 s each way.
    auto id = api.create(create_body.empty() || create_body == "{}" ? R"({"network":true})"
                                                                    : create_body);
    api.call("POST", "/v1/sandboxes/" + id + "/exec",
             R"({"cmd":"mkdir -p /tmp/www && yes x | head -c 2048 > /tmp/www/index.html"})");
    api.call("POST", "/v1/sandboxes/" + id + "/processes",
             R"({"argv":["python3","-m","http.server","8080","--directory","/tmp/www"]})");
    auto port = api.call("POST", "/v1/sandboxes/" + id + "/ports", R"({"port":8080})");
    std::string raw_url =
        "http://" + port["host"].as_string() + ":" + std::to_string(port["host_port"].as_int());
    api.call("POST", "/v1/sandboxes/" + id + "/previews", R"({"port":8080,"public":true})");
    std::string path = "/v1/sandboxes/" + id + "/previews/8080/index.html";
    HttpClient raw(raw_url, ""), proxied(url, "");
    auto get = [&](HttpClient& c, const std::string& p) {
      auto r = c.request("GET", p);
      return r.status == 200 && r.body.size() == 2048;
    };
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!get(raw, "/index.html")) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "pandastack-bench: the guest's web server did not answer\n");
        api.kill(id);
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::vector<double> raw_ms, preview_ms;
    for (int i = 0; i < 5; ++i) get(proxied, path);
    for (int i = 0; i < n; ++i) {
      auto t = Clock::now();
      if (!get(raw, "/index.html")) return 1;
      raw_ms.push_back(ms_since(t));
      t = Clock::now();
      if (!get(proxied, path)) return 1;
      preview_ms.push_back(ms_since(t));
    }
    auto rps = [&](const std::string& base, const std::string& p) {
      std::atomic<long> done{0};
      auto end = Clock::now() + std::chrono::seconds(5);
      std::vector<std::thread> threads;
      for (int c = 0; c < 4; ++c)
        threads.emplace_back([&] {
          HttpClient own(base, "");
          while (Clock::now() < end)
            if (get(own, p)) ++done;
        });
      for (auto& th : threads) th.join();
      return double(done) / 5.0;
    };
    double raw_rps = rps(raw_url, "/index.html"), preview_rps = rps(url, path);
    api.kill(id);
    auto r = summarize(raw_ms), v = summarize(preview_ms);
    std::printf(
        "{\"scenario\":\"api-preview\",\"n\":%zu,\"raw_p50_ms\":%.3f,\"raw_p99_ms\":%.3f,"
        "\"preview_p50_ms\":%.3f,\"preview_p99_ms\":%.3f,\"added_p50_ms\":%.3f,"
        "\"raw_rps\":%.0f,\"preview_rps\":%.0f,\"rps_ratio\":%.2f}\n",
        r.n, r.p50_ms, r.p99_ms, v.p50_ms, v.p99_ms, v.p50_ms - r.p50_ms, raw_rps, preview_rps,
        preview_rps / raw_rps);
    return 0;
  }
  // Polls `path` until its `durable` is "local" (a synced copy on the data disk) and adds the ms
  // since `t` to `out`; false after two minutes.
  // Until `path`'s `durable` is "local" or beyond ("remote": in the object store too), or with
  // `remote` until it is "remote".
  auto until_durable = [&](const std::string& path, Clock::time_point t, std::vector<double>& out,
                           bool remote = false) {
    for (;;) {
      auto d = api.call("GET", path, "")["durable"].as_string();
      if (d == "remote" || (d == "local" && !remote)) break;
      if (ms_since(t) > 120000) {
        std::fprintf(stderr, "pandastack-bench: %s never became durable (%s)\n", path.c_str(),
                     remote ? "remote" : "local");
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.push_back(ms_since(t));
    return true;
  };
  if (scenario == "create") {
    api.kill(api.create(create_body));  // the first create may bake the template
    for (int i = 0; i < n; ++i) {
      std::string id;
      sample([&](double* s) { id = api.create(create_body, s); });
      api.kill(id);
      pause();
    }
  } else if (scenario == "net-throughput") {
    // A guest downloads `upstream` (an HTTP server the caller runs where the sandbox's egress
    // policy allows) n times; reports MB/s per download as the samples.
    if (upstream.empty()) {
      std::fprintf(stderr, "pandastack-bench: net-throughput needs --upstream URL\n");
      return 2;
    }
    auto id = api.create(create_body);
    Json body = Json::object();
    body.set("cmd",
             "python3 -c \"import time,urllib.request as u\nt=time.time(); n=len(u.urlopen('" +
                 upstream + "', timeout=60).read()); print(n, time.time()-t)\"");
    body.set("timeout_seconds", 300);
    std::vector<double> mbps;
    for (int i = 0; i < n; ++i) {
      auto r = api.call("POST", "/v1/sandboxes/" + id + "/exec", body.dump());
      double bytes = 0, secs = 0;
      if (std::sscanf(r["stdout"].as_string().c_str(), "%lf %lf", &bytes, &secs) != 2 ||
          secs <= 0) {
        std::fprintf(stderr, "pandastack-bench: download failed: %s\n", r.dump().c_str());
        api.kill(id);
        return 1;
      }
      mbps.push_back(bytes / secs / 1e6);
    }
    api.kill(id);
    auto s = summarize(mbps);
    if (json)
      std::printf(
          "{\"scenario\":\"api-net-throughput\",\"n\":%zu,\"p50_mb_s\":%.1f,\"min_mb_s\":%.1f,"
          "\"max_mb_s\":%.1f}\n",
          s.n, s.p50_ms, s.min_ms, s.max_ms);
    else
      std::printf("api net-throughput: n=%zu p50 %.1f MB/s (min %.1f, max %.1f)\n", s.n, s.p50_ms,
                  s.min_ms, s.max_ms);
    return 0;
  } else if (scenario == "exec" || scenario == "exec-user") {
    // exec-user: the same command as the guest's `user` (the agent drops to it: a second exec).
    auto id = api.create(create_body);
    std::string body = scenario == "exec" ? R"({"argv":["/bin/true"]})"
                                          : R"({"argv":["/bin/true"],"user":"user"})";
    for (int i = 0; i < 5; ++i) api.call("POST", "/v1/sandboxes/" + id + "/exec", body);
    for (int i = 0; i < n; ++i)
      sample([&](double* s) { api.call("POST", "/v1/sandboxes/" + id + "/exec", body, s); });
    api.kill(id);
  } else if (scenario == "code") {
    // A code-interpreter run of `1+1` in a warm context (its server started by the first runs):
    // compare with `exec` in the same run (a run is one client process in the guest).
    auto id = api.create(create_body);
    const std::string path = "/v1/sandboxes/" + id + "/code", body = R"({"code":"1+1"})";
    for (int i = 0; i < 3; ++i) api.call("POST", path, body);
    for (int i = 0; i < n; ++i) {
      Json r;
      sample([&](double* s) { r = api.call("POST", path, body, s); });
      const auto& results = r["results"].as_array();
      if (results.empty() || results[0]["text"].as_string() != "2") {
        std::fprintf(stderr, "pandastack-bench: a code run answered %s\n", r.dump().c_str());
        api.kill(id);
        return 1;
      }
    }
    api.kill(id);
  } else if (scenario == "fork") {
    auto id = api.create(create_body);
    for (int i = 0; i < n; ++i) {
      Json kids;
      sample([&](double* s) {
        kids = api.call("POST", "/v1/sandboxes/" + id + "/fork", R"({"count":1})", s);
      });
      for (auto& k : kids["sandboxes"].as_array()) api.kill(k["id"].as_string());
      pause();
    }
    api.kill(id);
  } else if (scenario == "wake" || scenario == "wake-disk") {
    // wake-disk: from a hibernation that kept only the disk (the guest boots afresh on it).
    auto id = api.create(R"({"persistent":true})");
    std::string body = scenario == "wake" ? "" : R"({"memory":false})";
    for (int i = 0; i < n; ++i) {
      api.call("POST", "/v1/sandboxes/" + id + "/hibernate", body);
      pause();
      sample([&](double* s) { api.call("POST", "/v1/sandboxes/" + id + "/wake", "", s); });
    }
    api.kill(id);
  } else if (scenario == "hibernate-durable") {
    // A hibernate's answer (on tmpfs), and until its copy is on the data disk, synced (the
    // sandbox's `durable` turns "local"): what a reboot keeps.
    auto id = api.create(R"({"persistent":true})");
    std::vector<double> durable;
    for (int i = 0; i < n; ++i) {
      auto t = Clock::now();
      sample([&](double* s) { api.call("POST", "/v1/sandboxes/" + id + "/hibernate", "", s); });
      if (!until_durable("/v1/sandboxes/" + id, t, durable)) return 1;
      api.call("POST", "/v1/sandboxes/" + id + "/wake", "");
      pause();
    }
    api.kill(id);
    report(json, "hibernate", client, server);
    report(json, "hibernate-durable", durable, durable);
    return 0;
  } else if (scenario == "hibernate-remote") {
    // With a daemon that has --object-store: a hibernate's answer, until its copy is on the data
    // disk ("local") and until its manifest is in the object store ("remote"). Each round
    // changes ~1 MB of the guest's memory first (the store has the rest from earlier rounds).
    auto id = api.create(R"({"persistent":true})");
    std::vector<double> local, remote;
    for (int i = 0; i < n; ++i) {
      api.call("POST", "/v1/sandboxes/" + id + "/exec",
               R"({"cmd":"head -c 1000000 /dev/urandom > /dev/shm/round"})");
      auto t = Clock::now();
      sample([&](double* s) { api.call("POST", "/v1/sandboxes/" + id + "/hibernate", "", s); });
      if (!until_durable("/v1/sandboxes/" + id, t, local)) return 1;
      if (!until_durable("/v1/sandboxes/" + id, t, remote, true)) return 1;
      api.call("POST", "/v1/sandboxes/" + id + "/wake", "");
      pause();
    }
    api.kill(id);
    report(json, "hibernate", client, server);
    report(json, "hibernate-durable", local, local);
    report(json, "hibernate-remote", remote, remote);
    return 0;
  } else if (scenario == "snapshot-durable" || scenario == "snapshot-remote") {
    // A named snapshot's answer (on tmpfs), and until its copy is on the data disk, synced (its
    // `durable` turns "local"): what a reboot keeps; snapshot-remote (a daemon with
    // --object-store) also until its manifest is in the store ("remote"), each round changing
    // ~1 MB of the guest's memory first (the store has the rest from earlier rounds).
    bool remote = scenario == "snapshot-remote";
    auto id = api.create(create_body);
    std::vector<double> durable, uploaded;
    for (int i = 0; i < n; ++i) {
      if (remote)
        api.call("POST", "/v1/sandboxes/" + id + "/exec",
                 R"({"cmd":"head -c 1000000 /dev/urandom > /dev/shm/round"})");
      auto t = Clock::now();
      Json taken;
      sample([&](double* s) {
        taken = api.call("POST", "/v1/sandboxes/" + id + "/snapshots", R"({"name":"bench"})", s);
      });
      auto snap = taken["snapshot_id"].as_string();
      if (!until_durable("/v1/snapshots/" + snap, t, durable)) return 1;
      if (remote && !until_durable("/v1/snapshots/" + snap, t, uploaded, true)) return 1;
      api.call("DELETE", "/v1/snapshots/" + snap, "");
      pause();
    }
    api.kill(id);
    report(json, "snapshot", client, server);
    report(json, "snapshot-durable", durable, durable);
    if (remote) report(json, "snapshot-remote", uploaded, uploaded);
    return 0;
  } else if (scenario == "density") {
    // n sandboxes created (--create-body) and left idle, on a daemon on this host: what each
    // costs the host (MemAvailable before and after, divided by n; the daemon's pools are full
    // before and after), the host's CPU use while they idle, exec latency on one of them, and how
    // many answer an exec. Creates stop when the host would have less than 1 GiB available.
    pause();
    auto before = mem_available_kib();
    std::vector<std::string> ids;
    for (int i = 0; i < n && mem_available_kib() >= kDensityFloorKib; ++i)
      ids.push_back(api.create(create_body));
    if (ids.empty()) {
      std::fprintf(stderr, "pandastack-bench: less than 1 GiB available: no sandbox created\n");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::seconds(5));  // pools refilled, first answers done
    auto after = mem_available_kib();
    double cpu = cpu_busy_percent(std::chrono::seconds(idle_seconds));
    double load = load_average_1m();
    size_t answering = 0;
    for (auto& id : ids) {
      auto r = api.http.request("POST", "/v1/sandboxes/" + id + "/exec", R"({"cmd":"true"})");
      if (r.status == 200) ++answering;
    }
    const auto& one = ids[ids.size() / 2];
    for (int i = 0; i < 20; ++i)
      sample([&](double* s) {
        api.call("POST", "/v1/sandboxes/" + one + "/exec", R"({"cmd":"true"})", s);
      });
    for (auto& id : ids) api.kill(id);
    auto fields = density_fields(ids.size(), answering, before, after, cpu, idle_seconds, load);
    auto summary = summary_json("api-density", summarize(client), "daemon", fields);
    if (json) {
      std::printf("%s\n", summary.c_str());
    } else {
      std::printf(
          "api-density sandboxes=%zu answering=%zu mem/sandbox=%s MiB idle cpu=%s%% "
          "load=%s exec p50=%.3f ms\n",
          ids.size(), answering, fields[2].second.c_str(), fields[3].second.c_str(),
          fields[5].second.c_str(), summarize(client).p50_ms);
    }
    return 0;
  } else if (scenario == "kill") {
    // A kill answers once its VM is gone (the guest synced its volumes, QEMU ended): its cost.
    api.kill(api.create(create_body));
    for (int i = 0; i < n; ++i) {
      auto id = api.create(create_body);
      pause();
      sample([&](double* s) { api.call("DELETE", "/v1/sandboxes/" + id, "", s); });
    }
  } else if (scenario == "concurrent-create") {
    constexpr int kAtOnce = 20;
    for (int round = 0; round < n; ++round) {
      std::vector<std::string> ids(kAtOnce);
      std::vector<double> srv(kAtOnce);
      auto t = Clock::now();
      std::vector<std::thread> threads;
      for (int i = 0; i < kAtOnce; ++i)
        threads.emplace_back([&, i] {
          Api own(url, key);
          ids[i] = own.create(create_body, &srv[i]);
        });
      for (auto& th : threads) th.join();
      client.push_back(ms_since(t));
      server.push_back(*std::max_element(srv.begin(), srv.end()));
      for (auto& id : ids) api.kill(id);
      pause();
    }
  } else {
    std::fprintf(
        stderr,
        "pandastack-bench: api scenarios: create exec exec-user code fork wake wake-disk kill "
        "hibernate-durable hibernate-remote snapshot-durable snapshot-remote "
        "concurrent-create density "
        "net-throughput preview\n");
    return 2;
  }
  report(json, scenario, client, server);
  return 0;
}

}  // namespace pandastack::tools
