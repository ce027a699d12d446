// What every REST route handler works with: a parsed request (Request, typed JSON access with
// clear errors: Fields), the reply (HttpReply, ApiError), and the JSON shapes of the API's
// resources (sandboxes, command results, files, audit events, stream chunks).
#pragma once

#include <kj/compat/http.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "actors/runtime.h"
#include "wire/json.h"

namespace pandastack::gateway {

using wire::Json;

// A complete response, built on a worker thread.
struct HttpReply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::optional<Code> error_code;                            // metrics, logs, the E2B mapping
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones (Retry-After, Allow)
};

HttpReply json_reply(unsigned status, const Json& j);
HttpReply error_reply(const actors::Rejection& error);
inline HttpReply error_reply(Code code, const std::string& message) {
  return error_reply(actors::Rejection{code, message});
}
HttpReply no_content();
// 429 too_many_requests: every worker is taken and the queue is full.
HttpReply busy_reply();

// Thrown by request parsing helpers and handlers; becomes an error reply.
using ApiError = actors::Rejection;

// One parsed request, handed to a worker thread.
struct Request {
  kj::HttpMethod method;
  std::string route;  // the pattern, e.g. "/v1/sandboxes/{id}"
  std::map<std::string, std::string> params;
  std::multimap<std::string, std::string> query;
  std::string authorization;
  // The headers of the E2B-compatible surface (gateway/e2b.h): E2b-Sandbox-Id, X-Access-Token,
  // Connect-Timeout-Ms, Content-Type (lower-case names).
  std::map<std::string, std::string> headers;
  // E2B sandbox plane: the tenant its access token names (verified by the server for the sandbox
  // named by E2b-Sandbox-Id before anything else; "" elsewhere), and the API key it was issued
  // for (e2b::target checks the key is still there).
  std::string token_tenant, token_key;
  std::string body;
  // A file_body route's body: a file of the daemon's (removed after the handler unless it took
  // the file over by moving it).
  std::string body_file;
  std::string url;           // the path and query as sent
  std::string host;          // its Host header (at most 255 bytes), or ""
  std::string host_sandbox;  // E2B's sandbox plane by host name (49983-ID.DOMAIN): ID, else ""
  bool forwarded = false;  // (cluster mode) another host forwarded it (its creates are served here)
  bool routed = false;     // (cluster mode) its owner was looked up already
  // (cluster mode) the id's owner is down, and this route may act on it here anyway (a wake from
  // the object store): its absence here is not a 404 before the handler.
  bool owner_down = false;
  int conn_fd = -1;        // the client's connection (to notice it hang up), or -1
  std::stop_token cancel;  // fires when the client hung up or the server shuts down
  // (a request another host forwarded) fired when that host cancels the call: its client hung up
  std::shared_ptr<std::stop_source> peer_stop;

  std::string param(const std::string& k) const;
  std::optional<std::string> q(const std::string& k) const;
  // The body as a JSON object (an empty object for an empty body); invalid_json otherwise.
  Json json() const;
};

// Typed access to request JSON with clear errors; unknown fields are refused.
class Fields {
 public:
  Fields(Json j, std::initializer_list<const char*> known);
  bool has(const char* k) const;
  std::string str(const char* k, std::string def = "") const;
  bool boolean(const char* k, bool def = false) const;
  int64_t integer(const char* k, int64_t def, int64_t lo, int64_t hi) const;
  std::map<std::string, std::string> string_map(const char* k) const;
  // A nested object (validated as one); an empty object when absent.
  Json object(const char* k) const;
  std::vector<std::string> string_list(const char* k) const;

 private:
  Json j_;
};

// {"mode": "deny_all"|"allow_all"|"allowlist", "cidrs": [...], "domains": [...]}
actors::Egress egress_from(const Json& j);

template <typename T>
T unwrap(actors::Reply<T> r) {
  if (!r) throw r.error();
  return std::move(*r);
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

Json sandbox_json(const actors::SandboxInfo& i);
Json volume_json(const actors::VolumeInfo& v);
Json volume_snapshot_json(const std::string& volume, const actors::VolumeSnapshot& s);
Json exec_json(const vmm::ExecResult& r);
Json stat_json(const vmm::FileStat& s);
Json audit_json(const actors::AuditEvent& e);
// One chunk of command output: {"data": ...}, base64 with "encoding" when it is not text.
Json chunk_json(std::string_view d);
std::string sse_frame(const std::string& event, const Json& data);

// Output is text when it is valid UTF-8 without NUL bytes; else it travels as base64.
bool is_text(std::string_view d);

// A path parameter that must be a decimal integer within lo..hi.
uint32_t parse_number(const std::string& s, const char* what, uint32_t lo, uint32_t hi);
uint32_t parse_pid(const std::string& s);
// A query parameter that must be a non-negative integer (at most `hi`), `def` when absent.
int64_t query_int(const Request& r, const char* k, int64_t def, int64_t hi);
// A query flag: absent -> `def`; "1"/"true" -> true; "0"/"false" -> false; anything else: 400.
bool query_flag(const Request& r, const char* k, bool def = false);

const char* method_name(kj::HttpMethod m);

}  // namespace pandastack::gateway
