// The sandbox lifecycle as two pure functions (no CAF, no I/O):
//
//   decide(state, command) -> events | error     what a command means in a state
//   apply(state, event)    -> state              how an event changes the state
//
// The sandbox actor persists decide()'s events, applies them, and only then runs side effects
// (restore, snapshot, hibernate through the VMM driver), whose outcomes come back as commands
// (Started, TransitionDone, ...). Recovery replays apply() over the stored events. An event that
// is impossible in the current state is a bug: apply() throws std::logic_error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "vmm-driver/egress_summary.h"
#include "wire/errors.h"
#include "wire/result.h"

namespace pandastack::actors {

// A sandbox's state (named SandboxStatus: vmm::Status and storage::Status are Result<Ok>).
enum class SandboxStatus {
  none,
  creating,
  running,
  snapshotting,
  forking,
  hibernating,
  hibernated,
  waking,
  stopped,
  failed
};
const char* to_string(SandboxStatus s);
// The status named `name` (as to_string writes it), or nullopt.
std::optional<SandboxStatus> status_from_string(std::string_view name);

enum class Transition { snapshotting, forking, hibernating, waking };

// A sandbox's egress policy (enforced by vmm-driver/network; validated before it gets here):
// mode deny_all | allow_all | allowlist, with the allowlist's CIDRs and domain names.
struct Egress {
  std::string mode = "deny_all";
  std::vector<std::string> cidrs, domains;
  bool operator==(const Egress&) const = default;
};
enum class ReapAction { kill, hibernate };

// A volume (actors/volume.h) a sandbox has from its create: mounted at `mount` in the guest from
// block slot `slot` of its VM (vmm::kVolumeSlots), read-only or not.
struct SandboxVolume {
  std::string volume, mount;
  bool read_only = false;
  uint32_t slot = 0;
  bool operator==(const SandboxVolume&) const = default;
};

// A guest port served through the daemon's HTTP server at a preview URL (gateway/previews.h).
// Its tokens are an HMAC over (sandbox, port, expiry, nonce): a new nonce (the port opened again)
// revokes every token of the previous one.
struct Preview {
  uint32_t port = 0;
  bool is_public = false;  // no token needed
  int64_t created_at_ms = 0, expires_at_ms = 0;
  std::string nonce;  // random, chosen by the caller of OpenPreview
  bool operator==(const Preview&) const = default;
};

struct Event {
  enum class Kind {
    created,
    started,
    exec_started,
    exec_finished,
    transition_started,
    transition_failed,
    snapshot_taken,
    forked,
    hibernated,
    woke,
    ttl_changed,
    metadata_changed,
    reaped,
    killed,
    failed,
    network_attached,  // the VM (created or woken) runs on host subnet `subnet`
    egress_changed,
    port_exposed,  // guest TCP `port` is forwarded from the host (while the VM runs)
    port_unexposed,
    snapshot_deleted,  // one of its named snapshots (`snapshot_id`) was deleted
    // Audit only (no state changes): what the API did in the guest besides commands.
    process_started,  // a background process `pid`, `command`
    file_written,     // `path`, `bytes`
    file_removed,     // `path`
    // It moved to host `host` (a migration, from hibernated): ended here. A created event may
    // follow in the same stream when it comes back.
    migrated,
    preview_opened,  // `preview`: guest port `preview.port` is served at a preview URL
    preview_closed,  // `port`: its preview URL is revoked
    // The hibernation `snapshot_id` has a copy on the data disk, synced (Env::persisted_dir): it
    // survives a host reboot (which empties the tmpfs the hibernation is made on).
    hibernation_persisted,
    // Its named snapshot `snapshot_id` has a copy on the data disk, synced
    // (Env::persisted_snapshot_dir): it survives a host reboot.
    snapshot_persisted,
    // Audit only: what it reached over a period (`egress`: DNS queries, connections, requests
    // that carried a secret; bytes; the most used destinations), from its egress log.
    egress_summary,
    // The hibernation `snapshot_id` (already on the data disk) is in the host's object store:
    // `manifest` names it there (storage/snapshot_chunks.h). It survives the loss of the host's
    // disk.
    hibernation_uploaded,
    // Its named snapshot `snapshot_id` (already on the data disk) is in the host's object store:
    // `manifest` names it there. It survives the loss of the host's disk.
    snapshot_uploaded
  };
  Kind kind;
  int64_t at_ms = 0;
  // created
  std::string tenant, template_name, parent, from_snapshot;
  uint32_t vcpus = 0, memory_mib = 0, ttl_seconds = 0;
  std::map<std::string, std::string> metadata;  // created, metadata_changed
  int64_t expires_at_ms = 0;                    // created, ttl_changed
  bool persistent = false, auto_wake = false;
  uint32_t idle_timeout_seconds = 0;     // created: 0 = none
  std::optional<ReapAction> on_timeout;  // created: nullopt = by persistence (see SandboxState)
  bool timeout_disk_only = false;        // created: a hibernation at its timeout keeps no memory
  // exec
  std::string exec_id, command;
  int32_t exit_code = 0;
  uint32_t duration_ms = 0;
  bool timed_out = false;
  // transitions
  Transition transition = Transition::snapshotting;
  std::string snapshot_id;    // transition_started, snapshot_taken, hibernated, snapshot_deleted
  std::string snapshot_name;  // transition_started (snapshotting), snapshot_taken: "" = unnamed
  bool disk_only = false;     // transition_started (hibernating), hibernated: without its memory
  std::vector<std::string> children;  // forked
  std::string reason;  // transition_failed, failed; reaped: "ttl" or "idle"; snapshot_deleted:
                       // "" = by the API, else why it is gone ("snapshot_lost")
  ReapAction reap_action = ReapAction::kill;
  // network
  bool network = false;                // created: the sandbox has a network
  Egress egress;                       // created, egress_changed
  std::vector<SandboxVolume> volumes;  // created
  uint32_t subnet = 0;                 // network_attached
  uint32_t port = 0;                   // port_exposed, port_unexposed, preview_closed
  Preview preview;                     // preview_opened
  // audit
  uint32_t pid = 0;                   // process_started (and `command`)
  std::string path;                   // file_written, file_removed
  uint64_t bytes = 0;                 // file_written
  std::string host;                   // migrated: the host it moved to
  vmm::EgressSummary egress_summary;  // egress_summary
  std::string manifest;               // hibernation_uploaded, snapshot_uploaded
};
const char* to_string(Event::Kind k);

struct SandboxState {
  std::string id;
  SandboxStatus status = SandboxStatus::none;
  uint64_t version = 0;  // events applied
  std::string tenant, template_name, parent, from_snapshot;
  uint32_t vcpus = 0, memory_mib = 0, ttl_seconds = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0, expires_at_ms = 0;
  bool persistent = false, auto_wake = false;
  // Timeouts: the TTL (expires_at_ms) and, when set, the idle timeout (no command, file or
  // process call, stream or background process for that long) both end in `on_timeout`.
  uint32_t idle_timeout_seconds = 0;
  ReapAction on_timeout = ReapAction::kill;  // created with persistent: hibernate by default
  bool timeout_disk_only = false;            // a hibernation at its timeout keeps only the disk
  std::string pending_snapshot;              // snapshot id of the transition in progress
  std::string pending_snapshot_name;         // the name it is taken with ("" = none)
  std::string hibernation_snapshot;          // while hibernated: what wake restores
  // The hibernation in progress / the one it is in keeps only its disk: a wake boots afresh on it.
  bool pending_disk_only = false, hibernated_disk_only = false;
  // While hibernated: its hibernation has a durable copy on the data disk (hibernation_persisted).
  bool hibernation_durable = false;
  // While hibernated: the manifest of its copy in the object store (hibernation_uploaded), or "".
  std::string hibernation_manifest;
  // The version before its hibernation-persisted event: which copy on the data disk an upload is
  // of (hibernations made through the API have no snapshot id of their own).
  uint64_t hibernation_persisted_at = 0;
  std::vector<std::string> snapshots;                 // taken from this sandbox
  std::map<std::string, std::string> snapshot_names;  // snapshot id -> the name it was taken with
  std::set<std::string> durable_snapshots;  // of `snapshots`: a synced copy is on the data disk
  // Of `durable_snapshots`: those in the object store, and their manifests' keys.
  std::map<std::string, std::string> snapshot_manifests;
  std::map<std::string, std::string> running_execs;  // exec id -> command
  std::map<std::string, int64_t> exec_started_ms;    // exec id -> when it started
  uint64_t execs_finished = 0;
  std::string failure_reason;
  bool network = false;
  Egress egress;
  std::optional<uint32_t> subnet;  // while its VM runs with a network: the host subnet it holds
  std::set<uint32_t> ports;        // guest ports exposed on the host (re-exposed at every start)
  std::map<uint32_t, Preview> previews;  // guest port -> its preview (expired ones included)
  std::vector<SandboxVolume> volumes;    // bound at every start; mounted by the create
  // Ended here by a migration: the host it lives on now (stopped). It may come back (created).
  std::string moved_to;

  bool live() const {
    return status != SandboxStatus::none && status != SandboxStatus::stopped &&
           status != SandboxStatus::failed;
  }
};

// The metadata entry that marks a database's sandbox (its value: the database's id).
inline constexpr const char* kDatabaseKey = "pandastack.database";

// A retired sandbox (ended, then forgotten after RuntimeConfig::ended_retention): this key in the
// event store marks its stream as one recovery skips. Its events stay (the audit log keeps them).
inline std::string retired_key(const std::string& sandbox_id) { return "retired/" + sandbox_id; }
inline constexpr const char* kRetiredPrefix = "retired/";

// A TTL that never expires: only the runtime sets it (the sandbox of a managed database, which
// lives until the database is deleted); the API's TTLs are bounded by Limits::max_ttl_seconds.
inline constexpr uint32_t kNoExpiry = 0xFFFFFFFFu;

struct Limits {
  uint32_t default_ttl_seconds = 900;
  uint32_t max_ttl_seconds = 24 * 3600;
  uint32_t max_metadata_entries = 64;
  uint32_t max_fork_children = 16;
  uint32_t max_concurrent_execs = 16;  // commands in flight per sandbox (exec and streams)
  uint32_t max_exposed_ports = 16;     // guest ports exposed on the host per sandbox
  uint32_t max_previews = 16;          // preview URLs per sandbox (expired ones count until closed
                                       // or opened again)
  uint32_t default_preview_ttl_seconds = 3600;
  uint32_t max_preview_ttl_seconds = 7 * 24 * 3600;
  uint32_t max_processes = 64;  // background processes running per sandbox (and WebSocket
                                // commands): more are 429 too_many_processes
};

namespace cmd {
struct Create {
  std::string tenant, template_name, parent, from_snapshot;
  uint32_t vcpus = 1, memory_mib = 256, ttl_seconds = 0;  // 0 = default
  std::map<std::string, std::string> metadata;
  bool persistent = false, auto_wake = false;
  bool network = false;
  Egress egress;
  uint32_t idle_timeout_seconds = 0;     // 0 = none
  std::optional<ReapAction> on_timeout;  // nullopt: hibernate when persistent, else kill
  std::vector<SandboxVolume> volumes;    // attached by the registry before the create
  bool timeout_disk_only = false;        // a hibernation at its timeout keeps only the disk
};
struct Started {                   // the VM answers (after create or wake)
  std::optional<uint32_t> subnet;  // the host subnet its network got
};
struct StartFailed {
  std::string reason;
};
struct Exec {
  std::string exec_id, command;
};
struct ExecFinished {
  std::string exec_id;
  int32_t exit_code = 0;
  uint32_t duration_ms = 0;
  bool timed_out = false;
};
struct Snapshot {
  std::string snapshot_id;
  std::string name;  // "" = unnamed (a name: Runtime::snapshot)
};
struct Fork {
  std::string snapshot_id;
  uint32_t count = 1;
};
struct Hibernate {
  std::string snapshot_id;
  bool disk_only = false;  // keep only the disk (a wake boots on it): E2B's keepMemory: false
};
struct Wake {};
struct TransitionDone {
  std::vector<std::string> children;
  std::optional<uint32_t> subnet;  // waking: the host subnet the woken VM's network got
};                                 // the side effect of the transition succeeded
struct TransitionFailed {
  std::string reason;
};
struct SetTtl {
  uint32_t ttl_seconds = 0;
};
struct SetMetadata {
  std::map<std::string, std::string> metadata;
};
struct SetEgress {
  Egress egress;
};
struct ExposePort {
  uint32_t port = 0;
};
struct UnexposePort {
  uint32_t port = 0;
};
struct OpenPreview {  // opens (or opens again, with a new nonce and expiry) a port's preview
  uint32_t port = 0;
  bool is_public = false;
  uint32_t ttl_seconds = 0;  // 0: the default
  std::string nonce;
};
struct ClosePreview {
  uint32_t port = 0;
};
struct DeleteSnapshot {  // one of the sandbox's named snapshots, in any state of the sandbox
  std::string snapshot_id;
  std::string reason{};  // "" = the API's delete; else why it is gone (recovery: snapshot_lost)
};
struct Reap {  // the reaper: the TTL expired, or (idle) the sandbox was unused for its idle timeout
  bool idle = false;
};
struct Kill {};
// The VM worker made the hibernation `snapshot_id` durable (a copy on the data disk, synced).
struct HibernationPersisted {
  std::string snapshot_id;
};
// The hibernation `snapshot_id` was uploaded to the object store as `manifest`.
struct HibernationUploaded {
  std::string snapshot_id, manifest;
  uint64_t persisted_at = 0;  // SandboxState::hibernation_persisted_at of the copy uploaded
};
// Its named snapshot `snapshot_id` was copied to the data disk and synced (in any state of the
// sandbox: snapshots outlive it).
struct SnapshotPersisted {
  std::string snapshot_id;
};
// Its named snapshot `snapshot_id` (on the data disk) was uploaded to the object store as
// `manifest`.
struct SnapshotUploaded {
  std::string snapshot_id, manifest;
};
// Another host runs it now (a migration; it must be hibernated here): it ends here.
struct MigratedAway {
  std::string host;
};
struct Fail {
  std::string reason;
};
// Audit records of what the API did in a running guest (recorded after it happened).
struct RecordProcess {
  uint32_t pid = 0;
  std::string command;
};
struct RecordFile {
  std::string path;
  uint64_t bytes = 0;
  bool removed = false;
};
// Its egress log summed up over a period (recorded even once it ended: its last period).
struct RecordEgress {
  vmm::EgressSummary summary;
};
}  // namespace cmd

using Command = std::variant<
    cmd::Create, cmd::Started, cmd::StartFailed, cmd::Exec, cmd::ExecFinished, cmd::Snapshot,
    cmd::Fork, cmd::Hibernate, cmd::Wake, cmd::TransitionDone, cmd::TransitionFailed, cmd::SetTtl,
    cmd::SetMetadata, cmd::SetEgress, cmd::ExposePort, cmd::UnexposePort, cmd::DeleteSnapshot,
    cmd::Reap, cmd::Kill, cmd::MigratedAway, cmd::Fail, cmd::RecordProcess, cmd::RecordFile,
    cmd::OpenPreview, cmd::ClosePreview, cmd::HibernationPersisted, cmd::SnapshotPersisted,
    cmd::RecordEgress, cmd::HibernationUploaded, cmd::SnapshotUploaded>;

// A refused command: a stable machine-readable code and a message.
struct Rejection {
  Rejection() = default;
  Rejection(Code c, std::string m, std::optional<QuotaDetail> q = std::nullopt)
      : code(c), message(std::move(m)), quota(std::move(q)) {}
  Code code = Code::internal;  // wire/errors.h: sandbox_not_found, sandbox_busy, ...
  std::string message;
  std::optional<QuotaDetail> quota;  // quota_exceeded's details
};

// A result or a refusal with a stable code (wire/result.h).
template <typename T>
using Reply = Result<T, Rejection>;

using Decision = std::variant<std::vector<Event>, Rejection>;

// What `command` means for `state` at time `now_ms`. No events and no rejection = nothing to do
// (an idempotent repeat, e.g. waking a running sandbox).
Decision decide(const SandboxState& state, const Command& command, int64_t now_ms,
                const Limits& limits = {});

// The limits on a sandbox's metadata (entries, key and value sizes): the refusal, if any.
std::optional<Rejection> check_metadata(const std::map<std::string, std::string>& m,
                                        const Limits& l);

// Why a sandbox in `s` cannot do `what` (which needs it running): sandbox_hibernated,
// sandbox_stopped, sandbox_failed, sandbox_busy (a transition is in progress), sandbox_not_found.
Rejection not_running(const SandboxState& s, const std::string& what);

// The status a sandbox is in during `t`.
SandboxStatus transition_status(Transition t);
// When a sandbox with `ttl` seconds expires, counted from `from_ms` (never, for kNoExpiry).
int64_t expiry(int64_t from_ms, uint32_t ttl);

// The state after `event`. Throws std::logic_error when the event is impossible in `state`.
SandboxState apply(SandboxState state, const Event& event);

}  // namespace pandastack::actors
