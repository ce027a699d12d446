#include <memory>
#include <set>

#include "actors/registry.h"
#include "actors/volume_actor.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors::registry_volumes {

namespace {

Rejection volume_not_found(const std::string& id) {
  return {"volume_not_found", "no volume " + id};
}

caf::actor actor_of(RegistrySelf* self, const std::string& tenant, const std::string& id) {
  auto i = self->state.volumes.find(id);
  if (i == self->state.volumes.end() || i->second.tenant != tenant) return caf::actor();
  auto a = self->state.volume_actors.find(id);
  return a == self->state.volume_actors.end() ? caf::actor() : a->second;
}

caf::actor spawn_volume(RegistrySelf* self, VolumeState s) {
  auto a = self->spawn(volume_actor, self->state.env, caf::actor_cast<caf::actor>(self), s);
  self->state.volume_actors[s.id] = a;
  return a;
}

}  // namespace

std::optional<Rejection> admit(RegistrySelf* self, const std::string& tenant, uint64_t size_mib,
                               uint32_t volumes) {
  QuotaUse use;
  for (auto& [id, v] : self->state.volumes)
    if (v.tenant == tenant && v.status != "deleted") {
      ++use.volumes;
      use.volume_mib += v.size_mib;
    }
  QuotaAsk ask;
  ask.volumes = volumes;
  ask.volume_mib = size_mib;
  return check_quotas(self->state.env->quotas_of(tenant), use, ask);
}

caf::result<Answer> create(RegistrySelf* self, std::string id, VolumeRequest req) {
  // Checked again here, in order with other creates (the facade's check came before the file).
  if (auto r = admit(self, req.tenant, req.size_mib)) return Answer::fail(*r);
  VolumeState s;
  s.id = id;
  auto a = spawn_volume(self, s);
  VolumeInfo pending;
  pending.id = id;
  pending.tenant = req.tenant;
  pending.status = "creating";
  pending.size_mib = req.size_mib;
  self->state.volumes[id] = pending;  // counted against the quota from now on
  auto rp = self->make_response_promise();
  self->request(a, caf::infinite, vol_atom::value,
                VolumeCommand{vcmd::Create{req.tenant, req.name, req.size_mib, req.metadata}})
      .then(
          [self, rp, id](Answer ans) mutable {
            if (!ans.ok) {
              self->state.volumes.erase(id);
              self->state.volume_actors.erase(id);
            } else {
              self->state.volumes[id] = ans.volume;
            }
            rp.deliver(ans);
          },
          [self, rp, id](const caf::error& e) mutable {
            self->state.volumes.erase(id);
            self->state.volume_actors.erase(id);
            rp.deliver(Answer::fail({"internal", self->system().render(e)}));
          });
  return rp;
}

caf::result<Answer> route(RegistrySelf* self, const std::string& tenant, const std::string& id,
                          VolumeCommand c) {
  auto a = actor_of(self, tenant, id);
  if (!a) return Answer::fail(volume_not_found(id));
  auto rp = self->make_response_promise();
  self->request(a, caf::infinite, vol_atom::value, std::move(c))
      .then([rp](Answer ans) mutable { rp.deliver(ans); },
            [rp, self, id](const caf::error& e) mutable {
              // Its actor ended (the volume was deleted meanwhile).
              if (e == caf::sec::request_receiver_down)
                return rp.deliver(Answer::fail(volume_not_found(id)));
              rp.deliver(Answer::fail({"internal", self->system().render(e)}));
            });
  return rp;
}

Answer list(RegistrySelf* self, const std::string& tenant,
            const std::map<std::string, std::string>& metadata) {
  Answer a;
  for (auto& [id, v] : self->state.volumes) {
    if (v.tenant != tenant || v.status != "available") continue;
    bool match = true;
    for (auto& [k, val] : metadata) {
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
    bool holds = i != self->state.infos.end() && i->second.status != Status::stopped &&
                 i->second.status != Status::failed && i->second.status != Status::none;
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
    return then(Rejection{"invalid_argument",
                          "at most " + std::to_string(vmm::kVolumeSlots) + " volumes per sandbox"});
  std::set<std::string> ids, mounts;
  std::vector<SandboxVolume> out;
  std::vector<caf::actor> actors;
  for (auto& w : wanted) {
    if (auto r = check_mount_path(w.mount)) return then(*r);
    if (!ids.insert(w.volume).second)
      return then(Rejection{"invalid_argument", "volume " + w.volume + " is listed twice"});
    if (!mounts.insert(w.mount).second)
      return then(Rejection{"invalid_argument", "two volumes at " + w.mount});
    for (auto& m : mounts)
      if (m != w.mount && (w.mount.starts_with(m + "/") || m.starts_with(w.mount + "/")))
        return then(
            Rejection{"invalid_argument", "mount paths " + m + " and " + w.mount + " nest"});
    auto a = actor_of(self, tenant, w.volume);
    if (!a) return then(volume_not_found(w.volume));
    actors.push_back(a);
    out.push_back({w.volume, w.mount, w.read_only, uint32_t(out.size())});
  }
  if (out.empty()) return then(out);
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
    self->request(actors[i], caf::infinite, vol_atom::value, VolumeCommand{vcmd::Attach{at}})
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
    self->request(a->second, caf::infinite, vol_atom::value,
                  VolumeCommand{vcmd::Detach{sandbox, reason}})
        .then([one_done](Answer) { one_done(); }, [one_done](const caf::error&) { one_done(); });
  }
  one_done();
}

}  // namespace pandastack::actors::registry_volumes
