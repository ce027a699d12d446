// System routes: liveness, metrics, the OpenAPI document (no key needed), and templates.
#include "gateway/server.h"

namespace pandastack::gateway {

std::vector<Route> system_routes() {
  using M = kj::HttpMethod;
  using K = Route::Kind;
  std::vector<Route> routes = {
      route(
          M::GET, "/healthz",
          "Liveness: \"ok\", or \"recovering\" (with counts) while VMs that outlived a restart "
          "are being adopted",
          [](Call& c) {
            auto r = c.gw.rt.recovery();
            Json j = Json::object();
            j.set("status", r.done() ? "ok" : "recovering");
            if (r.to_adopt > 0) {
              Json a = Json::object();
              a.set("to_adopt", r.to_adopt);
              a.set("adopted", r.adopted);
              a.set("failed", r.failed);
              j.set("recovery", a);
            }
            return json_reply(200, j);
          },
          {}, K::json, false),
      route(
          M::GET, "/metrics", "Prometheus metrics",
          [](Call& c) {
            return HttpReply{200, "text/plain; version=0.0.4", c.gw.metrics(), "", {}};
          },
          {}, K::json, false),
      route(
          M::GET, "/openapi.json", "This document",
          [](Call& c) {
            return HttpReply{200, "application/json", c.gw.openapi(), "", {}};
          },
          {}, K::json, false),
  };
  routes[0].on_loop = true;  // /healthz: reads counters only
  return routes;
}

}  // namespace pandastack::gateway
