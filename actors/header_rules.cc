#include "actors/header_rules.h"

#include <algorithm>
#include <cctype>
#include <map>

namespace pandastack::actors::header_rules {

namespace {

constexpr size_t kSecretMarkerLen = std::char_traits<char>::length(kSecretMarker);

// E2B's other markers (workload identity tokens minted per request): not served here.
constexpr const char* kIdentityMarker = "${e2b.identity.";

bool dns_label_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
}

bool ipv4(const std::string& s) {
  int parts = 0;
  size_t at = 0;
  while (at <= s.size()) {
    size_t dot = s.find('.', at);
    if (dot == std::string::npos) dot = s.size();
    auto part = s.substr(at, dot - at);
    if (part.empty() || part.size() > 3 ||
        part.find_first_not_of("0123456789") != std::string::npos || std::stoi(part) > 255)
      return false;
    ++parts;
    at = dot + 1;
  }
  return parts == 4;
}

bool dns_name(const std::string& s) {
  if (s.empty() || s.size() > 253 || s.front() == '.' || s.back() == '.' ||
      s.find("..") != std::string::npos)
    return false;
  size_t label = 0;
  for (char c : s) {
    if (c == '.') {
      label = 0;
      continue;
    }
    if (!dns_label_char(c) || ++label > 63) return false;
  }
  return true;
}

bool token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Headers that frame or route a request, or that the proxy's own connection handling owns: a
// rule never sets them.
bool reserved_header(const std::string& name) {
  static const char* kReserved[] = {
      "host", "content-length", "transfer-encoding", "connection",       "upgrade",
      "te",   "trailer",        "keep-alive",        "proxy-connection", "expect"};
  auto n = lower(name);
  return std::any_of(std::begin(kReserved), std::end(kReserved),
                     [&](const char* r) { return n == r; });
}

Rejection bad(std::string message) { return Rejection{Code::invalid_argument, std::move(message)}; }

}  // namespace

std::optional<Rejection> check_host(const std::string& host) {
  if (host == "*")
    return bad("network rules: a bare \"*\" is not a host (\"*.example.com\" is its subdomains)");
  if (host.rfind("*.", 0) == 0) {
    if (!dns_name(host.substr(2)))
      return bad("network rules: \"" + host + "\" is not a wildcard of a DNS name");
    return std::nullopt;
  }
  if (host.find('/') != std::string::npos)
    return bad("network rules: \"" + host +
               "\": rules are keyed by DNS names, \"*.\" wildcards or IPv4 addresses, not CIDRs");
  bool numeric = host.find_first_not_of("0123456789.") == std::string::npos;
  if (ipv4(host) || (!numeric && dns_name(host))) return std::nullopt;
  return bad("network rules: \"" + host +
             "\" is not a DNS name, a \"*.\" wildcard of one or an IPv4 address");
}

std::vector<std::pair<std::string, bool>> parts(const std::string& value) {
  std::vector<std::pair<std::string, bool>> out;
  size_t at = 0;
  while (at < value.size()) {
    size_t m = value.find(kSecretMarker, at);
    size_t end = m == std::string::npos ? std::string::npos : value.find('}', m);
    if (m == std::string::npos || end == std::string::npos) {
      out.emplace_back(value.substr(at), false);
      break;
    }
    if (m > at) out.emplace_back(value.substr(at, m - at), false);
    out.emplace_back(value.substr(m + kSecretMarkerLen, end - m - kSecretMarkerLen), true);
    at = end + 1;
  }
  return out;
}

bool one_line(const std::string& value) {
  return value.find_first_of(std::string("\r\n\0", 3)) == std::string::npos;
}

std::optional<Rejection> check(const std::vector<storage::HeaderRule>& rules) {
  std::map<std::string, std::set<std::string>> per_host;  // host -> header names (lower case)
  for (auto& r : rules) {
    if (auto no = check_host(r.host)) return no;
    if (r.host != lower(r.host)) return bad("network rules: hosts are lower case: " + r.host);
    if (r.header.empty() || r.header.size() > kMaxHeaderNameBytes ||
        !std::all_of(r.header.begin(), r.header.end(), token_char))
      return bad("network rules (" + r.host + "): \"" + r.header +
                 "\" is not an HTTP header name (1.." + std::to_string(kMaxHeaderNameBytes) +
                 " token characters)");
    if (reserved_header(r.header))
      return bad("network rules (" + r.host + "): " + r.header +
                 " frames or routes the request: a rule does not set it");
    if (r.value.size() > kMaxValueBytes || !one_line(r.value))
      return bad("network rules (" + r.host + ", " + r.header +
                 "): a value is one line of at most " + std::to_string(kMaxValueBytes) + " bytes");
    if (r.value.find(kIdentityMarker) != std::string::npos)
      return Rejection{Code::not_implemented,
                       "network rules (" + r.host + ", " + r.header +
                           "): E2B's workload identity tokens (${e2b.identity...}) are not served "
                           "here; use a secret (${e2b.secrets.NAME})"};
    for (size_t m = r.value.find(kSecretMarker); m != std::string::npos;
         m = r.value.find(kSecretMarker, m + 1)) {
      auto end = r.value.find('}', m);
      auto name = end == std::string::npos
                      ? std::string()
                      : r.value.substr(m + kSecretMarkerLen, end - m - kSecretMarkerLen);
      if (name.empty() || name.find('{') != std::string::npos ||
          name.find('$') != std::string::npos)
        return bad("network rules (" + r.host + ", " + r.header +
                   "): a secret's marker is ${e2b.secrets.NAME} (Secret.fill(name))");
    }
    auto& headers = per_host[r.host];
    headers.insert(lower(r.header));
    if (headers.size() > kMaxHeadersPerHost)
      return bad("network rules (" + r.host + "): at most " + std::to_string(kMaxHeadersPerHost) +
                 " headers per host");
  }
  if (per_host.size() > kMaxHosts)
    return bad("network rules: at most " + std::to_string(kMaxHosts) + " hosts");
  return std::nullopt;
}

std::set<std::string> secret_names(const std::vector<storage::HeaderRule>& rules) {
  std::set<std::string> out;
  for (auto& r : rules)
    for (auto& [text, marker] : parts(r.value))
      if (marker) out.insert(text);
  return out;
}

std::vector<const storage::HeaderRule*> for_host(const std::vector<storage::HeaderRule>& rules,
                                                 const std::string& host) {
  std::vector<const storage::HeaderRule*> out;
  for (auto& r : rules)
    if (r.host == host) out.push_back(&r);
  if (!out.empty()) return out;
  // The longest wildcard whose suffix (".example.com") ends the host (a subdomain: not the apex).
  const std::string* best = nullptr;
  for (auto& r : rules) {
    if (r.host.rfind("*.", 0) != 0) continue;
    std::string_view suffix(r.host.data() + 1, r.host.size() - 1);
    if (host.size() > suffix.size() &&
        std::string_view(host).substr(host.size() - suffix.size()) == suffix &&
        (!best || r.host.size() > best->size()))
      best = &r.host;
  }
  if (best)
    for (auto& r : rules)
      if (r.host == *best) out.push_back(&r);
  return out;
}

}  // namespace pandastack::actors::header_rules
