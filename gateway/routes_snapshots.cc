// Snapshots: take one of a running sandbox (named or not), list and inspect the tenant's, delete
// one. Where a snapshot is named in a path or a create, its name serves as well as its id.
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json snapshot_json(const actors::SnapshotInfo& s) {
  Json j = Json::object();
  j.set("id", s.id);
  j.set("sandbox", s.sandbox);
  if (!s.name.empty()) j.set("name", s.name);
  j.set("current", s.current);  // the newest taken with its name: what the name stands for
  j.set("template", actors::template_display_name(s.template_name));
  j.set("created_at_ms", s.created_at_ms);
  j.set("size_bytes", s.size_bytes);  // what it holds: RAM (host memory) and disk layers
  j.set("memory_bytes", s.memory_bytes);
  // "local": a synced copy on the data disk; "remote": in the object store too
  j.set("durable", s.remote ? "remote" : s.durable ? "local" : "none");
  return j;
}

// The id of the snapshot the path names (by id or by name).
std::string snapshot_param(Call& c) {
  const std::string& snap = c.r.param("snapshot_id");
  if (snap.empty() || snap.size() > 160)
    throw ApiError{Code::snapshot_not_found, "no snapshot " + snap.substr(0, 160)};
  return unwrap(c.gw.rt.resolve_snapshot(c.tenant(), snap));
}

}  // namespace

std::vector<Route> snapshot_routes() {
  return {
      route(M::POST, "/v1/sandboxes/{id}/snapshots", "Snapshot a running sandbox",
            [](Call& c) {
              Fields f(c.r.json(), {"name"});
              std::string name = f.str("name");
              Json j = Json::object();
              j.set("snapshot_id", unwrap(c.gw.rt.snapshot(c.tenant(), c.id, name)));
              if (!name.empty()) j.set("name", name);
              return json_reply(201, j);
            }),
      route(M::GET, "/v1/snapshots",
            "List this tenant's snapshots (with their sizes; ?name= the one a name stands for)",
            [](Call& c) {
              auto all = unwrap(c.gw.rt.snapshots(c.tenant()));
              if (auto name = c.r.q("name")) {
                auto* named = actors::find_snapshot(all, c.tenant(), *name);
                std::string id = named ? named->id : "";
                std::erase_if(all, [&](auto& s) { return s.id != id; });
              }
              return list_reply("snapshots", all, snapshot_json);
            },
            {"name"}),
      route(M::GET, "/v1/snapshots/{snapshot_id}", "One snapshot",
            [](Call& c) {
              const std::string& ref = c.r.param("snapshot_id");
              auto all = unwrap(c.gw.rt.snapshots(c.tenant()));
              if (auto* s = actors::find_snapshot(all, c.tenant(), ref))
                return json_reply(200, snapshot_json(*s));
              throw ApiError{Code::snapshot_not_found, "no snapshot " + ref.substr(0, 160)};
            }),
      route(M::DELETE, "/v1/snapshots/{snapshot_id}",
            "Delete a snapshot (creates from it are refused afterwards)",
            [](Call& c) {
              unwrap(c.gw.rt.delete_snapshot(c.tenant(), snapshot_param(c)));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
