#include "actors/event_codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "actors/codec_util.h"
#include "wire/events.capnp.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace w = pandastack::wire::events;

uint32_t event_format() { return w::FORMAT_VERSION; }

namespace {

w::Transition to_wire(Transition t) {
  switch (t) {
    case Transition::snapshotting:
      return w::Transition::SNAPSHOTTING;
    case Transition::forking:
      return w::Transition::FORKING;
    case Transition::hibernating:
      return w::Transition::HIBERNATING;
    case Transition::waking:
      return w::Transition::WAKING;
  }
  return w::Transition::SNAPSHOTTING;
}
Transition from_wire(w::Transition t) {
  switch (t) {
    case w::Transition::SNAPSHOTTING:
      return Transition::snapshotting;
    case w::Transition::FORKING:
      return Transition::forking;
    case w::Transition::HIBERNATING:
      return Transition::hibernating;
    case w::Transition::WAKING:
      return Transition::waking;
  }
  return Transition::snapshotting;
}

void put_count(w::EgressCount::Builder b, const vmm::EgressCount& c) {
  b.setAllowed(c.allowed);
  b.setDenied(c.denied);
}
vmm::EgressCount get_count(w::EgressCount::Reader r) { return {r.getAllowed(), r.getDenied()}; }

void put_summary(w::EgressSummary::Builder b, const vmm::EgressSummary& s) {
  b.setFromMs(s.from_ms);
  b.setToMs(s.to_ms);
  put_count(b.initDns(), s.dns);
  put_count(b.initConnections(), s.connections);
  put_count(b.initSecretRequests(), s.secret_requests);
  b.setBytesOut(s.bytes_out);
  b.setBytesIn(s.bytes_in);
  auto d = b.initDestinations(unsigned(s.destinations.size()));
  for (unsigned i = 0; i < s.destinations.size(); ++i) {
    d[i].setName(s.destinations[i].name);
    put_count(d[i].initRequests(), s.destinations[i].requests);
  }
  b.setOtherDestinations(s.other_destinations);
}

vmm::EgressSummary get_summary(w::EgressSummary::Reader r) {
  vmm::EgressSummary s;
  s.from_ms = r.getFromMs();
  s.to_ms = r.getToMs();
  s.dns = get_count(r.getDns());
  s.connections = get_count(r.getConnections());
  s.secret_requests = get_count(r.getSecretRequests());
  s.bytes_out = r.getBytesOut();
  s.bytes_in = r.getBytesIn();
  for (auto d : r.getDestinations())
    s.destinations.push_back({d.getName().cStr(), get_count(d.getRequests())});
  s.other_destinations = r.getOtherDestinations();
  return s;
}

using codec::get_map;
using codec::put_map;

void put_egress(w::Egress::Builder b, const Egress& e) {
  b.setMode(e.mode);
  auto c = b.initCidrs(unsigned(e.cidrs.size()));
  for (unsigned i = 0; i < e.cidrs.size(); ++i) c.set(i, e.cidrs[i]);
  auto d = b.initDomains(unsigned(e.domains.size()));
  for (unsigned i = 0; i < e.domains.size(); ++i) d.set(i, e.domains[i]);
}

Egress get_egress(w::Egress::Reader r) {
  Egress e;
  if (r.hasMode()) e.mode = r.getMode();
  for (auto c : r.getCidrs()) e.cidrs.push_back(c);
  for (auto d : r.getDomains()) e.domains.push_back(d);
  return e;
}

}  // namespace

wire::Json egress_json(const Egress& e) {
  using wire::Json;
  Json j = Json::object();
  j.set("mode", e.mode);
  Json c = Json::array();
  for (auto& x : e.cidrs) c.push(x);
  j.set("cidrs", c);
  Json d = Json::array();
  for (auto& x : e.domains) d.push(x);
  j.set("domains", d);
  return j;
}

std::optional<Egress> egress_from_json(const wire::Json& j) {
  if (!j.is_object() || !j["mode"].is_string() || !j["cidrs"].is_array() ||
      !j["domains"].is_array())
    return std::nullopt;
  Egress e;
  e.mode = j["mode"].as_string();
  for (auto& v : j["cidrs"].as_array()) {
    if (!v.is_string()) return std::nullopt;
    e.cidrs.push_back(v.as_string());
  }
  for (auto& v : j["domains"].as_array()) {
    if (!v.is_string()) return std::nullopt;
    e.domains.push_back(v.as_string());
  }
  return e;
}

std::string encode_event(const Event& e) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<w::SandboxEvent>();
  b.setAtMs(e.at_ms);
  if (!e.snapshot_name.empty()) b.setSnapshotName(e.snapshot_name);
  if (e.disk_only) b.setDiskOnly(true);
  using K = Event::Kind;
  switch (e.kind) {
    case K::created: {
      auto c = b.initCreated();
      c.setTenant(e.tenant);
      c.setTemplate(e.template_name);
      c.setVcpus(e.vcpus);
      c.setMemoryMib(e.memory_mib);
      put_map(c.initMetadata(unsigned(e.metadata.size())), e.metadata);
      c.setTtlSeconds(e.ttl_seconds);
      c.setExpiresAtMs(e.expires_at_ms);
      c.setPersistent(e.persistent);
      c.setAutoWake(e.auto_wake);
      c.setParent(e.parent);
      c.setFromSnapshot(e.from_snapshot);
      c.setNetwork(e.network);
      if (e.network) put_egress(c.initEgress(), e.egress);
      c.setIdleTimeoutSeconds(e.idle_timeout_seconds);
      c.setTimeoutDiskOnly(e.timeout_disk_only);
      c.setOnTimeout(!e.on_timeout                            ? w::TimeoutAction::DEFAULT
                     : *e.on_timeout == ReapAction::hibernate ? w::TimeoutAction::HIBERNATE
                                                              : w::TimeoutAction::KILL);
      auto vols = c.initVolumes(unsigned(e.volumes.size()));
      for (unsigned i = 0; i < e.volumes.size(); ++i) {
        vols[i].setVolume(e.volumes[i].volume);
        vols[i].setMount(e.volumes[i].mount);
        vols[i].setReadOnly(e.volumes[i].read_only);
        vols[i].setSlot(e.volumes[i].slot);
      }
      break;
    }
    case K::started:
      b.setStarted();
      break;
    case K::exec_started: {
      auto x = b.initExecStarted();
      x.setExecId(e.exec_id);
      x.setCommand(e.command);
      break;
    }
    case K::exec_finished: {
      auto x = b.initExecFinished();
      x.setExecId(e.exec_id);
      x.setExitCode(e.exit_code);
      x.setDurationMs(e.duration_ms);
      x.setTimedOut(e.timed_out);
      break;
    }
    case K::transition_started: {
      auto t = b.initTransitionStarted();
      t.setTransition(to_wire(e.transition));
      t.setSnapshotId(e.snapshot_id);
      break;
    }
    case K::transition_failed: {
      auto t = b.initTransitionFailed();
      t.setTransition(to_wire(e.transition));
      t.setReason(e.reason);
      break;
    }
    case K::snapshot_taken:
      b.setSnapshotTaken(e.snapshot_id);
      break;
    case K::forked: {
      auto l = b.initForked(unsigned(e.children.size()));
      for (size_t i = 0; i < e.children.size(); ++i) l.set(unsigned(i), e.children[i]);
      break;
    }
    case K::hibernated:
      b.setHibernated(e.snapshot_id);
      break;
    case K::woke:
      b.setWoke();
      break;
    case K::ttl_changed: {
      auto t = b.initTtlChanged();
      t.setTtlSeconds(e.ttl_seconds);
      t.setExpiresAtMs(e.expires_at_ms);
      break;
    }
    case K::metadata_changed:
      put_map(b.initMetadataChanged(unsigned(e.metadata.size())), e.metadata);
      break;
    case K::reaped:
      b.setReaped(e.reap_action == ReapAction::hibernate ? w::ReapAction::HIBERNATE
                                                         : w::ReapAction::KILL);
      b.setReapReason(e.reason);
      break;
    case K::killed:
      b.setKilled();
      break;
    case K::failed:
      b.setFailed(e.reason);
      break;
    case K::network_attached:
      b.setNetworkAttached(e.subnet);
      break;
    case K::egress_changed:
      put_egress(b.initEgressChanged(), e.egress);
      break;
    case K::port_exposed:
      b.setPortExposed(e.port);
      break;
    case K::port_unexposed:
      b.setPortUnexposed(e.port);
      break;
    case K::snapshot_deleted:
      b.setSnapshotDeleted(e.snapshot_id);
      b.setDeleteReason(e.reason);
      break;
    case K::process_started: {
      auto p = b.initProcessStarted();
      p.setPid(e.pid);
      p.setCommand(e.command);
      break;
    }
    case K::file_written: {
      auto f = b.initFileWritten();
      f.setPath(e.path);
      f.setBytes(e.bytes);
      break;
    }
    case K::file_removed:
      b.setFileRemoved(e.path);
      break;
    case K::migrated:
      b.setMigrated(e.host);
      break;
    case K::preview_opened: {
      auto p = b.initPreviewOpened();
      p.setPort(e.preview.port);
      p.setIsPublic(e.preview.is_public);
      p.setCreatedAtMs(e.preview.created_at_ms);
      p.setExpiresAtMs(e.preview.expires_at_ms);
      p.setNonce(e.preview.nonce);
      break;
    }
    case K::preview_closed:
      b.setPreviewClosed(e.port);
      break;
    case K::hibernation_persisted:
      b.setHibernationPersisted(e.snapshot_id);
      break;
    case K::snapshot_persisted:
      b.setSnapshotPersisted(e.snapshot_id);
      break;
    case K::egress_summary:
      put_summary(b.initEgressSummary(), e.egress_summary);
      break;
    case K::hibernation_uploaded: {
      auto u = b.initHibernationUploaded();
      u.setSnapshotId(e.snapshot_id);
      u.setManifest(e.manifest);
      break;
    }
    case K::snapshot_uploaded: {
      auto u = b.initSnapshotUploaded();
      u.setSnapshotId(e.snapshot_id);
      u.setManifest(e.manifest);
      break;
    }
  }
  return codec::to_bytes(msg);
}

std::optional<Event> decode_event(const std::string& bytes) {
  return codec::from_bytes<w::SandboxEvent, Event>(
      bytes, [](w::SandboxEvent::Reader r) -> std::optional<Event> {
        Event e;
        e.at_ms = r.getAtMs();
        e.snapshot_name = r.getSnapshotName();
        e.disk_only = r.getDiskOnly();
        using K = Event::Kind;
        switch (r.which()) {
          case w::SandboxEvent::CREATED: {
            auto c = r.getCreated();
            e.kind = K::created;
            e.tenant = c.getTenant();
            e.template_name = c.getTemplate();
            e.vcpus = c.getVcpus();
            e.memory_mib = c.getMemoryMib();
            e.metadata = get_map(c.getMetadata());
            e.ttl_seconds = c.getTtlSeconds();
            e.expires_at_ms = c.getExpiresAtMs();
            e.persistent = c.getPersistent();
            e.auto_wake = c.getAutoWake();
            e.parent = c.getParent();
            e.from_snapshot = c.getFromSnapshot();
            e.network = c.getNetwork();
            if (c.hasEgress()) e.egress = get_egress(c.getEgress());
            e.idle_timeout_seconds = c.getIdleTimeoutSeconds();
            e.timeout_disk_only = c.getTimeoutDiskOnly();
            switch (c.getOnTimeout()) {
              case w::TimeoutAction::KILL:
                e.on_timeout = ReapAction::kill;
                break;
              case w::TimeoutAction::HIBERNATE:
                e.on_timeout = ReapAction::hibernate;
                break;
              default:
                break;
            }
            for (auto v : c.getVolumes())
              e.volumes.push_back({v.getVolume(), v.getMount(), v.getReadOnly(), v.getSlot()});
            break;
          }
          case w::SandboxEvent::STARTED:
            e.kind = K::started;
            break;
          case w::SandboxEvent::EXEC_STARTED:
            e.kind = K::exec_started;
            e.exec_id = r.getExecStarted().getExecId();
            e.command = r.getExecStarted().getCommand();
            break;
          case w::SandboxEvent::EXEC_FINISHED: {
            auto x = r.getExecFinished();
            e.kind = K::exec_finished;
            e.exec_id = x.getExecId();
            e.exit_code = x.getExitCode();
            e.duration_ms = x.getDurationMs();
            e.timed_out = x.getTimedOut();
            break;
          }
          case w::SandboxEvent::TRANSITION_STARTED:
            e.kind = K::transition_started;
            e.transition = from_wire(r.getTransitionStarted().getTransition());
            e.snapshot_id = r.getTransitionStarted().getSnapshotId();
            break;
          case w::SandboxEvent::TRANSITION_FAILED:
            e.kind = K::transition_failed;
            e.transition = from_wire(r.getTransitionFailed().getTransition());
            e.reason = r.getTransitionFailed().getReason();
            break;
          case w::SandboxEvent::SNAPSHOT_TAKEN:
            e.kind = K::snapshot_taken;
            e.snapshot_id = r.getSnapshotTaken();
            break;
          case w::SandboxEvent::FORKED:
            e.kind = K::forked;
            for (auto c : r.getForked()) e.children.push_back(c);
            break;
          case w::SandboxEvent::HIBERNATED:
            e.kind = K::hibernated;
            e.snapshot_id = r.getHibernated();
            break;
          case w::SandboxEvent::WOKE:
            e.kind = K::woke;
            break;
          case w::SandboxEvent::TTL_CHANGED:
            e.kind = K::ttl_changed;
            e.ttl_seconds = r.getTtlChanged().getTtlSeconds();
            e.expires_at_ms = r.getTtlChanged().getExpiresAtMs();
            break;
          case w::SandboxEvent::METADATA_CHANGED:
            e.kind = K::metadata_changed;
            e.metadata = get_map(r.getMetadataChanged());
            break;
          case w::SandboxEvent::REAPED:
            e.kind = K::reaped;
            e.reap_action = r.getReaped() == w::ReapAction::HIBERNATE ? ReapAction::hibernate
                                                                      : ReapAction::kill;
            e.reason = r.hasReapReason() ? std::string(r.getReapReason().cStr()) : "ttl";
            break;
          case w::SandboxEvent::KILLED:
            e.kind = K::killed;
            break;
          case w::SandboxEvent::FAILED:
            e.kind = K::failed;
            e.reason = r.getFailed();
            break;
          case w::SandboxEvent::NETWORK_ATTACHED:
            e.kind = K::network_attached;
            e.subnet = r.getNetworkAttached();
            break;
          case w::SandboxEvent::EGRESS_CHANGED:
            e.kind = K::egress_changed;
            e.egress = get_egress(r.getEgressChanged());
            break;
          case w::SandboxEvent::PORT_EXPOSED:
            e.kind = K::port_exposed;
            e.port = r.getPortExposed();
            break;
          case w::SandboxEvent::PORT_UNEXPOSED:
            e.kind = K::port_unexposed;
            e.port = r.getPortUnexposed();
            break;
          case w::SandboxEvent::SNAPSHOT_DELETED:
            e.kind = K::snapshot_deleted;
            e.snapshot_id = r.getSnapshotDeleted().cStr();
            e.reason = r.getDeleteReason().cStr();
            break;
          case w::SandboxEvent::PROCESS_STARTED:
            e.kind = K::process_started;
            e.pid = r.getProcessStarted().getPid();
            e.command = r.getProcessStarted().getCommand().cStr();
            break;
          case w::SandboxEvent::FILE_WRITTEN:
            e.kind = K::file_written;
            e.path = r.getFileWritten().getPath().cStr();
            e.bytes = r.getFileWritten().getBytes();
            break;
          case w::SandboxEvent::FILE_REMOVED:
            e.kind = K::file_removed;
            e.path = r.getFileRemoved().cStr();
            break;
          case w::SandboxEvent::MIGRATED:
            e.kind = K::migrated;
            e.host = r.getMigrated().cStr();
            break;
          case w::SandboxEvent::PREVIEW_OPENED: {
            e.kind = K::preview_opened;
            auto p = r.getPreviewOpened();
            e.preview = Preview{p.getPort(), p.getIsPublic(), p.getCreatedAtMs(),
                                p.getExpiresAtMs(), p.getNonce().cStr()};
            break;
          }
          case w::SandboxEvent::PREVIEW_CLOSED:
            e.kind = K::preview_closed;
            e.port = r.getPreviewClosed();
            break;
          case w::SandboxEvent::HIBERNATION_PERSISTED:
            e.kind = K::hibernation_persisted;
            e.snapshot_id = r.getHibernationPersisted().cStr();
            break;
          case w::SandboxEvent::SNAPSHOT_PERSISTED:
            e.kind = K::snapshot_persisted;
            e.snapshot_id = r.getSnapshotPersisted().cStr();
            break;
          case w::SandboxEvent::EGRESS_SUMMARY:
            e.kind = K::egress_summary;
            e.egress_summary = get_summary(r.getEgressSummary());
            break;
          case w::SandboxEvent::HIBERNATION_UPLOADED:
            e.kind = K::hibernation_uploaded;
            e.snapshot_id = r.getHibernationUploaded().getSnapshotId().cStr();
            e.manifest = r.getHibernationUploaded().getManifest().cStr();
            break;
          case w::SandboxEvent::SNAPSHOT_UPLOADED:
            e.kind = K::snapshot_uploaded;
            e.snapshot_id = r.getSnapshotUploaded().getSnapshotId().cStr();
            e.manifest = r.getSnapshotUploaded().getManifest().cStr();
            break;
          default:
            return std::nullopt;  // a kind this build does not know
        }
        return e;
      });
}

wire::Json string_map_json(const std::map<std::string, std::string>& m) {
  wire::Json o = wire::Json::object();
  for (auto& [k, v] : m) o.set(k, v);
  return o;
}

wire::Json volumes_json(const std::vector<SandboxVolume>& volumes) {
  using wire::Json;
  Json a = Json::array();
  for (auto& v : volumes) {
    Json o = Json::object();
    o.set("volume", v.volume);
    o.set("mount", v.mount);
    o.set("read_only", v.read_only);
    o.set("slot", v.slot);
    a.push(o);
  }
  return a;
}

namespace {

wire::Json count_json(const vmm::EgressCount& c) {
  wire::Json j = wire::Json::object();
  j.set("allowed", c.allowed);
  j.set("denied", c.denied);
  return j;
}

void put_summary_json(wire::Json& j, const vmm::EgressSummary& s) {
  j.set("from_ms", s.from_ms);
  j.set("to_ms", s.to_ms);
  j.set("dns", count_json(s.dns));
  j.set("connections", count_json(s.connections));
  j.set("secret_requests", count_json(s.secret_requests));
  j.set("bytes_out", int64_t(s.bytes_out));
  j.set("bytes_in", int64_t(s.bytes_in));
  wire::Json d = wire::Json::array();
  for (auto& x : s.destinations) {
    wire::Json o = count_json(x.requests);
    o.set("name", x.name);
    d.push(o);
  }
  j.set("destinations", d);
  j.set("other_destinations", s.other_destinations);
}

}  // namespace

std::string event_to_json(const Event& e) {
  using wire::Json;
  Json j = Json::object();
  j.set("kind", to_string(e.kind));
  j.set("at_ms", e.at_ms);
  auto metadata = [&] { return string_map_json(e.metadata); };
  static const char* transitions[] = {"snapshotting", "forking", "hibernating", "waking"};
  switch (e.kind) {
    case Event::Kind::created:
      j.set("tenant", e.tenant);
      j.set("template", e.template_name);
      if (!e.parent.empty()) j.set("parent", e.parent);
      if (!e.from_snapshot.empty()) j.set("from_snapshot", e.from_snapshot);
      j.set("vcpus", e.vcpus);
      j.set("memory_mib", e.memory_mib);
      j.set("ttl_seconds", e.ttl_seconds);
      j.set("expires_at_ms", e.expires_at_ms);
      j.set("persistent", e.persistent);
      j.set("auto_wake", e.auto_wake);
      if (e.idle_timeout_seconds) j.set("idle_timeout_seconds", e.idle_timeout_seconds);
      if (e.on_timeout)
        j.set("on_timeout", *e.on_timeout == ReapAction::kill ? "kill" : "hibernate");
      if (e.timeout_disk_only) j.set("timeout_disk_only", true);
      j.set("metadata", metadata());
      j.set("network", e.network);
      if (e.network) j.set("egress", egress_json(e.egress));
      if (!e.volumes.empty()) j.set("volumes", volumes_json(e.volumes));
      break;
    case Event::Kind::network_attached:
      j.set("subnet", e.subnet);
      break;
    case Event::Kind::egress_changed:
      j.set("egress", egress_json(e.egress));
      break;
    case Event::Kind::port_exposed:
    case Event::Kind::port_unexposed:
    case Event::Kind::preview_closed:
      j.set("port", e.port);
      break;
    case Event::Kind::preview_opened:  // (its nonce stays out of the audit log)
      j.set("port", e.preview.port);
      j.set("public", e.preview.is_public);
      j.set("expires_at_ms", e.preview.expires_at_ms);
      break;
    case Event::Kind::process_started:
      j.set("pid", e.pid);
      j.set("command", e.command);
      break;
    case Event::Kind::file_written:
      j.set("path", e.path);
      j.set("bytes", int64_t(e.bytes));
      break;
    case Event::Kind::file_removed:
      j.set("path", e.path);
      break;
    case Event::Kind::migrated:
      j.set("host", e.host);
      break;
    case Event::Kind::egress_summary:
      put_summary_json(j, e.egress_summary);
      break;
    case Event::Kind::exec_started:
      j.set("exec_id", e.exec_id);
      j.set("command", e.command);
      break;
    case Event::Kind::exec_finished:
      j.set("exec_id", e.exec_id);
      j.set("exit_code", e.exit_code);
      j.set("duration_ms", e.duration_ms);
      j.set("timed_out", e.timed_out);
      break;
    case Event::Kind::transition_started:
      j.set("transition", transitions[int(e.transition)]);
      if (!e.snapshot_id.empty()) j.set("snapshot_id", e.snapshot_id);
      if (!e.snapshot_name.empty()) j.set("snapshot_name", e.snapshot_name);
      if (e.disk_only) j.set("disk_only", true);
      break;
    case Event::Kind::transition_failed:
    case Event::Kind::failed:
      j.set("reason", e.reason);
      break;
    case Event::Kind::snapshot_taken:
    case Event::Kind::hibernated:
    case Event::Kind::snapshot_deleted:
    case Event::Kind::hibernation_persisted:
    case Event::Kind::snapshot_persisted:
    case Event::Kind::hibernation_uploaded:
    case Event::Kind::snapshot_uploaded:
      j.set("snapshot_id", e.snapshot_id);
      if (!e.manifest.empty()) j.set("manifest", e.manifest);
      if (!e.reason.empty()) j.set("reason", e.reason);
      if (!e.snapshot_name.empty()) j.set("snapshot_name", e.snapshot_name);
      if (e.disk_only) j.set("disk_only", true);
      break;
    case Event::Kind::forked: {
      Json c = Json::array();
      for (auto& id : e.children) c.push(id);
      j.set("children", c);
      break;
    }
    case Event::Kind::ttl_changed:
      j.set("ttl_seconds", e.ttl_seconds);
      j.set("expires_at_ms", e.expires_at_ms);
      break;
    case Event::Kind::metadata_changed:
      j.set("metadata", metadata());
      break;
    case Event::Kind::reaped:
      j.set("action", e.reap_action == ReapAction::kill ? "kill" : "hibernate");
      j.set("reason", e.reason.empty() ? "ttl" : e.reason);
      break;
    default:
      break;
  }
  return j.dump();
}

}  // namespace pandastack::actors
