// Pure helpers of the REST gateway (no I/O): error bodies, route patterns,
// request validation, base64. Unit-tested in http_util_test.cc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/base64.h"
#include "wire/errors.h"

namespace pandastack::gateway {

// `{"error":{"code":...,"message":...}}` (the code's HTTP status: wire/errors.h), with a
// quota_exceeded's details as fields (quota, limit, used, asked).
std::string error_body(Code code, std::string_view message,
                       const std::optional<QuotaDetail>& quota = std::nullopt);

// A route pattern like "/v1/sandboxes/{id}/files": literal segments and `{name}` parameters.
// match() fills `params` and returns true when `path` (already split on '/') fits.
struct RoutePattern {
  std::vector<std::string> segments;
  explicit RoutePattern(std::string_view pattern);
  bool match(const std::vector<std::string>& path,
             std::map<std::string, std::string>& params) const;
};

// Checks a guest path from a request: absolute, at most `max_len` bytes, no NUL byte, no "."
// or ".." segment. Returns an error message, or nullopt when the path is acceptable.
std::optional<std::string> check_guest_path(std::string_view path, size_t max_len);

using wire::base64_decode;
using wire::base64_encode;

// Prometheus histogram with fixed buckets (seconds). Not thread-safe: the caller locks.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // one per bound, plus +Inf
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1) {}
  void observe(double v);
  void render(std::string& out, std::string_view name, std::string_view help) const;
};

// An API key's shape: "pds_" + 12 base32 id + "_" + 40 base32 secret (57 bytes). Anything else is
// refused before a worker, the store or a body is touched.
bool well_formed_key(std::string_view k);

// `s` with A-Z as a-z (header names, schemes, host names: ASCII case-insensitive).
std::string ascii_lower(std::string_view s);

// The wall clock in milliseconds since the epoch (record times, RFC 3339 stamps, expiries).
int64_t now_ms();

// The IP address of connection `fd`'s other end (IPv4 or IPv6 text), or "" (-1, a unix socket).
std::string peer_address(int fd);

// A gzip stream's content (one or more members), at most `max_bytes` of it: nullopt when `data`
// is not gzip or its content is larger (a small body never inflates past the limit).
std::optional<std::string> gunzip(std::string_view data, size_t max_bytes);

}  // namespace pandastack::gateway
