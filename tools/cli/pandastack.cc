// pandastack: the command-line tool: the audit log, and an MCP server for agents.
//
//   pandastack audit [--data DIR | --url URL --key KEY] [--sandbox ID] [--from T] [--to T]
//                    [--after SEQ] [--limit N] [--json]
//   pandastack audit replay --data DIR [--url URL] [--key KEY]
//   pandastack mcp [--url URL] [--key KEY]
//
// `audit` prints the event log, oldest first: from the store itself (`--data`, opened read-only,
// so it works while the daemon runs) or through the API (admin keys see every tenant). `replay`
// rebuilds every sandbox's state from its events alone (the pure apply() of actors/sandbox.h) and
// compares it with the live state the running daemon reports; it exits 1 on any difference.
#include <spdlog/spdlog.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/database_codec.h"
#include "actors/event_codec.h"
#include "actors/sandbox.h"
#include "actors/volume_codec.h"
#include "storage/event_store.h"
#include "tools/http_client.h"
#include "wire/json.h"

namespace {

using pandastack::wire::Json;
namespace actors = pandastack::actors;
namespace storage = pandastack::storage;

const char* kUsage = R"(usage:
  pandastack audit [--data DIR | --url URL --key KEY] [--sandbox ID] [--from TIME] [--to TIME]
                   [--after SEQ] [--limit N] [--json]
      Prints the audit log, oldest first (text, or JSON lines with --json). TIME is epoch
      milliseconds or UTC like 2026-11-29T20:00:00Z. --data reads the store directly (read-only,
      also while the daemon runs); otherwise the API at --url (default $PANDASTACK_BASE_URL or
      http://127.0.0.1:7070) with --key (default $PANDASTACK_API_KEY).
  pandastack audit replay --data DIR [--url URL] [--key KEY]
      Rebuilds every sandbox from its events alone and compares it with the live state of the
      daemon at --url (an admin key). Exit 0: identical; 1: differences (listed); 2: error.
  pandastack mcp [--url URL] [--key KEY]
      A Model Context Protocol server on stdio (JSON-RPC, one message per line) with tools for
      agents: create_sandbox, run_command, run_code, read_file, write_file, list_dir, fork_sandbox,
      create_database, preview_url, egress_log, list_secrets, kill_sandbox. Calls the API at --url with --key (same defaults as above).
  pandastack sandbox|files|template|snapshot|volume|db ...   (see `pandastack sandbox help`)
  pandastack help | --version
)";

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "pandastack: %s\n", msg.c_str());
  std::exit(code);
}

std::optional<int64_t> parse_time(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) return std::stoll(s);
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end || (*end != '\0' && std::string(end) != "Z")) return std::nullopt;
  return int64_t(timegm(&tm)) * 1000;
}

std::string iso(int64_t ms) {
  std::time_t t = ms / 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03dZ", buf, int(ms % 1000));
  return out;
}

struct Entry {
  uint64_t seq = 0, version = 0;
  int64_t time_ms = 0;
  std::string sandbox, type;
  Json event;
};

void print(const Entry& e, bool json) {
  if (json) {
    Json j = Json::object();
    j.set("seq", e.seq);
    j.set("time_ms", e.time_ms);
    j.set("sandbox", e.sandbox);
    j.set("version", e.version);
    j.set("type", e.type);
    j.set("event", e.event);
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  Json details = Json::object();
  if (e.event.is_object())
    for (auto& [k, v] : e.event.as_object())
      if (k != "kind" && k != "at_ms") details.set(k, v);
  std::printf("%8llu  %s  %s  v%-4llu %-18s %s\n", (unsigned long long)e.seq,
              iso(e.time_ms).c_str(), e.sandbox.c_str(), (unsigned long long)e.version,
              e.type.c_str(), details.size() ? details.dump().c_str() : "");
}

std::unique_ptr<storage::EventStore> open_store(const std::string& dir) {
  storage::EventStore::Options o;
  o.dir = std::filesystem::path(dir) / "store";
  o.read_only = true;
  auto s = storage::EventStore::open(o);
  if (!s) die(2, "cannot open the event store in " + o.dir.string() + ": " + s.error().message);
  return std::move(*s);
}

Entry entry_of(const storage::StoredEvent& r) {
  Entry e{r.global_seq, r.version, r.time_ms, r.stream, r.type, Json()};
  std::optional<std::string> json;
  if (r.stream.starts_with("vol_")) {
    if (auto ev = actors::decode_volume_event(r.payload)) json = actors::volume_event_to_json(*ev);
  } else if (r.stream.starts_with("db_")) {
    if (auto ev = actors::decode_database_event(r.payload))
      json = actors::database_event_to_json(*ev);
  } else if (auto ev = actors::decode_event(r.payload)) {
    json = actors::event_to_json(*ev);
  }
  if (json) {
    if (auto j = Json::parse(*json)) e.event = *j;
  } else {
    e.event = Json::object();
    e.event.set("kind", "undecodable");
  }
  return e;
}

struct Args {
  std::string data, url, key, sandbox;
  std::optional<int64_t> from, to;
  uint64_t after = 0;
  size_t limit = SIZE_MAX;
  bool json = false;
};

int audit(const Args& a) {
  std::vector<Entry> out;
  if (!a.data.empty()) {
    auto store = open_store(a.data);
    auto rows = !a.sandbox.empty() ? store->read_stream(a.sandbox)
                : a.from           ? store->read_time_range(*a.from, a.to.value_or(INT64_MAX))
                                   : store->read_all(a.after + 1);
    if (!rows) die(2, "cannot read the log: " + rows.error().message);
    for (auto& r : *rows) {
      if (r.global_seq <= a.after) continue;
      if (a.from && r.time_ms < *a.from) continue;
      if (a.to && r.time_ms >= *a.to) continue;
      out.push_back(entry_of(r));
    }
  } else {
    pandastack::tools::HttpClient http(a.url, a.key);
    std::string path;
    if (!a.sandbox.empty()) {
      path = "/v1/sandboxes/" + a.sandbox + "/events";
    } else {
      path = "/v1/audit?all=1&limit=10000&after=" + std::to_string(a.after);
      if (a.from) path += "&from_ms=" + std::to_string(*a.from);
      if (a.to) path += "&to_ms=" + std::to_string(*a.to);
    }
    for (;;) {
      auto r = http.request("GET", path);
      if (r.status != 200)
        die(2,
            "GET " + path + ": " + (r.status ? std::to_string(r.status) + " " + r.body : r.error));
      auto j = Json::parse(r.body);
      if (!j) die(2, "the API answered something that is not JSON");
      size_t n = 0;
      for (auto& e : (*j)["events"].as_array()) {
        ++n;
        Entry x{uint64_t(e["seq"].as_int()), uint64_t(e["version"].as_int()), e["time_ms"].as_int(),
                e["sandbox"].as_string(),    e["type"].as_string(),           e["event"]};
        if (a.from && x.time_ms < *a.from) continue;
        if (a.to && x.time_ms >= *a.to) continue;
        out.push_back(x);
      }
      if (!a.sandbox.empty() || n < 10000 || a.from) break;
      // (a cluster's merged log goes on by its cursor; one host's by its sequence)
      if ((*j)["next_cursor"].is_string())
        path = "/v1/audit?all=1&limit=10000&cursor=" + (*j)["next_cursor"].as_string();
      else
        path = "/v1/audit?all=1&limit=10000&after=" + std::to_string((*j)["next_after"].as_int());
    }
  }
  size_t shown = 0;
  for (auto& e : out) {
    if (shown++ >= a.limit) break;
    print(e, a.json);
  }
  return 0;
}

// The fields both sides know, as one comparable JSON object.
Json comparable(const std::string& state, const std::string& tenant, const std::string& tmpl,
                const Json& metadata, int64_t expires, bool persistent, const std::string& parent,
                const Json& snapshots, uint64_t version) {
  Json j = Json::object();
  j.set("state", state);
  j.set("tenant", tenant);
  j.set("template", tmpl);
  j.set("metadata", metadata);
  j.set("expires_at_ms", expires);
  j.set("persistent", persistent);
  j.set("parent", parent);
  j.set("snapshots", snapshots);
  j.set("version", version);
  return j;
}

Json from_state(const actors::SandboxState& s) {
  Json m = actors::string_map_json(s.metadata);
  Json snaps = Json::array();
  for (auto& x : s.snapshots) snaps.push(x);
  // A sandbox that never expires (a database's) says so with null: 0 on both sides.
  int64_t expires = s.ttl_seconds == actors::kNoExpiry ? 0 : s.expires_at_ms;
  return comparable(actors::to_string(s.status), s.tenant, s.template_name, m, expires,
                    s.persistent, s.parent, snaps, s.version);
}

Json from_api(const Json& j) {
  return comparable(j["state"].as_string(), j["tenant"].as_string(), j["template"].as_string(),
                    j["metadata"], j["expires_at_ms"].as_int(), j["persistent"].as_bool(),
                    j.has("parent") ? j["parent"].as_string() : "", j["snapshots"],
                    uint64_t(j["version"].as_int()));
}

// Every sandbox rebuilt from its events; impossible or undecodable events are problems.
std::map<std::string, actors::SandboxState> replay_store(storage::EventStore& store,
                                                         std::vector<std::string>& problems,
                                                         size_t& events) {
  std::map<std::string, actors::SandboxState> out;
  auto streams = store.streams("sbx_");
  if (!streams) die(2, "cannot list streams: " + streams.error().message);
  for (auto& id : *streams) {
    auto rows = store.read_stream(id);
    if (!rows) die(2, "cannot read " + id + ": " + rows.error().message);
    actors::SandboxState s;
    s.id = id;
    // The stored state snapshot must equal the replay at its version.
    auto snap = store.load_snapshot(id);
    std::optional<storage::StateSnapshot> check;
    if (snap && *snap && (*snap)->format == actors::state_format()) check = **snap;
    for (auto& r : *rows) {
      ++events;
      auto e = actors::decode_event(r.payload);
      if (!e) {
        problems.push_back(id + " v" + std::to_string(r.version) + ": undecodable event");
        break;
      }
      try {
        s = actors::apply(s, *e);
      } catch (const std::exception& ex) {
        problems.push_back(id + " v" + std::to_string(r.version) + ": " + ex.what());
        break;
      }
      if (check && s.version == check->version && actors::encode_state(s) != check->state)
        problems.push_back(id + ": the state snapshot at v" + std::to_string(s.version) +
                           " differs from the replay");
    }
    out[id] = s;
  }
  return out;
}

std::map<std::string, Json> live_sandboxes(pandastack::tools::HttpClient& http) {
  auto r = http.request("GET", "/v1/sandboxes?all=1");
  if (r.status != 200)
    die(2, "cannot read the live state (GET /v1/sandboxes?all=1 needs an admin key): " +
               (r.status ? std::to_string(r.status) + " " + r.body : r.error));
  auto j = Json::parse(r.body);
  if (!j) die(2, "the API answered something that is not JSON");
  std::map<std::string, Json> out;
  for (auto& s : (*j)["sandboxes"].as_array()) out[s["id"].as_string()] = from_api(s);
  return out;
}

int replay(const Args& a) {
  if (a.data.empty()) die(2, "audit replay needs --data DIR (the daemon's data folder)");
  pandastack::tools::HttpClient http(a.url, a.key);
  // Live state before and after the replay: sandboxes that changed meanwhile are not compared.
  auto before = live_sandboxes(http);
  std::vector<std::string> problems;
  size_t events = 0;
  auto store = open_store(a.data);
  auto rebuilt = replay_store(*store, problems, events);
  // Retired sandboxes (ended, then forgotten by the daemon: --ended-retention) are not in the
  // API; the log must show each of them ended.
  std::set<std::string> retired;
  auto marks = store->scan(actors::kRetiredPrefix);
  if (!marks) die(2, "cannot list retired sandboxes: " + marks.error().message);
  for (auto& [k, v] : *marks) {
    auto id = k.substr(std::string_view(actors::kRetiredPrefix).size());
    retired.insert(id);
    auto it = rebuilt.find(id);
    if (it == rebuilt.end())
      problems.push_back(id + ": retired but has no events");
    else if (it->second.live())
      problems.push_back(id + ": retired while " + actors::to_string(it->second.status));
  }
  store.reset();
  auto after = live_sandboxes(http);
  size_t compared = 0, moving = 0;
  for (auto& [id, live] : after) {
    auto b = before.find(id);
    if (b == before.end() || b->second.dump() != live.dump()) {
      ++moving;
      continue;
    }
    auto it = rebuilt.find(id);
    if (it == rebuilt.end()) {
      problems.push_back(id + ": live but has no events");
      continue;
    }
    ++compared;
    auto mine = from_state(it->second);
    // Unchanged from before the store was opened until after the replay: the log must match.
    if (mine.dump() != live.dump())
      problems.push_back(id + ": replayed " + mine.dump() + " but live " + live.dump());
  }
  for (auto& [id, s] : rebuilt)
    if (s.status != actors::SandboxStatus::none && !after.count(id) && !before.count(id) &&
        !retired.count(id))
      problems.push_back(id + ": in the log (" + actors::to_string(s.status) +
                         ") but unknown to the daemon");
  std::printf("replayed %zu sandboxes from %zu events; compared %zu with the live daemon",
              rebuilt.size(), events, compared);
  if (!retired.empty()) std::printf(" (%zu retired, ended in the log)", retired.size());
  if (moving) std::printf(" (%zu changed during the replay, not compared)", moving);
  std::printf(": %zu difference(s)\n", problems.size());
  for (auto& p : problems) std::printf("  %s\n", p.c_str());
  return problems.empty() ? 0 : 1;
}

}  // namespace

namespace pandastack::cli {
bool is_api_command(const std::string& word);
int api_main(int argc, char** argv);
int mcp_main(const std::string& url, const std::string& key);  // (mcp_server.cc)
}  // namespace pandastack::cli

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  if (argc == 1 || std::string(argv[1]) == "help") {
    std::fputs(kUsage, argc == 1 ? stderr : stdout);
    return argc == 1 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("pandastack 0.2.0\n");
    return 0;
  }
  // Options that hold for every command may come before it too (`pandastack --url U sandbox
  // list`): they move behind its group and verb, where each command reads them.
  std::vector<std::string> lead;
  int first = 1;
  while (first < argc) {
    std::string s = argv[first];
    bool valued = s == "--url" || s == "--key" || s == "--timeout" || s == "--data";
    if (valued && first + 1 < argc) {
      lead.insert(lead.end(), {s, argv[first + 1]});
      first += 2;
    } else if (s == "--json") {
      lead.push_back(s);
      ++first;
    } else {
      break;
    }
  }
  static std::vector<std::string> moved;
  static std::vector<char*> moved_argv;
  if (!lead.empty() && first < argc) {
    moved = {argv[0], argv[first]};
    int verb = first + 1;
    if (pandastack::cli::is_api_command(argv[first]) && verb < argc) moved.push_back(argv[verb++]);
    moved.insert(moved.end(), lead.begin(), lead.end());
    for (int i = verb; i < argc; ++i) moved.push_back(argv[i]);
    for (auto& m : moved) moved_argv.push_back(m.data());
    moved_argv.push_back(nullptr);
    argc = int(moved.size());
    argv = moved_argv.data();
  }
  if (argc > 1 && pandastack::cli::is_api_command(argv[1]))
    return pandastack::cli::api_main(argc, argv);
  std::vector<std::string> pos;
  Args a;
  a.url = std::getenv("PANDASTACK_BASE_URL") ? std::getenv("PANDASTACK_BASE_URL")
                                             : "http://127.0.0.1:7070";
  if (const char* k = std::getenv("PANDASTACK_API_KEY")) a.key = k;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(2, s + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (s == "--data")
      a.data = value();
    else if (s == "--url")
      a.url = value();
    else if (s == "--key")
      a.key = value();
    else if (s == "--sandbox")
      a.sandbox = value();
    else if (s == "--from" || s == "--to") {
      auto v = value();
      auto t = parse_time(v);
      if (!t) die(2, s + ": not a time: " + v);
      (s == "--from" ? a.from : a.to) = t;
    } else if (s == "--after")
      a.after = std::strtoull(value().c_str(), nullptr, 10);
    else if (s == "--limit")
      a.limit = std::strtoull(value().c_str(), nullptr, 10);
    else if (s == "--json")
      a.json = true;
    else if (s == "-h" || s == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (s.rfind("--", 0) == 0)
      die(2, "unknown option " + s + "\n" + kUsage);
    else
      pos.push_back(s);
  }
  if (pos.size() == 1 && pos[0] == "mcp") return pandastack::cli::mcp_main(a.url, a.key);
  if (pos.empty() || pos[0] != "audit") die(2, std::string("unknown command\n") + kUsage);
  if (pos.size() == 2 && pos[1] == "replay") return replay(a);
  if (pos.size() != 1) die(2, std::string("unknown audit command\n") + kUsage);
  return audit(a);
}
