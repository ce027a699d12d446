// Cluster mode in the gateway: which host serves a request (the owner of the id it names, or the
// host placement picks for a create), forwarding to it over Cap'n Proto (gateway/peers.h), and
// GET /v1/hosts. A client never needs to know hosts exist: any host answers any request.
// GCC 12's false -Wmaybe-uninitialized in kj's ExceptionOr<T> fulfilled across threads (see
// rpc.cc), silenced for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <spdlog/spdlog.h>

#include <cstring>

#include "actors/cluster.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

// Why a request is served where it is.
struct Target {
  enum class Kind {
    here,
    peer,
    down,
    unauthorized,
    unavailable,
    undecided,
    busy
  } kind = Kind::here;
  std::string host, peer, message;
};

// The id a route is routed by: a volume's snapshot goes with the volume.
const char* routing_param(const std::string& pattern) {
  if (pattern.rfind("/v1/sandboxes/{id}", 0) == 0) return "id";
  if (pattern.rfind("/v1/snapshots/{snapshot_id}", 0) == 0) return "snapshot_id";
  if (pattern.rfind("/v1/volumes/{volume_id}", 0) == 0) return "volume_id";
  if (pattern.rfind("/v1/databases/{database_id}", 0) == 0) return "database_id";
  if (pattern.rfind("/v1/hosts/{host_id}", 0) == 0) return "host_id";  // (the host itself)
  return nullptr;
}

}  // namespace

bool wakes_from_store(const Route& route) {
  if (route.method != kj::HttpMethod::POST) return false;
  for (auto* p : {"/v1/sandboxes/{id}/wake", "/sandboxes/{id}/connect",
                  "/v2/sandboxes/{id}/connect", "/sandboxes/{id}/resume"})
    if (route.pattern == p) return true;
  return false;
}

namespace {

// A route naming a host goes to that host (its id prefixed "host:" in the routing id).
constexpr const char* kHostPrefix = "host:";

Target host_target(actors::Cluster& cluster, const std::string& host) {
  if (host == cluster.config().host_id) return {};
  auto live = cluster.hosts();
  if (!live) return {Target::Kind::unavailable, "", "", live.error().message};
  for (auto& h : *live)
    if (h.id == host) return {Target::Kind::peer, h.id, h.peer, ""};
  auto members = cluster.members();
  if (members && members->count(host)) return {Target::Kind::down, host, "", ""};
  return {};  // (no such host: the handler says so)
}

// `forwarded`: a request another host sent here; a cached "not this host" is asked again.
Target target_of(actors::Cluster& cluster, const std::string& id, bool forwarded) {
  auto o = cluster.owner(id);
  if (forwarded && (o.kind == actors::Owner::Kind::peer || o.kind == actors::Owner::Kind::down))
    o = cluster.owner(id, /*fresh=*/true);
  switch (o.kind) {
    case actors::Owner::Kind::self:
    case actors::Owner::Kind::unknown:  // (not recorded: a local id, or none: 404 here)
      return {};
    case actors::Owner::Kind::peer:
      return {Target::Kind::peer, o.host, o.peer, ""};
    case actors::Owner::Kind::down:
      return {Target::Kind::down, o.host, "", ""};
    case actors::Owner::Kind::error:
      break;
  }
  return {Target::Kind::unavailable, "", "", o.message};
}

// Where a create goes: the pinned host (placement.host), else the owner of what it is made from
// (a snapshot, a volume: they are on their host; a snapshot whose host is down but that is
// parked in the object store for `tenant`: placed as a create of its template), else the host
// placement scores best (for `tenant`'s own template of that name: the host that has it).
Target place(actors::Runtime& rt, actors::Cluster& cluster, const std::string& text,
             const std::string& tenant) {
  auto j = Json::parse(text);
  std::string pinned, tmpl = "base", place_as;
  if (j && j->is_object()) {
    if ((*j)["placement"]["host"].is_string()) pinned = (*j)["placement"]["host"].as_string();
    if ((*j)["template"].is_string()) tmpl = (*j)["template"].as_string();
    if ((*j)["templateID"].is_string()) tmpl = (*j)["templateID"].as_string();  // (E2B's create)
    std::string from;
    if ((*j)["from_snapshot"].is_string()) from = (*j)["from_snapshot"].as_string();
    if (from.empty() && (*j)["volumes"].is_array() && (*j)["volumes"].size() > 0 &&
        (*j)["volumes"].as_array()[0]["volume"].is_string())
      from = (*j)["volumes"].as_array()[0]["volume"].as_string();
    if (!from.empty() && pinned.empty()) {
      auto t = target_of(cluster, from, false);
      if (t.kind != Target::Kind::down) return t;
      // Its host is down: a snapshot it parked in the object store for this tenant is created
      // from on the host placement picks for its template (Runtime::create_from_parked).
      if (from.rfind("snap_", 0) != 0) return t;
      auto parked = rt.parked(tenant, from);
      if (!parked) return t;
      place_as = parked->template_name;  // (the template's id, as placement names it)
    }
  }
  auto h =
      cluster.place(place_as.empty() ? actors::placement_name(tenant, tmpl) : place_as, pinned);
  if (!h) {
    if (!pinned.empty()) return {Target::Kind::down, pinned, "", h.error().message};
    return {Target::Kind::unavailable, "", "", h.error().message};
  }
  if (h->self) return {};
  return {Target::Kind::peer, h->id, h->peer, ""};
}

}  // namespace

bool Server::cluster_target(const Route& route, const Request& req, std::string& id, bool& create) {
  // E2B's control plane names sandboxes in its paths; its sandbox plane in E2b-Sandbox-Id.
  if (route.style == Route::Style::e2b_api) {
    if (route.method == kj::HttpMethod::POST &&
        (route.pattern == "/sandboxes" || route.pattern == "/v2/sandboxes")) {
      create = true;
      return true;
    }
    if (route.pattern.rfind("/sandboxes/{id}", 0) != 0 &&
        route.pattern.rfind("/v2/sandboxes/{id}", 0) != 0)
      return false;
    id = req.param("id");
    return !id.empty();
  }
  if (route.style == Route::Style::e2b_envd) {
    auto it = req.headers.find("e2b-sandbox-id");
    if (it == req.headers.end()) return false;
    id = it->second;
    return !id.empty();
  }
  if (route.method == kj::HttpMethod::POST && route.pattern == "/v1/sandboxes") {
    create = true;
    return true;
  }
  const char* param = routing_param(route.pattern);
  if (param == nullptr) return false;
  id = req.param(param);
  if (!id.empty() && std::string(param) == "host_id") id = kHostPrefix + id;
  return !id.empty();
}

kj::Promise<void> Server::route_preview(const std::string& id, int fd, kj::HttpMethod method,
                                        kj::StringPtr url, const kj::HttpHeaders& headers,
                                        kj::AsyncInputStream& body,
                                        kj::HttpService::Response& response, Clock::time_point t0,
                                        kj::Function<kj::Promise<void>()> here) {
  auto* cluster = rt.cluster();
  using Decided = std::shared_ptr<Target>;
  auto decided = offload<Decided>(
      [cluster, id]() -> Decided {
        return std::make_shared<Target>(target_of(*cluster, id, false));
      },
      std::make_shared<Target>(Target{Target::Kind::busy, "", "", ""}));
  return decided.then([this, fd, method, url, &headers, &body, &response, t0,
                       here = kj::mv(here)](Decided d) mutable -> kj::Promise<void> {
    const Target& t = *d;
    switch (t.kind) {
      case Target::Kind::peer:
        break;
      case Target::Kind::down:
        return send(response,
                    error_reply(Code::host_unavailable,
                                "host " + t.host + " runs this sandbox and is down"),
                    t0);
      case Target::Kind::unavailable:
        return send(response,
                    error_reply(Code::cluster_unavailable, "cannot reach etcd: " + t.message), t0);
      case Target::Kind::busy:
        return send(response, busy_reply(), t0);
      default:
        return here();
    }
    count_preview("forwarded");
    if (headers.isWebSocket())
      return peers->forward_websocket(t.peer, t.host, url, headers, response, peer_address(fd));
    // (A request body crosses to the owner whole: at most max_file_bytes; answers stream.)
    size_t limit = limits.max_file_bytes;
    return body.readAllBytes(limit + 1).then(
        [this, fd, method, url, &headers, &response, t0, t,
         limit](kj::Array<kj::byte> bytes) mutable -> kj::Promise<void> {
          if (bytes.size() > limit)
            return send(response,
                        error_reply(Code::body_too_large,
                                    "a preview request body crossing to another host is at most " +
                                        std::to_string(limit) + " bytes"),
                        t0);
          return until_hangup(fd, peers->forward(t.peer, t.host, method, url, headers,
                                                 kj::mv(bytes), response, peer_address(fd)));
        });
  });
}

kj::Promise<void> Server::route_in_cluster(const Route& route, Request req, std::string id,
                                           bool create, kj::HttpMethod method, kj::StringPtr url,
                                           const kj::HttpHeaders& headers,
                                           kj::AsyncInputStream& body,
                                           kj::HttpService::Response& response,
                                           Clock::time_point t0, bool head) {
  auto* cluster = rt.cluster();
  std::string token = bearer_token(req.authorization);
  const int fd = req.conn_fd;  // (a forward ends when its client hangs up: security review 3, L2)
  // The key is checked here too (keys are shared through etcd): nobody without one makes this
  // host read a body or open a peer connection.
  using Decided = std::shared_ptr<Target>;
  bool fresh = req.forwarded;
  auto decided = offload<Decided>(
      [this, cluster, token, id, create, fresh, auth = route.auth]() -> Decided {
        if (auth && !rt.authenticate(token))
          return std::make_shared<Target>(Target{Target::Kind::unauthorized, "", "", ""});
        if (create) return std::make_shared<Target>(Target{Target::Kind::undecided, "", "", ""});
        if (id.rfind(kHostPrefix, 0) == 0)
          return std::make_shared<Target>(
              host_target(*cluster, id.substr(std::strlen(kHostPrefix))));
        return std::make_shared<Target>(target_of(*cluster, id, fresh));
      },
      std::make_shared<Target>(Target{Target::Kind::busy, "", "", ""}));
  return decided.then([this, &route, req = std::move(req), method, url, &headers, &body, &response,
                       t0, head, cluster, token, fd](Decided d) mutable -> kj::Promise<void> {
    Target t = *d;
    switch (t.kind) {
      case Target::Kind::here:
      case Target::Kind::unauthorized:  // (serve() checks the key again and answers 401)
        return serve(route, std::move(req), headers, body, response, t0, head);
      case Target::Kind::down:
        // A wake may bring it back here from the object store (routes_sandboxes.cc).
        if (wakes_from_store(route)) {
          req.owner_down = true;
          return serve(route, std::move(req), headers, body, response, t0, head);
        }
        return send(
            response,
            restyle(route, error_reply(Code::host_unavailable, actors::down_message(t.host))), t0,
            head);
      case Target::Kind::unavailable:
        return send(response,
                    restyle(route, error_reply(Code::cluster_unavailable,
                                               "cannot reach etcd: " + t.message)),
                    t0, head);
      case Target::Kind::busy:
        return send(response, busy_reply(), t0, head);
      case Target::Kind::peer:
      case Target::Kind::undecided:
        break;
    }
    if (route.kind == Route::Kind::websocket && t.kind == Target::Kind::peer)
      return peers->forward_websocket(t.peer, t.host, url, headers, response);
    size_t limit =
        route.kind == Route::Kind::raw_body ? limits.max_file_bytes : limits.max_body_bytes;
    return body.readAllBytes(limit + 1).then([this, &route, req = std::move(req), method, url,
                                              &headers, &response, t0, head, limit, cluster, t,
                                              token, fd](kj::Array<kj::byte> bytes) mutable
                                             -> kj::Promise<void> {
      if (bytes.size() > limit)
        return send(response,
                    error_reply(route.kind == Route::Kind::raw_body ? Code::file_too_large
                                                                    : Code::body_too_large,
                                "request body is larger than " + std::to_string(limit) + " bytes"),
                    t0);
      if (t.kind == Target::Kind::peer)
        return until_hangup(
            fd, peers->forward(t.peer, t.host, method, url, headers, kj::mv(bytes), response));
      // A create: placement. A pinned host, or the snapshot's owner, or the best host.
      std::string text(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
      auto placed = offload<Decided>(
          [this, cluster, text, token]() -> Decided {
            auto key = rt.authenticate(token);  // (checked before the body was read)
            return std::make_shared<Target>(place(rt, *cluster, text, key ? key->tenant : ""));
          },
          std::make_shared<Target>(Target{Target::Kind::busy, "", "", ""}));
      return placed.then([this, &route, req = std::move(req), method, url, &headers, &response, t0,
                          head, fd, bytes = kj::mv(bytes)](Decided d) mutable -> kj::Promise<void> {
        Target p = *d;
        switch (p.kind) {
          case Target::Kind::peer:
            return until_hangup(
                fd, peers->forward(p.peer, p.host, method, url, headers, kj::mv(bytes), response));
          case Target::Kind::down:
            return send(response,
                        error_reply(Code::host_unavailable,
                                    "host " + p.host + " is not up in the cluster" +
                                        (p.message.empty() ? "" : ": " + p.message)),
                        t0, head);
          case Target::Kind::busy:
            return send(response, busy_reply(), t0, head);
          case Target::Kind::unavailable:
            return send(
                response,
                error_reply(Code::cluster_unavailable, "cannot place the sandbox: " + p.message),
                t0, head);
          default:
            break;
        }
        auto in = bytes_input(kj::mv(bytes));
        auto& stream = *in;
        return serve(route, std::move(req), headers, stream, response, t0, head).attach(kj::mv(in));
      });
    });
  });
}

std::vector<Route> cluster_routes() {
  return {
      route(kj::HttpMethod::GET, "/v1/hosts",
            "The cluster's hosts: state, capacity, sandboxes (admin; cluster mode)",
            [](Call& c) {
              admin_only(c);
              auto* cluster = c.gw.rt.cluster();
              if (cluster == nullptr)
                throw ApiError{Code::cluster_disabled, "this daemon runs without --cluster"};
              auto live = cluster->hosts();
              if (!live) throw ApiError{Code::cluster_unavailable, live.error().message};
              auto members = cluster->members();
              Json hosts = Json::array();
              std::set<std::string> up;
              for (auto& h : *live) {
                auto j = h.json();
                j.set("state", "up");
                j.set("self", h.self);
                up.insert(h.id);
                hosts.push(j);
              }
              if (members)
                for (auto& [id, peer] : *members)
                  if (!up.count(id)) {
                    Json j = Json::object();
                    j.set("id", id);
                    j.set("peer", peer);
                    j.set("state", "down");
                    j.set("self", false);
                    hosts.push(j);
                  }
              Json out = Json::object();
              out.set("self", cluster->config().host_id);
              out.set("hosts", hosts);
              return json_reply(200, out);
            }),
  };
}

}  // namespace pandastack::gateway
