// `pandastack sandbox|files|template ...`: the REST API from the shell. Human output is a table or
// plain text; --json prints the API's JSON. Errors go to stderr as "pandastack: CODE: message"
// (exit 1); `sandbox exec` streams the command's output live and exits with its exit code.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli/api_client.h"
#include "tools/cli/api_options.h"
#include "tools/cli/api_output.h"
#include "tools/cli/shell.h"
#include "tools/http_client.h"
#include "tools/tar_writer.h"
#include "wire/base64.h"
#include "wire/json.h"

namespace pandastack::cli {

namespace {

// Server-sent events from a stream's chunks: `on_event(event, data)` per data line.
class SseReader {
 public:
  explicit SseReader(std::function<void(const std::string&, const Json&)> on_event)
      : on_event_(std::move(on_event)) {}
  void feed(const std::string& chunk) {
    buf_ += chunk;
    size_t nl;
    while ((nl = buf_.find('\n')) != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      if (line.rfind("event: ", 0) == 0) {
        event_ = line.substr(7);
      } else if (line.rfind("data: ", 0) == 0) {
        if (auto d = Json::parse(line.substr(6))) on_event_(event_, *d);
      }
    }
  }

 private:
  std::function<void(const std::string&, const Json&)> on_event_;
  std::string buf_, event_;
};

}  // namespace

int exec(Api& api, const Opts& o, const std::string& id) {
  if (o.cmd.empty()) usage("sandbox exec needs -- CMD [ARG...]");
  Json body = Json::object();
  if (o.cmd.size() == 1) {
    body.set("cmd", o.cmd[0]);  // one word: a shell command line
  } else {
    Json argv = Json::array();
    for (auto& a : o.cmd) argv.push(a);
    body.set("argv", argv);
  }
  if (o.flags.count("--timeout")) body.set("timeout_seconds", seconds_flag(o, "--timeout"));
  if (o.flags.count("--cwd")) body.set("cwd", o.flags.at("--cwd"));
  if (!o.env.empty()) {
    Json env = Json::object();
    for (auto& [k, v] : pairs(o.env, "--env")) env.set(k, v);
    body.set("env", env);
  }
  // Piped stdin (a pipe or a file, not a terminal or /dev/null) goes to the command, as bytes.
  struct stat in {};
  if (!o.no_stdin && ::fstat(0, &in) == 0 && (S_ISFIFO(in.st_mode) || S_ISREG(in.st_mode))) {
    constexpr size_t kMax = 64 << 10;  // the API's limit on command + stdin
    std::string data;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(0, buf, sizeof buf)) > 0) {
      data.append(buf, size_t(n));
      if (data.size() > kMax) {
        std::fprintf(stderr,
                     "pandastack: stdin is more than 64 KiB: copy it into the sandbox with "
                     "`files cp` and redirect from the file (or pass --no-stdin)\n");
        return 2;
      }
    }
    if (!data.empty()) {
      body.set("stdin", tools::base64(data));
      body.set("stdin_encoding", "base64");
    }
  }
  // A shell's convention: 128+N for a command killed by signal N; 124 (like timeout(1)) when
  // it ran out of time.
  auto exit_code = [](int64_t code, bool timed_out) {
    if (timed_out) return 124;
    if (code < 0) return int(128 - code);
    return int(code & 0xff);
  };
  std::string path = "/v1/sandboxes/" + tools::url_encode(id) + "/exec";
  if (o.json) {
    auto r = api.json("POST", path, body.dump());
    std::printf("%s\n", r.dump().c_str());
    return exit_code(r["exit_code"].as_int(), r["timed_out"].as_bool());
  }
  // Streamed: output as it comes, then the command's exit code.
  int code = 1;
  bool done = false;
  SseReader sse([&](const std::string& event, const Json& d) {
    if (event == "stdout" || event == "stderr") {
      std::string data = d["data"].as_string();
      if (d["encoding"].is_string()) data = wire::base64_decode(data).value_or("");
      write_all(event == "stdout" ? 1 : 2, data);
    } else if (event == "exit") {
      bool timed_out = d["timed_out"].as_bool();
      code = exit_code(d["exit_code"].as_int(), timed_out);
      if (timed_out) std::fprintf(stderr, "pandastack: the command timed out\n");
      done = true;
    } else if (event == "error") {
      std::fprintf(stderr, "pandastack: %s: %s\n", d["code"].as_string().c_str(),
                   d["message"].as_string().c_str());
      done = true;
    }
  });
  std::string head;  // the first bytes: a refusal's JSON body when the status is not 200
  auto r = api.http().stream("POST", path + "/stream", body.dump(), [&](const std::string& chunk) {
    if (head.size() < 65536) head.append(chunk, 0, 65536 - head.size());
    sse.feed(chunk);
  });
  if (r.status != 200) {
    if (r.body.empty()) r.body = head;
    Api::fail(r);
  }
  if (!done) std::fprintf(stderr, "pandastack: the stream ended early\n");
  return code;
}

void need_args(const Opts& o, size_t n, const std::string& what) {
  if (o.pos.size() != n) usage(what + ": wrong arguments");
}

namespace {

// `template build`: the build's request, then its progress (server-sent events) until it ends.
// A local file's bytes (a usage error when it cannot be read).
std::string read_local(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) usage(flag + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A Dockerfile's build context: `dir` as a tar (tools/tar_writer.h: every file, binary ones
// too; the daemon applies its .dockerignore), uploaded (POST /v1/build-contexts); its key.
std::string upload_context(Api& api, const std::string& dir) {
  auto tar = tools::tar_of_folder(dir);
  if (!tar) usage("--context: " + tar.error().message);
  auto answer = Json::parse(api.call("POST", "/v1/build-contexts", *tar, "application/x-tar"));
  if (!answer || !(*answer)["context"].is_string())
    throw std::runtime_error("the daemon did not answer the build context's key");
  return (*answer)["context"].as_string();
}

int follow_build(Api& api, const Opts& o, const std::string& name);

int template_build(Api& api, const Opts& o, const std::string& name) {
  Json body = Json::object();
  body.set("name", name);
  auto list = [](const std::vector<std::string>& v) {
    Json a = Json::array();
    for (auto& x : v) a.push(x);
    return a;
  };
  body.set("packages", list(o.packages));
  if (o.flags.count("--dockerfile")) {
    if (o.flags.count("--from") || !o.runs.empty() || !o.env.empty() || !o.files.empty())
      usage("template build: --dockerfile says what --from, --run, --env and --file would");
    body.set("dockerfile", read_local(o.flags.at("--dockerfile"), "--dockerfile"));
    if (o.flags.count("--context"))
      body.set("context", upload_context(api, o.flags.at("--context")));
    Json args = Json::object();
    for (auto& [k, v] : pairs(o.build_args, "--build-arg")) args.set(k, v);
    body.set("build_args", args);
  } else {
    if (o.flags.count("--context") || !o.build_args.empty())
      usage("template build: --context and --build-arg need --dockerfile");
    if (o.flags.count("--from")) body.set("from", o.flags.at("--from"));
    body.set("run", list(o.runs));
    Json env = Json::object();
    for (auto& [k, v] : pairs(o.env, "--env")) env.set(k, v);
    body.set("env", env);
    Json files = Json::object();
    for (auto& [guest, local] : pairs(o.files, "--file"))
      files.set(guest, read_local(local, "--file " + guest + "=" + local));
    body.set("files", files);
  }
  if (o.no_network) body.set("network", false);
  set_shape(body, o);
  api.json("POST", "/v1/templates", body.dump());
  return follow_build(api, o, name);
}

// `template import`: the archive PUT as the request's body, then its progress like a build's.
int template_import(Api& api, const Opts& o, const std::string& name, const std::string& archive) {
  std::string q;
  auto add = [&](const std::string& k, const std::string& v) {
    q += (q.empty() ? "?" : "&") + k + "=" + tools::url_encode(v);
  };
  if (o.flags.count("--memory")) add("memory_mib", std::to_string(seconds_flag(o, "--memory")));
  if (o.flags.count("--vcpus")) add("vcpus", std::to_string(seconds_flag(o, "--vcpus")));
  if (o.flags.count("--size")) add("disk_mib", std::to_string(seconds_flag(o, "--size")));
  if (o.flags.count("--no-start")) add("start", "false");
  if (o.no_network) add("network", "false");
  api.call("PUT", "/v1/templates/" + tools::url_encode(name) + "/image" + q,
           read_local(archive, "the archive"), "application/x-tar");
  return follow_build(api, o, name);
}

// A build's (or import's) progress (server-sent events) until it ends: 0 when it is ready.
int follow_build(Api& api, const Opts& o, const std::string& name) {
  const bool bar = !o.json && ::isatty(2);
  Json end;
  auto draw = [&](const std::string& stage, int64_t pct, const std::string& last) {
    int filled = int(pct * 30 / 100);
    std::fprintf(stderr, "\r\033[K[%s%s] %3lld%% %-7s %.40s",
                 std::string(size_t(filled), '#').c_str(),
                 std::string(size_t(30 - filled), ' ').c_str(), static_cast<long long>(pct),
                 stage.c_str(), last.c_str());
  };
  std::string stage = "queued", last;
  int64_t pct = 0;
  SseReader sse([&](const std::string& event, const Json& d) {
    if (event == "stage") {
      stage = d["stage"].as_string();
      pct = d["percent"].as_int();
      if (bar)
        draw(stage, pct, last);
      else if (!o.json)
        std::printf("== %s %lld%%\n", stage.c_str(), static_cast<long long>(pct));
    } else if (event == "log") {
      last = d["line"].as_string();
      if (bar)
        draw(stage, pct, last);
      else if (!o.json)
        std::printf("%s\n", last.c_str());
    } else if (event == "end") {
      end = d;
    }
    std::fflush(stdout);
  });
  std::string head;  // (as in exec)
  auto r = api.http().stream("GET", "/v1/templates/" + tools::url_encode(name) + "/build", "",
                             [&](const std::string& chunk) {
                               if (head.size() < 65536) head.append(chunk, 0, 65536 - head.size());
                               sse.feed(chunk);
                             });
  if (bar) std::fprintf(stderr, "\n");
  if (r.status != 200) {
    if (r.body.empty()) r.body = head;
    Api::fail(r);
  }
  if (!end.is_object()) {
    std::fprintf(stderr, "pandastack: the build's stream ended early\n");
    return 1;
  }
  if (o.json) std::printf("%s\n", end.dump().c_str());
  if (end["status"].as_string() != "ready") {
    std::fprintf(stderr, "pandastack: the build failed: %s\n%s", end["error"].as_string().c_str(),
                 end["log_tail"].as_string().c_str());
    return 1;
  }
  if (!o.json)
    std::printf("template %s ready (%.1f s, %.1f MB; %lld MiB, %lld vCPUs)\n", name.c_str(),
                double(end["build_ms"].as_int()) / 1000.0, double(end["size_bytes"].as_int()) / 1e6,
                (long long)end["memory_mib"].as_int(), (long long)end["vcpus"].as_int());
  return 0;
}

// "sbx_...:/path" -> (id, path); a local path -> ("", path).
std::pair<std::string, std::string> location(const std::string& s) {
  auto colon = s.find(':');
  if (s.rfind("sbx_", 0) == 0 && colon != std::string::npos)
    return {s.substr(0, colon), s.substr(colon + 1)};
  return {"", s};
}

// {"mode", "cidrs"}: an allowlist when only CIDRs are given.
Json egress_body(const std::string& mode, const std::vector<std::string>& allow) {
  Json e = Json::object();
  e.set("mode", !mode.empty() ? mode : allow.empty() ? "deny_all" : "allowlist");
  Json c = Json::array();
  for (auto& a : allow) c.push(a);
  e.set("cidrs", c);
  return e;
}

}  // namespace

bool is_api_command(const std::string& word) {
  return word == "sandbox" || word == "files" || word == "template" || word == "snapshot" ||
         word == "volume" || word == "db" || word == "secret";
}

int api_main(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h" ||
      std::string(argv[2]) == "help") {
    if (argc >= 3) {
      std::fputs(kApiUsage, stdout);
      return 0;
    }
    usage(std::string(argv[1]) + " needs a command");
  }
  std::string group = argv[1], verb = argv[2];
  Opts o = parse(argc, argv, 3);
  Api api(o);
  auto need = [&](size_t n) { need_args(o, n, group + " " + verb); };
  if (group == "template" && verb == "list") {
    auto r = api.json("GET", "/v1/templates");
    if (o.json) return std::printf("%s\n", r.dump().c_str()), 0;
    std::printf("%-24s %-8s %-8s %-5s %s\n", "TEMPLATE", "KIND", "MEMORY", "VCPUS", "STATUS");
    for (auto& t : r["templates"].as_array())
      std::printf(
          "%-24s %-8s %-8s %-5lld %s\n", t["name"].as_string().c_str(),
          t["kind"].as_string().c_str(), (std::to_string(t["memory_mib"].as_int()) + "M").c_str(),
          (long long)t["vcpus"].as_int(),
          t["kind"].as_string() == "shipped" ? (t["baked"].as_bool() ? "ready (baked)" : "ready")
                                             : t["status"].as_string().c_str());
    return 0;
  }
  if (group == "template" && verb == "build") {
    need(1);
    return template_build(api, o, o.pos[0]);
  }
  if (group == "template" && verb == "pull") {
    need(2);
    Json body = Json::object();
    body.set("name", o.pos[0]);
    body.set("image", o.pos[1]);
    if (o.secrets.size() > 1) usage("template pull: one --secret (the registry's credentials)");
    if (!o.secrets.empty()) body.set("registry_secret", o.secrets.front());
    if (o.flags.count("--size")) body.set("disk_mib", seconds_flag(o, "--size"));
    if (o.flags.count("--no-start")) body.set("start", "none");
    if (o.no_network) body.set("network", false);
    set_shape(body, o);
    api.json("POST", "/v1/templates", body.dump());
    return follow_build(api, o, o.pos[0]);
  }
  if (group == "template" && verb == "import") {
    need(2);
    return template_import(api, o, o.pos[0], o.pos[1]);
  }
  if (group == "template" && verb == "publish") {
    need(2);
    Json body = Json::object();
    body.set("name", o.pos[1]);
    auto t =
        api.json("POST", "/v1/sandboxes/" + tools::url_encode(o.pos[0]) + "/template", body.dump());
    if (o.json) return std::printf("%s\n", t.dump().c_str()), 0;
    std::printf("template %s ready (from %s)\n", t["name"].as_string().c_str(), o.pos[0].c_str());
    return 0;
  }
  if (group == "template" && (verb == "get" || verb == "delete")) {
    need(1);
    auto t =
        api.json(verb == "get" ? "GET" : "DELETE", "/v1/templates/" + tools::url_encode(o.pos[0]));
    if (o.json || verb == "get") std::printf("%s\n", t.dump().c_str());
    return 0;
  }
  if (group == "db") return db_command(api, o, verb);
  if (group == "secret") return secret_command(api, o, verb);
  if (group == "volume") return volume_command(api, o, verb);
  if (group == "snapshot" && verb == "delete") {
    need(1);
    api.json("DELETE", "/v1/snapshots/" + tools::url_encode(o.pos[0]));
    return 0;
  }
  if (group == "sandbox") {
    if (verb == "create") {
      need(0);
      Json body = Json::object();
      body.set("template", o.flags.count("--template") ? o.flags.at("--template") : "base");
      set_shape(body, o);
      if (o.flags.count("--ttl")) body.set("ttl_seconds", seconds_flag(o, "--ttl"));
      if (o.flags.count("--idle-timeout"))
        body.set("idle_timeout_seconds", seconds_flag(o, "--idle-timeout"));
      if (o.flags.count("--on-timeout")) body.set("on_timeout", o.flags.at("--on-timeout"));
      if (o.auto_wake) body.set("auto_wake", true);
      if (!o.metadata.empty()) {
        Json m = Json::object();
        for (auto& [k, v] : pairs(o.metadata, "--metadata")) m.set(k, v);
        body.set("metadata", m);
      }
      if (o.persistent) body.set("persistent", true);
      if (o.no_network) {
        if (o.flags.count("--egress") || !o.allow.empty())
          usage("sandbox create: --no-network and an egress policy exclude each other");
        body.set("network", false);
      } else if (o.flags.count("--egress") || !o.allow.empty()) {
        body.set("egress",
                 egress_body(o.flags.count("--egress") ? o.flags.at("--egress") : "", o.allow));
      }
      if (!o.secrets.empty()) {
        Json names = Json::array();
        for (auto& n : o.secrets) names.push(Json(n));
        body.set("secrets", names);
      }
      if (!o.volumes.empty()) {
        Json vols = Json::array();
        for (auto& spec : o.volumes) {  // VOL_ID:/mount[:ro]
          auto c1 = spec.find(':');
          if (c1 == std::string::npos) usage("--volume is VOL_ID:/mount[:ro]");
          auto rest = spec.substr(c1 + 1);
          bool ro = rest.size() > 3 && rest.ends_with(":ro");
          if (ro) rest.resize(rest.size() - 3);
          Json v = Json::object();
          v.set("volume", spec.substr(0, c1));
          v.set("mount", rest);
          if (ro) v.set("read_only", true);
          vols.push(v);
        }
        body.set("volumes", vols);
      }
      auto s = api.json("POST", "/v1/sandboxes", body.dump());
      if (o.json) return std::printf("%s\n", s.dump().c_str()), 0;
      return std::printf("%s\n", s["id"].as_string().c_str()), 0;
    }
    if (verb == "list") {
      need(0);
      std::string q;
      if (o.flags.count("--state")) q += "state=" + tools::url_encode(o.flags.at("--state"));
      bool live_only = !o.all && !o.flags.count("--state");
      for (auto& [k, v] : pairs(o.metadata, "--metadata"))
        q += (q.empty() ? "" : "&") + ("metadata." + tools::url_encode(k)) + "=" +
             tools::url_encode(v);
      auto r = api.json("GET", "/v1/sandboxes" + (q.empty() ? "" : "?" + q));
      Json shown = Json::array();
      for (auto& sbx : r["sandboxes"].as_array())
        if (!live_only || !ended(sbx)) shown.push(sbx);
      if (o.json) return std::printf("%s\n", shown.dump().c_str()), 0;
      print_table(shown);
      return 0;
    }
    if (verb == "egress") {
      need(2);
      Json body = Json::object();
      body.set("egress", egress_body(o.pos[1], o.allow));
      auto s = api.json("PATCH", "/v1/sandboxes/" + tools::url_encode(o.pos[0]), body.dump());
      return print_sandbox(s, o.json), 0;
    }
    if (verb == "preview" || verb == "unpreview") {
      need(2);
      std::string base = "/v1/sandboxes/" + tools::url_encode(o.pos[0]) + "/previews";
      if (o.pos[1].empty() || o.pos[1].find_first_not_of("0123456789") != std::string::npos)
        usage("sandbox " + verb + ": PORT is a number");
      if (verb == "unpreview") return api.json("DELETE", base + "/" + o.pos[1]), 0;
      Json body = Json::object();
      body.set("port", int64_t(std::atoll(o.pos[1].c_str())));
      if (o.is_public) body.set("public", true);
      if (o.flags.count("--ttl")) body.set("ttl_seconds", seconds_flag(o, "--ttl"));
      auto p = api.json("POST", base, body.dump());
      if (o.json) return std::printf("%s\n", p.dump().c_str()), 0;
      return std::printf("%s\n", p["url"].as_string().c_str()), 0;
    }
    if (verb == "expose" || verb == "unexpose") {
      need(2);
      std::string base = "/v1/sandboxes/" + tools::url_encode(o.pos[0]) + "/ports";
      if (verb == "unexpose")
        return api.json("DELETE", base + "/" + tools::url_encode(o.pos[1])), 0;
      Json body = Json::object();
      if (o.pos[1].empty() || o.pos[1].find_first_not_of("0123456789") != std::string::npos)
        usage("sandbox expose: PORT is a number");
      body.set("port", int64_t(std::atoll(o.pos[1].c_str())));
      auto p = api.json("POST", base, body.dump());
      if (o.json) return std::printf("%s\n", p.dump().c_str()), 0;
      return std::printf("%s\n", p["address"].as_string().c_str()), 0;
    }
    need(1);
    std::string base = "/v1/sandboxes/" + tools::url_encode(o.pos[0]);
    if (verb == "ports") {
      auto r = api.json("GET", base + "/ports");
      if (o.json) return std::printf("%s\n", r["ports"].dump().c_str()), 0;
      std::printf("%-8s %s\n", "PORT", "HOST ADDRESS");
      for (auto& p : r["ports"].as_array())
        std::printf("%-8lld %s\n", (long long)p["port"].as_int(),
                    p["address"].is_string() ? p["address"].as_string().c_str() : "(not running)");
      return 0;
    }
    if (verb == "egress-log") {
      // Every page (the daemon keeps at most 1,000 entries per sandbox).
      Json all = Json::array();
      for (int64_t after = 0;;) {
        auto r = api.json("GET", base + "/egress?limit=1000&after=" + std::to_string(after));
        for (auto& e : r["entries"].as_array()) all.push(e);
        if (r["entries"].size() == 0 || r["next_after"].as_int() == after) break;
        after = r["next_after"].as_int();
      }
      if (o.json) return std::printf("%s\n", all.dump().c_str()), 0;
      std::printf("%-6s %-10s %-8s %-14s %s\n", "SEQ", "KIND", "VERDICT", "REASON", "WHAT");
      for (auto& e : all.as_array()) {
        std::string what;
        if (e["kind"].as_string() == "dns") {
          what = e["name"].as_string() + " " + e["type"].as_string();
          for (auto& a : e["answers"].as_array()) what += " " + a.as_string();
        } else {
          what = e["protocol"].as_string() + " " + e["destination"].as_string();
          if (e.has("port")) what += ":" + std::to_string(e["port"].as_int());
          if (e.has("name")) what += " (" + e["name"].as_string() + ")";
          if (e.has("bytes_out"))
            what += " out " + std::to_string(e["bytes_out"].as_int()) + " B, in " +
                    std::to_string(e["bytes_in"].as_int()) + " B";
        }
        std::printf("%-6lld %-10s %-8s %-14s %s\n", (long long)e["seq"].as_int(),
                    e["kind"].as_string().c_str(), e["verdict"].as_string().c_str(),
                    e.has("reason") ? e["reason"].as_string().c_str() : "-", what.c_str());
      }
      return 0;
    }
    if (verb == "previews") {
      auto r = api.json("GET", base + "/previews");
      if (o.json) return std::printf("%s\n", r["previews"].dump().c_str()), 0;
      std::printf("%-8s %-8s %s\n", "PORT", "PUBLIC", "URL");
      for (auto& p : r["previews"].as_array())
        std::printf("%-8lld %-8s %s\n", (long long)p["port"].as_int(),
                    p["public"].as_bool() ? "yes" : "no", p["url"].as_string().c_str());
      return 0;
    }
    if (verb == "get") return print_sandbox(api.json("GET", base), o.json), 0;
    if (verb == "kill") return print_sandbox(api.json("DELETE", base), o.json), 0;
    if (verb == "hibernate" || verb == "wake")
      return print_sandbox(api.json("POST", base + "/" + verb), o.json), 0;
    if (verb == "snapshot") {
      auto r = api.json("POST", base + "/snapshots");
      if (o.json) return std::printf("%s\n", r.dump().c_str()), 0;
      return std::printf("%s\n", r["snapshot_id"].as_string().c_str()), 0;
    }
    if (verb == "fork") {
      Json body = Json::object();
      body.set("count", o.flags.count("--count") ? seconds_flag(o, "--count") : int64_t(1));
      if (o.inherit_secrets) body.set("inherit_secrets", true);
      auto r = api.json("POST", base + "/fork", body.dump());
      if (o.json) return std::printf("%s\n", r["sandboxes"].dump().c_str()), 0;
      for (auto& k : r["sandboxes"].as_array()) std::printf("%s\n", k["id"].as_string().c_str());
      return 0;
    }
    if (verb == "exec") return exec(api, o, o.pos[0]);
    if (verb == "shell") return shell(api.http(), o.pos[0], o.cmd);
    if (verb == "logs") {
      auto r = api.json("GET", base + "/events");
      for (auto& e : r["events"].as_array()) {
        if (o.json) {
          std::printf("%s\n", e.dump().c_str());
          continue;
        }
        Json details = Json::object();
        for (auto& [k, v] : e["event"].as_object())
          if (k != "kind" && k != "at_ms") details.set(k, v);
        std::printf("%s  v%-4lld %-18s %s\n", when(e["time_ms"].as_int()).c_str(),
                    (long long)e["version"].as_int(), e["type"].as_string().c_str(),
                    details.size() ? details.dump().c_str() : "");
      }
      return 0;
    }
  }
  if (group == "files") {
    if (verb == "ls") {
      need(2);
      auto r = api.json("GET", "/v1/sandboxes/" + tools::url_encode(o.pos[0]) +
                                   "/files/list?path=" + tools::url_encode(o.pos[1]));
      if (o.json) return std::printf("%s\n", r["entries"].dump().c_str()), 0;
      for (auto& e : r["entries"].as_array())
        std::printf("%-10s %12lld  %s%s\n", e["type"].as_string().c_str(),
                    (long long)e["size"].as_int(), e["name"].as_string().c_str(),
                    e["type"].as_string() == "directory" ? "/" : "");
      return 0;
    }
    if (verb == "cat") {
      need(2);
      write_all(1, api.call("GET", "/v1/sandboxes/" + tools::url_encode(o.pos[0]) +
                                       "/files?path=" + tools::url_encode(o.pos[1])));
      return 0;
    }
    if (verb == "cp") {
      need(2);
      auto [src_id, src] = location(o.pos[0]);
      auto [dst_id, dst] = location(o.pos[1]);
      if (src_id.empty() == dst_id.empty()) usage("files cp: exactly one side must be ID:/path");
      // Files of any size, 32 MiB per request (?offset=): never whole in memory.
      constexpr uint64_t kPart = uint64_t(32) << 20;
      if (!src_id.empty()) {
        std::string base =
            "/v1/sandboxes/" + tools::url_encode(src_id) + "/files?path=" + tools::url_encode(src);
        auto st = api.json("GET", "/v1/sandboxes/" + tools::url_encode(src_id) +
                                      "/files/stat?path=" + tools::url_encode(src));
        uint64_t size = uint64_t(st["size"].as_int());
        std::ofstream out(dst, std::ios::binary);
        if (!out) return std::fprintf(stderr, "pandastack: cannot write %s\n", dst.c_str()), 1;
        if (size <= 2 * kPart) {
          out << api.call("GET", base);
        } else {
          for (uint64_t off = 0; off < size; off += kPart)
            out << api.call("GET", base + "&offset=" + std::to_string(off) +
                                       "&length=" + std::to_string(kPart));
        }
        if (!out) return std::fprintf(stderr, "pandastack: cannot write %s\n", dst.c_str()), 1;
      } else {
        std::ifstream in(src, std::ios::binary);
        if (!in) return std::fprintf(stderr, "pandastack: cannot read %s\n", src.c_str()), 1;
        std::string base = "/v1/sandboxes/" + tools::url_encode(dst_id) + "/files";
        // Into a folder (cp's way): DST ends in '/' or names a folder in the sandbox.
        bool into = !dst.empty() && dst.back() == '/';
        if (!into) {
          auto st = api.http().request("GET", base + "/stat?path=" + tools::url_encode(dst));
          into = st.status == 200 && st.body.find("\"type\":\"directory\"") != std::string::npos;
        }
        if (into) {
          auto slash = src.find_last_of('/');
          dst += (dst.back() == '/' ? "" : "/") +
                 (slash == std::string::npos ? src : src.substr(slash + 1));
        }
        std::string part(kPart, '\0');
        uint64_t off = 0;
        do {
          in.read(part.data(), std::streamsize(kPart));
          auto n = size_t(in.gcount());
          api.call("PUT",
                   base + "?path=" + tools::url_encode(dst) +
                       (off ? "&offset=" + std::to_string(off) : std::string()),
                   part.substr(0, n), "application/octet-stream");
          off += n;
        } while (in);
      }
      return 0;
    }
  }
  usage("unknown command " + group + " " + verb);
}

}  // namespace pandastack::cli
