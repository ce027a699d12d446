// What the E2B-compatible control plane and sandbox plane share (see e2b.h).
#include "gateway/e2b.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <vector>

#include "gateway/http_util.h"
#include "gateway/signing.h"
#include "wire/base64.h"
#include "wire/hex.h"
#include "wire/sha256.h"

namespace pandastack::gateway::e2b {

namespace {

std::unique_ptr<Tokens> g_tokens;

// The expiry of a token issued at `now`: kLifetime after the end of now's hour.
int64_t expiry_of(int64_t now) {
  return (now / Tokens::kGranularity + 1) * Tokens::kGranularity + Tokens::kLifetime;
}

}  // namespace

std::optional<Tokens> Tokens::load(const std::string& path, std::string* error) {
  auto secret = load_or_make_secret(path, error);
  if (!secret) return std::nullopt;
  return Tokens(*secret);
}

std::string Tokens::mac(const std::string& tenant, const std::string& key_id, int64_t expires,
                        const std::string& sandbox) const {
  return hmac_sha256(
      secret_, "e2b2\n" + tenant + "\n" + key_id + "\n" + std::to_string(expires) + "\n" + sandbox);
}

std::string Tokens::token(const std::string& tenant, const std::string& key_id, int64_t expires,
                          const std::string& sandbox) const {
  return "e2b2." + b64url(tenant) + "." + key_id + "." + std::to_string(expires) + "." +
         b64url(mac(tenant, key_id, expires, sandbox));
}

std::string Tokens::issue(const std::string& tenant, const std::string& key_id,
                          const std::string& sandbox, int64_t now) const {
  if (now == 0) now = int64_t(std::time(nullptr));
  return token(tenant, key_id, expiry_of(now), sandbox);
}

std::vector<std::string> Tokens::live(const std::string& tenant, const std::string& key_id,
                                      const std::string& sandbox, int64_t now) const {
  std::vector<std::string> out;
  int64_t last = expiry_of(now);
  for (int64_t e = last; e > now && e > last - kLifetime - kGranularity; e -= kGranularity)
    out.push_back(token(tenant, key_id, e, sandbox));
  return out;
}

std::string file_signature(const std::string& path, const std::string& operation,
                           const std::string& user, const std::string& token,
                           std::optional<int64_t> expiration) {
  std::string raw = path + ":" + operation + ":" + user + ":" + token;
  if (expiration) raw += ":" + std::to_string(*expiration);
  auto b64 = wire::base64_encode(wire::sha256(raw));
  while (!b64.empty() && b64.back() == '=') b64.pop_back();
  return "v1_" + b64;
}

std::optional<Tokens::Claims> Tokens::verify(std::string_view token, const std::string& sandbox,
                                             int64_t now) const {
  if (token.size() > 600 || token.rfind("e2b2.", 0) != 0) return std::nullopt;
  std::vector<std::string_view> parts;
  for (size_t at = 5;;) {
    size_t dot = token.find('.', at);
    parts.push_back(token.substr(at, dot == std::string_view::npos ? dot : dot - at));
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  if (parts.size() != 4) return std::nullopt;
  auto tenant = unb64url(parts[0]);
  std::string key_id(parts[1]);
  auto got = unb64url(parts[3]);
  if (!tenant || !got || tenant->empty() || key_id.empty() || key_id.size() > 64 ||
      parts[2].empty() || parts[2].size() > 12)
    return std::nullopt;
  int64_t expires = 0;
  for (char c : parts[2]) {
    if (c < '0' || c > '9') return std::nullopt;
    expires = expires * 10 + (c - '0');
  }
  auto want = mac(*tenant, key_id, expires, sandbox);
  if (!equal_secret(*got, want)) return std::nullopt;
  if (expires <= now) return std::nullopt;
  return Claims{*tenant, key_id, expires};
}

void set_tokens(Tokens t) { g_tokens = std::make_unique<Tokens>(std::move(t)); }

std::string api_key_form(const std::string& pds_key) { return "e2b_" + wire::hex_encode(pds_key); }

std::optional<std::string> from_api_key_form(std::string_view key) {
  constexpr size_t kPdsKeyBytes = 57;
  if (key.size() != 4 + 2 * kPdsKeyBytes || key.substr(0, 4) != "e2b_") return std::nullopt;
  auto out = wire::hex_decode(key.substr(4));
  if (!out || !well_formed_key(*out)) return std::nullopt;
  return out;
}

const Tokens& tokens() {
  if (g_tokens) return *g_tokens;
  // Before set_tokens (tests of parts): a secret of this process only.
  static const Tokens ephemeral = [] {
    std::string secret(32, '\0');
    RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), 32);
    return Tokens(secret);
  }();
  return ephemeral;
}

std::string template_for(const std::string& name) {
  if (name.empty()) return "base";
  if (name == "code-interpreter-v1" || name == "code-interpreter-stateful")
    return "code-interpreter";
  auto colon = name.find(':');  // "base:latest" style tags
  return colon == std::string::npos ? name : name.substr(0, colon);
}

namespace {
std::string message_of(const HttpReply& r) {
  auto j = Json::parse(r.body);
  if (j && (*j)["error"].is_object()) return (*j)["error"]["message"].as_string();
  return r.body;
}
}  // namespace

HttpReply api_error(const HttpReply& native) {
  Json j = Json::object();
  j.set("code", int64_t(native.status));
  j.set("message", message_of(native));
  auto r = json_reply(native.status, j);
  r.error_code = native.error_code;
  r.headers = native.headers;
  return r;
}

bool sandbox_gone(std::optional<Code> code) {
  return code == Code::sandbox_not_found || code == Code::sandbox_stopped ||
         code == Code::sandbox_failed || code == Code::sandbox_hibernated ||
         code == Code::sandbox_not_running || code == Code::agent_error;
}

std::string connect_code(Code code) {
  if (std::string_view(to_string(code)).ends_with("_not_found")) return "not_found";
  if (code == Code::unauthorized) return "unauthenticated";
  if (code == Code::forbidden || code == Code::permission_denied) return "permission_denied";
  if (code == Code::file_exists) return "already_exists";
  if (code == Code::too_many_requests || code == Code::quota_exceeded ||
      std::string_view(to_string(code)).starts_with("too_many"))
    return "resource_exhausted";
  if (code == Code::timeout) return "deadline_exceeded";
  if (code == Code::cancelled) return "canceled";
  if (code == Code::not_implemented) return "unimplemented";
  if (code == Code::no_space) return "resource_exhausted";
  if (code == Code::is_a_directory || code == Code::not_a_directory ||
      code == Code::directory_not_empty || code == Code::invalid_state)
    return "failed_precondition";
  if (sandbox_gone(code) || code == Code::exec_failed || code == Code::host_full)
    return "unavailable";
  unsigned s = http_status(code);
  if (s == 400 || s == 413) return "invalid_argument";
  return "internal";
}

HttpReply envd_error(const HttpReply& native) {
  if (sandbox_gone(native.error_code)) {
    HttpReply r{502,
                "text/plain",
                "sandbox is not running: " + message_of(native) + "\n",
                native.error_code,
                {}};
    return r;
  }
  auto code = connect_code(native.error_code.value_or(Code::internal));
  static const std::map<std::string, unsigned> status = {
      {"invalid_argument", 400},   {"failed_precondition", 400},
      {"unauthenticated", 401},    {"permission_denied", 403},
      {"not_found", 404},          {"already_exists", 409},
      {"resource_exhausted", 429}, {"canceled", 499},
      {"internal", 500},           {"unimplemented", 501},
      {"unavailable", 503},        {"deadline_exceeded", 504}};
  Json j = Json::object();
  j.set("code", code);
  j.set("message", message_of(native));
  auto r = json_reply(status.at(code), j);
  r.error_code = native.error_code;
  return r;
}

std::string envelope(const Json& message, uint8_t flags) {
  std::string body = message.dump();
  std::string out(5, '\0');
  out[0] = char(flags);
  uint32_t n = uint32_t(body.size());
  for (int i = 0; i < 4; ++i) out[1 + i] = char((n >> (8 * (3 - i))) & 0xff);
  return out + body;
}

Json read_envelope(const std::string& body) {
  if (body.size() < 5)
    throw ApiError{Code::invalid_argument, "a Connect stream request needs an envelope"};
  if (body[0] & 1) throw ApiError{Code::invalid_argument, "compressed envelopes are not supported"};
  uint32_t n = 0;
  for (int i = 1; i <= 4; ++i) n = (n << 8) | uint8_t(body[i]);
  if (n != body.size() - 5)
    throw ApiError{Code::invalid_argument, "the envelope's length does not match"};
  auto j = Json::parse(body.substr(5));
  if (!j || !j->is_object())
    throw ApiError{Code::invalid_argument, "the envelope is not a JSON object"};
  return *j;
}

std::vector<std::pair<std::string, std::string>> multipart(const std::string& content_type,
                                                           const std::string& body) {
  auto b = content_type.find("boundary=");
  if (content_type.rfind("multipart/form-data", 0) != 0 || b == std::string::npos)
    throw ApiError{Code::invalid_argument, "uploads are multipart/form-data with a boundary"};
  std::string boundary = content_type.substr(b + 9);
  boundary = boundary.substr(0, boundary.find(';'));
  if (boundary.size() >= 2 && boundary.front() == '"')
    boundary = boundary.substr(1, boundary.size() - 2);
  if (boundary.empty() || boundary.size() > 200)
    throw ApiError{Code::invalid_argument, "bad multipart boundary"};
  std::string delim = "--" + boundary;
  std::vector<std::pair<std::string, std::string>> parts;
  size_t p = body.find(delim);
  if (p == std::string::npos) throw ApiError{Code::invalid_argument, "no multipart part"};
  while (true) {
    p += delim.size();
    if (body.compare(p, 2, "--") == 0) break;  // the closing delimiter
    if (body.compare(p, 2, "\r\n") != 0)
      throw ApiError{Code::invalid_argument, "malformed multipart body"};
    p += 2;
    auto head_end = body.find("\r\n\r\n", p);
    if (head_end == std::string::npos)
      throw ApiError{Code::invalid_argument, "malformed multipart part"};
    std::string head = body.substr(p, head_end - p);
    auto next = body.find("\r\n" + delim, head_end + 4);
    if (next == std::string::npos)
      throw ApiError{Code::invalid_argument, "unterminated multipart part"};
    std::string lower = ascii_lower(head);
    auto fn = lower.find("filename=\"");
    if (lower.find("name=\"file\"") != std::string::npos && fn != std::string::npos) {
      auto start = fn + 10, end = head.find('"', start);
      if (end == std::string::npos) throw ApiError{Code::invalid_argument, "malformed filename"};
      parts.emplace_back(head.substr(start, end - start),
                         body.substr(head_end + 4, next - (head_end + 4)));
      if (parts.size() > 1000)
        throw ApiError{Code::invalid_argument, "at most 1000 files per upload"};
    }
    p = next + 2;
  }
  if (parts.empty()) throw ApiError{Code::invalid_argument, "no part named \"file\""};
  return parts;
}

std::optional<int64_t> parse_rfc3339(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)
  auto digits = [&](size_t at, size_t n) -> std::optional<int> {
    if (at + n > t.size()) return std::nullopt;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return std::nullopt;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  if (t.size() < 20 || t.size() > 40 || t[4] != '-' || t[7] != '-' ||
      (t[10] != 'T' && t[10] != 't' && t[10] != ' ') || t[13] != ':' || t[16] != ':')
    return std::nullopt;
  auto y = digits(0, 4), mo = digits(5, 2), d = digits(8, 2), h = digits(11, 2), mi = digits(14, 2),
       sec = digits(17, 2);
  if (!y || !mo || !d || !h || !mi || !sec || *mo < 1 || *mo > 12 || *d < 1 || *d > 31 || *h > 23 ||
      *mi > 59 || *sec > 60)
    return std::nullopt;
  size_t at = 19;
  int64_t ms = 0;
  if (at < t.size() && t[at] == '.') {
    int64_t scale = 100;
    for (++at; at < t.size() && t[at] >= '0' && t[at] <= '9'; ++at, scale /= 10)
      ms += scale * (t[at] - '0');
  }
  int64_t offset_s = 0;
  if (at < t.size() && (t[at] == 'Z' || t[at] == 'z')) {
    ++at;
  } else if (at < t.size() && (t[at] == '+' || t[at] == '-')) {
    auto oh = digits(at + 1, 2), om = digits(at + 4, 2);
    if (!oh || !om || at + 3 >= t.size() || t[at + 3] != ':') return std::nullopt;
    offset_s = (t[at] == '+' ? 1 : -1) * (int64_t(*oh) * 3600 + int64_t(*om) * 60);
    at += 6;
  } else {
    return std::nullopt;
  }
  if (at != t.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = *y - 1900;
  tm.tm_mon = *mo - 1;
  tm.tm_mday = *d;
  tm.tm_hour = *h;
  tm.tm_min = *mi;
  tm.tm_sec = *sec;
  return (int64_t(::timegm(&tm)) - offset_s) * 1000 + ms;
}

std::string rfc3339(int64_t ms) {
  std::time_t t = std::time_t(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::map<std::string, std::string> string_object(const Json& j, const char* what) {
  std::map<std::string, std::string> out;
  if (j.is_null()) return out;
  if (!j.is_object())
    throw ApiError{Code::invalid_argument, std::string(what) + " must be an object"};
  for (auto& [k, v] : j.as_object()) {
    if (!v.is_string())
      throw ApiError{Code::invalid_argument, std::string(what) + " values must be strings"};
    out[k] = v.as_string();
  }
  return out;
}

}  // namespace pandastack::gateway::e2b
