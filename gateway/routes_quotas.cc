// Quotas: a key's own tenant's (limits and use), and any tenant's for an admin, who may set them.
#include <spdlog/spdlog.h>

#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json quotas_reply(const std::string& tenant, const actors::Quotas& q,
                  const std::optional<actors::QuotaUse>& use) {
  Json j = Json::object();
  j.set("tenant", tenant);
  j.set("limits", actors::quotas_json(q));
  if (use) j.set("use", actors::use_json(*use));
  return j;
}

}  // namespace

std::vector<Route> quota_routes() {
  return {
      route(M::GET, "/v1/quotas", "This key's tenant's quotas and what it uses of them",
            [](Call& c) {
              auto [q, use] = unwrap(c.gw.rt.quotas(c.tenant()));
              auto j = quotas_reply(c.tenant(), q, use);
              // (a host-wide limit, --quota-templates: not one a tenant's quotas set)
              auto limits = j["limits"];
              limits.set("templates", int64_t(c.gw.rt.config().max_templates));
              j.set("limits", limits);
              return json_reply(200, j);
            }),
      route(M::GET, "/v1/quotas/{tenant}", "A tenant's quotas and use (admin)",
            [](Call& c) {
              admin_only(c);
              auto tenant = c.r.param("tenant");
              auto [q, use] = unwrap(c.gw.rt.quotas(tenant));
              return json_reply(200, quotas_reply(tenant, q, use));
            }),
      route(M::PUT, "/v1/quotas/{tenant}",
            "Set a tenant's own quotas: the fields given, over its current ones (admin)",
            [](Call& c) {
              admin_only(c);
              auto tenant = c.r.param("tenant");
              auto q = unwrap(c.gw.rt.set_quotas(tenant, c.r.json()));
              spdlog::info("gateway: quotas of tenant {} set by key {}", tenant, c.key.id);
              return json_reply(200, quotas_reply(tenant, q, std::nullopt));
            }),
      route(M::DELETE, "/v1/quotas/{tenant}",
            "Forget a tenant's own quotas: the defaults apply (admin)",
            [](Call& c) {
              admin_only(c);
              auto tenant = c.r.param("tenant");
              auto q = unwrap(c.gw.rt.reset_quotas(tenant));
              return json_reply(200, quotas_reply(tenant, q, std::nullopt));
            }),
  };
}

}  // namespace pandastack::gateway
