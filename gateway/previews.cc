#include "gateway/previews.h"

#include <cctype>

#include "gateway/http_util.h"
#include "gateway/signing.h"

namespace pandastack::gateway {

namespace {

std::optional<uint32_t> port_of(std::string_view s) {
  if (s.empty() || s.size() > 5) return std::nullopt;
  uint32_t p = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    p = p * 10 + uint32_t(c - '0');
  }
  if (p == 0 || p > 65535) return std::nullopt;
  return p;
}

bool id_ok(std::string_view id) {
  if (id.size() < 5 || id.size() > 64 || id.substr(0, 4) != "sbx_") return false;
  for (char c : id.substr(4))
    if (!std::isalnum((unsigned char)c)) return false;
  return true;
}

// Splits the query of `url` off, takes `token` out of it; the rest stays as it was sent.
void split_token(std::string_view url, PreviewAddress& a, std::string_view path) {
  auto q = url.find('?');
  std::string target(path);
  if (q == std::string_view::npos) {
    a.target = target;
    return;
  }
  std::string kept;
  std::string_view query = url.substr(q + 1);
  while (!query.empty()) {
    auto amp = query.find('&');
    auto part = query.substr(0, amp);
    if (part.substr(0, 6) == "token=")
      a.token = std::string(part.substr(6));
    else if (!part.empty())
      kept += (kept.empty() ? "" : "&") + std::string(part);
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  a.target = kept.empty() ? target : target + "?" + kept;
}

}  // namespace

std::optional<PreviewAddress> preview_by_host(std::string_view host, std::string_view domain,
                                              std::string_view url) {
  if (domain.empty() || host.size() <= domain.size() + 1 || host.size() > 255) return std::nullopt;
  std::string h = ascii_lower(host), d = ascii_lower(domain);
  if (h.compare(h.size() - d.size(), d.size(), d) != 0 || h[h.size() - d.size() - 1] != '.')
    return std::nullopt;
  std::string label = h.substr(0, h.size() - d.size() - 1);
  auto dash = label.find('-');
  if (dash == std::string::npos) return std::nullopt;
  auto port = port_of(std::string_view(label).substr(0, dash));
  std::string id = label.substr(dash + 1);
  if (id.rfind("sbx_", 0) != 0) id = "sbx_" + id;
  if (!port || !id_ok(id)) return std::nullopt;
  PreviewAddress a;
  a.id = id;
  a.port = *port;
  a.host_based = true;
  a.cookie_path = "/";
  auto q = url.find('?');
  std::string_view path = url.substr(0, q);
  split_token(url, a, path.empty() ? std::string_view("/") : path);
  return a;
}

std::optional<PreviewAddress> preview_by_path(std::string_view url) {
  constexpr std::string_view kHead = "/v1/sandboxes/";
  if (url.substr(0, kHead.size()) != kHead) return std::nullopt;
  std::string_view rest = url.substr(kHead.size());
  auto slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string id(rest.substr(0, slash));
  rest.remove_prefix(slash);
  constexpr std::string_view kPreviews = "/previews/";
  if (rest.substr(0, kPreviews.size()) != kPreviews) return std::nullopt;
  rest.remove_prefix(kPreviews.size());
  auto end = rest.find_first_of("/?");
  if (end == std::string_view::npos || rest[end] != '/') return std::nullopt;
  auto port = port_of(rest.substr(0, end));
  if (!port || !id_ok(id)) return std::nullopt;
  PreviewAddress a;
  a.id = id;
  a.port = *port;
  a.prefix = std::string(kHead) + id + std::string(kPreviews) + std::to_string(*port);
  a.cookie_path = a.prefix + "/";
  std::string_view after = rest.substr(end);  // "/..." and the query
  auto q = after.find('?');
  split_token(after, a, after.substr(0, q));
  return a;
}

std::string PreviewTokens::issue(const std::string& sandbox, const actors::Preview& p) const {
  return b64url(hmac_sha256(secret_, "pds-preview-v1\n" + sandbox + "\n" + std::to_string(p.port) +
                                         "\n" + std::to_string(p.expires_at_ms) + "\n" + p.nonce));
}

bool PreviewTokens::verify(std::string_view token, const std::string& sandbox,
                           const actors::Preview& p) const {
  if (token.empty() || token.size() > kMaxPreviewTokenBytes) return false;
  return equal_secret(token, issue(sandbox, p));
}

std::vector<std::string> cookie_values(std::string_view header, std::string_view name) {
  std::vector<std::string> out;
  while (!header.empty()) {
    auto semi = header.find(';');
    auto part = header.substr(0, semi);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    auto eq = part.find('=');
    if (eq != std::string_view::npos && part.substr(0, eq) == name)
      out.emplace_back(part.substr(eq + 1));
    if (semi == std::string_view::npos) break;
    header.remove_prefix(semi + 1);
  }
  return out;
}

std::string without_cookie(std::string_view header, std::string_view name) {
  std::string out;
  while (!header.empty()) {
    auto semi = header.find(';');
    auto part = header.substr(0, semi);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    auto eq = part.find('=');
    if (!part.empty() && !(eq != std::string_view::npos && part.substr(0, eq) == name))
      out += (out.empty() ? "" : "; ") + std::string(part);
    if (semi == std::string_view::npos) break;
    header.remove_prefix(semi + 1);
  }
  return out;
}

std::string preview_host_url(const PreviewSettings& s, const std::string& id, uint32_t port) {
  return s.scheme + "://" + std::to_string(port) + "-" + id + "." + s.domain + "/";
}

std::string preview_path_url(const PreviewSettings& s, const std::string& api_host,
                             const std::string& id, uint32_t port) {
  return s.scheme + "://" + api_host + "/v1/sandboxes/" + id + "/previews/" + std::to_string(port) +
         "/";
}

}  // namespace pandastack::gateway
