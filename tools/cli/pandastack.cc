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
      create_database, preview_url, kill_sandbox. Calls the API at --url with --key (same defaults as above).
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

// ---------------------------------------------------------------------------------------------
// MCP server (stdio): the tools an agent needs, over the REST API.

struct Tool {
  const char* name;
  const char* description;
  const char* schema;  // JSON Schema of the arguments
};

const Tool
    kTools
        [] =
            {
                {"create_sandbox",
                 "Create a new isolated Linux sandbox (a microVM with its own kernel). Returns its "
                 "id, which "
                 "the other tools take as sandbox_id. Sandboxes expire after ttl_seconds (default "
                 "900). With "
                 "idle_timeout_seconds it is hibernated (on_timeout hibernate) or killed after "
                 "that long "
                 "unused; with auto_wake a hibernated sandbox wakes on its next command. volumes "
                 "mounts "
                 "existing volumes (their data outlives the sandbox).",
                 R"J({"type":"object","properties":{"template":{"type":"string","description":"base, agent or code-interpreter (default base)"},"ttl_seconds":{"type":"integer","minimum":1},"idle_timeout_seconds":{"type":"integer","minimum":1},"on_timeout":{"type":"string","enum":["kill","hibernate"]},"auto_wake":{"type":"boolean"},"metadata":{"type":"object","additionalProperties":{"type":"string"}},"volumes":{"type":"array","maxItems":4,"description":"volumes (vol_... ids) to mount before it starts; data on them outlives the sandbox","items":{"type":"object","properties":{"volume":{"type":"string"},"mount":{"type":"string","description":"absolute guest path, e.g. /data"},"read_only":{"type":"boolean"}},"required":["volume","mount"],"additionalProperties":false}}},"additionalProperties":false})J"},
                {"run_command",
                 "Run a shell command in a sandbox and wait for it. Returns exit_code=N and the "
                 "command's "
                 "stdout and stderr (each truncated to 16 KB).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"command":{"type":"string","description":"run with /bin/sh -c"},"timeout_seconds":{"type":"integer","minimum":1,"maximum":3600},"cwd":{"type":"string"}},"required":["sandbox_id","command"],"additionalProperties":false})J"},
                {"run_code",
                 "Run Python in a sandbox's persistent interpreter: variables, imports and the "
                 "working "
                 "folder stay between calls of the same context. Returns the output, the value of "
                 "the last "
                 "expression (result), and an exception's traceback (error). Charts (matplotlib) "
                 "are "
                 "reported as images with their size.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"code":{"type":"string"},"context":{"type":"string","description":"a context id (default: the sandbox's default context)"},"timeout_seconds":{"type":"integer","minimum":1,"maximum":3600}},"required":["sandbox_id","code"],"additionalProperties":false})J"},
                {"read_file",
                 "Read a text file from a sandbox (absolute path; at most 64 KB are shown; a "
                 "binary file is reported as binary with its first 12 KB in base64).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"}},"required":["sandbox_id","path"],"additionalProperties":false})J"},
                {"write_file",
                 "Write a text file in a sandbox (absolute path; parent folders are created; "
                 "replaces the "
                 "file).",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"},"content":{"type":"string"}},"required":["sandbox_id","path","content"],"additionalProperties":false})J"},
                {"list_dir",
                 "List a folder in a sandbox: one line per entry (type, size, name).", R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"path":{"type":"string"}},"required":["sandbox_id","path"],"additionalProperties":false})J"},
                {"fork_sandbox",
                 "Copy a running sandbox (memory, processes and files) into count new sandboxes, "
                 "e.g. to try "
                 "several approaches from the same state. Without count: one copy, returned like "
                 "create_sandbox (sandbox_id=...); with count: one sandbox_id=... line per copy.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"count":{"type":"integer","minimum":1,"maximum":16}},"required":["sandbox_id"],"additionalProperties":false})J"},
                {"create_database",
                 "Create a managed PostgreSQL database (ready in seconds). Returns database_id=... "
                 "and "
                 "connection_uri=postgresql://user:password@host:port/name: the password is shown "
                 "only "
                 "this once.",
                 R"J({"type":"object","properties":{"name":{"type":"string","description":"1-63 of a-z, 0-9 and _, starting with a letter, not pg_* or postgres, template0, template1, public: the database's and its user's name"},"metadata":{"type":"object","additionalProperties":{"type":"string"}}},"required":["name"],"additionalProperties":false})J"},
                {"preview_url",
                 "Serve a web server running in the sandbox (listening on `port`) at a URL a "
                 "person can open in a browser: returns url=... (it carries a token; it expires "
                 "after ttl_seconds, default 3600). Asking again for the port makes a new URL "
                 "and revokes the old one.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"},"port":{"type":"integer","minimum":1,"maximum":65535},"ttl_seconds":{"type":"integer","minimum":1}},"required":["sandbox_id","port"],"additionalProperties":false})J"},
                {"kill_sandbox", "Stop a sandbox and release it.",
                 R"J({"type":"object","properties":{"sandbox_id":{"type":"string"}},"required":["sandbox_id"],"additionalProperties":false})J"},
};

// At most `max` bytes of text, never cut inside a UTF-8 sequence.
std::string clip(const std::string& s, size_t max = 16 << 10) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "\n[... " + std::to_string(s.size() - cut) + " more bytes]";
}

std::string b64decode(const std::string& in) {
  static const std::string chars =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -8;
  for (char c : in) {
    auto p = chars.find(c);
    if (p == std::string::npos) continue;
    val = (val << 6) + int(p);
    bits += 6;
    if (bits >= 0) {
      out += char((val >> bits) & 0xFF);
      bits -= 8;
    }
  }
  return out;
}

// Content for a model: text as it is (clipped), binary said to be binary, with its first bytes
// as base64 (a JSON-RPC line must be valid UTF-8, and a model gains nothing from raw bytes).
std::string for_model(const std::string& data, size_t max = 16 << 10) {
  bool text = data.find('\0') == std::string::npos && pandastack::wire::is_valid_utf8(data);
  if (text) return clip(data, max);
  std::string head = data.substr(0, std::min<size_t>(data.size(), 12 << 10));
  return "[binary: " + std::to_string(data.size()) + " bytes; the first " +
         std::to_string(head.size()) + " as base64 follow]\n" + pandastack::tools::base64(head);
}

// Runs one tool; returns (text, is_error).
std::pair<std::string, bool> call_tool(pandastack::tools::HttpClient& http, const std::string& name,
                                       const Json& args) {
  auto str = [&](const char* k) {
    return args[k].is_string() ? args[k].as_string() : std::string();
  };
  auto api_error = [](const pandastack::tools::HttpResponse& r) {
    if (r.status == 0) return "connection_error: " + r.error;
    auto j = Json::parse(r.body);
    if (j && (*j)["error"].is_object())
      return (*j)["error"]["code"].as_string() + ": " + (*j)["error"]["message"].as_string();
    return "HTTP " + std::to_string(r.status);
  };
  if (name == "create_database") {
    Json body = Json::object();
    body.set("name", str("name"));
    if (args["metadata"].is_object()) body.set("metadata", args["metadata"]);
    auto r = http.request("POST", "/v1/databases", body.dump());
    if (r.status != 201) return {api_error(r), true};
    auto j = Json::parse(r.body);
    return {"database_id=" + (*j)["id"].as_string() +
                " connection_uri=" + (*j)["connection_uri"].as_string(),
            false};
  }
  std::string id = str("sandbox_id");
  if (name != "create_sandbox" && id.empty())
    return {"invalid_argument: sandbox_id is required", true};
  std::string base = "/v1/sandboxes/" + pandastack::tools::url_encode(id);
  if (name == "create_sandbox") {
    Json body = Json::object();
    body.set("template", str("template").empty() ? "base" : str("template"));
    if (args["ttl_seconds"].is_integer()) body.set("ttl_seconds", args["ttl_seconds"].as_int());
    if (args["metadata"].is_object()) body.set("metadata", args["metadata"]);
    if (args["idle_timeout_seconds"].is_integer())
      body.set("idle_timeout_seconds", args["idle_timeout_seconds"].as_int());
    if (!str("on_timeout").empty()) body.set("on_timeout", str("on_timeout"));
    if (args["auto_wake"].is_bool()) body.set("auto_wake", args["auto_wake"].as_bool());
    if (args["volumes"].is_array()) body.set("volumes", args["volumes"]);
    auto r = http.request("POST", "/v1/sandboxes", body.dump());
    if (r.status != 201) return {api_error(r), true};
    auto j = Json::parse(r.body);
    return {"sandbox_id=" + (*j)["id"].as_string() + " state=" + (*j)["state"].as_string(), false};
  }
  if (name == "run_command") {
    if (str("command").empty()) return {"invalid_argument: command is required", true};
    Json body = Json::object();
    body.set("cmd", str("command"));
    if (args["timeout_seconds"].is_integer())
      body.set("timeout_seconds", args["timeout_seconds"].as_int());
    if (!str("cwd").empty()) body.set("cwd", str("cwd"));
    auto r = http.request("POST", base + "/exec", body.dump());
    if (r.status != 200) return {api_error(r), true};
    auto j = *Json::parse(r.body);
    std::string text = "exit_code=" + std::to_string(j["exit_code"].as_int());
    if (j["timed_out"].as_bool()) text += " (timed out)";
    // The API sends non-text output as base64 ("*_encoding"): decoded here, then shown as text
    // or labelled binary.
    auto output = [&](const char* name) {
      std::string data = j[name].as_string();
      if (j[std::string(name) + "_encoding"].as_string() == "base64") data = b64decode(data);
      return for_model(data);
    };
    text += "\n--- stdout ---\n" + output("stdout");
    text += "\n--- stderr ---\n" + output("stderr");
    return {text, false};
  }
  if (name == "run_code") {
    if (str("code").empty()) return {"invalid_argument: code is required", true};
    Json body = Json::object();
    body.set("code", str("code"));
    if (!str("context").empty()) body.set("context", str("context"));
    if (args["timeout_seconds"].is_integer())
      body.set("timeout_seconds", args["timeout_seconds"].as_int());
    auto r = http.request("POST", base + "/code", body.dump());
    if (r.status != 200) return {api_error(r), true};
    auto j = *Json::parse(r.body);
    std::string text = "execution_count=" + std::to_string(j["execution_count"].as_int());
    if (j["timed_out"].as_bool()) text += " (timed out: interrupted, the context lives on)";
    for (const char* stream : {"stdout", "stderr"})
      if (!j[stream].as_string().empty())
        text += std::string("\n--- ") + stream + " ---\n" + for_model(j[stream].as_string());
    for (auto& res : j["results"].as_array()) {
      text += res["is_main_result"].as_bool() ? "\n--- result ---\n" : "\n--- display ---\n";
      if (res["png"].is_string())
        text +=
            "[image/png, " + std::to_string(res["png"].as_string().size() * 3 / 4) + " bytes]\n";
      if (res["text"].is_string()) text += for_model(res["text"].as_string());
    }
    if (j["error"].is_object())
      text += "\n--- error ---\n" + j["error"]["name"].as_string() + ": " +
              j["error"]["value"].as_string() + "\n" +
              for_model(j["error"]["traceback"].as_string());
    return {text, false};
  }
  if (name == "read_file") {
    auto r =
        http.request("GET", base + "/files?path=" + pandastack::tools::url_encode(str("path")));
    if (r.status != 200) return {api_error(r), true};
    return {for_model(r.body, 64 << 10), false};
  }
  if (name == "write_file") {
    auto r = http.request("PUT", base + "/files?path=" + pandastack::tools::url_encode(str("path")),
                          str("content"), "application/octet-stream");
    if (r.status != 200) return {api_error(r), true};
    return {"wrote " + std::to_string(str("content").size()) + " bytes to " + str("path"), false};
  }
  if (name == "list_dir") {
    auto r = http.request("GET",
                          base + "/files/list?path=" + pandastack::tools::url_encode(str("path")));
    if (r.status != 200) return {api_error(r), true};
    std::string text;
    Json listing = *Json::parse(r.body);  // (not a temporary: the loop would dangle)
    for (auto& e : listing["entries"].as_array())
      text += e["type"].as_string() + "	" + std::to_string(e["size"].as_int()) + "	" +
              e["name"].as_string() + "\n";
    return {text.empty() ? "(empty)" : text, false};
  }
  if (name == "fork_sandbox") {
    Json body = Json::object();
    body.set("count", args["count"].is_integer() ? args["count"].as_int() : 1);
    auto r = http.request("POST", base + "/fork", body.dump());
    if (r.status != 201) return {api_error(r), true};
    std::string text;
    Json kids = *Json::parse(r.body);
    for (auto& k : kids["sandboxes"].as_array())
      text += std::string(text.empty() ? "" : "\n") + "sandbox_id=" + k["id"].as_string() +
              " state=" + k["state"].as_string();
    return {text, false};
  }
  if (name == "preview_url") {
    Json body = Json::object();
    body.set("port", args["port"].is_integer() ? args["port"].as_int() : 0);
    if (args["ttl_seconds"].is_integer()) body.set("ttl_seconds", args["ttl_seconds"].as_int());
    auto r = http.request("POST", base + "/previews", body.dump());
    if (r.status != 201) return {api_error(r), true};
    Json p = *Json::parse(r.body);
    return {"url=" + p["url"].as_string() + "\npath_url=" + p["path_url"].as_string() +
                "\nexpires_at_ms=" + std::to_string(p["expires_at_ms"].as_int()),
            false};
  }
  if (name == "kill_sandbox") {
    auto r = http.request("DELETE", base);
    if (r.status != 200) return {api_error(r), true};
    return {"killed " + id, false};
  }
  return {"unknown tool " + name, true};
}

int mcp(const Args& a) {
  pandastack::tools::HttpClient http(a.url, a.key);
  std::string line;
  auto reply = [](const Json& id, const char* field, Json value) {
    Json j = Json::object();
    j.set("jsonrpc", "2.0");
    j.set("id", id);
    j.set(field, std::move(value));
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  auto error = [&](const Json& id, int code, const std::string& message) {
    Json e = Json::object();
    e.set("code", code);
    e.set("message", message);
    reply(id, "error", e);
  };
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    auto msg = Json::parse(line);
    if (!msg || !msg->is_object()) {
      error(Json(), -32700, "parse error");
      continue;
    }
    const Json& m = *msg;
    std::string method = m["method"].is_string() ? m["method"].as_string() : "";
    if (!m.has("id")) continue;  // notifications (initialized, cancelled) need no answer
    const Json& id = m["id"];
    if (method == "initialize") {
      Json caps = Json::object();
      caps.set("tools", Json::object());
      Json server = Json::object();
      server.set("name", "pandastack");
      server.set("version", "0.1.0");
      Json r = Json::object();
      std::string version = m["params"]["protocolVersion"].is_string()
                                ? m["params"]["protocolVersion"].as_string()
                                : "2024-11-05";
      r.set("protocolVersion", version);
      r.set("capabilities", caps);
      r.set("serverInfo", server);
      r.set("instructions",
            "Sandboxes are isolated Linux microVMs: create one, run commands and edit files in "
            "it, fork it to explore alternatives, kill it when done.");
      reply(id, "result", r);
    } else if (method == "ping") {
      reply(id, "result", Json::object());
    } else if (method == "tools/list") {
      Json tools = Json::array();
      for (auto& t : kTools) {
        Json j = Json::object();
        j.set("name", t.name);
        j.set("description", t.description);
        j.set("inputSchema", *Json::parse(t.schema));
        tools.push(j);
      }
      Json r = Json::object();
      r.set("tools", tools);
      reply(id, "result", r);
    } else if (method == "tools/call") {
      std::string name = m["params"]["name"].is_string() ? m["params"]["name"].as_string() : "";
      bool known = false;
      for (auto& t : kTools) known |= name == t.name;
      if (!known) {
        error(id, -32602, "unknown tool '" + name + "'");
        continue;
      }
      auto [text, is_error] = call_tool(http, name, m["params"]["arguments"]);
      Json content = Json::object();
      content.set("type", "text");
      content.set("text", text);
      Json list = Json::array();
      list.push(content);
      Json r = Json::object();
      r.set("content", list);
      r.set("isError", is_error);
      reply(id, "result", r);
    } else {
      error(id, -32601, "method not found: " + method);
    }
  }
  return 0;
}

}  // namespace

namespace pandastack::cli {
bool is_api_command(const std::string& word);
int api_main(int argc, char** argv);
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
  if (pos.size() == 1 && pos[0] == "mcp") return mcp(a);
  if (pos.empty() || pos[0] != "audit") die(2, std::string("unknown command\n") + kUsage);
  if (pos.size() == 2 && pos[1] == "replay") return replay(a);
  if (pos.size() != 1) die(2, std::string("unknown audit command\n") + kUsage);
  return audit(a);
}
