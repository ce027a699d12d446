#include "gateway/rest.h"

#include <kj/compat/url.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <set>
#include <thread>

#include "actors/cluster.h"
#include "gateway/acceptor.h"
#include "gateway/e2b.h"
#include "gateway/http_util.h"
#include "gateway/rpc.h"
#include "gateway/server.h"
#include "gateway/signing.h"
#include "gateway/tls_stream.h"

namespace pandastack::gateway {

Route route(kj::HttpMethod m, const char* pattern, const char* summary, Handler h,
            std::vector<std::string> query, Route::Kind kind, bool auth) {
  return Route{m,    pattern, RoutePattern(pattern), summary,
               kind, auth,    std::move(query),      std::move(h)};
}

namespace {

// A body over its limit that is read and thrown away after the 413 (so that a client which
// sends its whole body before it reads gets the answer) when it is at most this large.
constexpr uint64_t kDrainMaxBytes = uint64_t(256) << 20;

// Bodies written to disk as they arrive (image archives and build contexts, up to
// Limits::max_upload_bytes each): at most this many at once in the process (more: 429), so that
// uploads cannot fill the disk faster than builds take them. (E2B's template builder uploads
// the archives of a template's COPY steps all at once.)
constexpr int kMaxSpools = 8;
std::atomic<int> g_spooling{0};

// Reads and throws away up to `left` bytes of `in` (or until it ends), 64 KiB at a time.
kj::Promise<void> drain_into(kj::AsyncInputStream& in, uint64_t left, kj::Array<kj::byte> buf) {
  if (left == 0) return kj::READY_NOW;
  size_t n = size_t(std::min<uint64_t>(left, buf.size()));
  auto read = in.tryRead(buf.begin(), 1, n);
  return read.then([&in, left, buf = kj::mv(buf)](size_t got) mutable -> kj::Promise<void> {
    if (got == 0) return kj::READY_NOW;
    return drain_into(in, left - std::min<uint64_t>(left, got), kj::mv(buf));
  });
}

kj::StringPtr status_text(unsigned s) {
  switch (s) {
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 507:
      return "Insufficient Storage";
    default:
      return s < 400 ? "OK" : "Error";
  }
}

// Logs client-side HTTP trouble (a client that left, a malformed request) as one line, not as
// an exception with a stack trace.
class QuietErrors final : public kj::HttpServerErrorHandler {
 public:
  kj::Promise<void> handleClientProtocolError(kj::HttpHeaders::ProtocolError protocolError,
                                              kj::HttpService::Response& response) override {
    spdlog::debug("gateway: bad request: {}", protocolError.description.cStr());
    return kj::HttpServerErrorHandler::handleClientProtocolError(kj::mv(protocolError), response);
  }
  kj::Promise<void> handleApplicationError(
      kj::Exception exception, kj::Maybe<kj::HttpService::Response&> response) override {
    spdlog::debug("gateway: request ended: {}", exception.getDescription().cStr());
    KJ_IF_MAYBE (r, response) {
      kj::HttpHeaders headers(*table_);
      auto body = error_body(Code::internal, "the request could not be completed");
      auto out = r->send(500, "Internal Server Error", headers, body.size());
      auto owned = kj::heapString(body.data(), body.size());
      auto p = out->write(owned.begin(), owned.size());
      return p.attach(kj::mv(owned), kj::mv(out));
    }
    return kj::READY_NOW;
  }
  kj::Own<kj::HttpHeaderTable> table_ = kj::HttpHeaderTable::Builder().build();
};

QuietErrors& quiet_errors() {
  static QuietErrors q;
  return q;
}

// The service of one connection: the server's, knowing the connection's descriptor.
class ConnectionService final : public kj::HttpService {
 public:
  ConnectionService(Server& s, int fd) : s_(s), fd_(fd) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            kj::HttpService::Response& response) override {
    return s_.handle_request(fd_, method, url, headers, body, response);
  }

 private:
  Server& s_;
  int fd_;
};

}  // namespace

std::string bearer_token(const std::string& header) {
  if (header.size() < 7) return "";
  std::string scheme = ascii_lower(header.substr(0, 7));
  if (scheme != "bearer ") return "";
  auto token = header.substr(7);
  while (!token.empty() && token.front() == ' ') token.erase(0, 1);
  return token;
}

Server::Server(actors::Runtime& r, kj::Timer& t, Limits l)
    : rt(r),
      timer(t),
      limits(l),
      h_authorization(builder.add("Authorization")),
      h_server_timing(builder.add("Server-Timing")),
      h_cache_control(builder.add("Cache-Control")),
      h_allow(builder.add("Allow")),
      h_retry_after(builder.add("Retry-After")),
      h_next_token(builder.add("X-Next-Token")),
      h_x_api_key(builder.add("X-API-KEY")),
      h_e2b_sandbox_id(builder.add("E2b-Sandbox-Id")),
      h_x_access_token(builder.add("X-Access-Token")),
      h_connect_timeout(builder.add("Connect-Timeout-Ms")),
      h_traffic_token(builder.add("E2B-Traffic-Access-Token")),
      h_forwarded(builder.add(Peers::kForwardedHeader)),
      h_cookie(builder.add("Cookie")),
      h_x_forwarded_for(builder.add("X-Forwarded-For")),
      h_x_forwarded_host(builder.add("X-Forwarded-Host")),
      h_x_forwarded_proto(builder.add("X-Forwarded-Proto")),
      h_x_forwarded_prefix(builder.add("X-Forwarded-Prefix")),
      h_csp(builder.add("Content-Security-Policy")),
      table(builder.build()) {
  // The E2B surface's access tokens (gateway/e2b.h): a secret of the data folder.
  std::string error;
  auto tokens = e2b::Tokens::load((rt.config().data_dir / "e2b-token-secret").string(), &error);
  if (!tokens) throw std::runtime_error(error);
  e2b::set_tokens(std::move(*tokens));
  kj::HttpServerSettings settings;
  settings.errorHandler = quiet_errors();
  // A request answered before its body was read (refused: no key, a quota, a limit) has the rest
  // of its body read and dropped, up to 2 MiB within 1 s, before the connection closes: a client
  // still sending then reads the answer, where closing with unread bytes resets the connection
  // and the client sees ECONNRESET instead of the error (kj's default grace is 64 KiB).
  settings.canceledUploadGraceBytes = size_t(2) << 20;
  settings.canceledUploadGracePeriod = 1 * kj::SECONDS;
  server = kj::heap<kj::HttpServer>(
      timer, *table,
      [this](kj::AsyncIoStream& conn) -> kj::Own<kj::HttpService> {
        int fd = -1;
        KJ_IF_MAYBE (f, conn.getFd()) {
          fd = *f;
        }
        return kj::heap<ConnectionService>(*this, fd);
      },
      settings);
  pool = std::make_unique<WorkerPool>(limits.worker_threads, limits.max_queued_requests);
  stream_pool = std::make_unique<WorkerPool>(limits.stream_threads, limits.stream_threads);
  for (auto table :
       {system_routes(),      sandbox_routes(),    exec_routes(),         file_routes(),
        snapshot_routes(),    admin_routes(),      quota_routes(),        volume_routes(),
        secret_routes(),      database_routes(),   code_routes(),         preview_routes(),
        template_routes(),    dashboard_routes(),  e2b_api_routes(),      e2b_envd_routes(),
        e2b_code_routes(),    e2b_secret_routes(), e2b_template_routes(), cluster_routes(),
        cluster_move_routes()})
    for (auto& route : table) routes.push_back(std::move(route));
  spread_lists(routes);
}

Server::~Server() {
  peers.reset();  // (its connections hold requests in flight)
  shutting_down.request_stop();
  stream_pool.reset();  // the streams end (their commands are cancelled)
  pool.reset();         // waits for the runtime calls in flight
}

kj::Promise<void> Server::send(kj::HttpService::Response& response, HttpReply r,
                               Clock::time_point t0, bool head) {
  count_response(r);
  kj::HttpHeaders headers(*table);
  if (!r.content_type.empty())
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, kj::str(r.content_type.c_str()));
  for (auto& [name, value] : r.headers) {
    if (name == "Allow") headers.set(h_allow, kj::str(value.c_str()));
    if (name == "Retry-After") headers.set(h_retry_after, kj::str(value.c_str()));
    if (name == "X-Next-Token") headers.set(h_next_token, kj::str(value.c_str()));
  }
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  headers.set(h_server_timing, kj::str("total;dur=", ms));
  if (r.status == 204) {
    response.send(204, "No Content", headers, uint64_t(0));
    return kj::READY_NOW;
  }
  auto body = kj::heapString(r.body.data(), r.body.size());
  auto stream = response.send(r.status, status_text(r.status), headers, uint64_t(body.size()));
  if (body.size() == 0 || head) return kj::READY_NOW;
  auto p = stream->write(body.begin(), body.size());
  return p.attach(kj::mv(body), kj::mv(stream));
}

void Server::count_response(const HttpReply& r) {
  std::lock_guard l(metrics_mu);
  ++responses_by_status[r.status];
  if (r.error_code) ++errors_by_code[to_string(*r.error_code)];
}

kj::Promise<void> Server::watch_hangup(int fd, std::shared_ptr<std::stop_source> stop) {
  return timer.afterDelay(500 * kj::MILLISECONDS).then([this, fd, stop]() -> kj::Promise<void> {
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      stop->request_stop();  // the client is gone: what it asked for is cancelled
      return kj::READY_NOW;
    }
    return watch_hangup(fd, stop);
  });
}

kj::Promise<void> Server::until_hangup(int fd, kj::Promise<void> p) {
  if (fd < 0) return p;
  return p.exclusiveJoin(watch_hangup(fd, std::make_shared<std::stop_source>()));
}

kj::Promise<void> Server::handle_request(int fd, kj::HttpMethod method, kj::StringPtr url,
                                         const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                         kj::HttpService::Response& response, bool from_peer,
                                         std::shared_ptr<std::stop_source> peer_stop,
                                         std::string client_address) {
  auto t0 = Clock::now();
  // A preview's request goes to its sandbox, never to the API: by its Host (any path), or by its
  // path under /v1/sandboxes/{id}/previews/{port}/.
  // E2B's sandbox plane has host names of its own: envd at 49983-ID and the code interpreter at
  // 49999-ID (what E2B's SDKs use without E2B_SANDBOX_URL): served here by the E2B routes, as
  // for that sandbox.
  std::optional<PreviewAddress> to_preview;
  std::string host_sandbox;
  KJ_IF_MAYBE (host, headers.get(kj::HttpHeaderId::HOST)) {
    to_preview = preview_by_host(host->cStr(), preview.domain, url.cStr());
    if (to_preview && e2b::sandbox_plane_port(to_preview->port)) {
      host_sandbox = to_preview->id;
      to_preview.reset();
    }
  }
  if (!to_preview && host_sandbox.empty()) to_preview = preview_by_path(url.cStr());
  if (to_preview) {
    // (the guest's X-Forwarded-For: this connection's peer, or the forwarding host's client)
    to_preview->client_address = from_peer ? std::move(client_address) : peer_address(fd);
    // In a cluster: served by the host that runs the sandbox (a forwarded one is served here).
    if (peers && !from_peer) {
      auto id = to_preview->id;
      return route_preview(
          id, fd, method, url, headers, body, response, t0,
          [this, a = std::move(*to_preview), fd, method, &headers, &body, &response, t0]() mutable {
            return proxy_preview(std::move(a), fd, method, headers, body, response, t0);
          });
    }
    return proxy_preview(std::move(*to_preview), fd, method, headers, body, response, t0);
  }
  // In a cluster, a signed file URL (no token: a hash over one) is checked by the host that runs
  // its sandbox, which knows the sandbox's tenant: it goes there first, as a preview does.
  if (!host_sandbox.empty() && peers && !from_peer &&
      std::string_view(url.cStr()).find("signature=") != std::string_view::npos &&
      headers.get(h_x_access_token) == nullptr) {
    auto id = host_sandbox;
    return route_preview(id, fd, method, url, headers, body, response, t0,
                         [this, fd, method, url, &headers, &body, &response, peer_stop,
                          host_sandbox = std::move(host_sandbox), t0]() mutable {
                           return handle_api(fd, method, url, headers, body, response, false,
                                             std::move(peer_stop), std::move(host_sandbox), t0);
                         });
  }
  return handle_api(fd, method, url, headers, body, response, from_peer, std::move(peer_stop),
                    std::move(host_sandbox), t0);
}

kj::Promise<void> Server::handle_api(int fd, kj::HttpMethod method, kj::StringPtr url,
                                     const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                     kj::HttpService::Response& response, bool from_peer,
                                     std::shared_ptr<std::stop_source> peer_stop,
                                     std::string host_sandbox, Clock::time_point t0) {
  auto parsed = kj::Url::tryParse(url, kj::Url::HTTP_REQUEST);
  Request req;
  req.method = method;
  req.conn_fd = fd;
  req.host_sandbox = std::move(host_sandbox);
  req.peer_stop = std::move(peer_stop);
  KJ_IF_MAYBE (host, headers.get(kj::HttpHeaderId::HOST)) {
    if (host->size() <= 255) req.host = host->cStr();
  }
  std::vector<std::string> segments;
  KJ_IF_MAYBE (u, parsed) {
    for (auto& s : u->path) segments.emplace_back(s.cStr());
    for (auto& q : u->query) req.query.emplace(q.name.cStr(), q.value.cStr());
  } else {
    return send(response, error_reply(Code::invalid_argument, "malformed URL"), t0);
  }
  // HEAD is GET without the body, for the routes that answer GET with JSON or bytes.
  bool head = method == kj::HttpMethod::HEAD;
  kj::HttpMethod want = head ? kj::HttpMethod::GET : method;
  const Route* route = nullptr;
  std::set<std::string> allowed;
  for (auto& r : routes) {
    // (a sandbox plane's host name serves its routes only)
    if (!req.host_sandbox.empty() && r.style != Route::Style::e2b_envd) continue;
    std::map<std::string, std::string> params;
    if (!r.compiled.match(segments, params)) continue;
    allowed.insert(method_name(r.method));
    if (r.method == kj::HttpMethod::GET && r.kind == Route::Kind::json) allowed.insert("head");
    if (route || r.method != want) continue;
    if (head && r.kind != Route::Kind::json) continue;
    route = &r;
    req.params = std::move(params);
  }
  if (!route) {
    if (allowed.empty())
      return send(response, error_reply(Code::route_not_found, "no route for this path"), t0);
    std::string list;
    for (auto& m : allowed) {
      std::string up = m;
      for (auto& c : up) c = char(std::toupper((unsigned char)c));
      list += (list.empty() ? "" : ", ") + up;
    }
    auto reply = error_reply(Code::method_not_allowed, "this path takes " + list);
    reply.headers.emplace_back("Allow", list);
    return send(response, std::move(reply), t0);
  }
  req.route = route->pattern;
  req.url = url.cStr();
  req.forwarded = from_peer && headers.get(h_forwarded) != nullptr;
  KJ_IF_MAYBE (a, headers.get(h_authorization)) {
    req.authorization = a->cStr();
  }
  return serve(*route, std::move(req), headers, body, response, t0, head);
}

kj::Promise<void> Server::serve(const Route& route_ref, Request req, const kj::HttpHeaders& headers,
                                kj::AsyncInputStream& body, kj::HttpService::Response& response,
                                Clock::time_point t0, bool head) {
  const Route* route = &route_ref;
  if (route->on_loop) return send(response, handle(*route, req), t0, head);
  if (route->style != Route::Style::native) {
    // E2B's control plane sends our key as X-API-KEY; its sandbox plane a sandbox's token.
    KJ_IF_MAYBE (k, headers.get(h_x_api_key)) {
      if (route->style == Route::Style::e2b_api) {
        // Our key as it is, or in the e2b_<hex> form current E2B SDKs insist on.
        auto pds = e2b::from_api_key_form(k->cStr());
        req.authorization = "Bearer " + (pds ? *pds : std::string(k->cStr()));
      }
    }
    auto keep = [&](kj::HttpHeaderId id, const char* name) {
      KJ_IF_MAYBE (v, headers.get(id)) {
        if (v->size() <= 4096) req.headers[name] = v->cStr();
      }
    };
    keep(h_e2b_sandbox_id, "e2b-sandbox-id");
    if (!req.host_sandbox.empty()) {
      // The host name says the sandbox; a header, if any, must say the same.
      auto& named = req.headers["e2b-sandbox-id"];
      if (!named.empty() && named != req.host_sandbox)
        return send(response,
                    restyle(*route, error_reply(Code::invalid_argument,
                                                "E2b-Sandbox-Id names another sandbox than the "
                                                "host name")),
                    t0, head);
      named = req.host_sandbox;
    }
    keep(h_connect_timeout, "connect-timeout-ms");
    keep(kj::HttpHeaderId::CONTENT_TYPE, "content-type");
    if (route->style == Route::Style::e2b_envd && route->pattern == "/files") {
      // An upload's Content-Encoding and file metadata (X-Metadata-<key>: the first of each
      // key, whatever its size: the upload checks the limits, vmm::check_file_metadata).
      headers.forEach([&](kj::StringPtr name, kj::StringPtr value) {
        std::string n = ascii_lower(name.cStr());
        if ((n == "content-encoding" && value.size() <= 64) || n.rfind("x-metadata-", 0) == 0)
          req.headers.emplace(n, value.cStr());
      });
    }
    // The sandbox plane's token is checked here, once, on the loop (an HMAC, no runtime call),
    // before a body is read: nobody without one makes the daemon hold a request body. The code
    // interpreter's /contexts carry it as E2B-Traffic-Access-Token.
    if (route->style == Route::Style::e2b_envd && req.token_tenant.empty()) {
      std::string token;
      KJ_IF_MAYBE (v, headers.get(h_x_access_token)) {
        token = v->cStr();
      } else KJ_IF_MAYBE (v, headers.get(h_traffic_token)) {
        token = v->cStr();
      }
      // A signed file URL (E2B's uploadUrl/downloadUrl) carries a hash over the token instead:
      // checked on a worker (it looks up the sandbox and its tenant's keys), still before the
      // body is read; then served as if the token had come.
      if (token.empty() && route->pattern == "/files" && req.q("signature")) {
        auto r = std::make_shared<Request>(std::move(req));
        auto refused = std::make_shared<std::optional<actors::Rejection>>();
        return offload<bool>(
                   [this, r, refused] {
                     auto claims = e2b::verify_signed_url(*this, *r);
                     if (!claims) {
                       *refused = claims.error();
                       return false;
                     }
                     r->token_tenant = claims->tenant;
                     r->token_key = claims->key_id;
                     return true;
                   },
                   false)
            .then([this, r, refused, route, &headers, &body, &response, t0,
                   head](bool ok) -> kj::Promise<void> {
              if (!ok)
                return send(response,
                            *refused ? restyle(*route, error_reply(**refused)) : busy_reply(), t0);
              return serve(*route, std::move(*r), headers, body, response, t0, head);
            });
      }
      auto claims =
          e2b::tokens().verify(token, req.headers["e2b-sandbox-id"], int64_t(std::time(nullptr)));
      if (!claims)
        return send(response,
                    restyle(*route, error_reply(Code::unauthorized,
                                                "missing, wrong or expired access token for the "
                                                "sandbox named by E2b-Sandbox-Id")),
                    t0, head);
      req.token_tenant = claims->tenant;
      req.token_key = claims->key_id;
    }
  }
  // In a cluster, a request goes to the host that owns what it names (E2B's once its token is
  // known good: tokens are the cluster's), or to the host placement picks for a create. A
  // forwarded request is served here, unless it names an id this host does not own any more
  // (the sender's owner cache was a second old: a migration moved it): then its owner, looked up
  // afresh, serves it. Creates are never placed twice.
  if (peers && !req.routed) {
    std::string id;
    bool create = false;
    if (cluster_target(*route, req, id, create) && !(req.forwarded && create)) {
      req.routed = true;
      auto url = kj::heapString(req.url);
      auto method = req.method;
      auto& u = url;
      return route_in_cluster(*route, std::move(req), id, create, method, u, headers, body,
                              response, t0, head)
          .attach(kj::mv(url));
    }
  }
  // A missing or malformed key is refused here, before the body is read or a worker is used.
  if (route->auth && !well_formed_key(bearer_token(req.authorization)))
    return send(response,
                restyle(*route, error_reply(Code::unauthorized,
                                            bearer_token(req.authorization).empty()
                                                ? "missing 'Authorization: Bearer pds_...' header "
                                                  "(an API key)"
                                                : "malformed API key (keys look like "
                                                  "pds_<id>_<secret>)")),
                t0, head);
  size_t limit = route->kind == Route::Kind::raw_body ? limits.max_file_bytes
                 : route->kind == Route::Kind::file_body
                     ? (route->upload == Route::Upload::context ? limits.max_context_bytes
                                                                : limits.max_upload_bytes)
                     : limits.max_body_bytes;
  KJ_IF_MAYBE (len, body.tryGetLength()) {
    if (*len > limit) {
      auto too_large =
          error_reply(route->kind == Route::Kind::raw_body || route->kind == Route::Kind::file_body
                          ? Code::file_too_large
                          : Code::body_too_large,
                      "request body is larger than " + std::to_string(limit) + " bytes");
      // Answered at once. A client that sends its whole body before it reads (Python's httpx,
      // the CLI) would see a connection reset instead of the answer when the connection closes
      // with its body unread: for a key that verifies, a body up to kDrainMaxBytes is read and
      // thrown away after the answer (64 KiB at a time, within the body deadline). Nobody
      // without a key makes the daemon read it.
      bool keyed = route->auth || !req.token_tenant.empty();
      if (!keyed || *len > kDrainMaxBytes) return send(response, too_large, t0);
      kj::Promise<bool> admitted = true;
      if (route->auth) {
        auto token = bearer_token(req.authorization);
        admitted = offload<bool>([this, token] { return bool(rt.authenticate(token)); }, false);
      }
      return admitted.then([this, &body, &response, t0, too_large,
                            length = *len](bool ok) mutable -> kj::Promise<void> {
        auto sent = send(response, too_large, t0);
        if (!ok) return sent;
        return sent.then([this, &body, length]() {
          return drain_into(body, length, kj::heapArray<kj::byte>(64 * 1024))
              .exclusiveJoin(timer.afterDelay(limits.body_timeout.count() * kj::MILLISECONDS));
        });
      });
    }
  }
  auto kind = route->kind;
  if (kind == Route::Kind::websocket && !headers.isWebSocket())
    return send(response,
                error_reply(Code::invalid_argument, "this route needs a WebSocket upgrade request"),
                t0);
  // Large bodies (file uploads) are read only for a key that verifies: nobody without one makes
  // the daemon hold megabytes.
  kj::Promise<bool> admitted = true;
  if ((kind == Route::Kind::raw_body || kind == Route::Kind::file_body) &&
      route->style != Route::Style::e2b_envd) {  // (checked above)
    auto token = bearer_token(req.authorization);
    admitted = offload<bool>([this, token] { return bool(rt.authenticate(token)); }, false);
  }
  return admitted.then([this, req = std::move(req), kind, limit, t0, route, head, &body,
                        &response](bool ok) mutable -> kj::Promise<void> {
    if (!ok)
      return send(response,
                  restyle(*route, error_reply(Code::unauthorized, "unknown or revoked API key")),
                  t0);
    // A body that trickles in is cut off (408) instead of holding its connection and buffer.
    auto slow = timer.afterDelay(limits.body_timeout.count() * kj::MILLISECONDS)
                    .then([]() -> kj::Array<kj::byte> {
                      KJ_FAIL_REQUIRE("request_timeout: the request body did not arrive in time");
                    });
    kj::Promise<kj::Array<kj::byte>> arrived = nullptr;
    if (kind == Route::Kind::file_body) {
      // Written to a file as it arrives; a pause longer than the body timeout is a 408.
      if (g_spooling.fetch_add(1) >= kMaxSpools) {
        g_spooling.fetch_sub(1);
        return send(response,
                    error_reply(Code::too_many_requests,
                                std::to_string(kMaxSpools) +
                                    " uploads (image archives, build contexts) are arriving on "
                                    "this host, the most it takes at once: try again when one "
                                    "has"),
                    t0);
      }
      auto file = spool_file();
      if (!file) {
        g_spooling.fetch_sub(1);
        return send(response, error_reply(file.error()), t0);
      }
      req.body_file = file->first;
      arrived = spool(body, file->second, limit, 0)
                    .then([](uint64_t) { return kj::heapArray<kj::byte>(0); })
                    .attach(kj::defer([fd = file->second] {
                      ::close(fd);
                      g_spooling.fetch_sub(1);
                    }));
    } else {
      arrived = body.readAllBytes(limit + 1).exclusiveJoin(kj::mv(slow));
    }
    auto spooled = req.body_file;
    return kj::mv(arrived).then(
        [this, req = std::move(req), kind, limit, t0, route, head,
         &response](kj::Array<kj::byte> bytes) mutable -> kj::Promise<void> {
          if (bytes.size() > limit)
            return send(
                response,
                error_reply(
                    kind == Route::Kind::raw_body ? Code::file_too_large : Code::body_too_large,
                    "request body is larger than " + std::to_string(limit) + " bytes"),
                t0);
          req.body.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
          if (kind == Route::Kind::stream) return stream(*route, std::move(req), response, t0);
          if (kind == Route::Kind::websocket)
            return websocket(*route, std::move(req), response, t0);
          // A client that hangs up cancels what it asked for (a command stops in the guest)
          // instead of holding a worker until it ends.
          auto stop = req.peer_stop ? req.peer_stop : std::make_shared<std::stop_source>();
          req.cancel = stop->get_token();
          kj::Promise<void> watch = kj::NEVER_DONE;
          if (req.conn_fd >= 0) watch = watch_hangup(req.conn_fd, stop);
          auto r = std::make_shared<Request>(std::move(req));
          return offload<HttpReply>(
                     [this, r, route, stop] {
                       std::stop_callback on_shutdown(shutting_down.get_token(),
                                                      [stop] { stop->request_stop(); });
                       auto reply = handle(*route, *r);
                       // (a spooled body the handler did not take over)
                       if (!r->body_file.empty()) ::unlink(r->body_file.c_str());
                       return reply;
                     },
                     busy_reply())
              .attach(watch.eagerlyEvaluate(nullptr))
              .then([this, &response, t0, head](HttpReply rep) {
                return send(response, std::move(rep), t0, head);
              });
        },
        [this, &response, t0, spooled](kj::Exception&& e) -> kj::Promise<void> {
          if (!spooled.empty()) ::unlink(spooled.c_str());
          std::string why = e.getDescription().cStr();
          if (auto at = why.find("file_too_large: "); at != std::string::npos)
            return send(response, error_reply(Code::file_too_large, why.substr(at + 16)), t0);
          if (std::string(e.getDescription().cStr()).find(to_string(Code::request_timeout)) !=
              std::string::npos)
            return send(response,
                        error_reply(Code::request_timeout,
                                    "the request body did not arrive within " +
                                        std::to_string(limits.body_timeout.count() / 1000) + " s"),
                        t0);
          return send(response,
                      error_reply(Code::body_too_large, "request body rejected: " +
                                                            std::string(e.getDescription().cStr())),
                      t0);
        });
  });
}

actors::KeyInfo Server::auth(const Request& r) {
  auto token = bearer_token(r.authorization);
  if (token.empty())
    throw ApiError{Code::unauthorized,
                   "missing 'Authorization: Bearer pds_...' header (an API key)"};
  return unwrap(rt.authenticate(token));
}

Call Server::admit(const Route& route, const Request& r) {
  Call c{*this, r, {}, ""};
  if (route.auth) {
    c.key = auth(r);
    if (!limiter.take(c.key.id, rt.quota_limits(c.key.tenant).requests_per_second))
      throw ApiError{Code::too_many_requests,
                     "this key sent more than " +
                         std::to_string(rt.quota_limits(c.key.tenant).requests_per_second) +
                         " requests per second (its tenant's quota)"};
  }
  c.id = r.param("id");
  // Another tenant's sandbox does not exist for this key: 404 before anything else is looked at
  // (a sandbox of a host that is down is not here: its handler checks the tenant itself).
  if (!c.id.empty()) {
    auto here = rt.get(c.key.tenant, c.id);
    if (!here && !(r.owner_down && here.error().code == Code::sandbox_not_found))
      throw here.error();
  }
  for (auto& [k, v] : r.query) {
    bool known = false;
    for (auto& q : route.query)
      known |= q == k || (q.ends_with("*") && k.rfind(q.substr(0, q.size() - 1), 0) == 0);
    if (!known) throw ApiError{Code::invalid_argument, "unknown query parameter '" + k + "'"};
  }
  return c;
}

HttpReply Server::handle(const Route& route, const Request& r) {
  try {
    auto call = admit(route, r);
    if (!route.handler) throw ApiError{Code::route_not_found, "no handler for " + route.pattern};
    return restyle(route, route.handler(call));
  } catch (const ApiError& e) {
    return restyle(route, error_reply(e));
  } catch (const std::exception& e) {
    spdlog::error("gateway: {} {}: {}", method_name(r.method), r.route, e.what());
    return restyle(route, error_reply(Code::internal, e.what()));
  }
}

HttpReply Server::restyle(const Route& route, HttpReply r) {
  if (route.style == Route::Style::native || r.status < 400 || !r.error_code) return r;
  if (route.style == Route::Style::e2b_api) return e2b::api_error(r);
  // envd: /files and the code interpreter answer {"code": <status>} like the control plane;
  // Connect calls their codes.
  bool plain = route.pattern == "/files" || route.pattern == "/execute" ||
               route.pattern.rfind("/contexts", 0) == 0;
  if (plain && !e2b::sandbox_gone(r.error_code)) return e2b::api_error(r);
  return e2b::envd_error(r);
}

struct Gateway::Impl {
  Server server;
  std::unique_ptr<TlsConfig> tls;  // (serve_tls) HTTPS instead of HTTP
  Acceptor acceptor;
  Impl(actors::Runtime& r, kj::Timer& t, Limits l)
      : server(r, t, l),
        acceptor("rest", t, l.max_connections,
                 [this](kj::Own<kj::AsyncIoStream> c) { return connection(kj::mv(c)); }) {}

  kj::Promise<void> connection(kj::Own<kj::AsyncIoStream> c) {
    if (!tls) return server.server->listenHttp(kj::mv(c));
    // A client that never finishes its handshake gives its descriptor back within the deadline.
    auto timeout = server.limits.tls_handshake_timeout;
    return tls->server(kj::mv(c))
        .exclusiveJoin(server.timer.afterDelay(timeout.count() * kj::MILLISECONDS)
                           .then([]() -> TlsConfig::Connected {
                             KJ_FAIL_REQUIRE("the TLS handshake did not finish in time");
                           }))
        .then(
            [this](TlsConfig::Connected conn) {
              return server.server->listenHttp(kj::mv(conn.stream));
            },
            [](kj::Exception&& e) {
              spdlog::debug("gateway: TLS handshake failed: {}", e.getDescription().cStr());
            });
  }
};

Gateway::Gateway(actors::Runtime& runtime, kj::Timer& timer, Limits limits)
    : impl_(std::make_unique<Impl>(runtime, timer, limits)) {}

Gateway::~Gateway() = default;

void Gateway::serve_tls(const std::string& cert_pem, const std::string& key_pem) {
  impl_->tls = std::make_unique<TlsConfig>(cert_pem, key_pem);
}

kj::Promise<void> Gateway::listen(kj::ConnectionReceiver& listener) {
  return impl_->acceptor.listen(listener);
}

void Gateway::serve_previews(kj::LowLevelAsyncIoProvider& io, PreviewSettings settings) {
  auto& s = impl_->server;
  std::string error;
  auto secret =
      load_or_make_secret((s.rt.config().data_dir / "preview-token-secret").string(), &error);
  if (!secret) throw std::runtime_error(error);
  s.preview = std::move(settings);
  s.preview_tokens = std::make_unique<PreviewTokens>(*secret);
  s.lowlevel = &io;
}

kj::Promise<void> Gateway::serve_peers(kj::AsyncIoProvider& io, kj::ConnectionReceiver& listener,
                                       PeerAuth auth) {
  auto& s = impl_->server;
  // E2B access tokens are the cluster's: any host verifies a token another host issued. Their
  // key is the cluster's own (e2b-tokens.key), never derived from a peer credential; only an
  // insecure cluster derives it from its shared secret.
  std::string tokens_key = auth.tls ? auth.tls->e2b_tokens_key
                                    : derive_secret(auth.secret, "pandastack e2b access tokens");
  e2b::set_tokens(e2b::Tokens(tokens_key));
  // Preview tokens are the cluster's too (any host checks them, a migrated sandbox keeps its
  // URLs), under a key of their own derived from it.
  if (s.preview_tokens)
    s.preview_tokens =
        std::make_unique<PreviewTokens>(derive_secret(tokens_key, "pandastack preview tokens"));
  s.peers = std::make_unique<Peers>(s, io, std::move(auth));
  return s.peers->listen(listener);
}

void Gateway::connect_rpc(RpcServer* rpc) {
  auto& s = impl_->server;
  s.rpc = rpc;
  if (rpc == nullptr || !s.peers) return;
  rpc->route_to([&s](const std::string& host, const std::string& address, const std::string& key) {
    return s.peers->platform(host, address, key);
  });
}

std::string Gateway::openapi() const { return impl_->server.openapi(); }

}  // namespace pandastack::gateway
