// System routes: liveness, metrics, the OpenAPI document (no key needed), and templates.
#include "gateway/server.h"

namespace pandastack::gateway {

std::vector<Route> system_routes() {
  using M = kj::HttpMethod;
  using K = Route::Kind;
  return {
      route(M::GET, "/healthz", "Liveness",
            [](Call&) {
              Json j = Json::object();
              j.set("status", "ok");
              return json_reply(200, j);
            },
            {}, K::json, false),
      route(M::GET, "/metrics", "Prometheus metrics",
            [](Call& c) {
              return HttpReply{200, "text/plain; version=0.0.4", c.gw.metrics(), "", {}};
            },
            {}, K::json, false),
      route(M::GET, "/openapi.json", "This document",
            [](Call& c) { return HttpReply{200, "application/json", c.gw.openapi(), "", {}}; },
            {}, K::json, false),
      route(M::GET, "/v1/templates", "List templates",
            [](Call& c) {
              return list_reply("templates", c.gw.rt.templates(),
                                [](const actors::TemplateInfo& t) {
                                  Json j = Json::object();
                                  j.set("name", t.name);
                                  j.set("baked", t.baked);
                                  return j;
                                });
            }),
  };
}

}  // namespace pandastack::gateway
