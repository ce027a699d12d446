// How an event changes a sandbox's state: the pure `apply` of its lifecycle (actors/sandbox.h).
// Events are facts already persisted: one that is impossible in the state is a bug (it throws).
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "actors/sandbox.h"

namespace pandastack::actors {

namespace {

[[noreturn]] void impossible(const SandboxState& s, const Event& e) {
  throw std::logic_error(std::string("event ") + to_string(e.kind) + " is impossible for sandbox " +
                         s.id + " in state " + to_string(s.status));
}

}  // namespace

SandboxStatus transition_status(Transition t) {
  switch (t) {
    case Transition::snapshotting:
      return SandboxStatus::snapshotting;
    case Transition::forking:
      return SandboxStatus::forking;
    case Transition::hibernating:
      return SandboxStatus::hibernating;
    case Transition::waking:
      return SandboxStatus::waking;
  }
  return SandboxStatus::running;
}

// When a sandbox with `ttl` expires, counted from `from_ms` (never, for kNoExpiry).
int64_t expiry(int64_t from_ms, uint32_t ttl) {
  return ttl == kNoExpiry ? std::numeric_limits<int64_t>::max() : from_ms + int64_t(ttl) * 1000;
}

SandboxState apply(SandboxState s, const Event& e) {
  using K = Event::Kind;
  switch (e.kind) {
    case K::created:
      if (s.status != SandboxStatus::none && s.moved_to.empty()) impossible(s, e);
      if (!s.moved_to.empty()) {  // back from another host: a new life in the same stream
        SandboxState back;
        back.id = s.id;
        back.version = s.version;
        s = back;
      }
      s.status = SandboxStatus::creating;
      s.tenant = e.tenant;
      s.template_name = e.template_name;
      s.parent = e.parent;
      s.from_snapshot = e.from_snapshot;
      s.vcpus = e.vcpus;
      s.memory_mib = e.memory_mib;
      s.ttl_seconds = e.ttl_seconds;
      s.metadata = e.metadata;
      s.created_at_ms = e.at_ms;
      s.expires_at_ms = e.expires_at_ms;
      s.persistent = e.persistent;
      s.auto_wake = e.auto_wake;
      s.idle_timeout_seconds = e.idle_timeout_seconds;
      s.on_timeout = e.on_timeout.value_or(e.persistent ? ReapAction::hibernate : ReapAction::kill);
      s.timeout_disk_only = e.timeout_disk_only;
      s.network = e.network;
      s.egress = e.egress;
      s.volumes = e.volumes;
      break;
    case K::started:
      if (s.status != SandboxStatus::creating) impossible(s, e);
      s.status = SandboxStatus::running;
      break;
    case K::exec_started:
      if (s.status != SandboxStatus::running) impossible(s, e);
      s.running_execs[e.exec_id] = e.command;
      s.exec_started_ms[e.exec_id] = e.at_ms;
      break;
    case K::exec_finished:
      if (!s.running_execs.erase(e.exec_id)) impossible(s, e);
      s.exec_started_ms.erase(e.exec_id);
      ++s.execs_finished;
      break;
    case K::transition_started: {
      bool from_running = e.transition != Transition::waking && s.status == SandboxStatus::running;
      bool waking = e.transition == Transition::waking && s.status == SandboxStatus::hibernated;
      if (!from_running && !waking) impossible(s, e);
      s.status = transition_status(e.transition);
      s.pending_snapshot = e.snapshot_id;
      s.pending_snapshot_name = e.snapshot_name;
      s.pending_disk_only = e.disk_only;
      break;
    }
    case K::transition_failed:
      if (s.status != transition_status(e.transition)) impossible(s, e);
      s.status =
          e.transition == Transition::waking ? SandboxStatus::hibernated : SandboxStatus::running;
      s.pending_snapshot.clear();
      s.pending_snapshot_name.clear();
      s.pending_disk_only = false;
      break;
    case K::snapshot_taken:
      if (s.status != SandboxStatus::snapshotting) impossible(s, e);
      s.status = SandboxStatus::running;
      s.snapshots.push_back(e.snapshot_id);
      if (!e.snapshot_name.empty()) s.snapshot_names[e.snapshot_id] = e.snapshot_name;
      s.pending_snapshot.clear();
      s.pending_snapshot_name.clear();
      break;
    case K::forked:
      if (s.status != SandboxStatus::forking) impossible(s, e);
      s.status = SandboxStatus::running;
      s.pending_snapshot.clear();
      break;
    case K::hibernated:
      if (s.status != SandboxStatus::hibernating) impossible(s, e);
      s.status = SandboxStatus::hibernated;
      s.hibernation_snapshot = e.snapshot_id;
      s.hibernated_disk_only = e.disk_only;
      s.hibernation_durable = false;  // (until its copy is on the data disk)
      s.hibernation_manifest.clear();
      s.pending_disk_only = false;
      s.pending_snapshot.clear();
      s.running_execs.clear();  // they died with the VM
      s.exec_started_ms.clear();
      s.subnet.reset();  // and its network with it
      break;
    case K::woke:
      if (s.status != SandboxStatus::waking) impossible(s, e);
      s.status = SandboxStatus::running;
      // A woken sandbox gets its TTL afresh (it may have been hibernated at expiry).
      s.expires_at_ms = expiry(e.at_ms, s.ttl_seconds);
      s.hibernation_snapshot.clear();
      s.hibernated_disk_only = false;
      s.hibernation_durable = false;
      s.hibernation_manifest.clear();
      s.pending_snapshot.clear();
      break;
    case K::ttl_changed:
      if (!s.live()) impossible(s, e);
      s.ttl_seconds = e.ttl_seconds;
      s.expires_at_ms = e.expires_at_ms;
      break;
    case K::metadata_changed:
      if (!s.live()) impossible(s, e);
      s.metadata = e.metadata;
      break;
    case K::reaped:
      if (s.status != SandboxStatus::running) impossible(s, e);
      if (e.reap_action == ReapAction::hibernate) {
        s.status = SandboxStatus::hibernating;
        s.pending_disk_only = s.timeout_disk_only;
      } else {
        s.status = SandboxStatus::stopped;
        s.running_execs.clear();
        s.exec_started_ms.clear();
        s.subnet.reset();
      }
      break;
    case K::killed:
      if (!s.live()) impossible(s, e);
      s.status = SandboxStatus::stopped;
      s.hibernation_durable = false;
      s.hibernation_manifest.clear();
      s.running_execs.clear();
      s.exec_started_ms.clear();
      s.subnet.reset();
      break;
    case K::failed:
      if (!s.live()) impossible(s, e);
      s.status = SandboxStatus::failed;
      s.hibernation_durable = false;
      s.hibernation_manifest.clear();
      s.failure_reason = e.reason;
      s.running_execs.clear();
      s.exec_started_ms.clear();
      s.subnet.reset();
      break;
    case K::network_attached:
      if (!s.live() || !s.network) impossible(s, e);
      s.subnet = e.subnet;
      break;
    case K::egress_changed:
      if (!s.live() || !s.network) impossible(s, e);
      s.egress = e.egress;
      break;
    case K::port_exposed:
      if (!s.live() || !s.network) impossible(s, e);
      s.ports.insert(e.port);
      break;
    case K::port_unexposed:
      if (!s.live() || !s.ports.erase(e.port)) impossible(s, e);
      break;
    case K::snapshot_deleted: {
      auto it = std::find(s.snapshots.begin(), s.snapshots.end(), e.snapshot_id);
      if (it == s.snapshots.end()) impossible(s, e);
      s.snapshots.erase(it);
      s.snapshot_names.erase(e.snapshot_id);
      s.durable_snapshots.erase(e.snapshot_id);
      s.snapshot_manifests.erase(e.snapshot_id);
      break;
    }
    case K::process_started:
    case K::file_written:
    case K::file_removed:
      if (!s.live()) impossible(s, e);
      break;  // audit only
    case K::egress_summary:
      if (s.status == SandboxStatus::none) impossible(s, e);
      break;  // audit only
    case K::migrated:
      if (s.status != SandboxStatus::hibernated) impossible(s, e);
      s.status = SandboxStatus::stopped;
      s.hibernation_durable = false;
      s.hibernation_manifest.clear();
      s.moved_to = e.host;
      s.hibernation_snapshot.clear();
      break;
    case K::preview_opened:
      if (!s.live() || !s.network) impossible(s, e);
      s.previews[e.preview.port] = e.preview;
      break;
    case K::preview_closed:
      if (!s.previews.erase(e.port)) impossible(s, e);
      break;
    case K::hibernation_persisted:
      if (s.status != SandboxStatus::hibernated || s.hibernation_snapshot != e.snapshot_id)
        impossible(s, e);
      s.hibernation_durable = true;
      s.hibernation_persisted_at = s.version;
      break;
    case K::hibernation_uploaded:
      if (s.status != SandboxStatus::hibernated || s.hibernation_snapshot != e.snapshot_id ||
          !s.hibernation_durable)
        impossible(s, e);
      s.hibernation_manifest = e.manifest;
      break;
    case K::snapshot_persisted:
      if (std::find(s.snapshots.begin(), s.snapshots.end(), e.snapshot_id) == s.snapshots.end())
        impossible(s, e);
      s.durable_snapshots.insert(e.snapshot_id);
      break;
    case K::snapshot_uploaded:
      if (!s.durable_snapshots.count(e.snapshot_id)) impossible(s, e);
      s.snapshot_manifests[e.snapshot_id] = e.manifest;
      break;
  }
  ++s.version;
  return s;
}

}  // namespace pandastack::actors
