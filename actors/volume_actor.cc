#include "actors/volume_actor.h"

#include "actors/deadlines.h"
#include "actors/env.h"
#include "actors/event_codec.h"
#include "actors/snapshot_uploader.h"
#include "actors/volume_codec.h"
#include "actors/volume_files.h"

namespace pandastack::actors {

VolumeInfo volume_info_of(const VolumeState& s) {
  VolumeInfo i;
  i.id = s.id;
  i.tenant = s.tenant;
  i.name = s.name;
  i.origin = s.origin;
  i.status = to_string(s.status);
  i.size_mib = s.size_mib;
  i.metadata = s.metadata;
  i.created_at_ms = s.created_at_ms;
  i.attachments = s.attachments;
  i.snapshots = s.snapshots;
  i.version = s.version;
  i.manifest = s.manifest;
  i.stored = s.stored;
  return i;
}

namespace {

Answer volume_answer(const VolumeState& s) {
  Answer a;
  a.volume = volume_info_of(s);
  return a;
}

void persist(VolumeSelf* self);

void pump(VolumeSelf* self) {
  auto& st = self->state;
  while (!st.persisting && !st.queue.empty()) {
    auto [c, rp] = std::move(st.queue.front());
    st.queue.pop_front();
    auto d = decide(st.s, c, now_ms(), st.env->config.volume_limits, st.env->config.limits);
    if (auto* r = std::get_if<Rejection>(&d)) {
      rp.deliver(Answer::fail(*r));
      continue;
    }
    auto events = std::get<std::vector<VolumeEvent>>(d);
    if (events.empty()) {
      rp.deliver(volume_answer(st.s));
      continue;
    }
    st.persisting = true;
    st.current_rp = rp;
    st.pending = events;
    if (events.front().kind == VolumeEvent::Kind::snapshotted) {
      // The copy first: recorded only once it exists (a crash between leaves an orphan file,
      // which recovery removes).
      auto from = volume_file(st.env->volumes_dir(), st.s.id).string();
      auto to = volume_snapshot_file(st.env->volumes_dir(), events.front().snapshot.id).string();
      self->request(st.files, deadline::kVolumeCopy.limit, volclone_atom::value,
                    std::vector<std::string>{from, to}, false)
          .then(
              [self](std::string err) {
                if (err.empty()) return persist(self);
                self->send(self, persisted_atom::value, false, Code::storage_error,
                           "copying the volume: " + err);
              },
              [self](const caf::error& e) {
                auto why = deadline::missed(e, deadline::kVolumeCopy, self->system());
                self->send(self, persisted_atom::value, false, why.code, why.message);
              });
      return;
    }
    if (events.front().kind == VolumeEvent::Kind::resized) {
      // The file first (it only grows, sparsely: its file system grows in the guest at its next
      // mount): recorded only once it has the size, a grow that cannot be made records nothing.
      auto file = volume_file(st.env->volumes_dir(), st.s.id);
      if (auto grown = grow_volume_file(file, events.front().size_mib); !grown) {
        self->send(self, persisted_atom::value, false, Code::volume_grow_failed,
                   "growing the volume's file: " + grown.error().message);
        return;
      }
    }
    persist(self);
  }
}

void persist(VolumeSelf* self) {
  auto& st = self->state;
  std::vector<storage::NewEvent> ne;
  for (auto& e : st.pending)
    ne.push_back({to_string(e.kind), event_format(), encode_volume_event(e)});
  append_and_report(*st.env, st.s.id, st.s.version, std::move(ne),
                    caf::actor_cast<caf::actor>(self));
}

// The files of volume `s` (its own and its snapshots').
void remove_files(Env& env, const VolumeState& s) {
  remove_volume_file(volume_file(env.volumes_dir(), s.id));
  for (auto& sn : s.snapshots) remove_volume_file(volume_snapshot_file(env.volumes_dir(), sn.id));
}

// After the events are on disk: the file follows the record. `before`: the state they changed.
void effect(VolumeSelf* self, const VolumeEvent& e, const VolumeState& before) {
  auto& st = self->state;
  switch (e.kind) {
    case VolumeEvent::Kind::deleted:
    case VolumeEvent::Kind::migrated:  // (another host has them now)
      remove_files(*st.env, before);
      break;
    case VolumeEvent::Kind::snapshot_deleted:
      remove_volume_file(volume_snapshot_file(st.env->volumes_dir(), e.snapshot.id));
      break;
    default:
      break;
  }
}

// With an object store: a detached file no copy in the store is of goes there (once per file
// version); `before`: its copy until this batch, which goes when it is no longer the copy.
void follow_store(VolumeSelf* self, const std::string& before) {
  auto& st = self->state;
  if (!st.env->object_store) return;
  if (!before.empty() && before != st.s.manifest)
    caf::anon_send(st.registry, forget_atom::value, before, std::string());
  if (st.s.status == VolumeStatus::available && st.s.attachments.empty() && !st.s.stored &&
      st.upload_asked != st.s.file_version) {
    st.upload_asked = st.s.file_version;
    caf::anon_send(st.registry, upvol_atom::value, st.s.id, st.s.file_version);
  }
}

}  // namespace

caf::behavior volume_actor(VolumeSelf* self, Env* env, caf::actor registry, caf::actor files,
                           VolumeState initial) {
  auto& st = self->state;
  st.env = env;
  st.registry = registry;
  st.files = files;
  st.s = std::move(initial);
  log_exceptions(self, "volume " + st.s.id);
  follow_store(self, st.s.manifest);  // (recovered detached, not in the store: uploaded now)
  return {
      [=](vol_atom, VolumeCommand c) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        self->state.queue.emplace_back(std::move(c), rp);
        pump(self);
        return rp;
      },
      [=](persisted_atom, bool ok, Code code, std::string err) {
        auto& st = self->state;
        st.persisting = false;
        auto rp = st.current_rp;
        auto events = std::move(st.pending);
        st.pending.clear();
        if (!ok) {
          spdlog::error("volume {}: events not persisted: {}", st.s.id, err);
          rp.deliver(Answer::fail({code, err}));
          // A create (or an arrival) that was never recorded leaves no file behind, nor a
          // snapshot.
          if (st.s.status == VolumeStatus::none)
            remove_volume_file(volume_file(st.env->volumes_dir(), st.s.id));
          for (auto& e : events) {
            if (e.kind == VolumeEvent::Kind::snapshotted)
              remove_volume_file(volume_snapshot_file(st.env->volumes_dir(), e.snapshot.id));
            if (e.kind == VolumeEvent::Kind::arrived) {
              VolumeState came = st.s;
              came.snapshots = e.snapshots;
              remove_files(*st.env, came);
            }
          }
        } else {
          auto stored = st.s.manifest;
          for (auto& e : events) {
            auto before = st.s;
            st.s = apply(st.s, e);
            effect(self, e, before);
          }
          follow_store(self, stored);
          rp.deliver(volume_answer(st.s));
          self->send(st.registry, volinfo_atom::value, volume_info_of(st.s));
        }
        pump(self);
        if (st.s.status != VolumeStatus::available && st.queue.empty() && !st.persisting)
          self->quit();
      },
  };
}

}  // namespace pandastack::actors
