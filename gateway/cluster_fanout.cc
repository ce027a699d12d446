// Requests that span hosts (cluster mode): the lists of sandboxes, snapshots, volumes,
// databases and templates (a tenant's own live on the host that built them) are every live
// host's, merged, and so is the audit log (by time, below). The host that
// receives one asks each other live host the same (as the client, with the client's key: auth and
// tenancy are checked there), marks each item with its host, and orders them by creation time. A
// host that does not answer is named in `unreachable_hosts`: the list is partial, and says so.
// Handlers run on a worker thread.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>

#include "actors/cluster.h"
#include "gateway/peer_snapshots.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

int64_t created_at(const Json& item) {
  for (const char* k : {"created_at_ms", "created_at"})
    if (item[k].is_number()) return item[k].as_int();
  return 0;
}

// Asks host `h` `url` as the client would; the answer's JSON, or why not (into `unreachable`).
std::optional<Json> ask(Call& c, const actors::HostInfo& h, const std::string& url,
                        Json& unreachable) {
  auto fail = [&](const std::string& why) -> std::optional<Json> {
    spdlog::warn("cluster: host {} did not answer {}: {}", h.id, url, why);
    Json u = Json::object();
    u.set("host", h.id);
    u.set("message", why);
    unreachable.push(u);
    return std::nullopt;
  };
  auto session = PeerSession::open(h.id, h.peer, c.gw.peers->auth());
  if (!session) return fail(session.error().message);
  auto answer = (*session)->http("GET", url, {{"Authorization", c.r.authorization}});
  if (!answer) return fail(answer.error().message);
  auto j = Json::parse(answer->body);
  if (answer->status != 200 || !j) return fail("status " + std::to_string(answer->status));
  return j;
}

// `field`: the list's field in the answer, or "" for an answer that is the list (E2B's).
HttpReply merged(Call& c, const char* field, HttpReply local) {
  auto* cluster = c.gw.rt.cluster();
  if (cluster == nullptr || !c.gw.peers || c.r.forwarded || local.status != 200) return local;
  auto j = Json::parse(local.body);
  auto list_of = [field](const Json& answer) -> const Json& {
    return *field ? answer[field] : answer;
  };
  if (!j || !list_of(*j).is_array()) return local;
  // Shipped templates are every host's: listed once (this host's), without a host.
  auto everyones = [](const Json& item) {
    return item["kind"].is_string() && item["kind"].as_string() == "shipped";
  };
  const std::string self = cluster->config().host_id;
  std::vector<Json> items;
  for (auto item : list_of(*j).as_array()) {
    if (!everyones(item)) item.set("host", self);
    items.push_back(item);
  }
  Json unreachable = Json::array();
  auto hosts = cluster->hosts();
  if (!hosts)
    throw ApiError{Code::cluster_unavailable, "cannot reach etcd: " + hosts.error().message};
  for (auto& h : *hosts) {
    if (h.id == self) continue;
    auto theirs = ask(c, h, c.r.url, unreachable);
    if (!theirs) continue;
    if (!list_of(*theirs).is_array()) continue;
    for (auto item : list_of(*theirs).as_array()) {
      if (!item.is_object() || everyones(item)) continue;
      item.set("host", h.id);
      items.push_back(item);
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Json& a, const Json& b) {
    if (a["startedAt"].is_string() && b["startedAt"].is_string())  // (E2B's: RFC 3339, UTC)
      return a["startedAt"].as_string() < b["startedAt"].as_string();
    return created_at(a) < created_at(b);
  });
  Json list = Json::array();
  for (auto& i : items) list.push(i);
  if (!*field) return json_reply(200, list);  // (E2B's: no room to say who did not answer)
  Json out = Json::object();
  out.set(field, list);
  if (unreachable.size() > 0) out.set("unreachable_hosts", unreachable);
  return json_reply(200, out);
}

// The audit cursor of a merged log: "host:seq,host:seq" (each host's sequence is its own).
std::map<std::string, uint64_t> parse_cursor(const std::string& text) {
  std::map<std::string, uint64_t> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    auto part = text.substr(at, end - at);
    auto colon = part.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw ApiError{Code::invalid_argument, "cursor: host:seq pairs separated by commas"};
    try {
      out[part.substr(0, colon)] = std::stoull(part.substr(colon + 1));
    } catch (const std::exception&) {
      throw ApiError{Code::invalid_argument, "cursor: a sequence is a number"};
    }
    at = end + 1;
  }
  return out;
}

// The audit log of every live host, merged by time: each host's events keep their order (a
// k-way merge on the timestamps of the hosts' next events; equal times by host id), each marked
// with its host. `cursor` (the last reply's next_cursor) says where each host's part goes on.
HttpReply merged_audit(Call& c, const Handler& local) {
  auto* cluster = c.gw.rt.cluster();
  if (cluster == nullptr && c.r.q("cursor"))
    throw ApiError{Code::invalid_argument, "cursor is for a cluster's merged log; use after"};
  if (cluster == nullptr || !c.gw.peers || c.r.forwarded) return local(c);
  auto cursor = parse_cursor(c.r.q("cursor").value_or(""));
  size_t limit = size_t(query_int(c.r, "limit", 1000, 10000));
  uint64_t after_all = uint64_t(query_int(c.r, "after", 0, INT64_MAX));
  auto hosts = cluster->hosts();
  if (!hosts)
    throw ApiError{Code::cluster_unavailable, "cannot reach etcd: " + hosts.error().message};
  const std::string self = cluster->config().host_id;
  struct Part {
    std::string host;
    std::vector<Json> events;
    size_t next = 0;
    uint64_t last;
  };
  std::vector<Part> parts;
  Json unreachable = Json::array();
  for (auto& h : *hosts) {
    uint64_t after = cursor.count(h.id) ? cursor[h.id] : after_all;
    // The same query for each host, with its own place in its log.
    Request r = c.r;
    r.query = {{"after", std::to_string(after)}, {"limit", std::to_string(limit)}};
    for (auto& [k, v] : c.r.query)
      if (k == "from_ms" || k == "to_ms" || k == "all") r.query.emplace(k, v);
    std::optional<Json> got;
    if (h.id == self) {
      Call mine{c.gw, r, c.key, c.id};
      got = Json::parse(local(mine).body);
    } else {
      std::string url = "/v1/audit";
      char sep = '?';
      for (auto& [k, v] : r.query) {
        url += sep + k + "=" + v;
        sep = '&';
      }
      got = ask(c, h, url, unreachable);
    }
    Part p{h.id, {}, 0, after};
    if (got && (*got)["events"].is_array())
      for (auto e : (*got)["events"].as_array()) {
        e.set("host", h.id);
        p.events.push_back(e);
      }
    parts.push_back(std::move(p));
  }
  std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.host < b.host; });
  Json events = Json::array();
  while (events.size() < limit) {
    Part* next = nullptr;
    for (auto& p : parts)
      if (p.next < p.events.size() && (!next || p.events[p.next]["time_ms"].as_int() <
                                                    next->events[next->next]["time_ms"].as_int()))
        next = &p;
    if (!next) break;
    auto& e = next->events[next->next++];
    next->last = uint64_t(e["seq"].as_int());
    events.push(e);
  }
  std::string next_cursor;
  for (auto& p : parts)
    next_cursor += (next_cursor.empty() ? "" : ",") + p.host + ":" + std::to_string(p.last);
  Json out = Json::object();
  out.set("events", events);
  out.set("next_cursor", next_cursor);
  if (unreachable.size() > 0) out.set("unreachable_hosts", unreachable);
  return json_reply(200, out);
}

}  // namespace

void spread_lists(std::vector<Route>& routes) {
  static const std::pair<const char*, const char*> lists[] = {{"/v1/sandboxes", "sandboxes"},
                                                              {"/v1/snapshots", "snapshots"},
                                                              {"/v1/volumes", "volumes"},
                                                              {"/v1/databases", "databases"},
                                                              {"/v1/templates", "templates"}};
  for (auto& r : routes) {
    if (r.method == kj::HttpMethod::GET && r.style == Route::Style::e2b_api &&
        (r.pattern == "/sandboxes" || r.pattern == "/v2/sandboxes")) {
      r.handler = [local = r.handler](Call& c) { return merged(c, "", local(c)); };
      continue;
    }
    if (r.method != kj::HttpMethod::GET || r.style != Route::Style::native) continue;
    for (auto& [pattern, field] : lists)
      if (r.pattern == pattern) {
        r.handler = [local = r.handler, field = field](Call& c) {
          return merged(c, field, local(c));
        };
        r.summary += " (every host's, in cluster mode)";
      }
    if (r.pattern == "/v1/audit") {
      r.handler = [local = r.handler](Call& c) { return merged_audit(c, local); };
      r.query.push_back("cursor");
      r.summary += "; every host's merged by time in cluster mode (?cursor=)";
    }
  }
}

}  // namespace pandastack::gateway
