#include "actors/event_codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

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

template <typename List>
void put_map(List l, const std::map<std::string, std::string>& m) {
  size_t i = 0;
  for (auto& [k, v] : m) {
    l[i].setKey(k);
    l[i].setValue(v);
    ++i;
  }
}

template <typename List>
std::map<std::string, std::string> get_map(List l) {
  std::map<std::string, std::string> m;
  for (auto kv : l) m[kv.getKey().cStr()] = kv.getValue().cStr();
  return m;
}

}  // namespace

std::string encode_event(const Event& e) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<w::SandboxEvent>();
  b.setAtMs(e.at_ms);
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
      break;
    case K::killed:
      b.setKilled();
      break;
    case K::failed:
      b.setFailed(e.reason);
      break;
  }
  auto words = capnp::messageToFlatArray(msg);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

std::optional<Event> decode_event(const std::string& bytes) {
  if (bytes.size() % sizeof(capnp::word) != 0 || bytes.empty()) return std::nullopt;
  auto words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  memcpy(words.begin(), bytes.data(), bytes.size());
  std::optional<Event> out;
  kj::Maybe<kj::Exception> err = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader msg(words);
    auto r = msg.getRoot<w::SandboxEvent>();
    Event e;
    e.at_ms = r.getAtMs();
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
        e.reap_action =
            r.getReaped() == w::ReapAction::HIBERNATE ? ReapAction::hibernate : ReapAction::kill;
        break;
      case w::SandboxEvent::KILLED:
        e.kind = K::killed;
        break;
      case w::SandboxEvent::FAILED:
        e.kind = K::failed;
        e.reason = r.getFailed();
        break;
      default:
        return;  // a kind this build does not know
    }
    out = std::move(e);
  });
  if (err != nullptr) return std::nullopt;
  return out;
}

std::string event_to_json(const Event& e) {
  using wire::Json;
  Json j = Json::object();
  j.set("kind", to_string(e.kind));
  j.set("at_ms", e.at_ms);
  auto metadata = [&] {
    Json m = Json::object();
    for (auto& [k, v] : e.metadata) m.set(k, v);
    return m;
  };
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
      j.set("metadata", metadata());
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
      break;
    case Event::Kind::transition_failed:
    case Event::Kind::failed:
      j.set("reason", e.reason);
      break;
    case Event::Kind::snapshot_taken:
    case Event::Kind::hibernated:
      j.set("snapshot_id", e.snapshot_id);
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
      break;
    default:
      break;
  }
  return j.dump();
}

}  // namespace pandastack::actors
