// Preview URLs: a sandbox's web server reachable through the daemon's HTTP server. This file is
// their addresses and tokens; the reverse proxy is preview_proxy.cc, the API routes_previews.cc.
//
// Two URL shapes reach guest port P of sandbox S:
//   host-based  http://P-S.DOMAIN/...                 (DOMAIN: --preview-domain; default
//               localhost:<api port>, and *.localhost resolves to the host in browsers)
//   path-based  http://API-HOST/v1/sandboxes/S/previews/P/...   (no wildcard DNS needed)
// Access: a token in the `token` query parameter, exchanged at the first request for a cookie of
// that host (host-based) or path (path-based) so the app's own links work; or none for a public
// preview. A token is HMAC-SHA256(preview key; sandbox, port, expiry, nonce): it names one port of
// one sandbox until one instant, and opening the port's preview again (a new nonce) or closing it
// revokes it. The key is DATA/preview-token-secret, or the cluster's (derived from its token key).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/sandbox.h"

namespace pandastack::gateway {

struct PreviewSettings {
  std::string domain;  // host-based URLs: {port}-{id}.{domain}
  std::string scheme = "http";
  uint64_t max_upload_bytes = 1ull << 30;              // a request body: 413 above
  std::chrono::milliseconds connect_timeout{5000};     // the guest port must accept within
  std::chrono::milliseconds response_timeout{300000};  // the app's response headers within
  bool enabled() const { return !domain.empty(); }
};

// A request addressed to a preview.
struct PreviewAddress {
  std::string id;
  uint32_t port = 0;
  bool host_based = false;
  std::string target;          // the path and query the guest sees (the token removed)
  std::string token;           // the `token` query parameter, or ""
  std::string cookie_path;     // where the preview's cookie applies: "/" or the path prefix
  std::string prefix;          // path-based: "/v1/sandboxes/S/previews/P" (X-Forwarded-Prefix)
  std::string client_address;  // the client's IP address (X-Forwarded-For), or ""
};

// `host` (a Host header) names a preview under `domain` (case-insensitive): "P-S.DOMAIN", S with
// or without its "sbx_". `url`: the request's path and query.
std::optional<PreviewAddress> preview_by_host(std::string_view host, std::string_view domain,
                                              std::string_view url);
// `url` is "/v1/sandboxes/S/previews/P/..." (the slash after P is what makes it the proxy's:
// without it, it is the API's route for that preview).
std::optional<PreviewAddress> preview_by_path(std::string_view url);

class PreviewTokens {
 public:
  explicit PreviewTokens(std::string secret) : secret_(std::move(secret)) {}
  std::string issue(const std::string& sandbox, const actors::Preview& p) const;
  // Whether `token` is the token of preview `p` of `sandbox` (expiry is the caller's check).
  bool verify(std::string_view token, const std::string& sandbox, const actors::Preview& p) const;

 private:
  std::string secret_;
};

inline constexpr const char* kPreviewCookie = "pds_preview";
inline constexpr size_t kMaxPreviewTokenBytes = 128;

// The values of the cookies named `name` in a Cookie header (several may share a name).
std::vector<std::string> cookie_values(std::string_view header, std::string_view name);
// The Cookie header without the cookies named `name` (what the guest is given).
std::string without_cookie(std::string_view header, std::string_view name);

// The preview's URLs (without a token): host-based, and path-based at `api_host` (the Host the
// API was reached at).
std::string preview_host_url(const PreviewSettings& s, const std::string& id, uint32_t port);
std::string preview_path_url(const PreviewSettings& s, const std::string& api_host,
                             const std::string& id, uint32_t port);

}  // namespace pandastack::gateway
