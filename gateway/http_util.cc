#include "gateway/http_util.h"

#include <cstdio>

#include "wire/json.h"

namespace pandastack::gateway {

const std::vector<std::pair<std::string, unsigned>>& error_codes() {
  static const std::vector<std::pair<std::string, unsigned>> codes = {
      {"invalid_json", 400},
      {"invalid_argument", 400},
      {"invalid_path", 400},
      {"invalid_cwd", 400},
      {"command_not_found", 400},
      {"exceeds_template", 400},  // a create asking for more memory or vCPUs than its template
      {"unauthorized", 401},
      {"forbidden", 403},
      {"permission_denied", 403},
      {"route_not_found", 404},
      {"sandbox_not_found", 404},
      {"snapshot_not_found", 404},
      {"template_not_found", 404},
      {"file_not_found", 404},
      {"context_not_found", 404},
      {"offset_mismatch", 409},
      {"key_not_found", 404},
      {"process_not_found", 404},
      {"port_not_found", 404},
      {"volume_not_found", 404},
      {"database_not_found", 404},
      {"backup_not_found", 404},
      {"database_hibernated", 409},
      {"database_failed", 409},
      {"database_not_running", 409},
      {"managed_by_database", 409},
      {"method_not_allowed", 405},
      {"request_timeout", 408},
      {"is_a_directory", 409},
      {"not_a_directory", 409},
      {"file_exists", 409},
      {"directory_not_empty", 409},
      {"sandbox_hibernated", 409},
      {"sandbox_stopped", 409},
      {"sandbox_failed", 409},
      {"sandbox_busy", 409},
      {"sandbox_not_running", 409},
      {"invalid_state", 409},
      {"conflict", 409},
      {"network_disabled", 409},
      {"volume_in_use", 409},
      {"volume_attached", 409},
      {"volume_grow_failed", 409},
      {"template_in_use", 409},
      {"cancelled", 409},
      {"client_too_slow", 409},
      {"body_too_large", 413},
      {"file_too_large", 413},
      {"output_too_large", 413},
      {"backup_too_large", 413},
      {"too_many_execs", 429},
      {"too_many_requests", 429},
      {"too_many_ports", 429},
      {"too_many_processes", 429},
      {"quota_exceeded", 429},
      {"io_error", 422},
      {"too_many_directories", 422},
      {"internal", 500},
      {"storage_error", 500},
      {"start_failed", 500},
      {"snapshot_failed", 500},
      {"fork_failed", 500},
      {"backup_failed", 500},
      {"restore_failed", 500},
      {"hibernate_failed", 500},
      {"wake_failed", 500},
      {"network_error", 500},
      {"agent_error", 502},
      {"exec_failed", 503},
      {"host_full", 503},
      {"host_unavailable", 503},     // (cluster) the owner's lease expired
      {"cluster_unavailable", 503},  // (cluster) etcd cannot be reached
      {"peer_error", 502},           // (cluster) the owner did not answer a forwarded request
      {"cluster_disabled", 409},     // a cluster route on a daemon without --cluster
      {"host_not_found", 404},       // (cluster) no such host
      {"no_space", 507},
      {"not_implemented", 501},
      {"timeout", 504},
  };
  return codes;
}

unsigned status_for(std::string_view code) {
  for (auto& [c, s] : error_codes())
    if (c == code) return s;
  return 500;
}

std::string error_body(std::string_view code, std::string_view message) {
  wire::Json e = wire::Json::object();
  e.set("code", std::string(code));
  e.set("message", std::string(message));
  // quota_exceeded: which quota, its limit, the current use and what was asked, as fields
  // (actors::quota_exceeded writes them into the message in this form).
  if (code == "quota_exceeded") {
    char name[64] = {0};
    unsigned long long limit = 0, used = 0, asked = 0;
    std::string m(message);
    if (std::sscanf(m.c_str(), "quota '%63[a-z_]' exceeded: limit %llu, in use %llu, asked %llu",
                    name, &limit, &used, &asked) == 4) {
      e.set("quota", std::string(name));
      e.set("limit", int64_t(limit));
      e.set("used", int64_t(used));
      e.set("asked", int64_t(asked));
    }
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

// "pds_" + 12 base32 id + "_" + 40 base32 secret: anything else is refused before a worker,
// the store or the body is touched.
bool well_formed_key(std::string_view k) {
  if (k.size() != 57 || k.substr(0, 4) != "pds_" || k[16] != '_') return false;
  for (size_t i = 4; i < k.size(); ++i)
    if (i != 16 && !(std::islower((unsigned char)k[i]) || (k[i] >= '2' && k[i] <= '7')))
      return false;
  return true;
}

}  // namespace pandastack::gateway
