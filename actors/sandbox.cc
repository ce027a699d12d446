#include "actors/sandbox.h"

#include <algorithm>
#include <limits>

namespace pandastack::actors {

const char* to_string(SandboxStatus s) {
  switch (s) {
    case SandboxStatus::none:
      return "none";
    case SandboxStatus::creating:
      return "creating";
    case SandboxStatus::running:
      return "running";
    case SandboxStatus::snapshotting:
      return "snapshotting";
    case SandboxStatus::forking:
      return "forking";
    case SandboxStatus::hibernating:
      return "hibernating";
    case SandboxStatus::hibernated:
      return "hibernated";
    case SandboxStatus::waking:
      return "waking";
    case SandboxStatus::stopped:
      return "stopped";
    case SandboxStatus::failed:
      return "failed";
  }
  return "unknown";
}

std::optional<SandboxStatus> status_from_string(std::string_view name) {
  for (int i = int(SandboxStatus::none); i <= int(SandboxStatus::failed); ++i)
    if (name == to_string(SandboxStatus(i))) return SandboxStatus(i);
  return std::nullopt;
}

const char* to_string(Event::Kind k) {
  switch (k) {
    case Event::Kind::created:
      return "created";
    case Event::Kind::started:
      return "started";
    case Event::Kind::exec_started:
      return "exec-started";
    case Event::Kind::exec_finished:
      return "exec-finished";
    case Event::Kind::transition_started:
      return "transition-started";
    case Event::Kind::transition_failed:
      return "transition-failed";
    case Event::Kind::snapshot_taken:
      return "snapshot-taken";
    case Event::Kind::forked:
      return "forked";
    case Event::Kind::hibernated:
      return "hibernated";
    case Event::Kind::woke:
      return "woke";
    case Event::Kind::ttl_changed:
      return "ttl-changed";
    case Event::Kind::metadata_changed:
      return "metadata-changed";
    case Event::Kind::reaped:
      return "reaped";
    case Event::Kind::killed:
      return "killed";
    case Event::Kind::network_attached:
      return "network-attached";
    case Event::Kind::egress_changed:
      return "egress-changed";
    case Event::Kind::port_exposed:
      return "port-exposed";
    case Event::Kind::port_unexposed:
      return "port-unexposed";
    case Event::Kind::snapshot_deleted:
      return "snapshot-deleted";
    case Event::Kind::process_started:
      return "process-started";
    case Event::Kind::file_written:
      return "file-written";
    case Event::Kind::file_removed:
      return "file-removed";
    case Event::Kind::migrated:
      return "migrated";
    case Event::Kind::preview_opened:
      return "preview-opened";
    case Event::Kind::preview_closed:
      return "preview-closed";
    case Event::Kind::hibernation_persisted:
      return "hibernation-persisted";
    case Event::Kind::snapshot_persisted:
      return "snapshot-persisted";
    case Event::Kind::egress_summary:
      return "egress-summary";
    case Event::Kind::hibernation_uploaded:
      return "hibernation-uploaded";
    case Event::Kind::snapshot_uploaded:
      return "snapshot-uploaded";
    case Event::Kind::failed:
      return "failed";
  }
  return "unknown";
}

namespace {

Event ev(Event::Kind k, int64_t now) {
  Event e;
  e.kind = k;
  e.at_ms = now;
  return e;
}

Rejection reject(Code code, std::string message) { return Rejection{code, std::move(message)}; }

}  // namespace

// Why a sandbox in `s` cannot do what needs a running VM.
Rejection not_running(const SandboxState& s, const std::string& what) {
  switch (s.status) {
    case SandboxStatus::none:
      return reject(Code::sandbox_not_found, "no sandbox " + s.id);
    case SandboxStatus::hibernated:
      return reject(Code::sandbox_hibernated,
                    "sandbox " + s.id + " is hibernated: wake it to " + what);
    case SandboxStatus::stopped:
      return reject(Code::sandbox_stopped, "sandbox " + s.id + " was stopped");
    case SandboxStatus::failed:
      return reject(Code::sandbox_failed, "sandbox " + s.id + " failed: " + s.failure_reason);
    default:
      return reject(Code::sandbox_busy,
                    "sandbox " + s.id + " is " + to_string(s.status) + "; retry to " + what);
  }
}

std::optional<Rejection> check_metadata(const std::map<std::string, std::string>& m,
                                        const Limits& l) {
  if (m.size() > l.max_metadata_entries)
    return reject(Code::invalid_argument,
                  "at most " + std::to_string(l.max_metadata_entries) + " metadata entries");
  for (auto& [k, v] : m)
    if (k.empty() || k.size() > 128 || v.size() > 1024)
      return reject(Code::invalid_argument,
                    "metadata keys are 1..128 bytes and values at most 1024");
  return std::nullopt;
}

namespace {

std::optional<Rejection> check_ttl(uint32_t ttl, const Limits& l) {
  if (ttl == kNoExpiry) return std::nullopt;  // set by the runtime only (a database's sandbox)
  if (ttl > l.max_ttl_seconds)
    return reject(Code::invalid_argument, "ttl_seconds " + std::to_string(ttl) +
                                              " is over the maximum of " +
                                              std::to_string(l.max_ttl_seconds));
  return std::nullopt;
}

struct Decider {
  const SandboxState& s;
  int64_t now;
  const Limits& limits;

  Decision operator()(const cmd::Create& c) const {
    // (one that moved to another host may come back: its stream goes on)
    if (s.status != SandboxStatus::none && s.moved_to.empty())
      return reject(Code::already_exists, "sandbox " + s.id + " exists");
    if (c.tenant.empty() || c.template_name.empty())
      return reject(Code::invalid_argument, "tenant and template are required");
    if (c.vcpus == 0 || c.memory_mib == 0)
      return reject(Code::invalid_argument, "vcpus and memory must be positive");
    if (auto r = check_ttl(c.ttl_seconds, limits)) return *r;
    if (c.idle_timeout_seconds > limits.max_ttl_seconds)
      return reject(Code::invalid_argument,
                    "idle_timeout_seconds " + std::to_string(c.idle_timeout_seconds) +
                        " is over the maximum of " + std::to_string(limits.max_ttl_seconds));
    if (auto r = check_metadata(c.metadata, limits)) return *r;
    Event e = ev(Event::Kind::created, now);
    e.idle_timeout_seconds = c.idle_timeout_seconds;
    e.on_timeout = c.on_timeout;
    e.timeout_disk_only = c.timeout_disk_only;
    e.tenant = c.tenant;
    e.template_name = c.template_name;
    e.parent = c.parent;
    e.from_snapshot = c.from_snapshot;
    e.vcpus = c.vcpus;
    e.memory_mib = c.memory_mib;
    e.ttl_seconds = c.ttl_seconds ? c.ttl_seconds : limits.default_ttl_seconds;
    e.expires_at_ms = expiry(now, e.ttl_seconds);
    e.metadata = c.metadata;
    e.persistent = c.persistent;
    e.auto_wake = c.auto_wake;
    e.network = c.network;
    if (c.network) e.egress = c.egress;
    e.volumes = c.volumes;
    return std::vector<Event>{e};
  }

  // `first`, then the network attachment when the VM got one.
  std::vector<Event> with_subnet(Event first, std::optional<uint32_t> subnet) const {
    std::vector<Event> out{first};
    if (subnet && s.network) {
      Event n = ev(Event::Kind::network_attached, now);
      n.subnet = *subnet;
      out.push_back(n);
    }
    return out;
  }

  Decision operator()(const cmd::Started& c) const {
    if (s.status == SandboxStatus::creating)
      return with_subnet(ev(Event::Kind::started, now), c.subnet);
    if (s.status == SandboxStatus::waking) return with_subnet(ev(Event::Kind::woke, now), c.subnet);
    return reject(Code::invalid_state,
                  "a VM start is not expected in state " + std::string(to_string(s.status)));
  }

  Decision operator()(const cmd::StartFailed& c) const {
    if (s.status != SandboxStatus::creating && s.status != SandboxStatus::waking)
      return reject(Code::invalid_state, "a VM start failure is not expected in state " +
                                             std::string(to_string(s.status)));
    Event e = ev(Event::Kind::failed, now);
    e.reason = c.reason;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::Exec& c) const {
    if (s.status == SandboxStatus::hibernated && s.auto_wake) {
      // Wake first; the actor runs the command once the sandbox is running again.
      Event e = ev(Event::Kind::transition_started, now);
      e.transition = Transition::waking;
      e.snapshot_id = s.hibernation_snapshot;
      return std::vector<Event>{e};
    }
    if (s.status != SandboxStatus::running) return not_running(s, "exec");
    if (c.exec_id.empty()) return reject(Code::invalid_argument, "exec id required");
    if (s.running_execs.count(c.exec_id))
      return reject(Code::invalid_argument, "exec id " + c.exec_id + " in use");
    if (s.running_execs.size() >= limits.max_concurrent_execs)
      return reject(Code::too_many_execs,
                    "sandbox " + s.id + " already runs " + std::to_string(s.running_execs.size()) +
                        " commands (limit " + std::to_string(limits.max_concurrent_execs) + ")");
    Event e = ev(Event::Kind::exec_started, now);
    e.exec_id = c.exec_id;
    e.command = c.command;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::ExecFinished& c) const {
    if (!s.running_execs.count(c.exec_id))
      return reject(Code::invalid_argument, "no running exec " + c.exec_id);
    Event e = ev(Event::Kind::exec_finished, now);
    e.exec_id = c.exec_id;
    e.exit_code = c.exit_code;
    e.duration_ms = c.duration_ms;
    e.timed_out = c.timed_out;
    return std::vector<Event>{e};
  }

  Decision start_transition(Transition t, const std::string& snapshot_id) const {
    Event e = ev(Event::Kind::transition_started, now);
    e.transition = t;
    e.snapshot_id = snapshot_id;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::Snapshot& c) const {
    if (s.status != SandboxStatus::running) return not_running(s, "snapshot");
    if (c.snapshot_id.empty()) return reject(Code::invalid_argument, "snapshot id required");
    auto d = start_transition(Transition::snapshotting, c.snapshot_id);
    std::get<std::vector<Event>>(d).front().snapshot_name = c.name;
    return d;
  }

  Decision operator()(const cmd::Fork& c) const {
    if (s.status != SandboxStatus::running) return not_running(s, "fork");
    if (c.count == 0 || c.count > limits.max_fork_children)
      return reject(Code::invalid_argument,
                    "count must be 1.." + std::to_string(limits.max_fork_children));
    return start_transition(Transition::forking, c.snapshot_id);
  }

  Decision operator()(const cmd::Hibernate& c) const {
    if (s.status == SandboxStatus::hibernated || s.status == SandboxStatus::hibernating)
      return std::vector<Event>{};
    if (s.status != SandboxStatus::running) return not_running(s, "hibernate");
    auto d = start_transition(Transition::hibernating, c.snapshot_id);
    std::get<std::vector<Event>>(d).front().disk_only = c.disk_only;
    return d;
  }

  Decision operator()(const cmd::Wake&) const {
    if (s.status == SandboxStatus::running || s.status == SandboxStatus::waking)
      return std::vector<Event>{};
    if (s.status != SandboxStatus::hibernated) return not_running(s, "wake");
    return start_transition(Transition::waking, s.hibernation_snapshot);
  }

  Decision operator()(const cmd::TransitionDone& c) const {
    switch (s.status) {
      case SandboxStatus::snapshotting: {
        Event e = ev(Event::Kind::snapshot_taken, now);
        e.snapshot_id = s.pending_snapshot;
        e.snapshot_name = s.pending_snapshot_name;
        return std::vector<Event>{e};
      }
      case SandboxStatus::forking: {
        Event e = ev(Event::Kind::forked, now);
        e.children = c.children;
        return std::vector<Event>{e};
      }
      case SandboxStatus::hibernating: {
        Event e = ev(Event::Kind::hibernated, now);
        e.snapshot_id = s.pending_snapshot;
        e.disk_only = s.pending_disk_only;
        return ending(e);  // commands cancelled by the hibernation end with it
      }
      case SandboxStatus::waking:
        return with_subnet(ev(Event::Kind::woke, now), c.subnet);
      default:
        return reject(Code::invalid_state,
                      "no transition in progress in state " + std::string(to_string(s.status)));
    }
  }

  Decision operator()(const cmd::TransitionFailed& c) const {
    Transition t;
    switch (s.status) {
      case SandboxStatus::snapshotting:
        t = Transition::snapshotting;
        break;
      case SandboxStatus::forking:
        t = Transition::forking;
        break;
      case SandboxStatus::hibernating:
        t = Transition::hibernating;
        break;
      case SandboxStatus::waking:
        t = Transition::waking;
        break;
      default:
        return reject(Code::invalid_state,
                      "no transition in progress in state " + std::string(to_string(s.status)));
    }
    Event e = ev(Event::Kind::transition_failed, now);
    e.transition = t;
    e.reason = c.reason;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::SetTtl& c) const {
    if (!s.live()) return not_running(s, "change its TTL");
    if (c.ttl_seconds == 0 || c.ttl_seconds == kNoExpiry)
      return reject(Code::invalid_argument, "ttl_seconds must be positive and at most " +
                                                std::to_string(limits.max_ttl_seconds));
    if (auto r = check_ttl(c.ttl_seconds, limits)) return *r;
    Event e = ev(Event::Kind::ttl_changed, now);
    e.ttl_seconds = c.ttl_seconds;
    e.expires_at_ms = now + int64_t(c.ttl_seconds) * 1000;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::SetMetadata& c) const {
    if (!s.live()) return not_running(s, "change its metadata");
    if (auto r = check_metadata(c.metadata, limits)) return *r;
    Event e = ev(Event::Kind::metadata_changed, now);
    e.metadata = c.metadata;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::SetEgress& c) const {
    if (!s.live()) return not_running(s, "change its egress policy");
    if (!s.network)
      return reject(Code::network_disabled, "sandbox " + s.id + " was created without a network");
    if (c.egress == s.egress) return std::vector<Event>{};
    Event e = ev(Event::Kind::egress_changed, now);
    e.egress = c.egress;
    return std::vector<Event>{e};
  }

  // Audit records: kept for a sandbox that is live (one that ended meanwhile has nothing to add).
  Decision operator()(const cmd::RecordProcess& c) const {
    if (!s.live()) return std::vector<Event>{};
    Event e = ev(Event::Kind::process_started, now);
    e.pid = c.pid;
    e.command = c.command.substr(0, 4096);
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::OpenPreview& c) const {
    if (!s.live()) return not_running(s, "open a preview");
    if (!s.network)
      return reject(Code::network_disabled, "sandbox " + s.id +
                                                " was created without a network: its ports "
                                                "cannot be reached");
    if (c.port == 0 || c.port > 65535)
      return reject(Code::invalid_argument, "port must be within 1..65535");
    uint32_t ttl = c.ttl_seconds ? c.ttl_seconds : limits.default_preview_ttl_seconds;
    if (ttl > limits.max_preview_ttl_seconds)
      return reject(Code::invalid_argument, "ttl_seconds must be at most " +
                                                std::to_string(limits.max_preview_ttl_seconds));
    if (c.nonce.empty()) return reject(Code::internal, "a preview needs a nonce");
    if (!s.previews.count(c.port) && s.previews.size() >= limits.max_previews)
      return reject(Code::too_many_previews, "a sandbox has at most " +
                                                 std::to_string(limits.max_previews) +
                                                 " preview URLs (close one first)");
    Event e = ev(Event::Kind::preview_opened, now);
    e.preview = Preview{c.port, c.is_public, now, now + int64_t(ttl) * 1000, c.nonce};
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::ClosePreview& c) const {
    if (s.status == SandboxStatus::none)
      return reject(Code::sandbox_not_found, "no sandbox " + s.id);
    if (!s.previews.count(c.port))
      return reject(Code::preview_not_found,
                    "port " + std::to_string(c.port) + " has no preview URL");
    Event e = ev(Event::Kind::preview_closed, now);
    e.port = c.port;
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::HibernationPersisted& c) const {
    // Only the hibernation it is in, once (a copy of an earlier one, woken since, changes nothing).
    if (s.status != SandboxStatus::hibernated || s.hibernation_snapshot != c.snapshot_id ||
        s.hibernation_durable)
      return std::vector<Event>{};
    Event e = ev(Event::Kind::hibernation_persisted, now);
    e.snapshot_id = c.snapshot_id;
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::HibernationUploaded& c) const {
    // Only the hibernation it is in, once it is on the data disk (what was uploaded), once.
    if (s.status != SandboxStatus::hibernated || s.hibernation_snapshot != c.snapshot_id ||
        !s.hibernation_durable || !s.hibernation_manifest.empty() || c.manifest.empty() ||
        s.hibernation_persisted_at != c.persisted_at)
      return std::vector<Event>{};
    Event e = ev(Event::Kind::hibernation_uploaded, now);
    e.snapshot_id = c.snapshot_id;
    e.manifest = c.manifest;
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::RecordFile& c) const {
    if (!s.live()) return std::vector<Event>{};
    Event e = ev(c.removed ? Event::Kind::file_removed : Event::Kind::file_written, now);
    e.path = c.path.substr(0, 4096);
    e.bytes = c.bytes;
    return std::vector<Event>{e};
  }
  // Kept once it ended as well: a kill's summary is of the period that ends with it.
  Decision operator()(const cmd::RecordEgress& c) const {
    if (s.status == SandboxStatus::none || c.summary.empty()) return std::vector<Event>{};
    Event e = ev(Event::Kind::egress_summary, now);
    e.egress_summary = c.summary;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::ExposePort& c) const {
    if (!s.live()) return not_running(s, "expose a port");
    if (!s.network)
      return reject(Code::network_disabled, "sandbox " + s.id + " was created without a network");
    if (c.port == 0 || c.port > 65535)
      return reject(Code::invalid_argument, "port must be within 1..65535");
    if (s.ports.count(c.port)) return std::vector<Event>{};
    if (s.ports.size() >= limits.max_exposed_ports)
      return reject(Code::too_many_ports, "a sandbox exposes at most " +
                                              std::to_string(limits.max_exposed_ports) + " ports");
    Event e = ev(Event::Kind::port_exposed, now);
    e.port = c.port;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::UnexposePort& c) const {
    if (!s.live()) return not_running(s, "unexpose a port");
    if (!s.ports.count(c.port))
      return reject(Code::port_not_found, "port " + std::to_string(c.port) + " is not exposed");
    Event e = ev(Event::Kind::port_unexposed, now);
    e.port = c.port;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::DeleteSnapshot& c) const {
    if (s.status == SandboxStatus::none)
      return reject(Code::sandbox_not_found, "no sandbox " + s.id);
    if (std::find(s.snapshots.begin(), s.snapshots.end(), c.snapshot_id) == s.snapshots.end())
      return reject(Code::snapshot_not_found, "no snapshot " + c.snapshot_id);
    Event e = ev(Event::Kind::snapshot_deleted, now);
    e.snapshot_id = c.snapshot_id;
    e.reason = c.reason;
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::SnapshotPersisted& c) const {
    // Once, and only for a snapshot it still has (one deleted meanwhile changes nothing).
    if (std::find(s.snapshots.begin(), s.snapshots.end(), c.snapshot_id) == s.snapshots.end() ||
        s.durable_snapshots.count(c.snapshot_id))
      return std::vector<Event>{};
    Event e = ev(Event::Kind::snapshot_persisted, now);
    e.snapshot_id = c.snapshot_id;
    return std::vector<Event>{e};
  }
  Decision operator()(const cmd::SnapshotUploaded& c) const {
    // Once, for a snapshot it still has whose copy on the data disk (what was uploaded) is
    // recorded; a snapshot deleted meanwhile changes nothing (its manifest goes again).
    if (!s.durable_snapshots.count(c.snapshot_id) || s.snapshot_manifests.count(c.snapshot_id) ||
        c.manifest.empty())
      return std::vector<Event>{};
    Event e = ev(Event::Kind::snapshot_uploaded, now);
    e.snapshot_id = c.snapshot_id;
    e.manifest = c.manifest;
    return std::vector<Event>{e};
  }

  Decision operator()(const cmd::Reap& c) const {
    if (!s.live() || s.status == SandboxStatus::hibernated)
      return std::vector<Event>{};  // nothing running to reap
    if (c.idle && s.idle_timeout_seconds == 0)
      return reject(Code::invalid_argument, "sandbox " + s.id + " has no idle timeout");
    if (!c.idle && now < s.expires_at_ms)
      return reject(Code::not_expired, "sandbox " + s.id + " expires later");
    if (s.status != SandboxStatus::running)
      return reject(Code::sandbox_busy, "sandbox " + s.id + " is " + to_string(s.status));
    Event e = ev(Event::Kind::reaped, now);
    e.reap_action = s.on_timeout;
    e.reason = c.idle ? "idle" : "ttl";
    if (e.reap_action == ReapAction::kill) return ending(e);
    return std::vector<Event>{e};
  }

  // The commands still running when the sandbox ends (killed, reaped, failed) end with it: each
  // gets its exec-finished (-9, how long it ran) before the event that ends the sandbox, so the
  // audit log has an end for every command it has a start for.
  std::vector<Event> ending(Event last) const {
    std::vector<Event> out;
    for (auto& [id, command] : s.running_execs) {
      Event f = ev(Event::Kind::exec_finished, now);
      f.exec_id = id;
      f.exit_code = -9;
      auto started = s.exec_started_ms.find(id);
      if (started != s.exec_started_ms.end() && now > started->second)
        f.duration_ms = uint32_t(now - started->second);
      out.push_back(f);
    }
    out.push_back(last);
    return out;
  }

  Decision operator()(const cmd::Kill&) const {
    if (s.status == SandboxStatus::none)
      return reject(Code::sandbox_not_found, "no sandbox " + s.id);
    if (!s.live()) return std::vector<Event>{};
    return ending(ev(Event::Kind::killed, now));
  }

  Decision operator()(const cmd::MigratedAway& c) const {
    if (s.status != SandboxStatus::hibernated)
      return reject(Code::conflict, "sandbox " + s.id + " is not hibernated: it cannot have moved");
    Event e = ev(Event::Kind::migrated, now);
    e.host = c.host;
    return ending(e);
  }

  Decision operator()(const cmd::Fail& c) const {
    if (!s.live()) return std::vector<Event>{};
    Event e = ev(Event::Kind::failed, now);
    e.reason = c.reason;
    return ending(e);
  }
};

}  // namespace

Decision decide(const SandboxState& state, const Command& command, int64_t now_ms,
                const Limits& limits) {
  return std::visit(Decider{state, now_ms, limits}, command);
}

}  // namespace pandastack::actors
