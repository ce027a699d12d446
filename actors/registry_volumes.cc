#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <set>

#include "actors/deadlines.h"
#include "actors/registry.h"
#include "actors/volume_actor.h"
#include "actors/volume_file_worker.h"
#include "actors/volume_files.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors::registry_volumes {

namespace {

Rejection volume_not_found(const std::string& id) {
  return {Code::volume_not_found, "no volume " + id};
}

caf::actor actor_of(RegistrySelf* self, const std::string& tenant, const std::string& id) {
  auto i = self->state.volumes.find(id);
  if (i == self->state.volumes.end() || i->second.tenant != tenant) return caf::actor();
  auto a = self->state.volume_actors.find(id);
  return a == self->state.volume_actors.end() ? caf::actor() : a->second;
}

caf::actor files(RegistrySelf* self) {
  auto& f = self->state.volume_files;
  if (!f) f = self->spawn<caf::detached + caf::linked>(volume_file_worker, self->state.env);
  return f;
}

caf::actor spawn_volume(RegistrySelf* self, VolumeState s) {
  auto a =
      self->spawn(volume_actor, self->state.env, caf::actor_cast<caf::actor>(self), files(self), s);
  self->state.volume_actors[s.id] = a;
  return a;
}

VolumeInfo pending(const std::string& id, const std::string& tenant, uint64_t size_mib) {
  VolumeInfo p;
  p.id = id;
  p.tenant = tenant;
  p.status = "creating";
  p.size_mib = size_mib;
  return p;
}

// Records volume `id`, whose file is made, without a quota check (the caller made it): its actor
// records volume-created; `then` gets the answer.
void record(RegistrySelf* self, const std::string& id, const VolumeRequest& req,
            const std::string& origin, std::function<void(Answer)> then) {
  VolumeState s;
  s.id = id;
  auto a = spawn_volume(self, s);
  self->state.volumes[id] = pending(id, req.tenant, req.size_mib);  // counted from now on
  self->request(
          a, deadline::kVolumeCommand.limit, vol_atom::value,
          VolumeCommand{vcmd::Create{req.tenant, req.name, req.size_mib, req.metadata, origin}})
      .then(
          [self, then, id](Answer ans) {
            if (!ans.ok) {
              self->state.volumes.erase(id);
              self->state.volume_actors.erase(id);
            } else {
              self->state.volumes[id] = ans.volume;
            }
            then(ans);
          },
          [self, then, id](const caf::error& e) {
            self->state.volumes.erase(id);
            self->state.volume_actors.erase(id);
            then(Answer::fail(deadline::missed(e, deadline::kVolumeCommand, self->system())));
          });
}

}  // namespace

std::optional<Rejection> admit(RegistrySelf* self, const std::string& tenant, uint64_t size_mib,
                               uint32_t volumes) {
  QuotaUse use;
  for (auto& [id, v] : self->state.volumes)
    if (v.tenant == tenant) count_volume_use(v, use);
  // Database backups are disk too (DATA/backups).
  for (auto& [id, d] : self->state.databases)
    if (d.tenant == tenant && d.status != DatabaseStatus::deleted)
      use.volume_mib += backups_mib(d.backups);
  QuotaAsk ask;
  ask.volumes = volumes;
  ask.volume_mib = size_mib;
  return check_quotas(self->state.env->quotas_of(tenant), use, ask);
}

caf::result<Answer> create(RegistrySelf* self, std::string id, VolumeRequest req) {
  // Checked again here, in order with other creates (the facade's check came before the file).
  if (auto r = admit(self, req.tenant, req.size_mib)) return Answer::fail(*r);
  auto rp = self->make_response_promise();
  record(self, id, req, req.origin, [rp](Answer ans) mutable { rp.deliver(ans); });
  return rp;
}

void inherit(RegistrySelf* self, const std::string& tenant,
             const std::vector<SandboxVolume>& source, const std::string& snapshot_dir,
             const std::string& origin, bool take_copies, std::function<void(Inherited)> then) {
  std::vector<CreateRequest::Volume> wanted;
  if (source.empty()) return then(wanted);
  auto snap = vmm::Snapshot::load(snapshot_dir);  // its meta.json: which volumes it holds
  if (!snap) return then(Rejection{Code::internal, "snapshot: " + snap.error().message});
  auto sorted = source;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.slot < b.slot; });
  auto* env = self->state.env;
  std::vector<std::string> ids, pairs, origins;
  std::vector<VolumeRequest> reqs;
  uint64_t mib = 0;
  for (auto& v : sorted) {
    auto& copies = snap->volume_copies;
    if (std::find(copies.begin(), copies.end(), v.slot) == copies.end()) {
      if (!v.read_only)
        return then(Rejection{Code::internal, "the snapshot holds no copy of volume " + v.volume});
      wanted.push_back({v.volume, v.mount, true});  // shared, as the source had it
      continue;
    }
    struct stat st {};
    if (::stat(snap->volume(v.slot).c_str(), &st) != 0)
      return then(
          Rejection{Code::internal, "the snapshot's copy of volume " + v.volume + " is gone"});
    VolumeRequest r;
    r.tenant = tenant;
    if (auto src = self->state.volumes.find(v.volume); src != self->state.volumes.end()) {
      r.name = src->second.name;
      r.metadata = src->second.metadata;
    }
    r.size_mib = uint64_t(st.st_size) >> 20;
    mib += r.size_mib;
    std::string id = "vol_" + random_base32(16);
    pairs.push_back(snap->volume(v.slot).string());
    pairs.push_back(volume_file(env->volumes_dir(), id).string());
    ids.push_back(id);
    reqs.push_back(r);
    origins.push_back(v.volume.empty() ? origin : origin + ":" + v.volume);
    wanted.push_back({id, v.mount, v.read_only});
  }
  if (ids.empty()) return then(wanted);
  if (auto r = admit(self, tenant, mib, uint32_t(ids.size()))) return then(*r);
  for (size_t i = 0; i < ids.size(); ++i)  // counted while their files are made
    self->state.volumes[ids[i]] = pending(ids[i], tenant, reqs[i].size_mib);
  auto forget = [self, ids] {
    for (auto& id : ids) self->state.volumes.erase(id);
  };
  self->request(files(self), deadline::kVolumeCopy.limit, volclone_atom::value, pairs, take_copies)
      .then(
          [self, ids, reqs, origins, wanted, then, forget](std::string err) {
            if (!err.empty()) {
              forget();
              return then(Rejection{Code::storage_error, "copying the volumes: " + err});
            }
            struct Collect {
              size_t left;
              std::optional<Rejection> error;
            };
            auto col = std::make_shared<Collect>(Collect{ids.size(), std::nullopt});
            for (size_t i = 0; i < ids.size(); ++i)
              record(self, ids[i], reqs[i], origins[i], [self, ids, wanted, then, col](Answer a) {
                if (!a.ok && !col->error) col->error = a.error;
                if (--col->left > 0) return;
                if (!col->error) return then(wanted);
                discard(self, ids);
                then(*col->error);
              });
          },
          [self, then, forget](const caf::error& e) {
            forget();
            then(deadline::missed(e, deadline::kVolumeCopy, self->system()));
          });
}

void arrive(RegistrySelf* self, const std::string& tenant,
            const std::vector<VolumeArrival>& arrivals, const std::string& received,
            const std::string& from_host, std::function<void(Inherited)> then) {
  auto sorted = arrivals;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.slot < b.slot; });
  auto* env = self->state.env;
  uint64_t mib = 0;
  std::vector<std::string> pairs, ids;
  std::vector<CreateRequest::Volume> wanted;
  for (auto& a : sorted) {
    auto& v = a.volume;
    // Only one this host does not hold (or one that left it before: its stream goes on).
    if (auto known = self->state.volumes.find(v.id);
        (known != self->state.volumes.end() && known->second.status != "moved") ||
        self->state.volume_actors.count(v.id))
      return then(Rejection{Code::conflict, "volume " + v.id + " exists on this host already"});
    mib += v.size_mib;
    pairs.push_back((std::filesystem::path(received) / (v.id + ".img")).string());
    pairs.push_back(volume_file(env->volumes_dir(), v.id).string());
    for (auto& sn : v.snapshots) {
      mib += sn.size_mib;
      pairs.push_back((std::filesystem::path(received) / (sn.id + ".img")).string());
      pairs.push_back(volume_snapshot_file(env->volumes_dir(), sn.id).string());
    }
    ids.push_back(v.id);
    wanted.push_back({v.id, a.mount, a.read_only});
  }
  if (ids.empty()) return then(wanted);
  if (auto r = admit(self, tenant, mib, uint32_t(ids.size()))) return then(*r);
  // Counted while their files are moved into place (a returning one keeps its stream's version).
  std::map<std::string, uint64_t> versions;
  for (auto& a : sorted) {
    if (auto known = self->state.volumes.find(a.volume.id); known != self->state.volumes.end())
      versions[a.volume.id] = known->second.version;
    self->state.volumes[a.volume.id] = pending(a.volume.id, tenant, a.volume.size_mib);
  }
  self->request(files(self), deadline::kVolumeCopy.limit, volclone_atom::value, pairs, true)
      .then(
          [self, sorted, versions, wanted, then, from_host, tenant](std::string err) {
            if (!err.empty()) {
              for (auto& a : sorted) self->state.volumes.erase(a.volume.id);
              return then(Rejection{Code::storage_error, "placing the volumes: " + err});
            }
            struct Collect {
              size_t left;
              std::optional<Rejection> error;
              std::vector<std::string> recorded;
            };
            auto col = std::make_shared<Collect>(Collect{sorted.size(), std::nullopt, {}});
            for (auto& a : sorted) {
              VolumeState s;
              s.id = a.volume.id;
              if (auto v = versions.find(s.id); v != versions.end()) {
                s.status = VolumeStatus::moved;
                s.version = v->second;
              }
              auto actor = spawn_volume(self, s);
              auto& v = a.volume;
              vcmd::Arrive c{tenant,     v.name,     v.origin,        from_host,
                             v.size_mib, v.metadata, v.created_at_ms, v.snapshots};
              auto done = [self, col, wanted, then, from_host, id = s.id](Answer ans) {
                if (ans.ok) {
                  self->state.volumes[id] = ans.volume;
                  col->recorded.push_back(id);
                } else {
                  self->state.volumes.erase(id);
                  self->state.volume_actors.erase(id);
                  if (!col->error) col->error = ans.error;
                }
                if (--col->left > 0) return;
                if (!col->error) return then(wanted);
                send_back(self, col->recorded, from_host, "");
                then(*col->error);
              };
              self->request(actor, deadline::kVolumeCommand.limit, vol_atom::value,
                            VolumeCommand{c})
                  .then(done, [self, done](const caf::error& e) {
                    done(Answer::fail(
                        deadline::missed(e, deadline::kVolumeCommand, self->system())));
                  });
            }
          },
          [self, sorted, then](const caf::error& e) {
            for (auto& a : sorted) self->state.volumes.erase(a.volume.id);
            then(deadline::missed(e, deadline::kVolumeCopy, self->system()));
          });
}

void send_back(RegistrySelf* self, const std::vector<std::string>& ids, const std::string& host,
               const std::string& sandbox) {
  for (auto& id : ids)
    if (auto a = self->state.volume_actors.find(id); a != self->state.volume_actors.end())
      caf::anon_send(a->second, vol_atom::value, VolumeCommand{vcmd::Leave{host, sandbox}});
}

void discard(RegistrySelf* self, const std::vector<std::string>& ids) {
  std::vector<std::string> unrecorded;
  for (auto& id : ids) {
    if (auto a = self->state.volume_actors.find(id); a != self->state.volume_actors.end())
      caf::anon_send(a->second, vol_atom::value, VolumeCommand{vcmd::Delete{}});  // file too
    else
      unrecorded.push_back(volume_file(self->state.env->volumes_dir(), id).string());
  }
  if (!unrecorded.empty()) caf::anon_send(files(self), volremove_atom::value, unrecorded);
}

caf::result<Answer> route(RegistrySelf* self, const std::string& tenant, const std::string& id,
                          VolumeCommand c) {
  auto a = actor_of(self, tenant, id);
  if (!a) return Answer::fail(volume_not_found(id));
  auto rp = self->make_response_promise();
  self->request(a, deadline::kVolumeCommand.limit, vol_atom::value, std::move(c))
      .then(
          [rp, self](Answer ans) mutable {
            // The cache has what the caller is told before the caller is told it: a read after
            // this answer sees it (the actor's own report follows and repeats it).
            if (ans.ok && !ans.volume.id.empty()) info(self, ans.volume);
            rp.deliver(ans);
          },
          [rp, self, id](const caf::error& e) mutable {
            // Its actor ended (the volume was deleted meanwhile).
            if (e == caf::sec::request_receiver_down)
              return rp.deliver(Answer::fail(volume_not_found(id)));
            rp.deliver(Answer::fail(deadline::missed(e, deadline::kVolumeCommand, self->system())));
          });
  return rp;
}

Answer list(RegistrySelf* self, const ListQuery& q) {
  Answer a;
  for (auto& [id, v] : self->state.volumes) {
    if (v.tenant != q.tenant) continue;
    if (v.status != "available" && !(q.deleted_volumes && v.status == "deleted")) continue;
    bool match = true;
    for (auto& [k, val] : q.metadata) {
      auto m = v.metadata.find(k);
      match &= m != v.metadata.end() && m->second == val;
    }
    if (match) a.volumes.push_back(v);
  }
  return a;
}

void adopt(RegistrySelf* self, VolumeState s) {
  self->state.volumes[s.id] = volume_info_of(s);
  if (s.status != VolumeStatus::available) return;
  auto a = spawn_volume(self, s);
  // An attachment outlives only a sandbox that is still there (running or hibernated).
  for (auto& at : s.attachments) {
    auto i = self->state.infos.find(at.sandbox);
    bool holds = i != self->state.infos.end() && i->second.status != SandboxStatus::stopped &&
                 i->second.status != SandboxStatus::failed &&
                 i->second.status != SandboxStatus::none;
    if (!holds)
      caf::anon_send(a, vol_atom::value, VolumeCommand{vcmd::Detach{at.sandbox, "recovery"}});
  }
}

void info(RegistrySelf* self, VolumeInfo i) {
  if (i.status != "available") self->state.volume_actors.erase(i.id);
  self->state.volumes[i.id] = std::move(i);
}

void attach(RegistrySelf* self, const std::string& tenant, const std::string& sandbox,
            const std::vector<CreateRequest::Volume>& wanted, std::function<void(Attached)> then) {
  if (wanted.size() > vmm::kVolumeSlots)
    return then(Rejection{Code::invalid_argument,
                          "at most " + std::to_string(vmm::kVolumeSlots) + " volumes per sandbox"});
  std::set<std::string> ids, mounts;
  std::vector<SandboxVolume> out;
  std::vector<caf::actor> actors;
  for (auto& w : wanted) {
    if (auto r = check_mount_path(w.mount)) return then(*r);
    if (!ids.insert(w.volume).second)
      return then(Rejection{Code::invalid_argument, "volume " + w.volume + " is listed twice"});
    if (!mounts.insert(w.mount).second)
      return then(Rejection{Code::invalid_argument, "two volumes at " + w.mount});
    for (auto& m : mounts)
      if (m != w.mount && (w.mount.starts_with(m + "/") || m.starts_with(w.mount + "/")))
        return then(
            Rejection{Code::invalid_argument, "mount paths " + m + " and " + w.mount + " nest"});
    auto a = actor_of(self, tenant, w.volume);
    if (!a) return then(volume_not_found(w.volume));
    actors.push_back(a);
    out.push_back({w.volume, w.mount, w.read_only, uint32_t(out.size())});
  }
  if (out.empty()) return then(out);
  // Each read-only attachment's overlay counts against the volume MiB quota while it lasts.
  uint64_t overlay_mib = 0;
  for (auto& v : out)
    if (v.read_only)
      if (auto vi = self->state.volumes.find(v.volume); vi != self->state.volumes.end())
        overlay_mib += vi->second.size_mib;
  if (overlay_mib)
    if (auto r = admit(self, tenant, overlay_mib, 0)) return then(*r);
  struct Collect {
    size_t left;
    std::vector<bool> ok;
    std::optional<Rejection> error;
  };
  auto col = std::make_shared<Collect>(Collect{out.size(), std::vector<bool>(out.size()), {}});
  auto done = [self, sandbox, out, col, then](size_t i, std::optional<Rejection> r) {
    if (r && !col->error) col->error = r;
    if (!r) col->ok[i] = true;
    if (--col->left > 0) return;
    if (!col->error) return then(out);
    // All or none: what did attach is let go.
    std::vector<SandboxVolume> undo;
    for (size_t k = 0; k < out.size(); ++k)
      if (col->ok[k]) undo.push_back(out[k]);
    detach(self, sandbox, undo, "create_failed");
    then(*col->error);
  };
  for (size_t i = 0; i < out.size(); ++i) {
    VolumeAttachment at{sandbox, out[i].mount, out[i].read_only};
    self->request(actors[i], deadline::kVolumeCommand.limit, vol_atom::value,
                  VolumeCommand{vcmd::Attach{at}})
        .then(
            [done, i](Answer a) mutable {
              done(i, a.ok ? std::nullopt : std::optional<Rejection>(a.error));
            },
            [done, i, id = out[i].volume](const caf::error&) mutable {
              done(i, volume_not_found(id));
            });
  }
}

void detach(RegistrySelf* self, const std::string& sandbox,
            const std::vector<SandboxVolume>& volumes, const std::string& reason,
            std::function<void()> then) {
  auto left = std::make_shared<size_t>(1);
  auto one_done = [left, then]() {
    if (--*left == 0 && then) then();
  };
  for (auto& v : volumes) {
    auto a = self->state.volume_actors.find(v.volume);
    if (a == self->state.volume_actors.end()) continue;
    ++*left;
    self->request(a->second, deadline::kVolumeCommand.limit, vol_atom::value,
                  VolumeCommand{vcmd::Detach{sandbox, reason}})
        .then([one_done](Answer) { one_done(); }, [one_done](const caf::error&) { one_done(); });
  }
  one_done();
}

}  // namespace pandastack::actors::registry_volumes
