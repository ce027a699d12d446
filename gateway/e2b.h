// The E2B-compatible surface (../shared/specs/e2b-compat.md): the real, unmodified `e2b` SDK works
// against pandastackd with E2B_API_URL and E2B_SANDBOX_URL both set to the daemon's URL.
//   e2b_api.cc    the control plane (/v2/sandboxes, /sandboxes/{id}/...): X-API-KEY, our keys
//   e2b_envd.cc   the sandbox plane (envd): Connect-RPC process.Process and filesystem.Filesystem
//                 (JSON, HTTP/1.1), /files, /health; requests carry E2b-Sandbox-Id and the
//                 sandbox's access token
// Both map onto the same runtime calls as our REST API. This header holds what they share: the
// access tokens, the error shapes, the Connect envelope, the sandbox object.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/api_types.h"
#include "gateway/server.h"

namespace pandastack::gateway::e2b {

// The envd version we advertise: >= 0.4.0 (no forced user), >= 0.5.2 (closeStdin), >= 0.5.7
// (octet-stream and gzip uploads), >= 0.6.2 (file metadata), >= 0.6.3 (watch events with entries),
// >= 0.6.4 (watching network mounts: every folder of ours can be watched).
inline constexpr const char* kEnvdVersion = "0.6.4";

// A sandbox's access token (envdAccessToken): "e2b2." + base64url(tenant) + "." + key id + "." +
// expiry (Unix seconds) + "." + base64url(HMAC-SHA256(secret, those and the sandbox id)).
// Stateless (survives restarts), scoped to one sandbox of one tenant, and bound to the API key
// that asked for it: it stops working when that key is revoked (checked per request, within the
// key cache's 2 s) or when it expires (kLifetime after the hour it was issued in ends: create,
// connect and get issue a fresh one). Deterministic: the tokens issued for one sandbox and key
// within one hour are the same, so that the ones still valid can be recomputed (live()) to check
// a signed file URL, which carries a hash over the token and not the token (file_signature). The
// secret is DATA/e2b-token-secret (0600) on one host, the cluster's e2b-tokens.key in a cluster;
// never derived from another credential (security review 3, H1, M4).
class Tokens {
 public:
  // E2B's longest sandbox lifetime (24 h): an SDK object that lives longer connects again.
  static constexpr int64_t kLifetime = 24 * 3600;
  // Reads the secret from `path`, or makes one (32 random bytes) there.
  static std::optional<Tokens> load(const std::string& path, std::string* error);
  explicit Tokens(std::string secret) : secret_(std::move(secret)) {}
  // Expiries are whole hours: a token is valid kLifetime after the hour it was issued in.
  static constexpr int64_t kGranularity = 3600;
  // A token for `sandbox` of `tenant` asked for with key `key_id` at `now` (Unix seconds; 0: the
  // clock's), valid until the end of now's hour + kLifetime.
  std::string issue(const std::string& tenant, const std::string& key_id,
                    const std::string& sandbox, int64_t now = 0) const;
  // Every token issue() gave for (tenant, key_id, sandbox) that is still valid at `now`: one per
  // hour of the last kLifetime (25).
  std::vector<std::string> live(const std::string& tenant, const std::string& key_id,
                                const std::string& sandbox, int64_t now) const;
  struct Claims {
    std::string tenant, key_id;
    int64_t expires = 0;  // Unix seconds
  };
  // Whom the token was issued to for `sandbox`, when it was, by this daemon's secret, and has
  // not expired at `now` (Unix seconds); nullopt otherwise. The key's liveness is the caller's
  // to check (e2b::target).
  std::optional<Claims> verify(std::string_view token, const std::string& sandbox,
                               int64_t now) const;

 private:
  std::string mac(const std::string& tenant, const std::string& key_id, int64_t expires,
                  const std::string& sandbox) const;
  std::string token(const std::string& tenant, const std::string& key_id, int64_t expires,
                    const std::string& sandbox) const;
  std::string secret_;
};

// The signature in a signed file URL (E2B's uploadUrl/downloadUrl, `signature` query parameter):
// "v1_" + base64 (standard alphabet, unpadded) of SHA-256 of "PATH:OPERATION:USER:TOKEN" and,
// when the URL expires, ":EXPIRATION" (Unix seconds). OPERATION is "read" (GET /files) or "write"
// (POST); USER the `username` parameter or "".
std::string file_signature(const std::string& path, const std::string& operation,
                           const std::string& user, const std::string& token,
                           std::optional<int64_t> expiration);

// The sandbox plane's own host names (49983-ID.DOMAIN: envd; 49999-ID.DOMAIN: the code
// interpreter) are served by the E2B routes, not proxied to those guest ports.
inline constexpr uint32_t kEnvdPort = 49983, kCodeInterpreterPort = 49999;
inline bool sandbox_plane_port(uint32_t port) {
  return port == kEnvdPort || port == kCodeInterpreterPort;
}

// A signed file URL's check (e2b_envd.cc, on a worker): the signature must be one of the
// sandbox's live tokens' for the request (any live key of the sandbox's tenant, at most
// kMaxSigningKeys of them), and not expired. Whom the token names; unauthorized with E2B's
// messages ("invalid signature", "signature is already expired") otherwise.
inline constexpr size_t kMaxSigningKeys = 64;
inline constexpr uint32_t kSignedUrlsPerSecond = 100;  // per sandbox (then 429)
actors::Reply<Tokens::Claims> verify_signed_url(Server& gw, const Request& r);

// The tokens of the running server (set once at start).
void set_tokens(Tokens t);

// An API key in the form E2B's SDKs accept: current releases check X-API-KEY against
// ^e2b_[0-9a-f]+$ before they send anything. "e2b_" + the lowercase hex of a pds_ key (114 hex
// digits): the same key, verified as that key on the E2B control plane (and nowhere else).
std::string api_key_form(const std::string& pds_key);
// The pds_ key an E2B-form key stands for, if `key` is one (well formed: e2b_ and 114 lowercase
// hex digits that decode to a well-formed pds_ key); nullopt otherwise.
std::optional<std::string> from_api_key_form(std::string_view key);
const Tokens& tokens();

// E2B template names mapped to ours ("code-interpreter-v1" -> "code-interpreter"); others pass.
std::string template_for(const std::string& e2b_name);

// Error bodies. Control plane: {"code": <status>, "message"} with our code's status.
HttpReply api_error(const HttpReply& native);
// envd unary calls: a Connect error {"code": "not_found", "message"} with its status; a sandbox
// that is gone or not running is 502 text/plain (the SDK: "sandbox is not running").
HttpReply envd_error(const HttpReply& native);
// The Connect code for one of our error codes.
std::string connect_code(Code code);
// Whether our error code means "the sandbox itself is not there or not running".
bool sandbox_gone(std::optional<Code> code);

// One Connect envelope: flags, big-endian length, the JSON.
std::string envelope(const Json& message, uint8_t flags = 0);
// The single message of a streaming request's body (one envelope); invalid_argument otherwise.
Json read_envelope(const std::string& body);

// The parts named "file" of a multipart/form-data body, (filename, content) in order;
// invalid_argument for a malformed body, no boundary or no such part, more than 1000 parts.
std::vector<std::pair<std::string, std::string>> multipart(const std::string& content_type,
                                                           const std::string& body);

// RFC 3339 (UTC, seconds) of a Unix time in milliseconds.
std::string rfc3339(int64_t ms);
// An RFC 3339 time ("2026-12-04T15:22:33.123Z", or with an offset) in Unix milliseconds.
std::optional<int64_t> parse_rfc3339(std::string_view t);

// The sandbox of an envd request (E2b-Sandbox-Id) and whose it is (the tenant its access token
// names, verified by the server: Request::token_tenant); too_many_requests past the tenant's
// rate (e2b_envd.cc).
// And whom it acts as: the user it names (Authorization: Basic base64("USER:") on RPC calls,
// ?username= on /files), by default `user`, E2B's (every template has it; uid 1000, home
// /home/user); "root" is the agent's own identity.
struct Target {
  std::string tenant, id;
  std::string user = "user";
  std::string home = "/home/user";  // relative paths and a command's default cwd
  // What our exec and file calls name: "" for root (also what an agent before protocol 2 does).
  std::string as() const { return user == "root" ? "" : user; }
};
Target target(Server& gw, const Request& r);
// A route of the sandbox plane (e2b_envd.cc, e2b_code.cc): no API key (the server checks the
// sandbox's token instead), E2B's error shapes.
Route envd_route(kj::HttpMethod m, const char* path, const char* what, Handler h,
                 std::vector<std::string> query = {}, Route::Kind kind = Route::Kind::json);

// A route of E2B's control plane (e2b_api.cc, e2b_secrets.cc): an API key (X-API-KEY), E2B's
// error shapes.
Route api_route(kj::HttpMethod m, const char* path, const char* what, Handler h,
                std::vector<std::string> query = {});

// One of the E2B headers the server keeps (Request::headers), "" when absent.
std::string header_of(const Request& r, const char* name);

// The stream producers (on a stream worker): process Start/Connect and WatchDir (e2b_envd.cc),
// /execute (e2b_code.cc).
void produce_process(Server& gw, const Request& r, StreamChannel& ch);
void produce_watch(Server& gw, const Request& r, StreamChannel& ch);
void produce_execute(Server& gw, const Request& r, StreamChannel& ch);

// A sandbox's create-time envVars (e2b_env.cc; security review 3, M5): given to every process
// started through E2B's API, kept in the guest (kEnvFile: root's, 0600, a JSON object) and in
// this host's memory, never in the sandbox's metadata, events, audit log, answers or the settings
// other hosts get. Up to kMaxEnvVars, names of 1..128 bytes without '=' or NUL, values of at most
// kMaxEnvValue bytes without NUL.
inline constexpr const char* kEnvFile = "/etc/pandastack/e2b-env.json";
inline constexpr size_t kMaxEnvVars = 64;
inline constexpr size_t kMaxEnvValue = 16 * 1024;
// Sandboxes created before kept them as metadata under this prefix: still given to processes,
// hidden from every answer and redacted in the audit log.
inline constexpr const char* kEnvPrefix = "e2b.env.";

// An object of strings in a request (metadata, envVars; null: empty), or invalid_argument naming
// `what`.
std::map<std::string, std::string> string_object(const Json& j, const char* what);

using EnvVars = std::map<std::string, std::string>;
// A create's envVars, checked: invalid_argument saying what is wrong.
EnvVars env_vars(const Json& j);
// kEnvFile's content, and back: nullopt when the text is not such a file (the guest wrote it:
// checked as a request's envVars are).
std::string encode_env(const EnvVars& env);
std::optional<EnvVars> decode_env(std::string_view text);
// A new sandbox's envVars into its guest (and this host's memory). Throws ApiError when the guest
// write fails.
void keep_env(Server& gw, const std::string& tenant, const std::string& id, const EnvVars& env);
// What a process of sandbox `s` starts with: its envVars from memory, else from its guest
// (another host made it, or this daemon restarted), and any kept as metadata before.
EnvVars sandbox_env(Server& gw, const actors::SandboxInfo& s);
// A sandbox created through E2B's API: "1" when every guest port is served at its host-based
// preview URL without a token (E2B's network.allowPublicTraffic, its default), "0" when a request
// needs the sandbox's traffic access token (E2B-Traffic-Access-Token). gateway/previews.h.
inline constexpr const char* kPublicTrafficKey = "e2b.public-traffic";

}  // namespace pandastack::gateway::e2b
