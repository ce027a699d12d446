// E2B's control plane (../shared/specs/e2b-compat.md §3) on our runtime: create, connect (wake),
// get, list, kill, timeout, pause, metrics. Authenticated by X-API-KEY with our pds_ keys (or their
// e2b_ form: e2b.h); errors are E2B's {"code": <status>, "message"} (the server reshapes them:
// Route::Style::e2b_api).
#include <kj/encoding.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>

#include "gateway/e2b.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using namespace e2b;

// The Sandbox object of create and connect (ListedSandbox without the token and domain); with a
// fresh access token when `key` (the key that asks) is given, and the preview domain `domain`
// (getHost(port): "PORT-ID.DOMAIN", a preview URL; null when previews are off).
Json sandbox_obj(const actors::SandboxInfo& s, const actors::KeyInfo* key,
                 const std::string& domain) {
  Json j = Json::object();
  j.set("sandboxID", s.id);
  j.set("templateID", actors::template_display_name(s.template_name));
  j.set("alias", actors::template_display_name(s.template_name));
  j.set("clientID", "local");
  j.set("envdVersion", kEnvdVersion);
  if (key) {
    auto t = tokens().issue(s.tenant, key->id, s.id);
    j.set("envdAccessToken", t);
    j.set("trafficAccessToken", t);
    j.set("domain", domain.empty() ? Json() : Json(domain));
  }
  return j;
}

// SandboxDetail / ListedSandbox: the object plus metadata (without the envVars we keep there),
// times, state and shape.
Json detail_obj(const actors::SandboxInfo& s, const actors::KeyInfo* key,
                const std::string& domain) {
  Json j = sandbox_obj(s, key, domain);
  Json md = Json::object();
  for (auto& [k, v] : s.metadata)
    if (k.rfind(kEnvPrefix, 0) != 0 && k != kPublicTrafficKey) md.set(k, v);
  j.set("metadata", md);
  j.set("startedAt", rfc3339(s.created_at_ms));
  j.set("endAt", rfc3339(s.expires_at_ms ? s.expires_at_ms : s.created_at_ms));
  j.set("state", s.status == actors::SandboxStatus::hibernated ? "paused" : "running");
  j.set("cpuCount", int64_t(s.vcpus));
  j.set("memoryMB", int64_t(s.memory_mib));
  j.set("diskSizeMB", 1024);
  Json life = Json::object();
  life.set("onTimeout", s.on_timeout == actors::ReapAction::hibernate ? "pause" : "kill");
  life.set("autoResume", s.auto_wake);
  j.set("lifecycle", life);
  j.set("allowInternetAccess", s.network && s.egress.mode != "deny_all");
  return j;
}

// E2B's network rules, `{host: [{transform: {headers: {name: value}}}]}`, as header rules (in the
// order given; hosts lower-cased; values may hold ${e2b.secrets.NAME}). The runtime checks the
// hosts, names, values and counts (actors/header_rules.h); here only the shape: a rule holds a
// transform and a transform headers (anything else is not served: 501).
std::vector<storage::HeaderRule> rules_of(const Json& net) {
  std::vector<storage::HeaderRule> out;
  if (!net.is_object() || net["rules"].is_null()) return out;
  auto shape = [] {
    return ApiError{Code::invalid_argument,
                    "network.rules is {host: [{transform: {headers: {name: value}}}]}"};
  };
  if (!net["rules"].is_object()) throw shape();
  for (auto& [host, list] : net["rules"].as_object()) {
    if (!list.is_array()) throw shape();
    for (auto& rule : list.as_array()) {
      if (!rule.is_object()) throw shape();
      for (auto& [k, v] : rule.as_object())
        if (k != "transform")
          throw ApiError{Code::not_implemented,
                         "network.rules: a rule's " + k + " is not served here (transform is)"};
      const Json& t = rule["transform"];
      if (t.is_null()) continue;
      if (!t.is_object()) throw shape();
      for (auto& [k, v] : t.as_object())
        if (k != "headers")
          throw ApiError{Code::not_implemented,
                         "network.rules: a transform's " + k + " is not served here (headers is)"};
      if (t["headers"].is_null()) continue;
      if (!t["headers"].is_object()) throw shape();
      for (auto& [name, value] : t["headers"].as_object()) {
        if (!value.is_string()) throw shape();
        out.push_back({ascii_lower(host), name, value.as_string()});
      }
    }
  }
  return out;
}

// A rule naming a secret the tenant does not have is the request's fault (400), never a 404:
// E2B's SDK reads any 404 of a sandbox's route as "sandbox not found".
template <typename T>
void no_rule_secret(const actors::Reply<T>& r) {
  if (!r && r.error().code == Code::secret_not_found)
    throw ApiError{Code::invalid_argument, "network.rules: " + r.error().message};
}

// The sandbox, as E2B sees it: one that ended (killed, failed) no longer exists (404).
actors::SandboxInfo live(Call& c) {
  auto s = unwrap(c.gw.rt.get(c.tenant(), c.id));
  if (s.status == actors::SandboxStatus::stopped || s.status == actors::SandboxStatus::failed)
    throw ApiError{Code::sandbox_not_found, "sandbox " + c.id + " has ended"};
  return s;
}

uint32_t timeout_of(const Json& j, uint32_t def, uint32_t max) {
  const Json& t = j["timeout"];
  if (t.is_null()) return def;
  if (!t.is_number() || t.as_double() < 1 || t.as_double() > double(max))
    throw ApiError{Code::invalid_argument, "timeout is 1.." + std::to_string(max) + " seconds"};
  return uint32_t(t.as_int());
}

// E2B's network settings as our egress policy, or nullopt when they ask for nothing. `internet`:
// allow_internet_access; `net`: an object with allowOut / denyOut (lists of CIDRs, addresses or
// domain names; E2B's ALL_TRAFFIC is 0.0.0.0/0). No internet, or all traffic denied with nothing
// allowed: deny_all. All traffic denied but some allowed: an allowlist of those. Nothing denied:
// allow_all. A denylist of some addresses is refused: our policies are allowlists. (`rules`:
// rules_of.)
std::optional<actors::Egress> egress_of(const Json& internet, const Json& net) {
  // What E2B's network settings hold that is not served here is refused, never dropped: a SOCKS5
  // egress proxy, a host mask.
  if (net.is_object()) {
    for (auto name : {"egressProxy", "maskRequestHost"})
      if (!net[name].is_null())
        throw ApiError{Code::not_implemented,
                       std::string("network.") + name + " is not served here"};
  }
  auto list = [&](const char* name) {
    std::vector<std::string> out;
    if (!net.is_object() || net[name].is_null()) return out;
    if (!net[name].is_array())
      throw ApiError{Code::invalid_argument, std::string(name) + " is a list of strings"};
    for (auto& v : net[name].as_array()) {
      if (!v.is_string())
        throw ApiError{Code::invalid_argument, std::string(name) + " is a list of strings"};
      out.push_back(v.as_string());
    }
    return out;
  };
  auto allow = list("allowOut"), deny = list("denyOut");
  bool no_internet = internet.is_bool() && !internet.as_bool();
  bool deny_all = no_internet;
  for (auto& d : deny) {
    if (d == "0.0.0.0/0")
      deny_all = true;
    else
      throw ApiError{Code::invalid_argument,
                     "denyOut takes all traffic (0.0.0.0/0) only: egress policies here are "
                     "allowlists (deny all, then allowOut)"};
  }
  if (!deny_all) {
    if (internet.is_null() && allow.empty() && deny.empty()) return std::nullopt;  // (nothing)
    return actors::Egress{"allow_all", {}, {}};
  }
  if (allow.empty() || no_internet) return actors::Egress{};
  actors::Egress e{"allowlist", {}, {}};
  for (auto& a : allow) {
    bool address = !a.empty() && a.find_first_not_of("0123456789./") == std::string::npos;
    (address ? e.cidrs : e.domains).push_back(a);
  }
  return e;
}

// E2B's SnapshotInfo: a named snapshot (the newest taken with its name) is known by
// "TENANT/name:default", as E2B's are by "team/name:tag"; any other by its id.
Json snapshot_obj(Call& c, const actors::SnapshotInfo& s) {
  Json j = Json::object(), names = Json::array();
  std::string full = c.tenant() + "/" + s.name + ":default";
  if (s.current) names.push(full);
  j.set("snapshotID", s.current ? full : s.id);
  j.set("names", names);
  return j;
}

// GET /snapshots: newest first; `name` (a name in any of its forms, or an id: no match is an
// empty page), `sandboxID`, `limit`, and nextToken (the id the page before ended with).
HttpReply list_snapshots(Call& c) {
  auto of = c.r.q("sandboxID").value_or("");
  auto name = c.r.q("name").value_or("");
  int64_t limit = query_int(c.r, "limit", 1000, 1000000);
  auto all = unwrap(c.gw.rt.snapshots(c.tenant()));
  std::reverse(all.begin(), all.end());
  std::string want;  // the id `name` stands for
  if (!name.empty()) {
    auto* named = actors::find_snapshot(all, c.tenant(), name);
    if (!named) return json_reply(200, Json::array());
    want = named->id;
  }
  auto after = c.r.q("nextToken").value_or("");
  bool skipping = !after.empty();
  if (skipping && std::none_of(all.begin(), all.end(), [&](auto& s) { return s.id == after; }))
    throw ApiError{Code::invalid_argument, "nextToken is not one this server gave"};
  Json out = Json::array();
  std::string last;
  bool more = false;
  for (auto& s : all) {
    if (skipping) {
      skipping = s.id != after;
      continue;
    }
    if ((!of.empty() && s.sandbox != of) || (!want.empty() && s.id != want)) continue;
    if (int64_t(out.size()) >= limit) {
      more = true;
      break;
    }
    out.push(snapshot_obj(c, s));
    last = s.id;
  }
  auto reply = json_reply(200, out);
  if (more) reply.headers.emplace_back("X-Next-Token", last);
  return reply;
}

HttpReply create(Call& c) {
  auto& rt = c.gw.rt;
  const auto& limits = rt.config().limits;
  Json b = c.r.json();  // E2B sends fields we do not know (secure, mcp, ...): they are ignored
  actors::CreateRequest req;
  req.tenant = c.tenant();
  std::string tpl = b["templateID"].is_string() ? b["templateID"].as_string() : "base";
  // A snapshot: its id, or its name qualified by the tenant (TENANT/name[:default]); a bare
  // name is a template's first, else a snapshot's (below).
  bool snapshot_ref = tpl.rfind("snap_", 0) == 0 || tpl.find('/') != std::string::npos;
  if (snapshot_ref)
    req.from_snapshot = tpl;
  else
    req.template_name = template_for(tpl);
  req.ttl_seconds = timeout_of(b, 300, limits.max_ttl_seconds);
  req.metadata = string_object(b["metadata"], "metadata");
  // Kept in the guest once it runs, never in the sandbox's metadata (e2b_env.cc).
  EnvVars env = env_vars(b["envVars"]);
  // E2B's ports are public unless network.allowPublicTraffic is false (then a request needs the
  // sandbox's traffic access token): the preview proxy reads this key (gateway/previews.h).
  bool public_traffic =
      !(b["network"].is_object() && b["network"]["allowPublicTraffic"].is_bool() &&
        !b["network"]["allowPublicTraffic"].as_bool());
  req.metadata[kPublicTrafficKey] = public_traffic ? "1" : "0";
  // lifecycle {onTimeout: "pause", autoResume} arrives as autoPause / autoResume.enabled.
  // keepMemory: false (E2B's filesystem-only pause): only the disk is kept.
  if (b["autoPauseMemory"].is_bool()) req.timeout_disk_only = !b["autoPauseMemory"].as_bool();
  if (b["autoPause"].is_bool() && b["autoPause"].as_bool()) {
    req.persistent = true;
    req.on_timeout = actors::ReapAction::hibernate;
  }
  if (b["autoResume"].is_object() && b["autoResume"]["enabled"].is_bool())
    req.auto_wake = b["autoResume"]["enabled"].as_bool();
  if (req.auto_wake && req.timeout_disk_only)
    throw ApiError{Code::invalid_argument,
                   "autoResume needs keepMemory: a filesystem-only pause is resumed by connect"};
  // The network policy. No internet: a deny_all policy on a networked host; a host without
  // sandbox networking satisfies it by giving the sandbox no network at all.
  if (auto e = egress_of(b["allow_internet_access"], b["network"])) {
    if (rt.config().network)
      req.egress = *e;
    else if (e->mode == "deny_all")
      req.network = false;
  }
  // Header rules go through the sandbox's egress proxy; they do not open its egress policy.
  req.header_rules = rules_of(b["network"]);
  auto created = rt.create(req);
  no_rule_secret(created);
  // Not a template (none of that name, or not a template's name: "TENANT/name:default"): a
  // snapshot's name then; the first error stands when there is no such snapshot either.
  if (!created && !snapshot_ref &&
      (created.error().code == Code::template_not_found ||
       created.error().code == Code::invalid_argument)) {
    req.template_name.clear();
    req.from_snapshot = tpl;
    auto named = rt.create(req);
    if (named || named.error().code != Code::snapshot_not_found) created = std::move(named);
  }
  if (!created && created.error().code == Code::sandbox_failed)
    throw ApiError{Code::start_failed, created.error().message};
  auto s = unwrap(std::move(created));
  if (!env.empty()) {
    try {
      keep_env(c.gw, s.tenant, s.id, env);
    } catch (const ApiError& e) {
      // Not created as asked: no sandbox whose processes would start without their envVars.
      spdlog::warn("e2b create: sandbox={} envVars not kept ({}): killed", s.id, e.message);
      (void)rt.kill(s.tenant, s.id);
      throw;
    }
  }
  return json_reply(201, sandbox_obj(s, &c.key, c.gw.preview.domain));
}

// connect: a paused sandbox is woken; a running one's TTL grows when the new one is longer.
HttpReply connect(Call& c) {
  auto& rt = c.gw.rt;
  Json b = c.r.json();
  // (cluster mode: paused on a host that is down, it is woken here from the object store)
  auto s = c.r.owner_down ? wake_from_store(c) : live(c);
  if (s.status == actors::SandboxStatus::hibernated) s = unwrap(rt.wake(c.tenant(), c.id));
  if (b.has("timeout") && !b["timeout"].is_null()) {
    uint32_t t = timeout_of(b, 300, rt.config().limits.max_ttl_seconds);
    if (s.expires_at_ms < now_ms() + int64_t(t) * 1000) s = unwrap(rt.set_ttl(c.tenant(), c.id, t));
  }
  return json_reply(200, sandbox_obj(s, &c.key, c.gw.preview.domain));
}

std::optional<actors::SandboxStatus> one_state(const std::string& v) {
  if (v == "running") return actors::SandboxStatus::running;
  if (v == "paused") return actors::SandboxStatus::hibernated;
  throw ApiError{Code::invalid_argument, "state is running and/or paused"};
}

// The list's metadata filter arrives encoded as a query string inside the value
// ("k%3Dv%26a%3Db" once the URL is decoded): each key and value is percent-decoded once more.
std::string pct_decode(const std::string& s) {
  auto d = kj::decodeWwwForm(kj::arrayPtr(s.data(), s.size()));  // '+' is a space
  return std::string(d.begin(), d.size());
}

HttpReply list(Call& c) {
  auto& rt = c.gw.rt;
  std::vector<actors::SandboxStatus> states = {actors::SandboxStatus::running,
                                               actors::SandboxStatus::hibernated};
  if (auto st = c.r.q("state"); st && !st->empty()) {
    states.clear();
    size_t p = 0;
    while (p <= st->size()) {
      auto comma = st->find(',', p);
      if (comma == std::string::npos) comma = st->size();
      states.push_back(*one_state(st->substr(p, comma - p)));
      p = comma + 1;
    }
  }
  std::map<std::string, std::string> metadata;
  if (auto md = c.r.q("metadata"); md && !md->empty()) {
    std::string s = pct_decode(*md);  // what remained encoded after the URL's own decoding
    size_t p = 0;
    while (p < s.size()) {
      auto amp = s.find('&', p);
      if (amp == std::string::npos) amp = s.size();
      auto pair = s.substr(p, amp - p);
      auto eq = pair.find('=');
      if (eq == std::string::npos) throw ApiError{Code::invalid_argument, "metadata is k=v&k2=v2"};
      metadata[pct_decode(pair.substr(0, eq))] = pct_decode(pair.substr(eq + 1));
      p = amp + 1;
    }
  }
  std::string tpl = c.r.q("template").value_or("");
  std::optional<int64_t> started_after;
  if (auto t = c.r.q("startedAfter"); t && !t->empty()) {
    started_after = parse_rfc3339(*t);
    if (!started_after) throw ApiError{Code::invalid_argument, "startedAfter is an RFC 3339 time"};
  }
  Json out = Json::array();
  std::vector<actors::SandboxInfo> all;
  for (auto st : states) {
    auto some = unwrap(rt.list(c.tenant(), st, metadata));
    all.insert(all.end(), some.begin(), some.end());
  }
  // Ordered by creation time, then id (a stable order to page through).
  bool asc = c.r.q("order").value_or("desc") == "asc";
  auto key = [](const actors::SandboxInfo& s) { return std::make_pair(s.created_at_ms, s.id); };
  std::sort(all.begin(), all.end(),
            [&](const auto& a, const auto& b) { return asc ? key(a) < key(b) : key(b) < key(a); });
  // A page goes on after its nextToken: "<created_at_ms>.<id>" of the last item of the page
  // before (the SDK sends it back; a sandbox killed meanwhile does not move the position).
  std::optional<std::pair<int64_t, std::string>> after;
  if (auto t = c.r.q("nextToken"); t && !t->empty()) {
    auto dot = t->find('.');
    int64_t ms = 0;
    auto [end, ec] =
        std::from_chars(t->data(), t->data() + (dot == std::string::npos ? 0 : dot), ms);
    if (dot == std::string::npos || dot == 0 || ec != std::errc() || end != t->data() + dot ||
        t->size() - dot - 1 > 64)
      throw ApiError{Code::invalid_argument, "nextToken is not one this server gave"};
    after = std::make_pair(ms, t->substr(dot + 1));
  }
  int64_t limit = query_int(c.r, "limit", 1000, 1000000);
  const actors::SandboxInfo* last = nullptr;  // of this page
  bool more = false;
  for (auto& s : all) {
    if (!tpl.empty() && actors::template_display_name(s.template_name) != template_for(tpl))
      continue;
    if (after && (asc ? !(*after < key(s)) : !(key(s) < *after))) continue;
    if (started_after && s.created_at_ms <= *started_after) continue;
    if (int64_t(out.size()) >= limit) {
      more = true;
      break;
    }
    out.push(detail_obj(s, nullptr, ""));
    last = &s;
  }
  auto reply = json_reply(200, out);
  if (more && last)
    reply.headers.emplace_back("X-Next-Token",
                               std::to_string(last->created_at_ms) + "." + last->id);
  return reply;
}

Route api(M m, const char* path, const char* what, Handler h, std::vector<std::string> q = {}) {
  return e2b::api_route(m, path, what, std::move(h), std::move(q));
}

}  // namespace

Route e2b::api_route(M m, const char* path, const char* what, Handler h,
                     std::vector<std::string> q) {
  Route r = route(m, path, what, std::move(h), std::move(q));
  r.style = Route::Style::e2b_api;
  return r;
}

std::vector<Route> e2b_api_routes() {
  std::vector<Route> out = {
      api(M::POST, "/v2/sandboxes", "E2B: create a sandbox (X-API-KEY)", create),
      api(M::POST, "/sandboxes", "E2B: create a sandbox (SDK 2.7-2.50)", create),
      api(M::GET, "/v2/sandboxes", "E2B: list sandboxes", list,
          {"state", "metadata", "template", "order", "limit", "nextToken", "startedAfter"}),
      api(M::GET, "/sandboxes", "E2B: list running sandboxes", list, {"metadata", "state"}),
      api(M::GET, "/sandboxes/{id}", "E2B: one sandbox",
          [](Call& c) {
            return json_reply(200, detail_obj(live(c), &c.key, c.gw.preview.domain));
          }),
      api(M::DELETE, "/sandboxes/{id}", "E2B: kill a sandbox",
          [](Call& c) {
            live(c);
            unwrap(c.gw.rt.kill(c.tenant(), c.id));
            return no_content();
          }),
      api(M::POST, "/sandboxes/{id}/timeout", "E2B: a new timeout, counted from now",
          [](Call& c) {
            auto t = timeout_of(c.r.json(), 0, c.gw.rt.config().limits.max_ttl_seconds);
            if (t == 0) throw ApiError{Code::invalid_argument, "timeout is required"};
            live(c);
            unwrap(c.gw.rt.set_ttl(c.tenant(), c.id, t));
            return no_content();
          }),
      api(M::PUT, "/sandboxes/{id}/network", "E2B: a new network policy (updateNetwork)",
          [](Call& c) {
            Json b = c.r.json();
            auto s = live(c);
            auto e = egress_of(b["allow_internet_access"], b);
            // The rules are replaced (cleared when omitted, as E2B does).
            auto ruled = c.gw.rt.set_header_rules(c.tenant(), c.id, rules_of(b));
            no_rule_secret(ruled);
            unwrap(std::move(ruled));
            if (!e) return no_content();
            // A sandbox without a network has no internet: denying it is already so.
            if (!s.network && e->mode == "deny_all") return no_content();
            unwrap(c.gw.rt.set_egress(c.tenant(), c.id, *e));
            return no_content();
          }),
      api(M::POST, "/sandboxes/{id}/pause", "E2B: pause (hibernate) a sandbox",
          [](Call& c) {
            Json b = c.r.json();
            bool memory = !b["memory"].is_bool() || b["memory"].as_bool();  // keepMemory
            auto s = live(c);
            if (s.status == actors::SandboxStatus::hibernated)
              throw ApiError{Code::invalid_state, "sandbox " + c.id + " is already paused"};
            unwrap(c.gw.rt.hibernate(c.tenant(), c.id, memory));
            return no_content();
          }),
      api(M::POST, "/v2/sandboxes/{id}/connect", "E2B: connect (resumes a paused sandbox)",
          connect),
      api(M::POST, "/sandboxes/{id}/connect", "E2B: connect (SDK 2.7-2.50)", connect),
      api(M::POST, "/sandboxes/{id}/resume", "E2B: resume a paused sandbox", connect),
      api(M::POST, "/sandboxes/{id}/snapshots", "E2B: snapshot a sandbox (creates from its id)",
          [](Call& c) {
            Json b = c.r.json();
            live(c);
            std::string name = b["name"].is_string() ? b["name"].as_string() : "";
            auto snap = unwrap(c.gw.rt.snapshot(c.tenant(), c.id, name));
            actors::SnapshotInfo s;
            s.id = snap;
            s.name = name;
            s.current = !name.empty();
            return json_reply(200, snapshot_obj(c, s));
          }),
      api(M::GET, "/snapshots", "E2B: this tenant's snapshots (newest first)", list_snapshots,
          {"sandboxID", "name", "limit", "nextToken"}),
      api(M::DELETE, "/templates/{snapshot}",
          "E2B: delete a snapshot (by name: every snapshot taken with it, as E2B deletes a "
          "template with its builds)",
          [](Call& c) {
            const std::string& ref = c.r.param("snapshot");
            auto all = unwrap(c.gw.rt.snapshots(c.tenant()));
            auto* found = actors::find_snapshot(all, c.tenant(), ref);
            if (!found && ref.find('/') == std::string::npos && ref.rfind("snap_", 0) != 0) {
              // Not a snapshot: one of the tenant's templates (Template.build's), by name.
              unwrap(c.gw.rt.delete_template(c.tenant(), ref));
              return no_content();
            }
            if (!found) throw ApiError{Code::snapshot_not_found, "no snapshot '" + ref + "'"};
            const std::string target = found->id;
            std::string name;  // given by name: every snapshot taken with it goes
            if (found->current && found->id != ref) name = found->name;
            for (auto& s : all)
              if (name.empty() ? s.id == target : s.name == name)
                unwrap(c.gw.rt.delete_snapshot(c.tenant(), s.id));
            return no_content();
          }),
      api(M::POST, "/sandboxes/{id}/fork", "E2B: copies of a running sandbox",
          [](Call& c) {
            Json b = c.r.json();
            live(c);
            int64_t count = b["count"].is_number() ? b["count"].as_int() : 1;
            int64_t most = c.gw.rt.config().limits.max_fork_children;
            if (count < 1 || count > most)
              throw ApiError{Code::invalid_argument, "count is 1.." + std::to_string(most)};
            auto kids = unwrap(c.gw.rt.fork(c.tenant(), c.id, uint32_t(count)));
            uint32_t t = timeout_of(b, 0, c.gw.rt.config().limits.max_ttl_seconds);
            Json out = Json::array();
            for (auto& k : kids) {
              if (t) k = unwrap(c.gw.rt.set_ttl(c.tenant(), k.id, t));
              Json item = Json::object();
              item.set("sandbox", sandbox_obj(k, &c.key, c.gw.preview.domain));
              out.push(item);
            }
            return json_reply(200, out);
          }),
      api(M::GET, "/sandboxes/{id}/metrics", "E2B: the sandbox's CPU, memory and disk over time",
          [](Call& c) {
            live(c);
            int64_t start = query_int(c.r, "start", 0, INT64_MAX / 1000) * 1000;
            int64_t end =
                c.r.q("end") ? query_int(c.r, "end", 0, INT64_MAX / 1000) * 1000 + 999 : INT64_MAX;
            Json out = Json::array();
            for (auto& m : unwrap(c.gw.rt.metrics(c.tenant(), c.id, start, end))) {
              Json j = Json::object();
              j.set("timestamp", rfc3339(m.at_ms));
              j.set("timestampUnix", m.at_ms / 1000);
              j.set("cpuUsedPct", m.cpu_used_pct);
              j.set("cpuCount", int64_t(m.cpu_count));
              j.set("memUsed", m.mem_used_bytes);
              j.set("memTotal", m.mem_total_bytes);
              j.set("diskUsed", m.disk_used_bytes);
              j.set("diskTotal", m.disk_total_bytes);
              out.push(j);
            }
            return json_reply(200, out);
          },
          {"start", "end"}),
  };
  return out;
}

}  // namespace pandastack::gateway
