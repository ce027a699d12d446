// Snapshots: take one of a running sandbox, list and inspect the tenant's, delete one.
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json snapshot_json(const actors::SnapshotInfo& s) {
  Json j = Json::object();
  j.set("id", s.id);
  j.set("sandbox", s.sandbox);
  j.set("template", actors::template_display_name(s.template_name));
  j.set("created_at_ms", s.created_at_ms);
  j.set("size_bytes", s.size_bytes);  // what it holds: RAM (host memory) and disk layers
  j.set("memory_bytes", s.memory_bytes);
  return j;
}

std::string snapshot_param(const Request& r) {
  const std::string& snap = r.param("snapshot_id");
  if (snap.empty() || snap.size() > 64)
    throw ApiError{Code::snapshot_not_found, "no snapshot " + snap.substr(0, 64)};
  return snap;
}

}  // namespace

std::vector<Route> snapshot_routes() {
  return {
      route(M::POST, "/v1/sandboxes/{id}/snapshots", "Snapshot a running sandbox",
            [](Call& c) {
              Fields f(c.r.json(), {});
              Json j = Json::object();
              j.set("snapshot_id", unwrap(c.gw.rt.snapshot(c.tenant(), c.id)));
              return json_reply(201, j);
            }),
      route(M::GET, "/v1/snapshots", "List this tenant's snapshots (with their sizes)",
            [](Call& c) {
              return list_reply("snapshots", unwrap(c.gw.rt.snapshots(c.tenant())), snapshot_json);
            }),
      route(M::GET, "/v1/snapshots/{snapshot_id}", "One snapshot",
            [](Call& c) {
              auto snap = snapshot_param(c.r);
              for (auto& s : unwrap(c.gw.rt.snapshots(c.tenant())))
                if (s.id == snap) return json_reply(200, snapshot_json(s));
              throw ApiError{Code::snapshot_not_found, "no snapshot " + snap};
            }),
      route(M::DELETE, "/v1/snapshots/{snapshot_id}",
            "Delete a snapshot (creates from it are refused afterwards)",
            [](Call& c) {
              unwrap(c.gw.rt.delete_snapshot(c.tenant(), snapshot_param(c.r)));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
