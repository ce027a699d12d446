#include "gateway/http_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zlib.h>

#include <cctype>
#include <chrono>
#include <cstdio>

#include "wire/json.h"

namespace pandastack::gateway {

std::string error_body(Code code, std::string_view message,
                       const std::optional<QuotaDetail>& quota) {
  wire::Json e = wire::Json::object();
  e.set("code", to_string(code));
  e.set("message", std::string(message));
  if (quota) {
    e.set("quota", quota->quota);
    e.set("limit", int64_t(quota->limit));
    e.set("used", int64_t(quota->used));
    e.set("asked", int64_t(quota->asked));
  }
  wire::Json j = wire::Json::object();
  j.set("error", e);
  return j.dump();
}

RoutePattern::RoutePattern(std::string_view pattern) {
  size_t i = 0;
  while (i < pattern.size()) {
    if (pattern[i] == '/') {
      ++i;
      continue;
    }
    size_t j = pattern.find('/', i);
    if (j == std::string_view::npos) j = pattern.size();
    segments.emplace_back(pattern.substr(i, j - i));
    i = j;
  }
}

bool RoutePattern::match(const std::vector<std::string>& path,
                         std::map<std::string, std::string>& params) const {
  if (path.size() != segments.size()) return false;
  std::map<std::string, std::string> found;
  for (size_t i = 0; i < path.size(); ++i) {
    const auto& s = segments[i];
    if (s.size() > 2 && s.front() == '{' && s.back() == '}') {
      if (path[i].empty()) return false;
      found[s.substr(1, s.size() - 2)] = path[i];
    } else if (s != path[i]) {
      return false;
    }
  }
  params = std::move(found);
  return true;
}

std::optional<std::string> check_guest_path(std::string_view path, size_t max_len) {
  if (path.empty()) return "path is required";
  if (path.size() > max_len) return "path is longer than " + std::to_string(max_len) + " bytes";
  if (path.front() != '/') return "path must be absolute";
  if (path.find('\0') != std::string_view::npos) return "path contains a NUL byte";
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    auto seg = path.substr(i, j - i);
    if (seg == "." || seg == "..") return "path must not contain '.' or '..' segments";
    i = j + 1;
  }
  return std::nullopt;
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
  std::string n(name);
  out += "# HELP " + n + " " + std::string(help) + "\n# TYPE " + n + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    char b[32];
    std::snprintf(b, sizeof b, "%g", bounds[i]);
    out += n + "_bucket{le=\"" + b + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts.back();
  out += n + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  char s[32];
  std::snprintf(s, sizeof s, "%.6f", sum);
  out += n + "_sum " + s + "\n" + n + "_count " + std::to_string(count) + "\n";
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "pds_" + 12 base32 id + "_" + 40 base32 secret: anything else is refused before a worker,
// the store or the body is touched.
bool well_formed_key(std::string_view k) {
  if (k.size() != 57 || k.substr(0, 4) != "pds_" || k[16] != '_') return false;
  for (size_t i = 4; i < k.size(); ++i)
    if (i != 16 && !(std::islower((unsigned char)k[i]) || (k[i] >= '2' && k[i] <= '7')))
      return false;
  return true;
}

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::optional<std::string> gunzip(std::string_view data, size_t max_bytes) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return std::nullopt;
  std::string out;
  char buf[64 << 10];
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  int rc = Z_OK;
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    out.append(buf, sizeof buf - z.avail_out);
    if (out.size() > max_bytes) break;
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      inflateReset(&z);  // another member follows
    }
  }
  inflateEnd(&z);
  bool done = rc == Z_STREAM_END && z.avail_in == 0 && out.size() <= max_bytes;
  if (!done) return std::nullopt;
  return out;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace pandastack::gateway
