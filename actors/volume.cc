#include "actors/volume.h"

#include <algorithm>
#include <stdexcept>

namespace pandastack::actors {

const char* to_string(VolumeStatus s) {
  switch (s) {
    case VolumeStatus::none:
      return "none";
    case VolumeStatus::available:
      return "available";
    case VolumeStatus::deleted:
      return "deleted";
    case VolumeStatus::moved:
      return "moved";
  }
  return "?";
}

const char* to_string(VolumeEvent::Kind k) {
  switch (k) {
    case VolumeEvent::Kind::created:
      return "volume-created";
    case VolumeEvent::Kind::attached:
      return "volume-attached";
    case VolumeEvent::Kind::detached:
      return "volume-detached";
    case VolumeEvent::Kind::resized:
      return "volume-resized";
    case VolumeEvent::Kind::metadata_changed:
      return "volume-metadata-changed";
    case VolumeEvent::Kind::deleted:
      return "volume-deleted";
    case VolumeEvent::Kind::snapshotted:
      return "volume-snapshotted";
    case VolumeEvent::Kind::snapshot_deleted:
      return "volume-snapshot-deleted";
    case VolumeEvent::Kind::arrived:
      return "volume-arrived";
    case VolumeEvent::Kind::migrated:
      return "volume-migrated";
    case VolumeEvent::Kind::uploaded:
      return "volume-uploaded";
  }
  return "?";
}

bool VolumeState::attached_to(const std::string& sandbox) const {
  return std::any_of(attachments.begin(), attachments.end(),
                     [&](auto& a) { return a.sandbox == sandbox; });
}

std::optional<Rejection> check_mount_path(const std::string& p) {
  auto bad = [&](const std::string& why) {
    return Rejection{Code::invalid_argument, "mount path '" + p + "' " + why};
  };
  if (p.empty() || p[0] != '/') return bad("must be absolute");
  if (p.size() > 256) return bad("is longer than 256 bytes");
  if (p == "/") return bad("cannot be /");
  if (p.back() == '/') return bad("must not end with /");
  for (char c : p)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("has control characters");
  if (p.find("//") != std::string::npos || p.find("/./") != std::string::npos ||
      p.find("/../") != std::string::npos || p.ends_with("/..") || p.ends_with("/."))
    return bad("must be normalized (no //, . or ..)");
  // The guest's own system folders stay its own.
  for (const char* sys : {"/proc", "/sys", "/dev", "/run", "/bin", "/sbin", "/lib", "/lib64",
                          "/usr", "/etc", "/boot", "/var/lib/dpkg"}) {
    std::string s = sys;
    if (p == s || p.starts_with(s + "/")) return bad("is a system folder");
  }
  return std::nullopt;
}

namespace {

Rejection gone(const VolumeState& s) { return {Code::volume_not_found, "no volume " + s.id}; }

struct Decider {
  const VolumeState& s;
  int64_t now;
  const VolumeLimits& limits;
  const Limits& sandbox_limits;

  VolumeEvent event(VolumeEvent::Kind k) const {
    VolumeEvent e;
    e.kind = k;
    e.at_ms = now;
    return e;
  }

  VolumeDecision operator()(const vcmd::Create& c) const {
    if (s.status != VolumeStatus::none)
      return Rejection{Code::invalid_state, "volume " + s.id + " exists"};
    if (c.name.size() > limits.max_name_bytes)
      return Rejection{Code::invalid_argument,
                       "name is longer than " + std::to_string(limits.max_name_bytes) + " bytes"};
    for (char ch : c.name)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.'))
        return Rejection{Code::invalid_argument, "name may hold letters, digits, '-', '_' and '.'"};
    if (c.size_mib < limits.min_size_mib || c.size_mib > limits.max_size_mib)
      return Rejection{Code::invalid_argument, "size_mib must be " +
                                                   std::to_string(limits.min_size_mib) + ".." +
                                                   std::to_string(limits.max_size_mib)};
    if (auto r = check_metadata(c.metadata, sandbox_limits)) return *r;
    auto e = event(VolumeEvent::Kind::created);
    e.tenant = c.tenant;
    e.name = c.name;
    e.size_mib = c.size_mib;
    e.metadata = c.metadata;
    e.origin = c.origin;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Attach& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (auto r = check_mount_path(c.attachment.mount)) return *r;
    for (auto& a : s.attachments) {
      if (a.sandbox == c.attachment.sandbox) {
        if (a == c.attachment) return std::vector<VolumeEvent>{};
        return Rejection{Code::invalid_argument,
                         "volume " + s.id + " is attached to " + a.sandbox + " already"};
      }
      if (!c.attachment.read_only || !a.read_only)
        return Rejection{Code::volume_in_use, "volume " + s.id + " is attached " +
                                                  (a.read_only ? "read-only" : "read-write") +
                                                  " to sandbox " + a.sandbox};
    }
    auto e = event(VolumeEvent::Kind::attached);
    e.attachment = c.attachment;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Detach& c) const {
    if (!s.attached_to(c.sandbox)) return std::vector<VolumeEvent>{};
    auto e = event(VolumeEvent::Kind::detached);
    e.attachment.sandbox = c.sandbox;
    e.reason = c.reason;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Resize& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (c.size_mib == s.size_mib) return std::vector<VolumeEvent>{};
    if (c.size_mib < s.size_mib)
      return Rejection{Code::invalid_argument,
                       "a volume only grows (it has " + std::to_string(s.size_mib) + " MiB)"};
    if (c.size_mib > limits.max_size_mib)
      return Rejection{Code::invalid_argument,
                       "size_mib must be at most " + std::to_string(limits.max_size_mib)};
    if (!s.attachments.empty())
      return Rejection{Code::volume_attached, "volume " + s.id + " is attached to sandbox " +
                                                  s.attachments.front().sandbox +
                                                  ": it grows while detached"};
    auto e = event(VolumeEvent::Kind::resized);
    e.size_mib = c.size_mib;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::SetMetadata& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (auto r = check_metadata(c.metadata, sandbox_limits)) return *r;
    if (c.metadata == s.metadata) return std::vector<VolumeEvent>{};
    auto e = event(VolumeEvent::Kind::metadata_changed);
    e.metadata = c.metadata;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Snapshot& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (c.snapshot_id.empty()) return Rejection{Code::invalid_argument, "snapshot id required"};
    if (s.snapshots.size() >= limits.max_snapshots)
      return Rejection{Code::quota_exceeded, "volume " + s.id + " has " +
                                                 std::to_string(s.snapshots.size()) +
                                                 " snapshots, the most it may have: delete one"};
    for (auto& a : s.attachments)
      if (!a.read_only && a.sandbox != c.quiesced_by)
        return Rejection{Code::volume_attached, "volume " + s.id + " is attached read-write to " +
                                                    "sandbox " + a.sandbox +
                                                    " and was not quiesced"};
    auto e = event(VolumeEvent::Kind::snapshotted);
    e.snapshot = {c.snapshot_id, s.size_mib, now};
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::DeleteSnapshot& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (std::none_of(s.snapshots.begin(), s.snapshots.end(),
                     [&](auto& x) { return x.id == c.snapshot_id; }))
      return Rejection{Code::snapshot_not_found,
                       "volume " + s.id + " has no snapshot " + c.snapshot_id};
    auto e = event(VolumeEvent::Kind::snapshot_deleted);
    e.snapshot.id = c.snapshot_id;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Arrive& c) const {
    if (s.status != VolumeStatus::none && s.status != VolumeStatus::moved)
      return Rejection{Code::conflict, "volume " + s.id + " exists on this host already"};
    if (c.size_mib < limits.min_size_mib || c.size_mib > limits.max_size_mib)
      return Rejection{Code::invalid_argument, "size_mib out of bounds"};
    if (c.snapshots.size() > limits.max_snapshots)
      return Rejection{Code::invalid_argument, "more snapshots than a volume may have"};
    if (c.from_host.empty()) return Rejection{Code::invalid_argument, "the host it came from"};
    auto e = event(VolumeEvent::Kind::arrived);
    e.tenant = c.tenant;
    e.name = c.name;
    e.origin = c.origin;
    e.size_mib = c.size_mib;
    e.metadata = c.metadata;
    e.created_at_ms = c.created_at_ms;
    e.snapshots = c.snapshots;
    e.host = c.from_host;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Leave& c) const {
    if (s.status != VolumeStatus::available) return gone(s);
    for (auto& a : s.attachments)
      if (a.sandbox != c.sandbox)
        return Rejection{Code::volume_in_use, "volume " + s.id + " is attached to sandbox " +
                                                  a.sandbox + " too: it stays on this host"};
    auto e = event(VolumeEvent::Kind::migrated);
    e.host = c.host;
    e.attachment.sandbox = c.sandbox;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Uploaded& c) const {
    // Only a copy of the file as it is: detached all along since (nothing wrote it meanwhile).
    if (s.status != VolumeStatus::available || !s.attachments.empty() ||
        s.file_version != c.file_version || c.manifest.empty() ||
        (s.stored && s.manifest == c.manifest))
      return std::vector<VolumeEvent>{};
    auto e = event(VolumeEvent::Kind::uploaded);
    e.manifest = c.manifest;
    e.file_version = c.file_version;
    return std::vector<VolumeEvent>{e};
  }

  VolumeDecision operator()(const vcmd::Delete&) const {
    if (s.status != VolumeStatus::available) return gone(s);
    if (!s.attachments.empty())
      return Rejection{Code::volume_attached, "volume " + s.id + " is attached to sandbox " +
                                                  s.attachments.front().sandbox};
    return std::vector<VolumeEvent>{event(VolumeEvent::Kind::deleted)};
  }
};

[[noreturn]] void impossible(const VolumeState& s, const VolumeEvent& e) {
  throw std::logic_error(std::string("volume ") + s.id + ": " + to_string(e.kind) + " in state " +
                         to_string(s.status));
}

}  // namespace

VolumeDecision decide(const VolumeState& state, const VolumeCommand& command, int64_t now_ms,
                      const VolumeLimits& limits, const Limits& sandbox_limits) {
  return std::visit(Decider{state, now_ms, limits, sandbox_limits}, command);
}

VolumeState apply(VolumeState s, const VolumeEvent& e) {
  using K = VolumeEvent::Kind;
  if (e.kind == K::arrived) {
    // As it was on the host it came from; the stream goes on where it left (a volume back).
    if (s.status != VolumeStatus::none && s.status != VolumeStatus::moved) impossible(s, e);
    s.status = VolumeStatus::available;
    s.tenant = e.tenant;
    s.name = e.name;
    s.size_mib = e.size_mib;
    s.metadata = e.metadata;
    s.origin = e.origin;
    s.created_at_ms = e.created_at_ms;
    s.attachments.clear();
    s.snapshots = e.snapshots;
    s.file_version = s.version;
    s.manifest.clear();  // (a copy on this host before it left is not of this file)
    s.stored = false;
  } else if (e.kind == K::created) {
    if (s.status != VolumeStatus::none) impossible(s, e);
    s.status = VolumeStatus::available;
    s.tenant = e.tenant;
    s.name = e.name;
    s.size_mib = e.size_mib;
    s.metadata = e.metadata;
    s.origin = e.origin;
    s.created_at_ms = e.at_ms;
    s.file_version = s.version;
  } else {
    if (s.status != VolumeStatus::available) impossible(s, e);
    switch (e.kind) {
      case K::attached:
        s.attachments.push_back(e.attachment);
        s.file_version = s.version;
        s.stored = false;
        break;
      case K::detached:
        std::erase_if(s.attachments, [&](auto& a) { return a.sandbox == e.attachment.sandbox; });
        break;
      case K::resized:
        s.size_mib = e.size_mib;
        s.file_version = s.version;
        s.stored = false;
        break;
      case K::metadata_changed:
        s.metadata = e.metadata;
        break;
      case K::deleted:
        if (!s.attachments.empty()) impossible(s, e);
        s.status = VolumeStatus::deleted;
        s.manifest.clear();
        s.stored = false;
        break;
      case K::snapshotted:
        s.snapshots.push_back({e.snapshot.id, e.snapshot.size_mib, e.at_ms});
        break;
      case K::snapshot_deleted:
        std::erase_if(s.snapshots, [&](auto& x) { return x.id == e.snapshot.id; });
        break;
      case K::migrated:
        s.status = VolumeStatus::moved;
        s.attachments.clear();
        s.snapshots.clear();  // (their files went with it)
        s.manifest.clear();   // (and its copy in this host's store goes)
        s.stored = false;
        break;
      case K::uploaded:
        if (!s.attachments.empty() || s.file_version != e.file_version) impossible(s, e);
        s.manifest = e.manifest;
        s.stored = true;
        break;
      case K::created:
      case K::arrived:
        break;
    }
  }
  ++s.version;
  return s;
}

}  // namespace pandastack::actors
