#include "gateway/rest.h"

#include <kj/compat/url.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "actors/event_codec.h"
#include "gateway/http_util.h"
#include "gateway/worker_pool.h"
#include "wire/json.h"

namespace pandastack::gateway {

namespace {

using actors::Rejection;
using actors::Reply;
using wire::Json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// A complete response, built on a worker thread.
struct HttpReply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string error_code;  // for metrics and logs
};

HttpReply json_reply(unsigned status, const Json& j) {
  return {status, "application/json", j.dump(), ""};
}

HttpReply error_reply(const std::string& code, const std::string& message) {
  return {status_for(code), "application/json", error_body(code, message), code};
}

HttpReply no_content() { return {204, "", "", ""}; }

// Thrown by request parsing helpers; becomes an error reply.
struct ApiError {
  std::string code, message;
};

// One parsed request, handed to a worker thread.
struct Request {
  kj::HttpMethod method;
  std::string route;  // the pattern, e.g. "/v1/sandboxes/{id}"
  std::map<std::string, std::string> params;
  std::multimap<std::string, std::string> query;
  std::string authorization;
  std::string body;

  std::string param(const std::string& k) const {
    auto it = params.find(k);
    return it == params.end() ? "" : it->second;
  }
  std::optional<std::string> q(const std::string& k) const {
    auto it = query.find(k);
    if (it == query.end()) return std::nullopt;
    return it->second;
  }
  Json json() const {
    if (body.empty()) return Json::object();
    Json::ParseError err;
    auto j = Json::parse(body, &err);
    if (!j)
      throw ApiError{"invalid_json", "request body is not valid JSON (at byte " +
                                         std::to_string(err.offset) + ": " + err.message + ")"};
    if (!j->is_object()) throw ApiError{"invalid_json", "request body must be a JSON object"};
    return *j;
  }
};

// Typed access to request JSON with clear errors; unknown fields are refused.
class Fields {
 public:
  Fields(Json j, std::initializer_list<const char*> known) : j_(std::move(j)) {
    for (auto& [k, v] : j_.as_object()) {
      bool ok = false;
      for (auto* n : known) ok |= k == n;
      if (!ok) throw ApiError{"invalid_argument", "unknown field '" + k + "'"};
    }
  }
  bool has(const char* k) const { return j_.has(k) && !j_[k].is_null(); }
  std::string str(const char* k, std::string def = "") const {
    if (!has(k)) return def;
    if (!j_[k].is_string())
      throw ApiError{"invalid_argument", std::string(k) + " must be a string"};
    return j_[k].as_string();
  }
  bool boolean(const char* k, bool def = false) const {
    if (!has(k)) return def;
    if (!j_[k].is_bool()) throw ApiError{"invalid_argument", std::string(k) + " must be a boolean"};
    return j_[k].as_bool();
  }
  int64_t integer(const char* k, int64_t def, int64_t lo, int64_t hi) const {
    if (!has(k)) return def;
    if (!j_[k].is_integer())
      throw ApiError{"invalid_argument", std::string(k) + " must be an integer"};
    auto v = j_[k].as_int();
    if (v < lo || v > hi)
      throw ApiError{"invalid_argument", std::string(k) + " must be within " + std::to_string(lo) +
                                             ".." + std::to_string(hi)};
    return v;
  }
  std::map<std::string, std::string> string_map(const char* k) const {
    std::map<std::string, std::string> out;
    if (!has(k)) return out;
    if (!j_[k].is_object())
      throw ApiError{"invalid_argument", std::string(k) + " must be an object of strings"};
    for (auto& [mk, mv] : j_[k].as_object()) {
      if (!mv.is_string())
        throw ApiError{"invalid_argument", std::string(k) + "." + mk + " must be a string"};
      out[mk] = mv.as_string();
    }
    return out;
  }
  // A nested object (validated as one); an empty object when absent.
  Json object(const char* k) const {
    if (!has(k)) return Json::object();
    if (!j_[k].is_object())
      throw ApiError{"invalid_argument", std::string(k) + " must be an object"};
    return j_[k];
  }
  std::vector<std::string> string_list(const char* k) const {
    std::vector<std::string> out;
    if (!has(k)) return out;
    if (!j_[k].is_array())
      throw ApiError{"invalid_argument", std::string(k) + " must be an array of strings"};
    for (auto& v : j_[k].as_array()) {
      if (!v.is_string())
        throw ApiError{"invalid_argument", std::string(k) + " must be an array of strings"};
      out.push_back(v.as_string());
    }
    return out;
  }

 private:
  Json j_;
};

// {"mode": "deny_all"|"allow_all"|"allowlist", "cidrs": [...], "domains": [...]}
actors::Egress egress_from(const Json& j) {
  Fields f(j, {"mode", "cidrs", "domains"});
  actors::Egress e;
  e.cidrs = f.string_list("cidrs");
  e.domains = f.string_list("domains");
  e.mode = f.str("mode", e.cidrs.empty() && e.domains.empty() ? "deny_all" : "allowlist");
  return e;
}

template <typename T>
T unwrap(Reply<T> r) {
  if (!r) throw ApiError{r.error().code, r.error().message};
  return std::move(*r);
}

Json sandbox_json(const actors::SandboxInfo& i) {
  Json j = Json::object();
  j.set("id", i.id);
  j.set("template", i.template_name);
  j.set("state", actors::to_string(i.status));
  j.set("created_at_ms", i.created_at_ms);
  j.set("expires_at_ms", i.expires_at_ms);
  j.set("persistent", i.persistent);
  j.set("auto_wake", i.auto_wake);
  j.set("ttl_seconds", i.ttl_seconds);
  j.set("idle_timeout_seconds", i.idle_timeout_seconds);
  j.set("on_timeout", i.on_timeout == actors::ReapAction::kill ? "kill" : "hibernate");
  Json m = Json::object();
  for (auto& [k, v] : i.metadata) m.set(k, v);
  j.set("metadata", m);
  if (!i.parent.empty()) j.set("parent", i.parent);
  Json snaps = Json::array();
  for (auto& s : i.snapshots) snaps.push(s);
  j.set("snapshots", snaps);
  if (!i.failure_reason.empty()) j.set("failure_reason", i.failure_reason);
  j.set("tenant", i.tenant);
  j.set("version", i.version);  // events in the sandbox's stream
  j.set("network", i.network);
  if (i.network) {
    j.set("egress", actors::egress_json(i.egress));
    Json ports = Json::array();
    for (auto p : i.ports) ports.push(p);
    j.set("ports", ports);  // exposed guest ports (GET .../ports has their host addresses)
  }
  return j;
}

void set_output(Json& j, const char* name, const std::string& data, bool truncated) {
  bool utf8 = wire::is_valid_utf8(data);
  j.set(name, utf8 ? data : base64_encode(data));
  j.set(std::string(name) + "_encoding", utf8 ? "utf-8" : "base64");
  j.set(std::string(name) + "_truncated", truncated);
}

Json exec_json(const vmm::ExecResult& r) {
  Json j = Json::object();
  set_output(j, "stdout", r.stdout_data, r.stdout_truncated);
  set_output(j, "stderr", r.stderr_data, r.stderr_truncated);
  j.set("exit_code", r.exit_code);
  j.set("timed_out", r.timed_out);
  j.set("duration_ms", double(r.duration_us) / 1000.0);
  return j;
}

// `{name: [to_json(item)...]}` with status 200.
template <typename T, typename F>
HttpReply list_reply(const char* name, const std::vector<T>& items, F&& to_json) {
  Json list = Json::array();
  for (auto& x : items) list.push(to_json(x));
  Json j = Json::object();
  j.set(name, list);
  return json_reply(200, j);
}

Json stat_json(const vmm::FileStat& s) {
  static const char* types[] = {"file", "directory", "symlink", "other"};
  Json j = Json::object();
  j.set("name", s.name);
  j.set("type", types[int(s.type)]);
  j.set("size", s.size);
  j.set("mode", s.mode);
  j.set("mtime_ms", s.mtime_ms);
  return j;
}

Json audit_json(const actors::AuditEvent& e) {
  Json j = Json::object();
  j.set("sandbox", e.stream);
  j.set("version", e.version);
  j.set("seq", e.global_seq);
  j.set("time_ms", e.time_ms);
  j.set("type", e.type);
  auto ev = Json::parse(e.json);
  j.set("event", ev ? *ev : Json());
  return j;
}

// One chunk of command output: {"data": ...}, base64 with "encoding" when it is not UTF-8.
Json chunk_json(std::string_view d) {
  Json j = Json::object();
  bool utf8 = wire::is_valid_utf8(d);
  j.set("data", utf8 ? std::string(d) : base64_encode(d));
  if (!utf8) j.set("encoding", "base64");
  return j;
}

std::string sse_frame(const std::string& event, const Json& data) {
  return "event: " + event + "\ndata: " + data.dump() + "\n\n";
}

// Output chunks travel from a driver thread to the event loop through this channel.
struct StreamChannel {
  std::mutex mu;
  std::string pending;  // SSE frames not yet written
  bool started = false, done = false;
  std::optional<HttpReply> early;  // an error before the stream began: a normal reply
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter;
  std::stop_source stop;  // cancels the command in the guest
  size_t limit;
  bool overflowed = false;

  explicit StreamChannel(size_t l) : limit(l) {}

  void wake() {
    if (waiter) {
      waiter->fulfill();
      waiter = nullptr;
    }
  }
  void push(std::string frame) {
    std::lock_guard l(mu);
    if (pending.size() + frame.size() > limit) {
      if (!overflowed) {
        overflowed = true;
        stop.request_stop();  // the client reads too slowly: end the command
      }
      return;
    }
    pending += frame;
    wake();
  }
  void begin() {
    std::lock_guard l(mu);
    started = true;
    wake();
  }
  void fail_early(HttpReply r) {
    std::lock_guard l(mu);
    early = std::move(r);
    done = true;
    wake();
  }
  void finish(std::string frame) {
    std::lock_guard l(mu);
    pending += frame;
    done = true;
    wake();
  }
};

struct Route {
  kj::HttpMethod method;
  std::string pattern;
  RoutePattern compiled;
  std::string summary;
  enum class Kind { json, stream, raw_body, websocket } kind = Kind::json;
  bool auth = true;
};

const char* method_name(kj::HttpMethod m) {
  switch (m) {
    case kj::HttpMethod::GET:
      return "get";
    case kj::HttpMethod::POST:
      return "post";
    case kj::HttpMethod::PUT:
      return "put";
    case kj::HttpMethod::DELETE:
      return "delete";
    case kj::HttpMethod::PATCH:
      return "patch";
    default:
      return "other";
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct Gateway::Impl final : public kj::HttpService {
  actors::Runtime& rt;
  kj::Timer& timer;
  Limits limits;
  kj::HttpHeaderTable::Builder builder;
  kj::HttpHeaderId h_authorization, h_server_timing, h_cache_control;
  kj::Own<kj::HttpHeaderTable> table;
  kj::Own<kj::HttpServer> server;
  std::vector<Route> routes;
  std::unique_ptr<WorkerPool> pool;

  // Metrics.
  std::mutex metrics_mu;
  std::map<std::string, uint64_t> errors_by_code;
  std::map<unsigned, uint64_t> responses_by_status;
  uint64_t creates = 0, execs = 0;
  Histogram create_latency{{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram exec_latency{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30}};

  Impl(actors::Runtime& r, kj::Timer& t, Limits l)
      : rt(r),
        timer(t),
        limits(l),
        h_authorization(builder.add("Authorization")),
        h_server_timing(builder.add("Server-Timing")),
        h_cache_control(builder.add("Cache-Control")),
        table(builder.build()) {
    kj::HttpServerSettings settings;
    server = kj::heap<kj::HttpServer>(timer, *table, *this, settings);
    pool = std::make_unique<WorkerPool>(limits.worker_threads, limits.max_queued_requests);
    using M = kj::HttpMethod;
    using K = Route::Kind;
    auto add = [&](M m, const char* p, const char* summary, K kind = K::json, bool auth = true) {
      routes.push_back({m, p, RoutePattern(p), summary, kind, auth});
    };
    add(M::GET, "/healthz", "Liveness", K::json, false);
    add(M::GET, "/metrics", "Prometheus metrics", K::json, false);
    add(M::GET, "/openapi.json", "This document", K::json, false);
    add(M::GET, "/v1/templates", "List templates");
    add(M::POST, "/v1/sandboxes", "Create a sandbox");
    add(M::GET, "/v1/sandboxes", "List sandboxes (?state=, ?metadata.KEY=VALUE)");
    add(M::GET, "/v1/sandboxes/{id}", "Get a sandbox");
    add(M::PATCH, "/v1/sandboxes/{id}", "Change ttl_seconds, metadata or the egress policy");
    add(M::DELETE, "/v1/sandboxes/{id}", "Kill a sandbox");
    add(M::POST, "/v1/sandboxes/{id}/exec", "Run a command to completion");
    add(M::POST, "/v1/sandboxes/{id}/exec/stream", "Run a command, output as server-sent events",
        K::stream);
    add(M::GET, "/v1/sandboxes/{id}/exec/ws",
        "Run a command over a WebSocket: output out, stdin in; closing kills it", K::websocket);
    add(M::POST, "/v1/sandboxes/{id}/processes", "Start a background process");
    add(M::GET, "/v1/sandboxes/{id}/processes", "List background processes");
    add(M::GET, "/v1/sandboxes/{id}/processes/{pid}/stream",
        "A background process's output as server-sent events", K::stream);
    add(M::DELETE, "/v1/sandboxes/{id}/processes/{pid}", "Signal a background process");
    add(M::GET, "/v1/sandboxes/{id}/files", "Read a file (?path=), raw bytes");
    add(M::PUT, "/v1/sandboxes/{id}/files", "Write a file (?path=), raw bytes", K::raw_body);
    add(M::DELETE, "/v1/sandboxes/{id}/files", "Remove a file or folder (?path=, ?recursive=1)");
    add(M::GET, "/v1/sandboxes/{id}/files/list", "List a folder (?path=)");
    add(M::GET, "/v1/sandboxes/{id}/files/stat", "Stat a path (?path=)");
    add(M::POST, "/v1/sandboxes/{id}/files/mkdir", "Make a folder");
    add(M::POST, "/v1/sandboxes/{id}/files/rename", "Rename a path");
    add(M::POST, "/v1/sandboxes/{id}/snapshots", "Snapshot a running sandbox");
    add(M::DELETE, "/v1/snapshots/{snapshot_id}",
        "Delete a snapshot (creates from it are refused afterwards)");
    add(M::POST, "/v1/sandboxes/{id}/fork", "Fork a running sandbox into count children");
    add(M::POST, "/v1/sandboxes/{id}/hibernate", "Hibernate a sandbox");
    add(M::POST, "/v1/sandboxes/{id}/wake", "Wake a hibernated sandbox");
    add(M::GET, "/v1/sandboxes/{id}/events", "The sandbox's audit events (?follow=1: SSE)",
        K::stream);
    add(M::POST, "/v1/sandboxes/{id}/ports", "Expose a guest TCP port on a host address");
    add(M::GET, "/v1/sandboxes/{id}/ports", "Exposed guest ports and their host addresses");
    add(M::DELETE, "/v1/sandboxes/{id}/ports/{port}", "Stop exposing a guest port");
    add(M::GET, "/v1/audit", "The audit log (?after=, ?from_ms=, ?to_ms=, ?limit=)");
    add(M::GET, "/v1/keys", "List API keys (admin)");
    add(M::POST, "/v1/keys", "Create an API key for a tenant (admin)");
    add(M::DELETE, "/v1/keys/{key_id}", "Revoke an API key (admin)");
  }

  // Fires at shutdown: commands in flight are cancelled so the workers can be joined.
  std::stop_source shutting_down;

  ~Impl() {
    shutting_down.request_stop();
    pool.reset();  // waits for the runtime calls in flight
  }

  // -------------------------------------------------------------------------------------------
  // Event loop side.

  template <typename T>
  kj::Promise<T> offload(std::function<T()> f, T overloaded) {
    return pool->offload<T>(std::move(f), std::move(overloaded));
  }

  kj::Promise<void> send(kj::HttpService::Response& response, HttpReply r, Clock::time_point t0) {
    count_response(r);
    kj::HttpHeaders headers(*table);
    if (!r.content_type.empty())
      headers.set(kj::HttpHeaderId::CONTENT_TYPE, kj::str(r.content_type.c_str()));
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    headers.set(h_server_timing, kj::str("total;dur=", ms));
    auto body = kj::heapString(r.body.data(), r.body.size());
    if (r.status == 204) {
      response.send(204, "No Content", headers, uint64_t(0));
      return kj::READY_NOW;
    }
    auto stream = response.send(r.status, status_text(r.status), headers, uint64_t(body.size()));
    if (body.size() == 0) return kj::READY_NOW;
    auto p = stream->write(body.begin(), body.size());
    return p.attach(kj::mv(body), kj::mv(stream));
  }

  static kj::StringPtr status_text(unsigned s) {
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
      case 409:
        return "Conflict";
      case 413:
        return "Payload Too Large";
      case 429:
        return "Too Many Requests";
      case 501:
        return "Not Implemented";
      case 502:
        return "Bad Gateway";
      case 504:
        return "Gateway Timeout";
      default:
        return s < 400 ? "OK" : "Error";
    }
  }

  void count_response(const HttpReply& r) {
    std::lock_guard l(metrics_mu);
    ++responses_by_status[r.status];
    if (!r.error_code.empty()) ++errors_by_code[r.error_code];
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            kj::HttpService::Response& response) override {
    auto t0 = Clock::now();
    auto parsed = kj::Url::tryParse(url, kj::Url::HTTP_REQUEST);
    Request req;
    req.method = method;
    std::vector<std::string> segments;
    KJ_IF_MAYBE (u, parsed) {
      for (auto& s : u->path) segments.emplace_back(s.cStr());
      for (auto& q : u->query) req.query.emplace(q.name.cStr(), q.value.cStr());
    } else {
      return send(response, error_reply("invalid_argument", "malformed URL"), t0);
    }
    const Route* route = nullptr;
    bool path_matched = false;
    for (auto& r : routes) {
      std::map<std::string, std::string> params;
      if (!r.compiled.match(segments, params)) continue;
      path_matched = true;
      if (r.method != method) continue;
      route = &r;
      req.params = std::move(params);
      break;
    }
    if (!route) {
      if (path_matched)
        return send(response, error_reply("method_not_allowed", "method not allowed here"), t0);
      return send(response, error_reply("route_not_found", "no route for this path"), t0);
    }
    req.route = route->pattern;
    KJ_IF_MAYBE (a, headers.get(h_authorization)) {
      req.authorization = a->cStr();
    }
    size_t limit =
        route->kind == Route::Kind::raw_body ? limits.max_file_bytes : limits.max_body_bytes;
    KJ_IF_MAYBE (len, body.tryGetLength()) {
      if (*len > limit)
        return send(
            response,
            error_reply(route->kind == Route::Kind::raw_body ? "file_too_large" : "body_too_large",
                        "request body is larger than " + std::to_string(limit) + " bytes"),
            t0);
    }
    auto kind = route->kind;
    if (kind == Route::Kind::websocket && !headers.isWebSocket())
      return send(response,
                  error_reply("invalid_argument", "this route needs a WebSocket upgrade request"),
                  t0);
    return body.readAllBytes(limit + 1).then(
        [this, req = std::move(req), kind, limit, t0,
         &response](kj::Array<kj::byte> bytes) mutable -> kj::Promise<void> {
          if (bytes.size() > limit)
            return send(response,
                        error_reply("body_too_large", "request body is larger than " +
                                                          std::to_string(limit) + " bytes"),
                        t0);
          req.body.assign(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
          if (kind == Route::Kind::stream) return stream(std::move(req), response, t0);
          if (kind == Route::Kind::websocket) return websocket(std::move(req), response, t0);
          auto r = std::make_shared<Request>(std::move(req));
          return offload<HttpReply>([this, r] { return handle(*r); },
                                    error_reply("too_many_requests", "the server is busy"))
              .then([this, &response, t0](HttpReply rep) {
                return send(response, std::move(rep), t0);
              });
        },
        [this, &response, t0](kj::Exception&& e) -> kj::Promise<void> {
          return send(response,
                      error_reply("body_too_large", "request body rejected: " +
                                                        std::string(e.getDescription().cStr())),
                      t0);
        });
  }

  // Server-sent events: a worker produces frames into a channel; the loop writes them.
  kj::Promise<void> stream(Request req, kj::HttpService::Response& response, Clock::time_point t0) {
    auto ch = std::make_shared<StreamChannel>(limits.max_stream_buffer_bytes);
    auto r = std::make_shared<Request>(std::move(req));
    if (r->route == "/v1/sandboxes/{id}/events" && r->q("follow") != "1") {
      return offload<HttpReply>([this, r] { return handle(*r); },
                                error_reply("too_many_requests", "the server is busy"))
          .then(
              [this, &response, t0](HttpReply rep) { return send(response, std::move(rep), t0); });
    }
    bool queued = pool->submit([this, r, ch] { produce(*r, *ch); });
    if (!queued) return send(response, error_reply("too_many_requests", "the server is busy"), t0);
    // When this promise ends for any reason (done, client gone, shutdown), the command stops.
    auto guard = kj::defer([ch] { ch->stop.request_stop(); });
    return wait_channel(ch)
        .then([this, ch, &response, t0](bool) -> kj::Promise<void> {
          std::unique_lock l(ch->mu);
          if (ch->early) {
            auto rep = std::move(*ch->early);
            l.unlock();
            return send(response, std::move(rep), t0);
          }
          l.unlock();
          HttpReply ok{200, "text/event-stream", "", ""};
          count_response(ok);
          kj::HttpHeaders headers(*table);
          headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream");
          headers.set(h_cache_control, "no-cache");
          auto out = response.send(200, "OK", headers);
          auto& ref = *out;
          return pump(ch, ref).attach(kj::mv(out));
        })
        .attach(kj::mv(guard));
  }

  // WebSocket exec: the key and the sandbox are checked first (a normal error reply if they fail),
  // then the upgrade. Protocol (text frames are JSON):
  //   client -> {"cmd": ...} or {"argv": [...]} (+ env, cwd, timeout_seconds): the command
  //   server -> {"type":"started","pid":N}
  //   server -> {"type":"stdout"|"stderr","data":"..."[,"encoding":"base64"]} ...
  //   client -> binary frames or {"type":"stdin","data":"..."}: stdin; {"type":"close_stdin"}
  //   server -> {"type":"exit","exit_code":N,"timed_out":false} or {"type":"error",...}, close
  // The command runs as a background process with stdin kept open; when the client closes or
  // goes away, it is killed.
  struct WsSession {
    Impl& gw;
    kj::Own<kj::WebSocket> ws;
    std::string tenant, id;
    uint32_t pid = 0;
    std::shared_ptr<CrossThreadQueue<std::string>> out =
        std::make_shared<CrossThreadQueue<std::string>>();
    std::shared_ptr<std::stop_source> stop = std::make_shared<std::stop_source>();

    struct Outcome {
      bool ok = true;
      std::string code, message;
      uint32_t pid = 0;
    };

    kj::Promise<void> send_text(std::string text) {
      auto owned = kj::heapString(text.data(), text.size());
      auto p = ws->send(owned.asArray());
      return p.attach(kj::mv(owned));
    }
    kj::Promise<void> fail(const std::string& code, const std::string& message) {
      Json e = Json::object();
      e.set("type", "error");
      e.set("code", code);
      e.set("message", message);
      return send_text(e.dump())
          .then([this] { return ws->close(1011, "error"); })
          .catch_([](kj::Exception&&) {});
    }

    kj::Promise<void> run() {
      return ws->receive(gw.limits.max_body_bytes)
          .then([this](kj::WebSocket::Message&& m) -> kj::Promise<void> {
            if (!m.is<kj::String>())
              return fail("invalid_argument", "the first message must be the command as JSON text");
            vmm::ExecRequest req;
            try {
              auto j = Json::parse(m.get<kj::String>().cStr());
              if (!j || !j->is_object())
                throw ApiError{"invalid_json", "the command is not a JSON object"};
              req = gw.exec_request(*j, true);
            } catch (const ApiError& e) {
              return fail(e.code, e.message);
            }
            req.keep_stdin_open = true;
            return gw.pool
                ->offload<Outcome>(
                    [rt = &gw.rt, t = tenant, i = id, req] {
                      auto r = rt->start_process(t, i, req);
                      if (!r) return Outcome{false, r.error().code, r.error().message, 0};
                      return Outcome{true, "", "", *r};
                    },
                    Outcome{false, "too_many_requests", "the server is busy", 0})
                .then([this](Outcome o) -> kj::Promise<void> {
                  if (!o.ok) return fail(o.code, o.message);
                  pid = o.pid;
                  start_output();
                  Json j = Json::object();
                  j.set("type", "started");
                  j.set("pid", pid);
                  return send_text(j.dump()).then([this] {
                    return pump_out().exclusiveJoin(read_in().then([this] { return kill(); }));
                  });
                });
          })
          .catch_([this](kj::Exception&&) { return kill(); });  // the client went away
    }

    // The process's output, streamed on a worker into the queue.
    void start_output() {
      bool queued = gw.pool->submit([rt = &gw.rt, t = tenant, i = id, p = pid, q = out, st = stop,
                                     shutdown = gw.shutting_down.get_token()] {
        std::stop_callback on_shutdown(shutdown, [st] { st->request_stop(); });
        auto r = rt->stream_process(
            t, i, p,
            [q](vmm::StreamKind k, std::string_view d) {
              Json j = chunk_json(d);
              j.set("type", k == vmm::StreamKind::out ? "stdout" : "stderr");
              q->push(j.dump());
            },
            st->get_token());
        Json j = Json::object();
        if (r) {
          j.set("type", "exit");
          j.set("exit_code", r->exit_code);
          j.set("timed_out", r->timed_out);
        } else {
          j.set("type", "error");
          j.set("code", r.error().code);
          j.set("message", r.error().message);
        }
        q->push(j.dump());
        q->close();
      });
      if (!queued) out->close();
    }

    kj::Promise<void> pump_out() {
      return out->ready().then([this]() -> kj::Promise<void> {
        auto [items, closed] = out->take();
        kj::Promise<void> p = kj::READY_NOW;
        for (auto& text : items)
          p = p.then(
              [this, text = std::move(text)]() mutable { return send_text(std::move(text)); });
        if (closed) return p.then([this] { return ws->close(1000, "exit"); });
        return p.then([this] { return pump_out(); });
      });
    }

    // Stdin from the client until it closes; each write completes before the next is read.
    kj::Promise<void> read_in() {
      return ws->receive(gw.limits.max_body_bytes)
          .then([this](kj::WebSocket::Message&& m) -> kj::Promise<void> {
            if (m.is<kj::WebSocket::Close>()) return kj::READY_NOW;
            std::string data;
            bool close = false;
            if (m.is<kj::Array<kj::byte>>()) {
              auto& b = m.get<kj::Array<kj::byte>>();
              data.assign(reinterpret_cast<const char*>(b.begin()), b.size());
            } else {
              auto j = Json::parse(m.get<kj::String>().cStr());
              std::string type =
                  j && j->is_object() && (*j)["type"].is_string() ? (*j)["type"].as_string() : "";
              if (type == "stdin" && (*j)["data"].is_string())
                data = (*j)["data"].as_string();
              else if (type == "close_stdin")
                close = true;
              else
                return read_in();  // unknown messages are ignored
            }
            return gw.pool
                ->offload<bool>([rt = &gw.rt, t = tenant, i = id, p = pid, data,
                                 close] { return bool(rt->write_stdin(t, i, p, data, close)); },
                                false)
                .then([this](bool) { return read_in(); });
          });
    }

    kj::Promise<void> kill() {
      stop->request_stop();
      if (pid == 0) return kj::READY_NOW;
      return gw.pool
          ->offload<bool>([rt = &gw.rt, t = tenant, i = id,
                           p = pid] { return bool(rt->kill_process(t, i, p)); },
                          false)
          .then([](bool) {});
    }
  };

  kj::Promise<void> websocket(Request req, kj::HttpService::Response& response,
                              Clock::time_point t0) {
    auto r = std::make_shared<Request>(std::move(req));
    return offload<HttpReply>(
               [this, r] {
                 try {
                   auto key = auth(*r);
                   unwrap(rt.get(key.tenant, r->param("id")));
                   return HttpReply{101, "", key.tenant, ""};
                 } catch (const ApiError& e) {
                   return error_reply(e.code, e.message);
                 }
               },
               error_reply("too_many_requests", "the server is busy"))
        .then([this, r, &response, t0](HttpReply rep) -> kj::Promise<void> {
          if (rep.status != 101) return send(response, std::move(rep), t0);
          count_response(rep);
          kj::HttpHeaders headers(*table);
          auto session = kj::heap<WsSession>(
              WsSession{*this, response.acceptWebSocket(headers), rep.body, r->param("id")});
          auto p = session->run();
          return p.attach(kj::mv(session));
        });
  }

  // Resolves when the channel has news (true) or the keepalive interval passed (false).
  kj::Promise<bool> wait_channel(std::shared_ptr<StreamChannel> ch) {
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    bool started;
    {
      std::lock_guard l(ch->mu);
      if (ch->early || ch->done || (ch->started && !ch->pending.empty())) return true;
      started = ch->started;
      ch->waiter = kj::mv(paf.fulfiller);
    }
    auto news = paf.promise.then([] { return true; });
    if (!started) return news;  // the worker decides first (reply or stream)
    return news.exclusiveJoin(
        timer.afterDelay(limits.sse_keepalive.count() * kj::MILLISECONDS).then([] {
          return false;
        }));
  }

  kj::Promise<void> pump(std::shared_ptr<StreamChannel> ch, kj::AsyncOutputStream& out) {
    return wait_channel(ch).then([this, ch, &out](bool news) -> kj::Promise<void> {
      std::string data;
      bool done;
      {
        std::lock_guard l(ch->mu);
        data.swap(ch->pending);
        done = ch->done;
      }
      if (!news && data.empty()) data = ": keepalive\n\n";  // also finds clients that left
      if (data.empty() && done) return kj::READY_NOW;
      auto buf = kj::heapString(data.data(), data.size());
      auto w = out.write(buf.begin(), buf.size()).attach(kj::mv(buf));
      if (done) return w;
      return w.then([this, ch, &out] { return pump(ch, out); });
    });
  }

  // -------------------------------------------------------------------------------------------
  // Worker side: blocking runtime calls.

  actors::KeyInfo auth(const Request& r) {
    static const std::string prefix = "Bearer ";
    if (r.authorization.rfind(prefix, 0) != 0)
      throw ApiError{"unauthorized", "missing 'Authorization: Bearer pds_...' header"};
    return unwrap(rt.authenticate(r.authorization.substr(prefix.size())));
  }

  std::string guest_path(const Request& r, const char* name = "path") {
    auto p = r.q(name);
    if (!p)
      throw ApiError{"invalid_path", std::string("query parameter '") + name + "' is required"};
    if (auto e = check_guest_path(*p, limits.max_path_bytes)) throw ApiError{"invalid_path", *e};
    return *p;
  }

  std::string checked_path(const std::string& p) {
    if (auto e = check_guest_path(p, limits.max_path_bytes)) throw ApiError{"invalid_path", *e};
    return p;
  }

  vmm::ExecRequest exec_request(const Json& j, bool with_timeout) {
    Fields f(j, {"cmd", "argv", "env", "cwd", "stdin", "timeout_seconds"});
    vmm::ExecRequest e;
    e.shell = f.str("cmd");
    e.argv = f.string_list("argv");
    e.stdin_data = f.str("stdin");
    e.env = f.string_map("env");
    e.cwd = f.str("cwd");
    if (auto refused = check_exec(e, limits)) throw ApiError{refused->code, refused->message};
    if (with_timeout) {
      e.timeout_ms = uint32_t(f.integer("timeout_seconds", limits.default_exec_timeout_s, 1,
                                        limits.max_exec_timeout_s)) *
                     1000;
    } else if (f.has("timeout_seconds")) {
      e.timeout_ms = uint32_t(f.integer("timeout_seconds", 0, 1, limits.max_exec_timeout_s)) * 1000;
    }
    return e;
  }

  HttpReply handle(const Request& r) {
    try {
      return dispatch(r);
    } catch (const ApiError& e) {
      return error_reply(e.code, e.message);
    } catch (const std::exception& e) {
      spdlog::error("gateway: {} {}: {}", method_name(r.method), r.route, e.what());
      return error_reply("internal", e.what());
    }
  }

  HttpReply dispatch(const Request& r) {
    using M = kj::HttpMethod;
    const auto& route = r.route;
    if (route == "/healthz") {
      Json j = Json::object();
      j.set("status", "ok");
      return json_reply(200, j);
    }
    if (route == "/metrics") return {200, "text/plain; version=0.0.4", metrics(), ""};
    if (route == "/openapi.json") return {200, "application/json", openapi(), ""};

    auto key = auth(r);
    const std::string& tenant = key.tenant;
    std::string id = r.param("id");
    // Another tenant's sandbox does not exist for this key: 404 before anything else is looked at.
    if (!id.empty()) unwrap(rt.get(tenant, id));

    if (route == "/v1/templates") {
      return list_reply("templates", rt.templates(), [](const actors::TemplateInfo& t) {
        Json j = Json::object();
        j.set("name", t.name);
        j.set("baked", t.baked);
        return j;
      });
    }
    if (route == "/v1/sandboxes" && r.method == M::POST) {
      Fields f(r.json(), {"template", "ttl_seconds", "metadata", "persistent", "auto_wake",
                          "from_snapshot", "network", "egress", "idle_timeout_seconds",
                          "on_timeout"});
      actors::CreateRequest c;
      c.tenant = tenant;
      c.template_name = f.str("template", "base");
      c.ttl_seconds = uint32_t(f.integer("ttl_seconds", 0, 1, UINT32_MAX));
      c.metadata = f.string_map("metadata");
      c.persistent = f.boolean("persistent");
      c.auto_wake = f.boolean("auto_wake");
      c.idle_timeout_seconds = uint32_t(f.integer("idle_timeout_seconds", 0, 0, UINT32_MAX));
      if (f.has("on_timeout")) {
        auto a = f.str("on_timeout");
        if (a != "kill" && a != "hibernate")
          throw ApiError{"invalid_argument", "on_timeout must be \"kill\" or \"hibernate\""};
        c.on_timeout = a == "kill" ? actors::ReapAction::kill : actors::ReapAction::hibernate;
      }
      c.from_snapshot = f.str("from_snapshot");
      if (f.has("network")) c.network = f.boolean("network");
      if (f.has("egress")) c.egress = egress_from(f.object("egress"));
      auto t0 = Clock::now();
      auto created = rt.create(c);
      if (!created && created.error().code == "sandbox_failed")
        throw ApiError{"start_failed", created.error().message};
      auto s = unwrap(std::move(created));
      {
        std::lock_guard l(metrics_mu);
        ++creates;
        create_latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return json_reply(201, sandbox_json(s));
    }
    if (route == "/v1/sandboxes") {
      std::optional<actors::Status> status;
      std::map<std::string, std::string> metadata;
      bool all_tenants = false;
      for (auto& [k, v] : r.query) {
        if (k == "state") {
          status = actors::status_from_string(v);
          if (!status) throw ApiError{"invalid_argument", "unknown state '" + v + "'"};
        } else if (k == "all" && v == "1") {
          if (!key.admin) throw ApiError{"forbidden", "all=1 needs an admin key"};
          all_tenants = true;
        } else if (k.rfind("metadata.", 0) == 0) {
          metadata[k.substr(9)] = v;
        } else {
          throw ApiError{"invalid_argument", "unknown query parameter '" + k + "'"};
        }
      }
      return list_reply("sandboxes", unwrap(rt.list(all_tenants ? "*" : tenant, status, metadata)),
                        sandbox_json);
    }
    if (route == "/v1/sandboxes/{id}") {
      if (r.method == M::GET) return json_reply(200, sandbox_json(unwrap(rt.get(tenant, id))));
      if (r.method == M::DELETE) return json_reply(200, sandbox_json(unwrap(rt.kill(tenant, id))));
      Fields f(r.json(), {"ttl_seconds", "metadata", "egress"});
      if (!f.has("ttl_seconds") && !f.has("metadata") && !f.has("egress"))
        throw ApiError{"invalid_argument", "give ttl_seconds, metadata and/or egress"};
      // Validate everything before changing anything.
      if (f.has("ttl_seconds")) f.integer("ttl_seconds", 0, 1, UINT32_MAX);
      std::optional<actors::Egress> egress;
      if (f.has("egress")) egress = egress_from(f.object("egress"));
      auto m = f.string_map("metadata");
      actors::SandboxInfo s;
      if (egress) s = unwrap(rt.set_egress(tenant, id, *egress));
      if (f.has("metadata")) s = unwrap(rt.set_metadata(tenant, id, m));
      if (f.has("ttl_seconds"))
        s = unwrap(rt.set_ttl(tenant, id, uint32_t(f.integer("ttl_seconds", 0, 1, UINT32_MAX))));
      return json_reply(200, sandbox_json(s));
    }
    if (route == "/v1/sandboxes/{id}/ports") {
      auto port_json = [](const actors::PortInfo& p) {
        Json j = Json::object();
        j.set("port", p.port);
        j.set("host", p.host);
        if (p.host_port) {
          j.set("host_port", p.host_port);
          j.set("address", p.host + ":" + std::to_string(p.host_port));
        } else {
          j.set("host_port", Json());  // recorded; forwarded again when the sandbox runs
        }
        return j;
      };
      if (r.method == M::GET) return list_reply("ports", unwrap(rt.ports(tenant, id)), port_json);
      Fields f(r.json(), {"port"});
      if (!f.has("port")) throw ApiError{"invalid_argument", "port is required"};
      auto port = uint32_t(f.integer("port", 0, 1, 65535));
      for (auto& p : unwrap(rt.expose_port(tenant, id, port)))
        if (p.port == port) return json_reply(201, port_json(p));
      throw ApiError{"internal", "the exposed port is not listed"};
    }
    if (route == "/v1/sandboxes/{id}/ports/{port}") {
      unwrap(rt.unexpose_port(tenant, id, parse_number(r.param("port"), "port", 1, 65535)));
      return no_content();
    }
    if (route == "/v1/sandboxes/{id}/exec") {
      auto req = exec_request(r.json(), true);
      auto t0 = Clock::now();
      auto res = unwrap(rt.exec(tenant, id, req, shutting_down.get_token()));
      {
        std::lock_guard l(metrics_mu);
        ++execs;
        exec_latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return json_reply(200, exec_json(res));
    }
    if (route == "/v1/sandboxes/{id}/processes" && r.method == M::POST) {
      auto req = exec_request(r.json(), false);
      auto pid = unwrap(rt.start_process(tenant, id, req));
      Json j = Json::object();
      j.set("pid", pid);
      return json_reply(201, j);
    }
    if (route == "/v1/sandboxes/{id}/processes") {
      return list_reply("processes", unwrap(rt.list_processes(tenant, id)),
                        [](const vmm::ProcessInfo& p) {
                          Json j = Json::object();
                          j.set("pid", p.pid);
                          j.set("command", p.command);
                          j.set("running", p.running);
                          j.set("exit_code", p.exit_code);
                          j.set("started_at_ms", p.started_at_ms);
                          return j;
                        });
    }
    if (route == "/v1/sandboxes/{id}/processes/{pid}") {
      uint32_t pid = parse_pid(r.param("pid"));
      int sig = 0;
      if (auto s = r.q("signal")) {
        try {
          sig = std::stoi(*s);
        } catch (...) {
          sig = -1;
        }
        if (sig < 1 || sig > 64) throw ApiError{"invalid_argument", "signal must be 1..64"};
      }
      auto k = rt.kill_process(tenant, id, pid, sig);
      if (!k && k.error().code == "file_not_found")
        throw ApiError{"process_not_found", "no process " + std::to_string(pid)};
      unwrap(std::move(k));
      return no_content();
    }
    if (route == "/v1/sandboxes/{id}/files") {
      auto path = guest_path(r);
      if (r.method == M::GET) {
        auto data = unwrap(rt.read_file(tenant, id, path, limits.max_file_bytes));
        return {200, "application/octet-stream", std::move(data), ""};
      }
      if (r.method == M::PUT) {
        unwrap(rt.write_file(tenant, id, path, r.body));
        Json j = Json::object();
        j.set("path", path);
        j.set("size", uint64_t(r.body.size()));
        return json_reply(200, j);
      }
      unwrap(rt.remove(tenant, id, path, r.q("recursive") == "1"));
      return no_content();
    }
    if (route == "/v1/sandboxes/{id}/files/list") {
      auto path = guest_path(r);
      Json list = Json::array();
      for (auto& s : unwrap(rt.list_dir(tenant, id, path))) list.push(stat_json(s));
      Json j = Json::object();
      j.set("path", path);
      j.set("entries", list);
      return json_reply(200, j);
    }
    if (route == "/v1/sandboxes/{id}/files/stat")
      return json_reply(200, stat_json(unwrap(rt.stat(tenant, id, guest_path(r)))));
    if (route == "/v1/sandboxes/{id}/files/mkdir") {
      Fields f(r.json(), {"path", "parents"});
      unwrap(rt.mkdir(tenant, id, checked_path(f.str("path")), f.boolean("parents", true)));
      return no_content();
    }
    if (route == "/v1/sandboxes/{id}/files/rename") {
      Fields f(r.json(), {"from", "to"});
      unwrap(rt.rename(tenant, id, checked_path(f.str("from")), checked_path(f.str("to"))));
      return no_content();
    }
    if (route == "/v1/sandboxes/{id}/snapshots") {
      Fields f(r.json(), {});
      Json j = Json::object();
      j.set("snapshot_id", unwrap(rt.snapshot(tenant, id)));
      return json_reply(201, j);
    }
    if (route == "/v1/sandboxes/{id}/fork") {
      Fields f(r.json(), {"count"});
      auto kids = unwrap(rt.fork(tenant, id, uint32_t(f.integer("count", 1, 1, 1 << 20))));
      auto reply = list_reply("sandboxes", kids, sandbox_json);
      reply.status = 201;
      return reply;
    }
    if (route == "/v1/sandboxes/{id}/hibernate")
      return json_reply(200, sandbox_json(unwrap(rt.hibernate(tenant, id))));
    if (route == "/v1/sandboxes/{id}/wake")
      return json_reply(200, sandbox_json(unwrap(rt.wake(tenant, id))));
    if (route == "/v1/sandboxes/{id}/events") {
      actors::AuditQuery q;
      q.tenant = tenant;
      q.stream = id;
      q.limit = 100000;
      return list_reply("events", unwrap(rt.audit(q)), audit_json);
    }
    if (route == "/v1/audit") {
      actors::AuditQuery q;
      q.tenant = key.admin && r.q("all") == "1" ? "" : tenant;
      q.after_seq = query_int(r, "after", 0, INT64_MAX);
      q.from_ms = query_int(r, "from_ms", 0, INT64_MAX);
      q.to_ms = query_int(r, "to_ms", 0, INT64_MAX);
      q.limit = size_t(query_int(r, "limit", 1000, 10000));
      Json list = Json::array();
      uint64_t last = q.after_seq;
      for (auto& e : unwrap(rt.audit(q))) {
        list.push(audit_json(e));
        last = e.global_seq;
      }
      Json j = Json::object();
      j.set("events", list);
      j.set("next_after", last);
      return json_reply(200, j);
    }
    if (route == "/v1/snapshots/{snapshot_id}") {
      const std::string& snap = r.param("snapshot_id");
      if (snap.empty() || snap.size() > 64)
        throw ApiError{"snapshot_not_found", "no snapshot " + snap.substr(0, 64)};
      unwrap(rt.delete_snapshot(tenant, snap));
      return no_content();
    }
    // Keys: admin only.
    if (!key.admin) throw ApiError{"forbidden", "this route needs an admin key"};
    if (route == "/v1/keys" && r.method == M::POST) {
      Fields f(r.json(), {"tenant", "admin"});
      auto t = f.str("tenant");
      auto [token, info] = unwrap(rt.create_key(t, f.boolean("admin")));
      Json j = Json::object();
      j.set("id", info.id);
      j.set("key", token);
      j.set("tenant", info.tenant);
      j.set("admin", info.admin);
      spdlog::info("gateway: key {} created for tenant {}", info.id, info.tenant);
      return json_reply(201, j);
    }
    if (route == "/v1/keys") {
      return list_reply("keys", unwrap(rt.list_keys()), [](const actors::KeyInfo& k) {
        Json j = Json::object();
        j.set("id", k.id);
        j.set("tenant", k.tenant);
        j.set("admin", k.admin);
        j.set("created_ms", k.created_ms);
        return j;
      });
    }
    if (route == "/v1/keys/{key_id}") {
      unwrap(rt.revoke_key(r.param("key_id")));
      spdlog::info("gateway: key {} revoked", r.param("key_id"));
      return no_content();
    }
    throw ApiError{"route_not_found", "no handler for " + route};
  }

  // A path parameter that must be a decimal integer within lo..hi.
  static uint32_t parse_number(const std::string& s, const char* what, uint32_t lo, uint32_t hi) {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(s) < lo || std::stoul(s) > hi)
      throw ApiError{"invalid_argument", std::string(what) + " must be an integer within " +
                                             std::to_string(lo) + ".." + std::to_string(hi)};
    return uint32_t(std::stoul(s));
  }
  static uint32_t parse_pid(const std::string& s) { return parse_number(s, "pid", 0, 999999999); }

  static int64_t query_int(const Request& r, const char* k, int64_t def, int64_t hi) {
    auto v = r.q(k);
    if (!v) return def;
    if (v->empty() || v->size() > 18 || v->find_first_not_of("0123456789") != std::string::npos)
      throw ApiError{"invalid_argument", std::string(k) + " must be a non-negative integer"};
    auto n = std::stoll(*v);
    if (n > hi)
      throw ApiError{"invalid_argument", std::string(k) + " is at most " + std::to_string(hi)};
    return n;
  }

  // Streams: runs on a worker; validation errors become a normal reply (early), the rest frames.
  void produce(const Request& r, StreamChannel& ch) {
    std::stop_callback on_shutdown(shutting_down.get_token(), [&ch] { ch.stop.request_stop(); });
    std::string tenant, id = r.param("id");
    vmm::ExecRequest req;
    try {
      tenant = auth(r).tenant;
      unwrap(rt.get(tenant, id));
      if (r.route == "/v1/sandboxes/{id}/exec/stream") req = exec_request(r.json(), true);
    } catch (const ApiError& e) {
      return ch.fail_early(error_reply(e.code, e.message));
    } catch (const std::exception& e) {
      return ch.fail_early(error_reply("internal", e.what()));
    }
    auto on_output = [&ch](vmm::StreamKind k, std::string_view d) {
      ch.push(sse_frame(k == vmm::StreamKind::out ? "stdout" : "stderr", chunk_json(d)));
    };
    auto finish = [&ch](Reply<vmm::ExecResult> res) {
      bool overflow;
      {
        std::lock_guard l(ch.mu);
        overflow = ch.overflowed;
      }
      if (overflow) res = Rejection{"cancelled", "the client read too slowly; command cancelled"};
      if (!res) {
        Json e = Json::object();
        e.set("code", res.error().code);
        e.set("message", res.error().message);
        return ch.finish(sse_frame("error", e));
      }
      Json j = Json::object();
      j.set("exit_code", res->exit_code);
      j.set("timed_out", res->timed_out);
      j.set("duration_ms", double(res->duration_us) / 1000.0);
      ch.finish(sse_frame("exit", j));
    };
    if (r.route == "/v1/sandboxes/{id}/exec/stream") {
      ch.begin();
      auto t0 = Clock::now();
      auto res = rt.exec_stream(tenant, id, req, on_output, ch.stop.get_token());
      {
        std::lock_guard l(metrics_mu);
        ++execs;
        exec_latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return finish(std::move(res));
    }
    if (r.route == "/v1/sandboxes/{id}/processes/{pid}/stream") {
      uint32_t pid;
      try {
        pid = parse_pid(r.param("pid"));
      } catch (const ApiError& e) {
        return ch.fail_early(error_reply(e.code, e.message));
      }
      ch.begin();
      return finish(rt.stream_process(tenant, id, pid, on_output, ch.stop.get_token()));
    }
    // Events, followed: poll the log, end when the sandbox ended or after the idle timeout.
    ch.begin();
    uint64_t after = 0;
    auto idle_since = Clock::now();
    while (!ch.stop.stop_requested()) {
      actors::AuditQuery q;
      q.tenant = tenant;
      q.stream = id;
      q.limit = 100000;
      auto events = rt.audit(q);
      if (!events) return finish(events.error());
      bool ended = false;
      for (auto& e : *events) {
        if (e.version <= after) continue;
        after = e.version;
        idle_since = Clock::now();
        ch.push(sse_frame("event", audit_json(e)));
        ended |= e.type == "killed" || e.type == "failed" ||
                 (e.type == "reaped" && e.json.find("\"kill\"") != std::string::npos);
      }
      if (ended || Clock::now() - idle_since > limits.events_idle_timeout) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ch.finish(": end\n\n");
  }

  std::string metrics() {
    std::string out;
    auto counts = rt.counts();
    out +=
        "# HELP pandastack_sandboxes Live sandboxes by state.\n# TYPE pandastack_sandboxes gauge\n";
    for (auto st :
         {actors::Status::creating, actors::Status::running, actors::Status::snapshotting,
          actors::Status::forking, actors::Status::hibernating, actors::Status::hibernated,
          actors::Status::waking, actors::Status::stopped, actors::Status::failed}) {
      auto it = counts.by_status.find(actors::to_string(st));
      out += std::string("pandastack_sandboxes{state=\"") + actors::to_string(st) + "\"} " +
             std::to_string(it == counts.by_status.end() ? 0 : it->second) + "\n";
    }
    out +=
        "# HELP pandastack_vm_exits_total VMs that died on their own (crash, OOM kill, kill -9): "
        "their sandboxes failed with vm_exited.\n# TYPE pandastack_vm_exits_total counter\n";
    out += "pandastack_vm_exits_total " + std::to_string(counts.vm_exits) + "\n";
    std::lock_guard l(metrics_mu);
    out +=
        "# HELP pandastack_creates_total Sandboxes created.\n# TYPE pandastack_creates_total "
        "counter\n";
    out += "pandastack_creates_total " + std::to_string(creates) + "\n";
    out += "# HELP pandastack_execs_total Commands run.\n# TYPE pandastack_execs_total counter\n";
    out += "pandastack_execs_total " + std::to_string(execs) + "\n";
    create_latency.render(out, "pandastack_create_seconds", "Create latency (server side).");
    exec_latency.render(out, "pandastack_exec_seconds", "Command latency (server side).");
    out +=
        "# HELP pandastack_http_responses_total Responses by status.\n"
        "# TYPE pandastack_http_responses_total counter\n";
    for (auto& [s, n] : responses_by_status)
      out += "pandastack_http_responses_total{status=\"" + std::to_string(s) + "\"} " +
             std::to_string(n) + "\n";
    out +=
        "# HELP pandastack_errors_total Error responses by code.\n"
        "# TYPE pandastack_errors_total counter\n";
    for (auto& [c, n] : errors_by_code)
      out += "pandastack_errors_total{code=\"" + c + "\"} " + std::to_string(n) + "\n";
    return out;
  }

  std::string openapi() const {
    Json doc = Json::object();
    doc.set("openapi", "3.0.3");
    Json info = Json::object();
    info.set("title", "PandaStack API");
    info.set("version", "0.1.0");
    doc.set("info", info);
    Json schemes = Json::object();
    Json bearer = Json::object();
    bearer.set("type", "http");
    bearer.set("scheme", "bearer");
    schemes.set("bearer", bearer);
    Json error_schema = Json::object();
    error_schema.set("type", "object");
    Json codes = Json::array();
    for (auto& [c, s] : error_codes()) codes.push(c);
    Json code_prop = Json::object();
    code_prop.set("type", "string");
    code_prop.set("enum", codes);
    Json msg_prop = Json::object();
    msg_prop.set("type", "string");
    Json inner_props = Json::object();
    inner_props.set("code", code_prop);
    inner_props.set("message", msg_prop);
    Json inner = Json::object();
    inner.set("type", "object");
    inner.set("properties", inner_props);
    Json outer_props = Json::object();
    outer_props.set("error", inner);
    error_schema.set("properties", outer_props);
    Json schemas = Json::object();
    schemas.set("Error", error_schema);
    Json components = Json::object();
    components.set("securitySchemes", schemes);
    components.set("schemas", schemas);
    doc.set("components", components);
    Json statuses = Json::object();
    for (auto& [c, s] : error_codes()) statuses.set(c, s);
    doc.set("x-error-codes", statuses);
    Json paths = Json::object();
    for (auto& r : routes) {
      Json item = paths.has(r.pattern) ? paths[r.pattern] : Json::object();
      Json op = Json::object();
      op.set("summary", r.summary);
      Json params = Json::array();
      for (auto& seg : r.compiled.segments)
        if (seg.size() > 2 && seg.front() == '{') {
          Json p = Json::object();
          p.set("name", seg.substr(1, seg.size() - 2));
          p.set("in", "path");
          p.set("required", true);
          Json sch = Json::object();
          sch.set("type", "string");
          p.set("schema", sch);
          params.push(p);
        }
      op.set("parameters", params);
      if (r.auth) {
        Json sec = Json::array();
        Json s = Json::object();
        s.set("bearer", Json::array());
        sec.push(s);
        op.set("security", sec);
      }
      Json responses = Json::object();
      Json ok = Json::object();
      ok.set("description",
             r.kind == Route::Kind::stream ? "text/event-stream (or JSON)" : "success");
      responses.set("2XX", ok);
      Json err = Json::object();
      err.set("description", "error (see x-error-codes)");
      Json content = Json::object();
      Json media = Json::object();
      Json ref = Json::object();
      ref.set("$ref", "#/components/schemas/Error");
      media.set("schema", ref);
      content.set("application/json", media);
      err.set("content", content);
      responses.set("default", err);
      op.set("responses", responses);
      item.set(method_name(r.method), op);
      paths.set(r.pattern, item);
    }
    doc.set("paths", paths);
    return doc.dump();
  }
};

std::optional<actors::Rejection> check_exec(vmm::ExecRequest& e, const Limits& limits) {
  if (e.shell.empty() == e.argv.empty())
    return actors::Rejection{"invalid_argument",
                             "give exactly one of cmd (a shell command) or argv"};
  size_t size = e.shell.size() + e.stdin_data.size();
  for (auto& a : e.argv) size += a.size() + 1;
  if (size > limits.max_command_bytes)
    return actors::Rejection{
        "body_too_large",
        "command and stdin exceed " + std::to_string(limits.max_command_bytes) + " bytes"};
  if (!e.cwd.empty())
    if (auto err = check_guest_path(e.cwd, limits.max_path_bytes))
      return actors::Rejection{"invalid_path", *err};
  e.max_output_bytes = limits.max_exec_output_bytes;
  return std::nullopt;
}

Gateway::Gateway(actors::Runtime& runtime, kj::Timer& timer, Limits limits)
    : impl_(std::make_unique<Impl>(runtime, timer, limits)) {}

Gateway::~Gateway() = default;

kj::Promise<void> Gateway::listen(kj::ConnectionReceiver& listener) {
  return impl_->server->listenHttp(listener);
}

std::string Gateway::openapi() const { return impl_->openapi(); }

}  // namespace pandastack::gateway
