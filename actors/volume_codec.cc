#include "actors/volume_codec.h"

#include "actors/codec_util.h"
#include "actors/event_codec.h"
#include "wire/events.capnp.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace w = pandastack::wire::events;

using codec::get_map;
using codec::put_map;

std::string encode_volume_event(const VolumeEvent& e) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<w::VolumeEvent>();
  b.setAtMs(e.at_ms);
  using K = VolumeEvent::Kind;
  switch (e.kind) {
    case K::created: {
      auto c = b.initCreated();
      c.setTenant(e.tenant);
      c.setName(e.name);
      c.setSizeMib(e.size_mib);
      put_map(c.initMetadata(unsigned(e.metadata.size())), e.metadata);
      c.setOrigin(e.origin);
      break;
    }
    case K::attached: {
      auto a = b.initAttached();
      a.setSandbox(e.attachment.sandbox);
      a.setMount(e.attachment.mount);
      a.setReadOnly(e.attachment.read_only);
      break;
    }
    case K::detached: {
      auto d = b.initDetached();
      d.setSandbox(e.attachment.sandbox);
      d.setReason(e.reason);
      break;
    }
    case K::resized:
      b.setResized(e.size_mib);
      break;
    case K::metadata_changed:
      put_map(b.initMetadataChanged(unsigned(e.metadata.size())), e.metadata);
      break;
    case K::deleted:
      b.setDeleted();
      break;
    case K::snapshotted: {
      auto sn = b.initSnapshotted();
      sn.setSnapshotId(e.snapshot.id);
      sn.setSizeMib(e.snapshot.size_mib);
      break;
    }
    case K::snapshot_deleted:
      b.setSnapshotDeleted(e.snapshot.id);
      break;
    case K::arrived: {
      auto a = b.initArrived();
      a.setFromHost(e.host);
      a.setTenant(e.tenant);
      a.setName(e.name);
      a.setSizeMib(e.size_mib);
      put_map(a.initMetadata(unsigned(e.metadata.size())), e.metadata);
      a.setOrigin(e.origin);
      a.setCreatedAtMs(e.created_at_ms);
      auto sn = a.initSnapshots(unsigned(e.snapshots.size()));
      for (unsigned i = 0; i < sn.size(); ++i) {
        sn[i].setId(e.snapshots[i].id);
        sn[i].setSizeMib(e.snapshots[i].size_mib);
        sn[i].setCreatedAtMs(e.snapshots[i].created_at_ms);
      }
      break;
    }
    case K::migrated:
      b.setMigrated(e.host);
      break;
    case K::uploaded: {
      auto u = b.initUploaded();
      u.setManifest(e.manifest);
      u.setFileVersion(e.file_version);
      break;
    }
  }
  return codec::to_bytes(msg);
}

std::optional<VolumeEvent> decode_volume_event(const std::string& bytes) {
  return codec::from_bytes<w::VolumeEvent, VolumeEvent>(
      bytes, [](w::VolumeEvent::Reader r) -> std::optional<VolumeEvent> {
        VolumeEvent e;
        e.at_ms = r.getAtMs();
        using K = VolumeEvent::Kind;
        switch (r.which()) {
          case w::VolumeEvent::CREATED: {
            auto c = r.getCreated();
            e.kind = K::created;
            e.tenant = c.getTenant();
            e.name = c.getName();
            e.size_mib = c.getSizeMib();
            e.metadata = get_map(c.getMetadata());
            e.origin = c.getOrigin();
            break;
          }
          case w::VolumeEvent::ATTACHED: {
            auto a = r.getAttached();
            e.kind = K::attached;
            e.attachment.sandbox = a.getSandbox();
            e.attachment.mount = a.getMount();
            e.attachment.read_only = a.getReadOnly();
            break;
          }
          case w::VolumeEvent::DETACHED: {
            auto d = r.getDetached();
            e.kind = K::detached;
            e.attachment.sandbox = d.getSandbox();
            e.reason = d.getReason();
            break;
          }
          case w::VolumeEvent::RESIZED:
            e.kind = K::resized;
            e.size_mib = r.getResized();
            break;
          case w::VolumeEvent::METADATA_CHANGED:
            e.kind = K::metadata_changed;
            e.metadata = get_map(r.getMetadataChanged());
            break;
          case w::VolumeEvent::DELETED:
            e.kind = K::deleted;
            break;
          case w::VolumeEvent::SNAPSHOTTED:
            e.kind = K::snapshotted;
            e.snapshot.id = r.getSnapshotted().getSnapshotId();
            e.snapshot.size_mib = r.getSnapshotted().getSizeMib();
            e.snapshot.created_at_ms = e.at_ms;
            break;
          case w::VolumeEvent::SNAPSHOT_DELETED:
            e.kind = K::snapshot_deleted;
            e.snapshot.id = r.getSnapshotDeleted();
            break;
          case w::VolumeEvent::ARRIVED: {
            auto a = r.getArrived();
            e.kind = K::arrived;
            e.host = a.getFromHost();
            e.tenant = a.getTenant();
            e.name = a.getName();
            e.size_mib = a.getSizeMib();
            e.metadata = get_map(a.getMetadata());
            e.origin = a.getOrigin();
            e.created_at_ms = a.getCreatedAtMs();
            for (auto sn : a.getSnapshots())
              e.snapshots.push_back({sn.getId(), sn.getSizeMib(), sn.getCreatedAtMs()});
            break;
          }
          case w::VolumeEvent::MIGRATED:
            e.kind = K::migrated;
            e.host = r.getMigrated();
            break;
          case w::VolumeEvent::UPLOADED:
            e.kind = K::uploaded;
            e.manifest = r.getUploaded().getManifest();
            e.file_version = r.getUploaded().getFileVersion();
            break;
          default:
            return std::nullopt;
        }
        return e;
      });
}

std::string volume_event_to_json(const VolumeEvent& e) {
  using wire::Json;
  Json j = Json::object();
  j.set("kind", to_string(e.kind));
  j.set("at_ms", e.at_ms);
  auto metadata = [&] { return string_map_json(e.metadata); };
  using K = VolumeEvent::Kind;
  switch (e.kind) {
    case K::created:
      j.set("tenant", e.tenant);
      j.set("name", e.name);
      j.set("size_mib", e.size_mib);
      j.set("metadata", metadata());
      if (!e.origin.empty()) j.set("origin", e.origin);
      break;
    case K::attached:
      j.set("sandbox", e.attachment.sandbox);
      j.set("mount", e.attachment.mount);
      j.set("read_only", e.attachment.read_only);
      break;
    case K::detached:
      j.set("sandbox", e.attachment.sandbox);
      j.set("reason", e.reason);
      break;
    case K::resized:
      j.set("size_mib", e.size_mib);
      break;
    case K::metadata_changed:
      j.set("metadata", metadata());
      break;
    case K::deleted:
      break;
    case K::snapshotted:
      j.set("snapshot_id", e.snapshot.id);
      j.set("size_mib", e.snapshot.size_mib);
      break;
    case K::snapshot_deleted:
      j.set("snapshot_id", e.snapshot.id);
      break;
    case K::arrived: {
      j.set("from_host", e.host);
      j.set("tenant", e.tenant);
      j.set("name", e.name);
      j.set("size_mib", e.size_mib);
      j.set("metadata", metadata());
      if (!e.origin.empty()) j.set("origin", e.origin);
      j.set("created_at_ms", e.created_at_ms);
      Json sn = Json::array();
      for (auto& x : e.snapshots) sn.push(x.id);
      j.set("snapshots", sn);
      break;
    }
    case K::migrated:
      j.set("host", e.host);
      break;
    case K::uploaded:
      j.set("manifest", e.manifest);
      j.set("file_version", e.file_version);
      break;
  }
  return j.dump();
}

}  // namespace pandastack::actors
