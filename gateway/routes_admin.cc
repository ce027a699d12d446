// The audit log (a tenant's; every tenant's with an admin key) and API keys (admin keys only).
#include <spdlog/spdlog.h>

#include "gateway/e2b.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

}  // namespace

std::vector<Route> admin_routes() {
  return {
      route(M::GET, "/v1/audit",
            "The audit log (?after=, ?from_ms=, ?to_ms=, ?limit=, admin ?all=1)",
            [](Call& c) {
              actors::AuditQuery q;
              bool all = query_flag(c.r, "all");
              if (all && !c.key.admin) throw ApiError{Code::forbidden, "all=1 needs an admin key"};
              q.tenant = all ? "" : c.tenant();
              q.after_seq = query_int(c.r, "after", 0, INT64_MAX);
              q.from_ms = query_int(c.r, "from_ms", 0, INT64_MAX);
              q.to_ms = query_int(c.r, "to_ms", 0, INT64_MAX);
              q.limit = size_t(query_int(c.r, "limit", 1000, 10000));
              Json list = Json::array();
              uint64_t last = q.after_seq;
              for (auto& e : unwrap(c.gw.rt.audit(q))) {
                list.push(audit_json(e));
                last = e.global_seq;
              }
              Json j = Json::object();
              j.set("events", list);
              j.set("next_after", last);
              return json_reply(200, j);
            },
            {"after", "from_ms", "to_ms", "limit", "all"}),
      route(M::GET, "/v1/keys", "List API keys (admin)",
            [](Call& c) {
              admin_only(c);
              return list_reply("keys", unwrap(c.gw.rt.list_keys()), [](const actors::KeyInfo& k) {
                Json j = Json::object();
                j.set("id", k.id);
                j.set("tenant", k.tenant);
                j.set("admin", k.admin);
                j.set("created_ms", k.created_ms);
                return j;
              });
            }),
      route(M::POST, "/v1/keys", "Create an API key for a tenant (admin)",
            [](Call& c) {
              admin_only(c);
              Fields f(c.r.json(), {"tenant", "admin"});
              auto [token, info] = unwrap(c.gw.rt.create_key(f.str("tenant"), f.boolean("admin")));
              Json j = Json::object();
              j.set("id", info.id);
              j.set("key", token);
              j.set("e2b_key", e2b::api_key_form(token));  // the same key, for E2B's SDKs
              j.set("tenant", info.tenant);
              j.set("admin", info.admin);
              spdlog::info("gateway: key {} created for tenant {}", info.id, info.tenant);
              return json_reply(201, j);
            }),
      route(M::DELETE, "/v1/keys/{key_id}", "Revoke an API key (admin)",
            [](Call& c) {
              admin_only(c);
              unwrap(c.gw.rt.revoke_key(c.r.param("key_id")));
              spdlog::info("gateway: key {} revoked", c.r.param("key_id"));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
