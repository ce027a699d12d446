// Requests that span hosts (cluster mode): the lists of sandboxes, snapshots, volumes and
// databases are every live host's, merged. The host that receives one asks each other live host
// the same (as the client, with the client's key: auth and tenancy are checked there), marks each
// item with its host, and orders them by creation time. A host that does not answer is named in
// `unreachable_hosts`: the list is partial, and says so. Handlers run on a worker thread.
#include <spdlog/spdlog.h>

#include <algorithm>

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

HttpReply merged(Call& c, const char* field, HttpReply local) {
  auto* cluster = c.gw.rt.cluster();
  if (cluster == nullptr || !c.gw.peers || c.r.forwarded || local.status != 200) return local;
  auto j = Json::parse(local.body);
  if (!j || !(*j)[field].is_array()) return local;
  const std::string self = cluster->config().host_id;
  std::vector<Json> items;
  for (auto item : (*j)[field].as_array()) {
    item.set("host", self);
    items.push_back(item);
  }
  Json unreachable = Json::array();
  auto hosts = cluster->hosts();
  if (!hosts) throw ApiError{"cluster_unavailable", "cannot reach etcd: " + hosts.error().message};
  for (auto& h : *hosts) {
    if (h.id == self) continue;
    auto fail = [&](const std::string& why) {
      spdlog::warn("cluster: host {} did not answer {}: {}", h.id, c.r.url, why);
      Json u = Json::object();
      u.set("host", h.id);
      u.set("message", why);
      unreachable.push(u);
    };
    auto session = PeerSession::open(h.id, h.peer, c.gw.peers->secret(), self);
    if (!session) {
      fail(session.error().message);
      continue;
    }
    auto answer = (*session)->http("GET", c.r.url, {{"Authorization", c.r.authorization}});
    if (!answer) {
      fail(answer.error().message);
      continue;
    }
    auto theirs = Json::parse(answer->body);
    if (answer->status != 200 || !theirs || !(*theirs)[field].is_array()) {
      fail("status " + std::to_string(answer->status));
      continue;
    }
    for (auto item : (*theirs)[field].as_array()) {
      if (!item.is_object()) continue;
      item.set("host", h.id);
      items.push_back(item);
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Json& a, const Json& b) {
    return created_at(a) < created_at(b);
  });
  Json list = Json::array();
  for (auto& i : items) list.push(i);
  Json out = Json::object();
  out.set(field, list);
  if (unreachable.size() > 0) out.set("unreachable_hosts", unreachable);
  return json_reply(200, out);
}

}  // namespace

void spread_lists(std::vector<Route>& routes) {
  static const std::pair<const char*, const char*> lists[] = {{"/v1/sandboxes", "sandboxes"},
                                                              {"/v1/snapshots", "snapshots"},
                                                              {"/v1/volumes", "volumes"},
                                                              {"/v1/databases", "databases"}};
  for (auto& r : routes) {
    if (r.method != kj::HttpMethod::GET || r.style != Route::Style::native) continue;
    for (auto& [pattern, field] : lists)
      if (r.pattern == pattern) {
        r.handler = [local = r.handler, field = field](Call& c) {
          return merged(c, field, local(c));
        };
        r.summary += " (every host's, in cluster mode)";
      }
  }
}

}  // namespace pandastack::gateway
