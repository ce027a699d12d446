// Volumes: create (empty, or from a volume snapshot), list, get, change (grow, metadata), delete;
// volume snapshots. Attaching is part of a sandbox's create (routes_sandboxes.cc: "volumes").
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

std::string volume_param(const Request& r) {
  const std::string& id = r.param("volume_id");
  if (id.size() != 20 || id.rfind("vol_", 0) != 0)
    throw ApiError{Code::volume_not_found, "no volume " + id.substr(0, 64)};
  return id;
}

std::string snapshot_param(const Request& r) {
  const std::string& id = r.param("snapshot_id");
  if (id.size() != 22 || id.rfind("vsnap_", 0) != 0)
    throw ApiError{Code::snapshot_not_found, "no volume snapshot " + id.substr(0, 64)};
  return id;
}

// {size_mib, name?, metadata?}, or {from_snapshot, size_mib? (default: the snapshot's), ...}.
HttpReply create(Call& c) {
  const auto& lim = c.gw.rt.config().volume_limits;
  Fields f(c.r.json(), {"name", "size_mib", "metadata", "from_snapshot"});
  actors::VolumeRequest req;
  req.from_snapshot = f.str("from_snapshot");
  if (!f.has("size_mib") && req.from_snapshot.empty())
    throw ApiError{Code::invalid_argument, "size_mib is required"};
  if (f.has("from_snapshot") &&
      (req.from_snapshot.size() != 22 || req.from_snapshot.rfind("vsnap_", 0) != 0))
    throw ApiError{Code::snapshot_not_found,
                   "no volume snapshot " + req.from_snapshot.substr(0, 64)};
  req.tenant = c.tenant();
  req.name = f.str("name");
  if (f.has("size_mib"))
    req.size_mib =
        uint64_t(f.integer("size_mib", 0, int64_t(lim.min_size_mib), int64_t(lim.max_size_mib)));
  req.metadata = f.string_map("metadata");
  return json_reply(201, volume_json(unwrap(c.gw.rt.create_volume(req))));
}

HttpReply list(Call& c) {
  std::map<std::string, std::string> metadata;
  for (auto& [k, v] : c.r.query)
    if (k.rfind("metadata.", 0) == 0) metadata[k.substr(9)] = v;
  return list_reply("volumes", unwrap(c.gw.rt.list_volumes(c.tenant(), metadata)), volume_json);
}

// PATCH: size_mib (grows only, while detached) and/or metadata (replaced).
HttpReply change(Call& c) {
  const auto& lim = c.gw.rt.config().volume_limits;
  Fields f(c.r.json(), {"size_mib", "metadata"});
  if (!f.has("size_mib") && !f.has("metadata"))
    throw ApiError{Code::invalid_argument, "give size_mib and/or metadata"};
  std::optional<uint64_t> size;
  if (f.has("size_mib"))
    size = uint64_t(f.integer("size_mib", 0, int64_t(lim.min_size_mib), int64_t(lim.max_size_mib)));
  std::optional<std::map<std::string, std::string>> metadata;
  if (f.has("metadata")) metadata = f.string_map("metadata");
  return json_reply(
      200,
      volume_json(unwrap(c.gw.rt.update_volume(c.tenant(), volume_param(c.r), size, metadata))));
}

}  // namespace

std::vector<Route> volume_routes() {
  return {
      route(M::POST, "/v1/volumes", "Create a volume (an ext4 file system on the host's disk)",
            create),
      route(M::GET, "/v1/volumes", "List this tenant's volumes (filter: metadata.KEY=VALUE)", list,
            {"metadata.*"}),
      route(M::GET, "/v1/volumes/{volume_id}", "One volume, with its attachments",
            [](Call& c) {
              return json_reply(
                  200, volume_json(unwrap(c.gw.rt.get_volume(c.tenant(), volume_param(c.r)))));
            }),
      route(M::PATCH, "/v1/volumes/{volume_id}", "Grow a detached volume and/or set its metadata",
            change),
      route(M::DELETE, "/v1/volumes/{volume_id}",
            "Delete a volume (409 volume_attached while a sandbox holds it)",
            [](Call& c) {
              unwrap(c.gw.rt.delete_volume(c.tenant(), volume_param(c.r)));
              return no_content();
            }),
      route(M::POST, "/v1/volumes/{volume_id}/snapshots",
            "Snapshot a volume (attached read-write: its guest's file system is frozen meanwhile)",
            [](Call& c) {
              Fields f(c.r.json(), {});
              auto id = volume_param(c.r);
              return json_reply(
                  201, volume_snapshot_json(id, unwrap(c.gw.rt.snapshot_volume(c.tenant(), id))));
            }),
      route(M::GET, "/v1/volumes/{volume_id}/snapshots", "A volume's snapshots, oldest first",
            [](Call& c) {
              auto id = volume_param(c.r);
              auto v = unwrap(c.gw.rt.get_volume(c.tenant(), id));
              Json list = Json::array();
              for (auto& s : v.snapshots) list.push(volume_snapshot_json(id, s));
              Json j = Json::object();
              j.set("snapshots", list);
              return json_reply(200, j);
            }),
      route(M::DELETE, "/v1/volumes/{volume_id}/snapshots/{snapshot_id}",
            "Delete a volume snapshot (volumes made from it keep their data)",
            [](Call& c) {
              unwrap(c.gw.rt.delete_volume_snapshot(c.tenant(), volume_param(c.r),
                                                    snapshot_param(c.r)));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
