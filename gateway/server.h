// The REST server behind gateway::Gateway (internal to gateway/): the kj-http service, its route
// table and the pieces the route files share. Each API resource has its own file with its own
// table of routes (routes_*.cc); the table drives dispatch, query-parameter checks and the
// OpenAPI document alike, so the document cannot drift from what is served.
//   rest.cc          parsing, routing, auth, replies, metrics, the OpenAPI document
//   streams.cc       server-sent events (exec/stream, process streams, events?follow=1)
//   websocket.cc     the WebSocket exec
//   routes_*.cc      the handlers, one file per resource
#pragma once

#include <kj/async-io.h>
#include <kj/compat/http.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include "gateway/api_types.h"
#include "gateway/http_util.h"
#include "gateway/peers.h"
#include "gateway/previews.h"
#include "gateway/rate_limit.h"
#include "gateway/rest.h"
#include "gateway/worker_pool.h"

namespace pandastack::gateway {

using Clock = std::chrono::steady_clock;

struct Server;
class RpcServer;

// What a handler gets: the server, the request, and who asks (checked before the handler runs).
struct Call {
  Server& gw;
  const Request& r;
  actors::KeyInfo key;  // empty for routes without auth
  std::string id;       // the {id} parameter (a sandbox of key.tenant, checked), or ""
  const std::string& tenant() const { return key.tenant; }
};

// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive,
// RFC 7235), or "".
std::string bearer_token(const std::string& header);

// Routes for admin keys only: 403 forbidden for any other.
inline void admin_only(const Call& c) {
  if (!c.key.admin) throw ApiError{Code::forbidden, "this route needs an admin key"};
}

using Handler = std::function<HttpReply(Call&)>;

struct Route {
  kj::HttpMethod method;
  std::string pattern;
  RoutePattern compiled;
  std::string summary;
  // file_body: the body is written to a file as it arrives (Request::body_file), up to
  // Limits::max_upload_bytes, instead of being held in memory.
  enum class Kind { json, stream, raw_body, websocket, file_body } kind = Kind::json;
  bool auth = true;
  // Query parameters the route takes; any other is refused (400). A name ending in '*' is a
  // prefix ("metadata.*").
  std::vector<std::string> query;
  Handler handler;  // json and raw_body routes (and a stream route's JSON form)
  // Answered on the event loop itself (no worker, no runtime call): liveness must answer even
  // when every worker is busy.
  bool on_loop = false;
  // native: our API. e2b_api: E2B's control plane (X-API-KEY, errors {"code": status, "message"}).
  // e2b_envd: E2B's sandbox plane (a sandbox's access token, Connect errors; gateway/e2b.h).
  enum class Style { native, e2b_api, e2b_envd } style = Style::native;
  // A file_body route's limit: Limits::max_upload_bytes (image archives) or
  // Limits::max_context_bytes (build contexts).
  enum class Upload { image, context } upload = Upload::image;
};

// A route table entry. `query` lists the parameters it takes.
Route route(kj::HttpMethod m, const char* pattern, const char* summary, Handler h,
            std::vector<std::string> query = {}, Route::Kind kind = Route::Kind::json,
            bool auth = true);

// One table per resource.
std::vector<Route> system_routes();     // health, metrics, openapi, templates
std::vector<Route> sandbox_routes();    // create, list, get, change, kill, lifecycle, ports, events
std::vector<Route> exec_routes();       // exec, streams, WebSocket, background processes
std::vector<Route> file_routes();       // files
std::vector<Route> snapshot_routes();   // snapshots
std::vector<Route> admin_routes();      // keys, the audit log
std::vector<Route> quota_routes();      // quotas: one's own, a tenant's (admin)
std::vector<Route> volume_routes();     // volumes
std::vector<Route> secret_routes();     // secrets (names, hosts, expiry; values never answered)
std::vector<Route> database_routes();   // managed databases
std::vector<Route> code_routes();       // the code interpreter and its contexts
std::vector<Route> preview_routes();    // preview URLs: open, list, get, close (routes_previews.cc)
std::vector<Route> template_routes();   // templates: shipped ones, custom builds
std::vector<Route> dashboard_routes();  // the dashboard's page and files (dashboard.cc)
Json template_json(const actors::TemplateState& t);  // a custom template as the API shows it
std::vector<Route> e2b_api_routes();                 // E2B's control plane (e2b_api.cc)
std::vector<Route> e2b_envd_routes();      // E2B's envd: processes, files, health (e2b_envd.cc)
std::vector<Route> e2b_secret_routes();    // E2B's Secret API on ours (e2b_secrets.cc)
std::vector<Route> e2b_template_routes();  // E2B's template builder on ours (e2b_templates.cc)
std::vector<Route> e2b_code_routes();  // E2B's code interpreter: /execute, /contexts (e2b_code.cc)
std::vector<Route> cluster_routes();   // GET /v1/hosts (cluster_routes.cc)
std::vector<Route> cluster_move_routes();  // migrate, drain (cluster_moves.cc)
// The lists of sandboxes, snapshots, volumes and databases: every host's in cluster mode
// (cluster_fanout.cc).
void spread_lists(std::vector<Route>& routes);
// A fork whose children go to `hosts` (round-robin; cluster_moves.cc).
HttpReply fork_across_hosts(Call& c, uint32_t count, const std::vector<std::string>& hosts);
// A fork this host is too full for, placed on the host placement picks (else `full` stands).
HttpReply fork_elsewhere(Call& c, uint32_t count, const actors::Rejection& full);
// A wake of a sandbox whose host is down (Request::owner_down): when its hibernation is parked
// in the object store for the caller's tenant, woken on the host placement picks (this one, or
// forwarded there), else host_unavailable (cluster_moves.cc; Runtime::wake_parked).
HttpReply wake_elsewhere(Call& c);
// The same woken here, whatever placement says (E2B's connect and resume).
actors::SandboxInfo wake_from_store(Call& c);
// Whether `route` may act on a sandbox whose host is down (Request::owner_down): the wakes.
bool wakes_from_store(const Route& route);

// Output chunks travel from a driver thread to the event loop through this channel.
struct StreamChannel {
  std::mutex mu;
  std::string pending;  // SSE frames not yet written
  bool started = false, done = false;
  std::optional<HttpReply> early;  // an error before the stream began: a normal reply
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter;
  std::stop_source stop;  // cancels the command in the guest
  size_t limit;
  // Written when the stream was idle for a keepalive interval (SSE: a comment; Connect: a
  // keepalive envelope).
  std::string keepalive = ": keepalive\n\n";
  bool overflowed = false;

  explicit StreamChannel(size_t l) : limit(l) {}
  void wake();
  void push(std::string frame);
  void begin();
  void fail_early(HttpReply r);
  void finish(std::string frame);
};

struct Server;
// The SSE form of a code run (routes_code.cc); a new context's id ("ctx_" + 16 hex).
void produce_code(Server& gw, const std::string& tenant, const std::string& id, const Request& r,
                  StreamChannel& ch);
// A terminal's columns or rows, at most (the WebSocket /pty and E2B's PTYs).
inline constexpr int64_t kMaxTerminalSide = 1000;
// GET /v1/sandboxes/{id}/files/watch on a stream worker (routes_files.cc).
void produce_watch(Server& gw, const std::string& tenant, const std::string& id, const Request& r,
                   StreamChannel& ch);
std::string new_context_id();

struct Server final : public kj::HttpService {
  actors::Runtime& rt;
  kj::Timer& timer;
  Limits limits;
  kj::HttpHeaderTable::Builder builder;
  kj::HttpHeaderId h_authorization, h_server_timing, h_cache_control, h_allow, h_retry_after,
      h_next_token;
  kj::HttpHeaderId h_x_api_key, h_e2b_sandbox_id, h_x_access_token, h_connect_timeout,
      h_traffic_token, h_forwarded;
  kj::HttpHeaderId h_cookie, h_x_forwarded_for, h_x_forwarded_host, h_x_forwarded_proto,
      h_x_forwarded_prefix, h_csp;
  kj::Own<kj::HttpHeaderTable> table;
  kj::Own<kj::HttpServer> server;
  std::vector<Route> routes;
  std::unique_ptr<WorkerPool> pool;
  // Long-lived producers (SSE streams, a WebSocket command's output) run here, never on `pool`:
  // streams held open cannot take the workers plain requests need.
  std::unique_ptr<WorkerPool> stream_pool;
  RateLimiter limiter;  // requests per second per key
  // Fires at shutdown: commands in flight are cancelled so the workers can be joined.
  std::stop_source shutting_down;

  // Metrics.
  std::mutex metrics_mu;
  std::map<std::string, uint64_t> errors_by_code;
  std::map<unsigned, uint64_t> responses_by_status;
  uint64_t creates = 0, execs = 0;
  Histogram create_latency{{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram exec_latency{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30}};
  std::map<std::string, uint64_t> preview_requests;  // by outcome: proxied, websocket, refused...
  // Preview URLs (previews.h, preview_proxy.cc), set by Gateway::serve_previews; until then a
  // preview request is 501.
  PreviewSettings preview;
  std::unique_ptr<PreviewTokens> preview_tokens;
  kj::LowLevelAsyncIoProvider* lowlevel = nullptr;

  Server(actors::Runtime& r, kj::Timer& t, Limits l);
  ~Server();

  // kj::HttpService
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            kj::HttpService::Response& response) override {
    return handle_request(-1, method, url, headers, body, response);
  }
  // The same, for a request on connection `fd` (-1: unknown). `from_peer`: a request another
  // host forwarded (gateway/peers.cc); only then does the forwarding header count (a client's
  // is ignored: it would skip placement, drains and fan-out).
  // `peer_stop` (a forwarded request): fired when the forwarding host cancels the call, it
  // cancels what the request asked for as a hang-up would. `client_address` (a forwarded
  // request): the client's IP address as the forwarding host saw it.
  kj::Promise<void> handle_request(int fd, kj::HttpMethod method, kj::StringPtr url,
                                   const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                   kj::HttpService::Response& response, bool from_peer = false,
                                   std::shared_ptr<std::stop_source> peer_stop = nullptr,
                                   std::string client_address = "");
  // An API request (not a preview's): its route, then serve(). `host_sandbox`: E2B's sandbox
  // plane named by the host name (Request::host_sandbox).
  kj::Promise<void> handle_api(int fd, kj::HttpMethod method, kj::StringPtr url,
                               const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                               kj::HttpService::Response& response, bool from_peer,
                               std::shared_ptr<std::stop_source> peer_stop,
                               std::string host_sandbox, Clock::time_point t0);
  // A request addressed to a preview (by its Host or path): checked, then proxied to the guest.
  kj::Promise<void> proxy_preview(PreviewAddress a, int fd, kj::HttpMethod method,
                                  const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                  kj::HttpService::Response& response, Clock::time_point t0);
  // Cluster mode (cluster_routes.cc): a preview request for sandbox `id` goes to the host that
  // runs it (the original URL and headers: that host checks the access), or `here()` serves it.
  kj::Promise<void> route_preview(const std::string& id, int fd, kj::HttpMethod method,
                                  kj::StringPtr url, const kj::HttpHeaders& headers,
                                  kj::AsyncInputStream& body, kj::HttpService::Response& response,
                                  Clock::time_point t0, kj::Function<kj::Promise<void>()> here);
  void count_preview(const std::string& outcome);
  // The request after routing (its Authorization read): auth, body, handler (also a peer's
  // forwarded request).
  kj::Promise<void> serve(const Route& route, Request req, const kj::HttpHeaders& headers,
                          kj::AsyncInputStream& body, kj::HttpService::Response& response,
                          Clock::time_point t0, bool head);

  // Cluster mode (cluster_routes.cc). Whether `route` names an id whose owner serves it (`id`),
  // or is a create that placement decides (`create`).
  bool cluster_target(const Route& route, const Request& req, std::string& id, bool& create);
  // Serves the request here, or forwards it to the owner (or the placed host), or answers
  // host_unavailable.
  kj::Promise<void> route_in_cluster(const Route& route, Request req, std::string id, bool create,
                                     kj::HttpMethod method, kj::StringPtr url,
                                     const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                                     kj::HttpService::Response& response, Clock::time_point t0,
                                     bool head);
  std::unique_ptr<Peers> peers;  // (cluster mode)
  RpcServer* rpc = nullptr;      // the host's RPC API, which peers reach (cluster mode)

  // A file_body route's spool: a new file of the daemon's (its path, an open descriptor), and
  // the body written into it as it arrives, 1 MiB at a time: its size, or a failure
  // ("file_too_large: ..." past `limit`, "request_timeout: ..." after a pause longer than the
  // body timeout).
  actors::Reply<std::pair<std::string, int>> spool_file();
  kj::Promise<uint64_t> spool(kj::AsyncInputStream& in, int fd, uint64_t limit, uint64_t so_far);

  // Fires `stop` when the client on `fd` hangs up (checked twice a second) while the promise lives.
  kj::Promise<void> watch_hangup(int fd, std::shared_ptr<std::stop_source> stop);
  // `p`, cancelled when the client on `fd` (-1: none known) hangs up first (a forward to the
  // owner: the cancelled call cancels the command there).
  kj::Promise<void> until_hangup(int fd, kj::Promise<void> p);

  // Event loop side.
  template <typename T>
  kj::Promise<T> offload(std::function<T()> f, T overloaded) {
    return pool->offload<T>(std::move(f), std::move(overloaded));
  }
  kj::Promise<void> send(kj::HttpService::Response& response, HttpReply r, Clock::time_point t0,
                         bool head = false);
  void count_response(const HttpReply& r);
  kj::Promise<void> stream(const Route& route, Request req, kj::HttpService::Response& response,
                           Clock::time_point t0);
  // E2B's server-streaming Connect calls (process Start/Connect): envelopes, always 200.
  kj::Promise<void> connect_stream(const Route& route, Request req,
                                   kj::HttpService::Response& response, Clock::time_point t0);
  kj::Promise<void> websocket(const Route& route, Request req, kj::HttpService::Response& response,
                              Clock::time_point t0);
  // Answers with what the channel's producer decides: its early reply, or a 200 stream of
  // `content_type` pumped from the channel.
  kj::Promise<void> respond(std::shared_ptr<StreamChannel> ch, kj::HttpService::Response& response,
                            Clock::time_point t0, std::string content_type);
  kj::Promise<bool> wait_channel(std::shared_ptr<StreamChannel> ch);
  kj::Promise<void> pump(std::shared_ptr<StreamChannel> ch, kj::AsyncOutputStream& out);

  // Worker side: blocking runtime calls.
  actors::KeyInfo auth(const Request& r);
  // The key, then the sandbox named by {id} (another tenant's is sandbox_not_found), then the
  // route's query parameters are checked, in that order, before anything else.
  Call admit(const Route& route, const Request& r);
  HttpReply handle(const Route& route, const Request& r);
  // An error reply in the route's style (E2B's shapes for the E2B surface).
  HttpReply restyle(const Route& route, HttpReply r);
  void produce(const Route& route, const Request& r, StreamChannel& ch);
  void produce_build(const std::string& tenant, const std::string& name, StreamChannel& ch);
  std::string guest_path(const Request& r, const char* name = "path");
  std::string checked_path(const std::string& p);
  vmm::ExecRequest exec_request(const Json& j, bool with_timeout);
  std::string metrics();
  std::string openapi() const;
  void observe_exec(Clock::time_point t0);
};

}  // namespace pandastack::gateway
