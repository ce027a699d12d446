// pandastack: the command-line tool. For now: the audit log.
//
//   pandastack audit [--data DIR | --url URL --key KEY] [--sandbox ID] [--from T] [--to T]
//                    [--after SEQ] [--limit N] [--json]
//   pandastack audit replay --data DIR [--url URL] [--key KEY]
//
// `audit` prints the event log, oldest first: from the store itself (`--data`, opened read-only,
// so it works while the daemon runs) or through the API (admin keys see every tenant). `replay`
// rebuilds every sandbox's state from its events alone (the pure apply() of actors/sandbox.h) and
// compares it with the live state the running daemon reports; it exits 1 on any difference.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/event_codec.h"
#include "actors/sandbox.h"
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
  auto ev = actors::decode_event(r.payload);
  if (ev) {
    if (auto j = Json::parse(actors::event_to_json(*ev))) e.event = *j;
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
  Json m = Json::object();
  for (auto& [k, v] : s.metadata) m.set(k, v);
  Json snaps = Json::array();
  for (auto& x : s.snapshots) snaps.push(x);
  return comparable(actors::to_string(s.status), s.tenant, s.template_name, m, s.expires_at_ms,
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
    if (s.status != actors::Status::none && !after.count(id) && !before.count(id))
      problems.push_back(id + ": in the log (" + actors::to_string(s.status) +
                         ") but unknown to the daemon");
  std::printf("replayed %zu sandboxes from %zu events; compared %zu with the live daemon",
              rebuilt.size(), events, compared);
  if (moving) std::printf(" (%zu changed during the replay, not compared)", moving);
  std::printf(": %zu difference(s)\n", problems.size());
  for (auto& p : problems) std::printf("  %s\n", p.c_str());
  return problems.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
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
  if (pos.empty() || pos[0] != "audit") die(2, std::string("unknown command\n") + kUsage);
  if (pos.size() == 2 && pos[1] == "replay") return replay(a);
  if (pos.size() != 1) die(2, std::string("unknown audit command\n") + kUsage);
  return audit(a);
}
