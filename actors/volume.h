// The volume lifecycle as two pure functions (no CAF, no I/O), like the sandbox's (sandbox.h):
//
//   decide(state, command) -> events | error     what a command means in a state
//   apply(state, event)    -> state              how an event changes the state
//
// A volume is a file on a real disk (an ext4 image, volume_files.h) that outlives sandboxes. The
// volume actor persists decide()'s events in the volume's own stream (`vol_...`), applies them,
// and only then touches the file. Attachments are recorded here, so "attached read-write to at
// most one sandbox" is decided by one actor, in order: never by a race between two creates.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/sandbox.h"

namespace pandastack::actors {

// `moved`: it went to another host of a cluster with its sandbox (a migration); it may come back.
enum class VolumeStatus { none, available, deleted, moved };
const char* to_string(VolumeStatus s);

// Where a volume is attached: a sandbox, the guest path and how.
struct VolumeAttachment {
  std::string sandbox;
  std::string mount;
  bool read_only = false;
  bool operator==(const VolumeAttachment&) const = default;
};

// A point-in-time copy of a volume (`vsnap_...`): a file next to the volume's (a reflink where
// the file system has them, else a sparse copy), a source for new volumes (from_snapshot).
struct VolumeSnapshot {
  std::string id;
  uint64_t size_mib = 0;  // the volume's size when it was taken
  int64_t created_at_ms = 0;
  bool operator==(const VolumeSnapshot&) const = default;
};

struct VolumeEvent {
  enum class Kind {
    created,
    attached,
    detached,
    resized,
    metadata_changed,
    deleted,
    snapshotted,       // `snapshot` (its file is made before the event is recorded)
    snapshot_deleted,  // `snapshot.id`
    arrived,           // from `host` (a migration): the volume as it was there, unattached
    migrated,          // to `host`, with its sandbox: its files went with it
    // Its file (detached since `file_version`) is in the host's object store: `manifest` names
    // it there (storage/snapshot_chunks.h). It survives the loss of the host's disk.
    uploaded,
  };
  Kind kind = Kind::created;
  int64_t at_ms = 0;
  std::string tenant, name;                     // created
  std::string origin;                           // created: "" or what it is a copy of
  uint64_t size_mib = 0;                        // created, resized
  std::map<std::string, std::string> metadata;  // created, metadata_changed
  VolumeAttachment attachment;                  // attached; detached: its sandbox
  std::string reason;                           // detached: "sandbox_ended", "create_failed", ...
  VolumeSnapshot snapshot;                      // snapshotted; snapshot_deleted: its id
  std::string host;                             // arrived: from; migrated: to
  int64_t created_at_ms = 0;                    // arrived
  std::vector<VolumeSnapshot> snapshots;        // arrived
  std::string manifest;                         // uploaded
  uint64_t file_version = 0;                    // uploaded
};
const char* to_string(VolumeEvent::Kind k);

struct VolumeState {
  std::string id;
  VolumeStatus status = VolumeStatus::none;
  uint64_t version = 0;
  std::string tenant, name;
  std::string origin;  // "" (made empty), or "fork:<sandbox>:<volume>", "snapshot:<snap>:<volume>"
  uint64_t size_mib = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0;
  std::vector<VolumeAttachment> attachments;
  std::vector<VolumeSnapshot> snapshots;  // oldest first; deleted with the volume
  // The version of its last event that may have changed its file (created, arrived, attached,
  // resized): a copy made while it was detached since then is of the file as it is.
  uint64_t file_version = 0;
  // Its file's copy in the object store (uploaded), or "": the last one made; `stored` while it
  // is of the file as it is (nothing changed it since).
  std::string manifest;
  bool stored = false;

  bool attached_to(const std::string& sandbox) const;
};

struct VolumeLimits {
  uint64_t min_size_mib = 16;     // ext4 with a journal needs room
  uint64_t max_size_mib = 65536;  // one volume: 64 GiB
  uint32_t max_name_bytes = 64;
  uint32_t max_snapshots = 16;  // per volume
};

namespace vcmd {
struct Create {
  std::string tenant, name;
  uint64_t size_mib = 0;
  std::map<std::string, std::string> metadata;
  std::string origin;  // a copy's (its file is made by copying before the command)
};
struct Attach {
  VolumeAttachment attachment;
};
struct Detach {
  std::string sandbox;
  std::string reason;
};
struct Resize {
  uint64_t size_mib = 0;
};
struct SetMetadata {
  std::map<std::string, std::string> metadata;
};
struct Delete {};
// A volume another host sent (its file and its snapshots' files are in place): it goes on here
// as it was there. Only a volume this host does not hold (or one that moved away before).
struct Arrive {
  std::string tenant, name, origin, from_host;
  uint64_t size_mib = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0;
  std::vector<VolumeSnapshot> snapshots;
};
// The volume went to host `host` with sandbox `sandbox` (the only one it may be attached to).
struct Leave {
  std::string host, sandbox;
};
// A point-in-time copy, named `snapshot_id`. Refused while a sandbox holds the volume read-write,
// unless it is `quiesced_by` (its guest froze the file system, or it is hibernated).
struct Snapshot {
  std::string snapshot_id;
  std::string quiesced_by;
};
struct DeleteSnapshot {
  std::string snapshot_id;
};
// Its file was uploaded to the object store as `manifest`, read while it was detached at
// `file_version` (VolumeState::file_version): recorded only if nothing changed the file since.
struct Uploaded {
  std::string manifest;
  uint64_t file_version = 0;
};
}  // namespace vcmd

using VolumeCommand = std::variant<vcmd::Create, vcmd::Attach, vcmd::Detach, vcmd::Resize,
                                   vcmd::SetMetadata, vcmd::Delete, vcmd::Snapshot,
                                   vcmd::DeleteSnapshot, vcmd::Arrive, vcmd::Leave, vcmd::Uploaded>;
using VolumeDecision = std::variant<std::vector<VolumeEvent>, Rejection>;

// Refusals: invalid_argument, volume_not_found (deleted), volume_in_use (attached read-write
// elsewhere, or read-only elsewhere for a read-write attach), volume_attached (delete or resize
// while a sandbox holds it; a snapshot while one holds it read-write unquiesced),
// snapshot_not_found, quota_exceeded (max_snapshots). No events and no rejection = nothing to do
// (an idempotent repeat).
VolumeDecision decide(const VolumeState& state, const VolumeCommand& command, int64_t now_ms,
                      const VolumeLimits& limits = {}, const Limits& sandbox_limits = {});

// The state after `event`. Throws std::logic_error when the event is impossible in `state`.
VolumeState apply(VolumeState state, const VolumeEvent& event);

// A valid guest mount path: absolute, normalized, not "/", not under a system folder.
std::optional<Rejection> check_mount_path(const std::string& path);

}  // namespace pandastack::actors
