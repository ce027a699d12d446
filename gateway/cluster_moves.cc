// Sandboxes moving between hosts of a cluster: a fork whose children go to other hosts, a
// migration, a drain. Each ships a snapshot to the other host over Cap'n Proto
// (gateway/peer_snapshots.h) and starts sandboxes from it there; ownership records follow in
// etcd. Handlers run on the request's worker thread (a session blocks it, never the loop). The
// request reached this host because it owns the sandbox (gateway/cluster_routes.cc).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "actors/cluster.h"
#include "gateway/peer_snapshots.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

actors::Cluster& cluster_of(Call& c, const char* what) {
  auto* cluster = c.gw.rt.cluster();
  if (cluster == nullptr)
    throw ApiError{Code::cluster_disabled,
                   std::string(what) + ": this daemon runs without --cluster"};
  return *cluster;
}

// The live host `id` (503 host_unavailable when it is not up).
actors::HostInfo live_host(actors::Cluster& cluster, const std::string& id) {
  auto hosts = cluster.hosts();
  if (!hosts)
    throw ApiError{Code::cluster_unavailable, "cannot reach etcd: " + hosts.error().message};
  for (auto& h : *hosts)
    if (h.id == id) return h;
  throw ApiError{Code::host_unavailable, "host " + id + " is not up in the cluster"};
}

// A session with host `h` for the request whose API key is `key` (the host checks it before it
// takes a snapshot or starts a sandbox).
std::unique_ptr<PeerSession> session_with(Server& gw, const actors::HostInfo& h,
                                          const std::string& key) {
  return unwrap(PeerSession::open(h.id, h.peer, gw.peers->auth(), key));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A fork's children on another host get copies of the parent's read-write volumes (its
// snapshot holds them); read-only volumes are shared with the parent, so they stay on its host.
Json fork_volumes(const actors::SandboxInfo& parent) {
  Json out = Json::array();
  for (auto& v : parent.volumes) {
    if (v.read_only)
      throw ApiError{Code::not_implemented,
                     "a fork onto another host of a sandbox with a read-only volume (" + v.volume +
                         "): read-only volumes are shared with the parent and stay on its host"};
    Json j = Json::object();
    j.set("volume", v.volume);
    j.set("mount", v.mount);
    j.set("slot", int64_t(v.slot));
    out.push(j);
  }
  return out;
}

// The volumes that move with a migrated sandbox: each attached to it alone (else it stays, and
// so does the sandbox), as the API shows them plus where the sandbox has them; their files in
// `files` (each volume's, then its snapshots').
Json moving_volumes(actors::Runtime& rt, const actors::SandboxInfo& s,
                    std::vector<std::filesystem::path>& files) {
  Json out = Json::array();
  for (auto& v : s.volumes) {
    auto vi = unwrap(rt.get_volume(s.tenant, v.volume));
    for (auto& a : vi.attachments)
      if (a.sandbox != s.id)
        throw ApiError{Code::volume_in_use,
                       "volume " + v.volume + " is attached to sandbox " + a.sandbox +
                           " too: it cannot move to another host " + "(nor can " + s.id + ")"};
    for (auto& f : rt.volume_files(vi)) files.push_back(f);
    auto j = volume_json(vi);
    j.set("mount", v.mount);
    j.set("read_only", v.read_only);
    j.set("slot", int64_t(v.slot));
    out.push(j);
  }
  return out;
}

// What a snapshot's trip to another host cost (in the replies of forks and migrations).
Json transfer_json(const std::string& host, const PeerSession::Shipped& s, double ship_ms,
                   double start_ms) {
  Json j = Json::object();
  j.set("host", host);
  j.set("bytes", int64_t(s.bytes));
  j.set("files_sent", s.files);
  j.set("files_offered", s.files_offered);
  j.set("transfer_ms", ship_ms);
  j.set("mb_per_s", ship_ms > 0 ? double(s.bytes) / 1e3 / ship_ms : 0.0);
  j.set("start_ms", start_ms);
  return j;
}

}  // namespace

HttpReply fork_across_hosts(Call& c, uint32_t count, const std::vector<std::string>& hosts) {
  auto& cluster = cluster_of(c, "hosts");
  if (hosts.empty() || hosts.size() > count)
    throw ApiError{Code::invalid_argument, "hosts: a list of 1..count host ids"};
  // Children go round-robin over the hosts named (a host named twice gets twice the share).
  std::vector<std::pair<std::string, uint32_t>> share;
  for (uint32_t i = 0; i < count; ++i) {
    auto& h = hosts[i % hosts.size()];
    auto it = std::find_if(share.begin(), share.end(), [&](auto& p) { return p.first == h; });
    if (it == share.end())
      share.push_back({h, 1});
    else
      ++it->second;
  }
  const std::string self = cluster.config().host_id;
  std::vector<std::pair<actors::HostInfo, uint32_t>> remote;
  uint32_t local = 0;
  for (auto& [h, n] : share) {
    if (h == self)
      local += n;
    else
      remote.push_back({live_host(cluster, h), n});
  }
  auto& rt = c.gw.rt;
  auto parent = unwrap(rt.get(c.tenant(), c.id));
  Json volumes = remote.empty() ? Json::array() : fork_volumes(parent);
  Json children = Json::array(), transfers = Json::array();
  std::vector<std::string> made_here;
  std::vector<std::pair<std::unique_ptr<PeerSession>, std::vector<std::string>>> made_there;
  std::string snap;
  double snapshot_ms = 0;
  try {
    if (local > 0)
      for (auto& kid : unwrap(rt.fork(c.tenant(), c.id, local))) {
        made_here.push_back(kid.id);
        auto j = sandbox_json(kid);
        j.set("host", self);
        children.push(j);
      }
    if (!remote.empty()) {
      // One snapshot of the parent (recorded on it, deleted once its children run), shipped to
      // each host in turn.
      auto t0 = std::chrono::steady_clock::now();
      snap = unwrap(rt.snapshot(c.tenant(), c.id));
      snapshot_ms = ms_since(t0);
      auto offer = unwrap(rt.offer_snapshot(c.tenant(), snap));
      for (auto& [host, n] : remote) {
        auto t0 = std::chrono::steady_clock::now();
        auto session = session_with(c.gw, host, bearer_token(c.r.authorization));
        auto shipped = unwrap(session->ship(c.tenant(), offer));
        double ship_ms = ms_since(t0);
        PeerSession::Start s{shipped.snapshot,     c.tenant(), c.id,   std::vector<std::string>(n),
                             sandbox_json(parent), false,      volumes};
        auto kids = unwrap(session->start(s));
        std::vector<std::string> ids;
        for (auto& k : kids) {
          ids.push_back(k["id"].as_string());
          auto j = k;
          j.set("host", host.id);
          children.push(j);
        }
        auto transfer = transfer_json(host.id, shipped, ship_ms, ms_since(t0) - ship_ms);
        spdlog::info("cluster: fork {} -> {} children: {}", c.id, n, transfer.dump());
        transfers.push(transfer);
        made_there.push_back({std::move(session), ids});
      }
    }
  } catch (...) {
    // A fork is all or nothing.
    for (auto& id : made_here) (void)rt.kill(c.tenant(), id);
    for (auto& [session, ids] : made_there) session->discard(c.tenant(), ids);
    if (!snap.empty()) (void)rt.delete_snapshot(c.tenant(), snap);
    throw;
  }
  if (!snap.empty()) (void)rt.delete_snapshot(c.tenant(), snap);
  Json out = Json::object();
  out.set("sandboxes", children);
  if (!remote.empty()) {
    out.set("snapshot_ms", snapshot_ms);
    out.set("transfers", transfers);
  }
  return json_reply(201, out);
}

HttpReply fork_elsewhere(Call& c, uint32_t count, const actors::Rejection& full) {
  auto& cluster = cluster_of(c, "fork");
  auto parent = unwrap(c.gw.rt.get(c.tenant(), c.id));
  auto to = cluster.place(parent.template_name, "");
  if (!to || to->self || std::any_of(parent.volumes.begin(), parent.volumes.end(), [](auto& v) {
        return v.read_only;
      }))
    throw full;
  spdlog::info("cluster: fork of {}: this host is full, the children go to host {}", c.id, to->id);
  return fork_across_hosts(c, count, {to->id});
}

actors::SandboxInfo wake_from_store(Call& c) {
  cluster_of(c, "wake");
  return unwrap(c.gw.rt.wake_parked(c.tenant(), c.id));
}

HttpReply wake_elsewhere(Call& c) {
  auto& cluster = cluster_of(c, "wake");
  auto parked = unwrap(c.gw.rt.parked(c.tenant(), c.id));  // (its host down, parked for it)
  // Where placement puts it: here, or the host picked (which then wakes it itself: a request
  // forwarded by a host is not placed again).
  if (!c.r.forwarded) {
    auto to = cluster.place(parked.template_name, "");
    if (to && !to->self) {
      auto session = session_with(c.gw, *to, bearer_token(c.r.authorization));
      auto a = unwrap(session->http("POST", "/v1/sandboxes/" + c.id + "/wake",
                                    {{"Authorization", c.r.authorization}}));
      spdlog::info("cluster: wake of {} (host {} is down) placed on host {}: {}", c.id, parked.host,
                   to->id, a.status);
      return HttpReply{a.status, "application/json", a.body, std::nullopt, {}};
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto j = sandbox_json(unwrap(c.gw.rt.wake_parked(c.tenant(), c.id)));
  j.set("host", cluster.config().host_id);
  j.set("woken_from", parked.host);
  j.set("wake_ms", ms_since(t0));
  return json_reply(200, j);
}

// Moves sandbox `id` of `tenant` to host `to`: hibernated here, its hibernation shipped with its
// volumes' files, started there under the same id (its volumes under theirs), its owner record
// and its volumes' handed over in one transaction, then ended here. Returns it as the target
// shows it. `key`: the request's API key (the tenant's, or an admin's for a drain).
Json migrate_sandbox(Server& gw, const std::string& tenant, const std::string& id,
                     const actors::HostInfo& to, const std::string& key) {
  auto& rt = gw.rt;
  auto& cluster = *rt.cluster();
  auto info = unwrap(rt.get(tenant, id));
  if (info.status != actors::SandboxStatus::running &&
      info.status != actors::SandboxStatus::hibernated)
    throw ApiError{Code::conflict, "sandbox " + id + " is " + actors::to_string(info.status) +
                                       ": only a running or hibernated sandbox migrates"};
  std::vector<std::filesystem::path> carried;
  Json volumes = moving_volumes(rt, info, carried);
  std::vector<std::string> owned{id}, volume_ids;
  for (auto& v : info.volumes) volume_ids.push_back(v.volume);
  owned.insert(owned.end(), volume_ids.begin(), volume_ids.end());
  auto t0 = std::chrono::steady_clock::now();
  bool was_running = info.status == actors::SandboxStatus::running;
  if (was_running) unwrap(rt.hibernate(tenant, id));
  double hibernate_ms = ms_since(t0);
  auto back = [&] {
    if (was_running) (void)rt.wake(tenant, id);
  };
  std::unique_ptr<PeerSession> session;
  Json moved;
  try {
    auto offer = unwrap(rt.offer_hibernation(tenant, id, carried));
    session = session_with(gw, to, key);
    auto shipped = unwrap(session->ship(tenant, offer));
    double ship_ms = ms_since(t0) - hibernate_ms;
    PeerSession::Start s{shipped.snapshot, tenant, "", {id}, sandbox_json(info), true, volumes};
    auto started = unwrap(session->start(s));
    moved = started.at(0);
    moved.set("transfer",
              transfer_json(to.id, shipped, ship_ms, ms_since(t0) - hibernate_ms - ship_ms));
    moved.set("hibernate_ms", hibernate_ms);
    auto handed = cluster.hand_over(owned, to.id);
    if (!handed || !*handed) {
      session->discard(tenant, {id}, volume_ids);
      throw ApiError{handed ? Code::conflict : Code::cluster_unavailable,
                     "cannot hand " + id + " over to host " + to.id + ": " +
                         (handed ? "this host does not own it any more" : handed.error().message)};
    }
    spdlog::info(
        "cluster: migrated {} to host {}: hibernated in {:.0f} ms, sent {} bytes in {:.0f} ms, "
        "running there after {:.0f} ms",
        id, to.id, hibernate_ms, shipped.bytes, ship_ms, ms_since(t0));
  } catch (...) {
    back();
    throw;
  }
  // Ended here (recorded as migrated): its hibernation files go, its events stay in this host's
  // log.
  if (auto ended = rt.migrated_away(tenant, id, to.id); !ended)
    spdlog::warn("cluster: migrated {} but could not end it here: {}", id, ended.error().message);
  for (auto& v : volume_ids)
    if (auto left = rt.volume_left(tenant, v, to.id, id); !left)
      spdlog::warn("cluster: volume {} moved with {} but could not end it here: {}", v, id,
                   left.error().message);
  moved.set("host", to.id);
  return moved;
}

// Moves every sandbox off this host (it stops taking creates first): running and hibernated
// ones migrate with their volumes, one after another, each to the host placement picks. One
// that cannot move (a volume shared with another sandbox) is listed as failed, with why.
Json drain(Server& gw, actors::Cluster& cluster, const std::string& key) {
  if (auto d = cluster.set_draining(true); !d)
    throw ApiError{Code::cluster_unavailable, "cannot publish the drain: " + d.error().message};
  auto all = unwrap(gw.rt.list("*"));
  Json moved = Json::array(), failed = Json::array();
  auto item = [](const std::string& id, const char* k, const std::string& v) {
    Json j = Json::object();
    j.set("id", id);
    j.set(k, v);
    return j;
  };
  for (auto& s : all) {
    if (s.status != actors::SandboxStatus::running && s.status != actors::SandboxStatus::hibernated)
      continue;
    try {
      auto to = cluster.place(s.template_name, "");
      if (!to)
        throw ApiError{Code::host_unavailable, "no host to move it to: " + to.error().message};
      migrate_sandbox(gw, s.tenant, s.id, *to, key);
      moved.push(item(s.id, "host", to->id));
    } catch (const ApiError& e) {
      auto j = item(s.id, "code", to_string(e.code));
      j.set("message", e.message);
      failed.push(j);
    }
  }
  Json out = Json::object();
  out.set("host", cluster.config().host_id);
  out.set("draining", true);
  out.set("moved", moved);
  out.set("failed", failed);
  spdlog::info("cluster: host {} drained: {} moved, {} failed", cluster.config().host_id,
               moved.size(), failed.size());
  return out;
}

// The host a /v1/hosts/{host_id}/... route names must be this one (the routing sent it here
// when it is up).
actors::Cluster& this_host(Call& c) {
  admin_only(c);
  auto& cluster = cluster_of(c, "hosts");
  auto host = c.r.param("host_id");
  if (host != cluster.config().host_id)
    throw ApiError{Code::host_not_found, "no host " + host + " in the cluster"};
  return cluster;
}

std::vector<Route> cluster_move_routes() {
  using M = kj::HttpMethod;
  return {
      route(M::POST, "/v1/sandboxes/{id}/migrate",
            "Move a sandbox to another host {host} (cluster mode; tmpfs and memory kept)",
            [](Call& c) {
              auto& cluster = cluster_of(c, "migrate");
              Fields f(c.r.json(), {"host"});
              auto host = f.str("host");
              if (host.empty()) throw ApiError{Code::invalid_argument, "host: required"};
              if (host == cluster.config().host_id)
                throw ApiError{Code::conflict,
                               "sandbox " + c.id + " is on host " + host + " already"};
              return json_reply(200,
                                migrate_sandbox(c.gw, c.tenant(), c.id, live_host(cluster, host),
                                                bearer_token(c.r.authorization)));
            }),
      route(M::POST, "/v1/hosts/{host_id}/drain",
            "Migrate every sandbox off a host; it takes no creates until undrained (admin)",
            [](Call& c) {
              auto& cluster = this_host(c);
              Fields f(c.r.json(), {});
              return json_reply(200, drain(c.gw, cluster, bearer_token(c.r.authorization)));
            }),
      route(M::GET, "/v1/hosts/{host_id}/metrics",
            "A host's Prometheus metrics, through any host (admin; cluster mode)",
            [](Call& c) {
              this_host(c);
              return HttpReply{200, "text/plain; version=0.0.4", c.gw.metrics(), std::nullopt, {}};
            }),
      route(M::DELETE, "/v1/hosts/{host_id}/drain",
            "End a host's drain: it takes creates again (admin)",
            [](Call& c) {
              auto& cluster = this_host(c);
              if (auto d = cluster.set_draining(false); !d)
                throw ApiError{Code::cluster_unavailable, d.error().message};
              Json out = Json::object();
              out.set("host", cluster.config().host_id);
              out.set("draining", false);
              return json_reply(200, out);
            }),
  };
}

}  // namespace pandastack::gateway
