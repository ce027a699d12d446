// Preview URLs (previews.h): open one for a guest port, list, get and close them. The proxy that
// serves them is preview_proxy.cc.
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

void need_previews(const Server& gw) {
  if (!gw.preview_tokens)
    throw ApiError{Code::not_implemented, "this server does not serve preview URLs"};
}

// What the API says of a preview: its URLs carry its token (none for a public one).
Json preview_json(const Server& gw, const Request& r, const std::string& id,
                  const actors::Preview& p) {
  Json j = Json::object();
  j.set("port", p.port);
  j.set("public", p.is_public);
  j.set("created_at_ms", p.created_at_ms);
  j.set("expires_at_ms", p.expires_at_ms);
  std::string query;
  if (!p.is_public) {
    auto token = gw.preview_tokens->issue(id, p);
    j.set("token", token);
    query = "?token=" + token;
  }
  j.set("url", preview_host_url(gw.preview, id, p.port) + query);
  std::string api_host = r.host.empty() ? gw.preview.domain : r.host;
  j.set("path_url", preview_path_url(gw.preview, api_host, id, p.port) + query);
  return j;
}

}  // namespace

std::vector<Route> preview_routes() {
  return {
      route(M::POST, "/v1/sandboxes/{id}/previews",
            "Serve a guest port at a preview URL (again: a new URL, the old one revoked)",
            [](Call& c) {
              need_previews(c.gw);
              Fields f(c.r.json(), {"port", "ttl_seconds", "public"});
              if (!f.has("port")) throw ApiError{Code::invalid_argument, "port is required"};
              auto port = uint32_t(f.integer("port", 0, 1, 65535));
              const auto& limits = c.gw.rt.config().limits;
              auto ttl = uint32_t(f.integer("ttl_seconds", 0, 1, limits.max_preview_ttl_seconds));
              auto p =
                  unwrap(c.gw.rt.open_preview(c.tenant(), c.id, port, f.boolean("public"), ttl));
              return json_reply(201, preview_json(c.gw, c.r, c.id, p));
            }),
      route(M::GET, "/v1/sandboxes/{id}/previews", "The sandbox's preview URLs",
            [](Call& c) {
              need_previews(c.gw);
              Json list = Json::array();
              for (auto& p : unwrap(c.gw.rt.previews(c.tenant(), c.id)))
                list.push(preview_json(c.gw, c.r, c.id, p));
              Json j = Json::object();
              j.set("previews", list);
              return json_reply(200, j);
            }),
      route(M::GET, "/v1/sandboxes/{id}/previews/{port}", "One preview URL",
            [](Call& c) {
              need_previews(c.gw);
              auto port = uint32_t(parse_number(c.r.param("port"), "port", 1, 65535));
              for (auto& p : unwrap(c.gw.rt.previews(c.tenant(), c.id)))
                if (p.port == port) return json_reply(200, preview_json(c.gw, c.r, c.id, p));
              throw ApiError{Code::preview_not_found,
                             "port " + std::to_string(port) + " has no preview URL"};
            }),
      route(M::DELETE, "/v1/sandboxes/{id}/previews/{port}",
            "Revoke a preview URL (at once: its next request is refused)",
            [](Call& c) {
              need_previews(c.gw);
              unwrap(c.gw.rt.close_preview(c.tenant(), c.id,
                                           parse_number(c.r.param("port"), "port", 1, 65535)));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
