#include "actors/registry.h"

#include <algorithm>
#include <memory>

#include "actors/deadlines.h"
#include "actors/sandbox_actor.h"
#include "actors/snapshot_uploader.h"
#include "actors/template_actor.h"

namespace pandastack::actors {

namespace {

// Records `info` (get, list and quota tallies read it), or forgets sandbox `id`.
void put_info(RegistrySelf* self, SandboxInfo info) {
  auto& st = self->state;
  st.tenant_ids[info.tenant].insert(info.id);
  st.infos[info.id] = std::move(info);
}
void drop_info(RegistrySelf* self, const std::string& id) {
  auto& st = self->state;
  auto it = st.infos.find(id);
  if (it == st.infos.end()) return;
  if (auto t = st.tenant_ids.find(it->second.tenant); t != st.tenant_ids.end()) {
    t->second.erase(id);
    if (t->second.empty()) st.tenant_ids.erase(t);
  }
  st.infos.erase(it);
}

// Calls `f` with each of the tenant's records (its own only: tallies and lists do not read
// every tenant's).
template <typename F>
void for_tenant(RegistrySelf* self, const std::string& tenant, F&& f) {
  if (auto ids = self->state.tenant_ids.find(tenant); ids != self->state.tenant_ids.end())
    for (auto& id : ids->second) f(self->state.infos.at(id));
}

// The tenant's sandbox that took named snapshot `snapshot` (alive or ended), or null.
const SandboxInfo* snapshot_owner(RegistrySelf* self, const std::string& tenant,
                                  const std::string& snapshot) {
  const SandboxInfo* owner = nullptr;
  for_tenant(self, tenant, [&](const SandboxInfo& i) {
    if (std::find(i.snapshots.begin(), i.snapshots.end(), snapshot) != i.snapshots.end())
      owner = &i;
  });
  return owner;
}

// An ended sandbox whose actor is back (a command must record something, or it came back from
// another host): its recorded state no longer answers for it.
void forget_ended(RegistrySelf* self, const std::string& id) {
  self->state.ended.erase(id);
  self->state.ended_since.erase(id);
}

caf::actor spawn_sandbox(RegistrySelf* self, SandboxState s, std::string adopt_dir = "") {
  auto a = self->spawn(sandbox_actor, self->state.env, caf::actor_cast<caf::actor>(self), s,
                       std::move(adopt_dir));
  self->state.actors[s.id] = a;
  put_info(self, info_of(s));
  return a;
}

// Sandbox `s` ended (its actor retired, or it ended before this process started): its recorded
// state answers for it until it is retired.
void note_ended(RegistrySelf* self, const SandboxState& s) {
  auto& st = self->state;
  int64_t now = now_ms();
  put_info(self, info_of(s));
  st.ended[s.id] = s;
  st.ended_since[s.id] = now;
  st.ended_queue.emplace_back(now, s.id);
}

// Whether an ended sandbox may be forgotten: nothing refers to it any more (its named snapshots,
// a database that still names it, a move to another host it may come back from).
bool retirable(RegistrySelf* self, const SandboxState& s) {
  if (s.live() || !s.snapshots.empty() || !s.moved_to.empty()) return false;
  if (auto db = s.metadata.find(kDatabaseKey); db != s.metadata.end()) {
    auto d = self->state.databases.find(db->second);
    if (d != self->state.databases.end() && d->second.status != DatabaseStatus::deleted)
      return false;
  }
  return true;
}

// Forgets ended sandboxes older than the retention, and the oldest beyond kMaxEndedRecords: the
// registry's memory, its lists and quota tallies, and the next start's recovery stay flat however
// many sandboxes a host has made. Each gets a tombstone (retired_key) so recovery skips it.
void retire_ended(RegistrySelf* self) {
  auto& st = self->state;
  const auto& cfg = st.env->config;
  int64_t cutoff =
      now_ms() - std::chrono::duration_cast<std::chrono::milliseconds>(cfg.ended_retention).count();
  size_t retired = 0;
  while (!st.ended_queue.empty()) {
    auto [at, id] = st.ended_queue.front();
    auto since = st.ended_since.find(id);
    if (since != st.ended_since.end() && since->second == at && at > cutoff &&
        st.ended_since.size() <= RuntimeConfig::kMaxEndedRecords)
      break;
    st.ended_queue.pop_front();
    if (since == st.ended_since.end() || since->second != at) continue;  // stale
    st.ended_since.erase(since);
    auto e = st.ended.find(id);
    if (e == st.ended.end() || !retirable(self, e->second)) continue;  // kept while referred to
    st.ended.erase(e);
    drop_info(self, id);
    if (auto put = st.env->store->put(retired_key(id), "", false); !put)
      spdlog::warn(
          "registry: {} retired, but its tombstone was not written ({}); the next start "
          "recovers it as ended",
          id, put.error().message);
    ++retired;
  }
  if (retired) spdlog::debug("registry: retired {} ended sandboxes", retired);
}

// Spawns a sandbox actor and sends it the Create command for `req`; `then` gets its answer.
template <typename Then>
void start_sandbox(RegistrySelf* self, const CreateRequest& req, const std::string& parent,
                   const std::string& snapshot, Then then, std::string id = "",
                   std::vector<SandboxVolume> volumes = {}) {
  SandboxState s;
  s.id = id.empty() ? new_sandbox_id() : id;
  // A sandbox that moved to another host and comes back goes on with its stream.
  if (auto back = self->state.ended.find(s.id);
      back != self->state.ended.end() && !back->second.moved_to.empty()) {
    s = back->second;
    forget_ended(self, s.id);
  }
  cmd::Create c;
  c.tenant = req.tenant;
  c.template_name = req.template_name;
  c.ttl_seconds = req.ttl_seconds;
  c.metadata = req.metadata;
  c.persistent = req.persistent;
  c.auto_wake = req.auto_wake;
  c.idle_timeout_seconds = req.idle_timeout_seconds;
  c.on_timeout = req.on_timeout;
  c.timeout_disk_only = req.timeout_disk_only;
  c.parent = parent;
  c.from_snapshot = snapshot;
  auto shape = self->state.env->template_shape(req.template_name);
  c.vcpus = shape.vcpus;
  c.memory_mib = shape.memory_mib;
  c.network = req.network.value_or(false);
  if (c.network) c.egress = req.egress.value_or(Egress{});
  c.volumes = std::move(volumes);
  // Decided before anything is spawned: a refused create costs no actor and no thread.
  auto d = decide(s, Command{c}, now_ms(), self->state.env->config.limits);
  if (auto* r = std::get_if<Rejection>(&d)) return then(Answer::fail(*r));
  auto a = spawn_sandbox(self, s);
  self->request(a, deadline::kSandboxCommand.limit, cmd_atom::value, Command{c})
      .then([then](Answer ans) mutable { then(std::move(ans)); },
            [then, self](const caf::error& e) mutable {
              then(Answer::fail(deadline::missed(e, deadline::kSandboxCommand, self->system())));
            });
}

// Creates a sandbox for `req` (its volumes attached first); `then` gets the answer. `inherited`:
// volumes made for it from a snapshot (registry_volumes::inherit), deleted if it does not start.
// `given_id`: its id ("" for a new one; a migrated sandbox keeps its own).
void create_then(RegistrySelf* self, CreateRequest req, std::string parent, std::string snapshot,
                 std::function<void(Answer)> then, std::vector<std::string> inherited = {},
                 std::string given_id = "") {
  if (req.volumes.empty()) return start_sandbox(self, req, parent, snapshot, then, given_id);
  // Its volumes are attached (recorded in theirs streams) first: the sandbox's id is named in
  // the attachments, and a create that fails lets them go again.
  std::string id = given_id.empty() ? new_sandbox_id() : given_id;
  registry_volumes::attach(
      self, req.tenant, id, req.volumes,
      [self, then, req, parent, snapshot, id, inherited](registry_volumes::Attached r) mutable {
        if (auto* no = std::get_if<Rejection>(&r)) {
          registry_volumes::discard(self, inherited);  // after the undo of attach (in order)
          return then(Answer::fail(*no));
        }
        auto vols = std::get<std::vector<SandboxVolume>>(r);
        start_sandbox(
            self, req, parent, snapshot,
            [self, then, id, vols, inherited](Answer ans) mutable {
              if (!ans.ok)
                registry_volumes::detach(self, id, vols, "create_failed", [self, inherited] {
                  registry_volumes::discard(self, inherited);
                });
              then(ans);
            },
            id, vols);
      });
}

// Creates a sandbox from snapshot `snapshot` (a named one, or a fork's) taken of sandbox
// `source`: with volumes inherited from it (copies of the snapshot's).
// `take_copies`: the last one made from it (registry_volumes::inherit).
void create_from(RegistrySelf* self, CreateRequest req, std::string parent, std::string snapshot,
                 const std::vector<SandboxVolume>& source, const std::string& origin,
                 bool take_copies, std::function<void(Answer)> then) {
  if (source.empty()) return create_then(self, req, parent, snapshot, then);
  registry_volumes::inherit(
      self, req.tenant, source, self->state.env->snapshot_dir(snapshot).string(), origin,
      take_copies,
      [self, req, parent, snapshot, source, then](registry_volumes::Inherited r) mutable {
        if (auto* no = std::get_if<Rejection>(&r)) return then(Answer::fail(*no));
        req.volumes = std::get<std::vector<CreateRequest::Volume>>(r);
        std::vector<std::string> inherited;
        for (auto& v : req.volumes)
          if (std::none_of(source.begin(), source.end(),
                           [&](auto& s) { return s.volume == v.volume; }))
            inherited.push_back(v.volume);
        create_then(self, req, parent, snapshot, then, inherited);
      });
}

caf::result<Answer> create_in(RegistrySelf* self, CreateRequest req, std::string parent,
                              std::string snapshot, const std::vector<SandboxVolume>& source = {}) {
  auto rp = self->make_response_promise();
  create_from(self, req, parent, snapshot, source, "snapshot:" + snapshot, false,
              [rp](Answer ans) mutable { rp.deliver(ans); });
  return rp;
}

// Undoes sandboxes that must not be: children of a fork that did not happen (one of them
// failed, or the parent ended meanwhile; exploratory test 3 #6), a database's sandbox that no
// database names (after a restart). Each is killed, then its read-write volumes (made for it)
// are detached and deleted, files too (a volume attached elsewhere meanwhile refuses that).
void unfork(RegistrySelf* self, const std::vector<std::string>& kids) {
  for (auto& kid : kids) {
    auto i = self->state.infos.find(kid);
    if (i == self->state.infos.end()) continue;
    std::vector<SandboxVolume> own;
    for (auto& v : i->second.volumes)
      if (!v.read_only) own.push_back(v);
    auto undo_volumes = [self, kid, own] {
      if (own.empty()) return;
      registry_volumes::detach(self, kid, own, "sandbox_undone", [self, own] {
        std::vector<std::string> ids;
        for (auto& v : own) ids.push_back(v.volume);
        registry_volumes::discard(self, ids);
      });
    };
    auto a = self->state.actors.find(kid);
    if (a == self->state.actors.end()) {  // ended already: its volumes only
      undo_volumes();
      continue;
    }
    self->request(a->second, deadline::kSandboxCommand.limit, cmd_atom::value, Command{cmd::Kill{}})
        .then([undo_volumes](Answer) { undo_volumes(); },
              [undo_volumes](const caf::error&) { undo_volumes(); });
  }
}

// Creates one sandbox per id of `ids` ("" = a new id) with `make(index, id, then)`; all or nothing:
// when one fails, the others that started are undone (unfork).
template <typename Make>
caf::result<Answer> create_all(RegistrySelf* self, std::vector<std::string> ids, Make make) {
  auto rp = self->make_response_promise();
  struct Collect {
    std::vector<SandboxInfo> infos;
    std::optional<Rejection> error;
    size_t left;
  };
  auto col = std::make_shared<Collect>(Collect{{}, std::nullopt, ids.size()});
  for (uint32_t i = 0; i < ids.size(); ++i)
    make(i, ids[i], [self, rp, col](Answer ans) mutable {
      if (ans.ok)
        col->infos.push_back(ans.info);
      else
        col->error = ans.error;
      if (--col->left > 0) return;
      if (col->error) {
        std::vector<std::string> kids;
        for (auto& kid : col->infos) kids.push_back(kid.id);
        unfork(self, kids);
        return rp.deliver(Answer::fail(*col->error));
      }
      Answer a;
      a.infos = col->infos;
      rp.deliver(a);
    });
  return rp;
}

caf::actor template_of(RegistrySelf* self, const std::string& name) {
  auto& t = self->state.templates[name];
  if (!t) t = self->spawn<caf::detached + caf::linked>(template_actor, self->state.env, name);
  return t;
}

// A create of a template baked with a data volume (Env::template_data_volume): the template is
// baked (once) first, then the sandbox gets a copy of its baked volume at slot 0 (already mounted
// in the guest it restores), its own volumes after it.
caf::result<Answer> create_with_data_volume(RegistrySelf* self, CreateRequest req,
                                            const Env::DataVolume& dv) {
  if (req.volumes.size() + 1 > vmm::kVolumeSlots)
    return Answer::fail({Code::invalid_argument,
                         "template " + req.template_name + " has a data volume: at most " +
                             std::to_string(vmm::kVolumeSlots - 1) + " volumes of your own"});
  auto rp = self->make_response_promise();
  self->request(template_of(self, req.template_name), deadline::kBake.limit, bake_atom::value)
      .then(
          [self, rp, req, dv](Answer baked) mutable {
            if (!baked.ok) return rp.deliver(baked);
            std::vector<SandboxVolume> source{{"", dv.mount, false, 0}};
            registry_volumes::inherit(
                self, req.tenant, source, baked.text, "template:" + req.template_name, false,
                [self, rp, req](registry_volumes::Inherited r) mutable {
                  if (auto* no = std::get_if<Rejection>(&r)) return rp.deliver(Answer::fail(*no));
                  auto data = std::get<std::vector<CreateRequest::Volume>>(r);
                  std::vector<std::string> inherited;
                  for (auto& v : data) inherited.push_back(v.volume);
                  data.insert(data.end(), req.volumes.begin(), req.volumes.end());
                  req.volumes = data;
                  create_then(
                      self, req, "", "", [rp](Answer a) mutable { rp.deliver(a); }, inherited);
                });
          },
          [self, rp](const caf::error& e) mutable {
            rp.deliver(Answer::fail(deadline::missed(e, deadline::kBake, self->system())));
          });
  return rp;
}

void ended_to(RegistrySelf* self, const std::string& tenant, const std::string& id,
              const Command& c, caf::response_promise rp);

bool is_live(SandboxStatus s) {
  return s != SandboxStatus::none && s != SandboxStatus::stopped && s != SandboxStatus::failed &&
         s != SandboxStatus::hibernated;
}

// The tenant's use of its quotas, from the records of its sandboxes.
QuotaUse use_of(RegistrySelf* self, const std::string& tenant) {
  QuotaUse u;
  for_tenant(self, tenant,
             [&](const SandboxInfo& i) { count_use(i, self->state.env->config.memory_mib, u); });
  std::lock_guard l(self->state.env->quotas_mu);
  u.execs = self->state.env->execs_running[tenant];
  return u;
}

// Refused (quota_exceeded, host_full) before anything starts, or admitted.
std::optional<Rejection> admit(RegistrySelf* self, const std::string& tenant, const QuotaAsk& ask) {
  // Most commands ask for nothing (an exec on a running sandbox): no tally of the tenant's records.
  if (ask.sandboxes == 0 && ask.memory_mib == 0 && ask.snapshots == 0 && ask.snapshot_mib == 0 &&
      ask.hibernated == 0 && ask.hibernated_mib == 0 && ask.ports == 0)
    return std::nullopt;
  auto* env = self->state.env;
  if (auto r = check_quotas(env->quotas_of(tenant), use_of(self, tenant), ask)) return r;
  if (uint64_t ram = ask.memory_mib + ask.snapshot_mib) return env->host_admits(ram);
  return std::nullopt;
}

// What `n` new sandboxes of `memory_mib` each (their template's shape) take of their tenant's
// quotas (persistent ones may hibernate).
QuotaAsk creates_ask(uint64_t memory_mib, bool persistent, uint32_t n) {
  QuotaAsk ask;
  ask.sandboxes = n;
  ask.memory_mib = memory_mib * n;
  if (persistent) {
    ask.hibernated = n;
    ask.hibernated_mib = ask.memory_mib;
  }
  return ask;
}

// What a command asks of its tenant's quotas, for the sandbox `i` (its memory: its record's, or
// `default_mem`).
QuotaAsk ask_of(const Command& c, const SandboxInfo& i, uint64_t default_mem) {
  uint64_t mem = i.memory_mib != 0 ? i.memory_mib : default_mem;
  QuotaAsk a;
  if (auto* f = std::get_if<cmd::Fork>(&c)) {
    a.sandboxes = f->count;
    a.memory_mib = mem * f->count;
    if (i.persistent) {
      a.hibernated = f->count;
      a.hibernated_mib = mem * f->count;
    }
  } else if (std::holds_alternative<cmd::Snapshot>(c)) {
    a.snapshots = 1;
    a.snapshot_mib = mem;
  } else if (std::holds_alternative<cmd::Wake>(c) && i.status == SandboxStatus::hibernated) {
    a.sandboxes = 1;
    a.memory_mib = mem;
  } else if (std::holds_alternative<cmd::Hibernate>(c) && !i.persistent && is_live(i.status)) {
    a.hibernated = 1;
    a.hibernated_mib = mem;
  } else if (auto* p = std::get_if<cmd::ExposePort>(&c); p && !i.ports.count(p->port)) {
    a.ports = 1;
  }
  return a;
}

// Sends `msg` to `to` and answers the current request with its answer. A sandbox actor that
// retired meanwhile (it ended) is answered for from its recorded state (`c`, when given).
caf::result<Answer> forward(RegistrySelf* self, caf::actor to, caf::message msg,
                            std::optional<std::pair<std::string, std::string>> who = std::nullopt,
                            std::optional<Command> c = std::nullopt) {
  auto rp = self->make_response_promise();
  self->request(to, deadline::kSandboxCommand.limit, std::move(msg))
      .then(
          [rp, self](Answer ans) mutable {
            // A sandbox that ended (a kill) lets its volumes go before its caller hears of it:
            // the next create can attach them at once.
            auto st = ans.info.status;
            if (ans.ok && !ans.info.volumes.empty() &&
                (st == SandboxStatus::stopped || st == SandboxStatus::failed)) {
              auto id = ans.info.id;
              auto vols = ans.info.volumes;
              return registry_volumes::detach(self, id, vols, "sandbox_ended",
                                              [rp, ans]() mutable { rp.deliver(ans); });
            }
            rp.deliver(ans);
          },
          [rp, self, who, c](const caf::error& e) mutable {
            if (who && c && e == caf::sec::request_receiver_down)
              return ended_to(self, who->first, who->second, *c, rp);
            rp.deliver(
                Answer::fail(deadline::missed(e, deadline::kSandboxCommand, self->system())));
          });
  return rp;
}

// A command for a sandbox that has no actor (it ended before this host process started): the
// same answer its actor would give, decided on its recorded state: a kill changes nothing (200),
// the rest say why not (sandbox_stopped, sandbox_failed). Commands that would record something
// (deleting one of its snapshots) get its actor back.
void ended_to(RegistrySelf* self, const std::string& tenant, const std::string& id,
              const Command& c, caf::response_promise rp) {
  auto& st = self->state;
  auto it = st.infos.find(id);
  if (it == st.infos.end() || it->second.tenant != tenant)
    return void(rp.deliver(Answer::fail(not_found(id))));
  SandboxState s;
  if (auto e = st.ended.find(id); e != st.ended.end()) {
    s = e->second;
  } else {
    s.id = id;
    s.tenant = tenant;
    s.status = it->second.status;
    s.failure_reason = it->second.failure_reason;
  }
  auto d = decide(s, c, now_ms(), st.env->config.limits);
  if (auto* r = std::get_if<Rejection>(&d)) return void(rp.deliver(Answer::fail(*r)));
  if (std::get<std::vector<Event>>(d).empty()) {
    Answer a;
    a.info = it->second;
    return void(rp.deliver(a));
  }
  if (!st.ended.count(id)) return void(rp.deliver(Answer::fail(not_running(s, "change it"))));
  auto actor = spawn_sandbox(self, s);
  forget_ended(self, id);
  self->request(actor, deadline::kSandboxCommand.limit, cmd_atom::value, c)
      .then([rp](Answer ans) mutable { rp.deliver(ans); },
            [rp, self](const caf::error& e) mutable {
              rp.deliver(
                  Answer::fail(deadline::missed(e, deadline::kSandboxCommand, self->system())));
            });
}

caf::result<Answer> ended(RegistrySelf* self, const std::string& tenant, const std::string& id,
                          const Command& c) {
  auto rp = self->make_response_promise();
  ended_to(self, tenant, id, c, rp);
  return rp;
}

}  // namespace

caf::actor actor_to_record(RegistrySelf* self, const std::string& id) {
  if (auto a = self->state.actors.find(id); a != self->state.actors.end()) return a->second;
  auto e = self->state.ended.find(id);
  if (e == self->state.ended.end()) return caf::actor();
  auto actor = spawn_sandbox(self, e->second);
  forget_ended(self, id);
  return actor;
}

caf::behavior registry_actor(RegistrySelf* self, Env* env) {
  self->state.env = env;
  log_exceptions(self, "registry");
  // When the registry ends (shutdown), every sandbox actor ends with it, and with each its VM
  // worker.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    for (auto& [id, a] : self->state.actors)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& [name, t] : self->state.templates)
      caf::anon_send_exit(t, caf::exit_reason::user_shutdown);
    for (auto& [id, v] : self->state.volume_actors)
      caf::anon_send_exit(v, caf::exit_reason::user_shutdown);
    self->quit(msg.reason);
  });
  self->delayed_send(self, env->config.reaper_interval, tick_atom::value);
  auto find = [self](const std::string& tenant, const std::string& id) -> caf::actor {
    auto it = self->state.infos.find(id);
    if (it == self->state.infos.end() || it->second.tenant != tenant) return caf::actor();
    auto a = self->state.actors.find(id);
    return a == self->state.actors.end() ? caf::actor() : a->second;
  };
  return caf::message_handler{
      [=](create_atom, CreateRequest req) -> caf::result<Answer> {
        std::string snapshot;
        std::vector<SandboxVolume> source;  // the snapshot's sandbox's volumes
        if (!req.from_snapshot.empty()) {
          // Only a snapshot taken from one of this tenant's sandboxes.
          auto* taken_from = snapshot_owner(self, req.tenant, req.from_snapshot);
          if (!taken_from)
            return Answer::fail({Code::snapshot_not_found, "no snapshot " + req.from_snapshot});
          req.template_name = taken_from->template_name;  // the snapshot's VM shape and image
          source = taken_from->volumes;
          if (!source.empty() && !req.volumes.empty())
            return Answer::fail(
                {Code::invalid_argument,
                 "snapshot " + req.from_snapshot +
                     " has volumes: a sandbox made from it gets copies of them, and no others"});
          snapshot = req.from_snapshot;
        }
        // Its guest is its template's shape (the snapshot's): a create may not ask for more.
        auto shape = self->state.env->template_shape(req.template_name);
        if (auto no = Env::shape_admits(shape, req.memory_mib, req.vcpus, req.template_name))
          return Answer::fail(*no);
        if (auto refused =
                admit(self, req.tenant, creates_ask(shape.memory_mib, req.persistent, 1)))
          return Answer::fail(*refused);
        if (snapshot.empty())
          if (auto dv = self->state.env->template_data_volume(req.template_name))
            return create_with_data_volume(self, req, *dv);
        return create_in(self, req, "", snapshot, source);
      },
      [=](fork_atom, ForkRequest fr) -> caf::result<Answer> {
        const auto& parent_info = self->state.infos[fr.parent];
        CreateRequest req;
        req.tenant = fr.tenant;
        req.template_name = fr.template_name;
        req.metadata = parent_info.metadata;
        req.persistent = parent_info.persistent;
        // Its timeouts too: a child lives by the parent's rules (a fresh TTL of the same length).
        req.ttl_seconds = parent_info.ttl_seconds;
        req.auto_wake = parent_info.auto_wake;
        req.idle_timeout_seconds = parent_info.idle_timeout_seconds;
        req.on_timeout = parent_info.on_timeout;
        req.timeout_disk_only = parent_info.timeout_disk_only;
        req.network = parent_info.network;  // children get networks of their own, same policy
        req.egress = parent_info.egress;
        auto volumes = parent_info.volumes;
        return create_all(
            self, std::vector<std::string>(fr.count),
            [self, req, fr, volumes](uint32_t i, std::string, std::function<void(Answer)> then) {
              // Each child gets copies of the parent's read-write volumes as new
              // volumes of its own (the snapshot's copies), and shares its read-only
              // ones. The last child's copies are the fork snapshot's own (dropped
              // after the fork): taken, not copied (the file worker does the copies
              // in the order asked).
              create_from(self, req, fr.parent, fr.snapshot_id, volumes, "fork:" + fr.parent,
                          i + 1 == fr.count, then);
            });
      },
      [=](unfork_atom, std::vector<std::string> kids) { unfork(self, kids); },
      [=](import_atom, ImportRequest ir) -> caf::result<Answer> {
        for (auto& id : ir.ids) {
          if (id.empty()) continue;
          auto back = self->state.ended.find(id);
          bool returning = back != self->state.ended.end() && !back->second.moved_to.empty();
          if (self->state.actors.count(id) || (self->state.infos.count(id) && !returning))
            return Answer::fail({Code::conflict, "sandbox " + id + " exists on this host already"});
        }
        if (auto refused =
                admit(self, ir.create.tenant,
                      creates_ask(env->template_shape(ir.create.template_name).memory_mib,
                                  ir.create.persistent, uint32_t(ir.ids.size()))))
          return Answer::fail(*refused);
        if (!ir.arrivals.empty())
          // A migration with volumes: they are recorded here first (as they were on the host
          // they left), then attached to it in the slots its guest has them in.
          return create_all(
              self, ir.ids, [self, ir](uint32_t, std::string id, std::function<void(Answer)> then) {
                registry_volumes::arrive(
                    self, ir.create.tenant, ir.arrivals, ir.received, ir.from_host,
                    [self, ir, id, then](registry_volumes::Inherited r) mutable {
                      if (auto* no = std::get_if<Rejection>(&r)) return then(Answer::fail(*no));
                      auto req = ir.create;
                      req.volumes = std::get<std::vector<CreateRequest::Volume>>(r);
                      std::vector<std::string> vols;
                      for (auto& v : req.volumes) vols.push_back(v.volume);
                      create_then(
                          self, req, ir.parent, ir.snapshot_id,
                          [self, then, vols, id, from = ir.from_host](Answer ans) mutable {
                            if (!ans.ok) registry_volumes::send_back(self, vols, from, id);
                            then(ans);
                          },
                          {}, id);
                    });
              });
        if (!ir.fork_volumes.empty())
          // A fork's children: copies of the parent's read-write volumes (the snapshot's), the
          // last child taking the snapshot's own.
          return create_all(
              self, ir.ids, [self, ir](uint32_t i, std::string, std::function<void(Answer)> then) {
                create_from(self, ir.create, ir.parent, ir.snapshot_id, ir.fork_volumes,
                            "fork:" + ir.parent, i + 1 == ir.ids.size(), then);
              });
        return create_all(self, ir.ids,
                          [self, ir](uint32_t, std::string id, std::function<void(Answer)> then) {
                            start_sandbox(self, ir.create, ir.parent, ir.snapshot_id, then, id);
                          });
      },
      // Sandbox `id` whoever owns it: for callers that checked access another way (a preview
      // URL's token names the sandbox, not its tenant). The answer says whose it is.
      [=](get_atom, std::string id) -> Answer {
        auto it = self->state.infos.find(id);
        if (it == self->state.infos.end()) return Answer::fail(not_found(id));
        Answer a;
        a.info = it->second;
        return a;
      },
      [=](get_atom, std::string tenant, std::string id) -> Answer {
        auto it = self->state.infos.find(id);
        if (it == self->state.infos.end() || it->second.tenant != tenant)
          return Answer::fail(not_found(id));
        Answer a;
        a.info = it->second;
        return a;
      },
      [=](list_atom, ListQuery q) -> Answer {
        Answer a;
        auto one = [&](const SandboxInfo& i) {
          if (i.status == SandboxStatus::none) return;
          if (!i.moved_to.empty()) return;  // another host runs it now
          if (q.status && i.status != *q.status) return;
          for (auto& [k, v] : q.metadata) {
            auto m = i.metadata.find(k);
            if (m == i.metadata.end() || m->second != v) return;
          }
          a.infos.push_back(i);
        };
        if (q.tenant == "*") {
          for (auto& [id, i] : self->state.infos) one(i);
        } else {
          for_tenant(self, q.tenant, one);
        }
        return a;
      },
      [=](route_atom, std::string tenant, std::string id, Command c) -> caf::result<Answer> {
        auto a = find(tenant, id);
        if (!a) return ended(self, tenant, id, c);
        auto& info = self->state.infos[id];
        auto ask = ask_of(c, info, self->state.env->config.memory_mib);
        if (auto refused = admit(self, tenant, ask)) return Answer::fail(*refused);
        if (auto* f = std::get_if<cmd::Fork>(&c)) {
          // Each child gets a copy of every read-write volume: asked before anything is copied
          // (and again, in order with other creates, when the copies are recorded).
          uint64_t mib = 0;
          uint32_t n = 0;
          for (auto& v : info.volumes)
            if (!v.read_only) {
              ++n;
              if (auto vi = self->state.volumes.find(v.volume); vi != self->state.volumes.end())
                mib += vi->second.size_mib;
            }
          if (n > 0)
            if (auto refused = registry_volumes::admit(self, tenant, mib * f->count, n * f->count))
              return Answer::fail(*refused);
        }
        return forward(self, a, caf::make_message(cmd_atom::value, c), std::make_pair(tenant, id),
                       c);
      },
      [=](exec_atom, std::string tenant, std::string id,
          std::string command) -> caf::result<Answer> {
        Command as = cmd::Exec{"x", command};
        auto a = find(tenant, id);
        if (!a) return ended(self, tenant, id, as);
        // A command that wakes its sandbox (auto_wake) asks what a wake asks.
        auto woken = ask_of(cmd::Wake{}, self->state.infos[id], self->state.env->config.memory_mib);
        if (auto refused = admit(self, tenant, woken)) return Answer::fail(*refused);
        return forward(self, a, caf::make_message(exec_atom::value, std::move(command)),
                       std::make_pair(tenant, id), as);
      },
      [=](lease_atom, std::string tenant, std::string id) -> caf::result<Answer> {
        Command as = cmd::Exec{"x", "use it"};
        auto a = find(tenant, id);
        if (!a) return ended(self, tenant, id, as);
        auto woken = ask_of(cmd::Wake{}, self->state.infos[id], self->state.env->config.memory_mib);
        if (auto refused = admit(self, tenant, woken)) return Answer::fail(*refused);
        return forward(self, a, caf::make_message(lease_atom::value), std::make_pair(tenant, id),
                       as);
      },
      // A sandbox actor retired (its sandbox ended): its state answers for it from now on.
      [=](ended_atom, SandboxState s) {
        self->state.actors.erase(s.id);
        note_ended(self, s);
      },
      [=](template_atom, std::string name) -> caf::actor { return template_of(self, name); },
      [=](info_atom, SandboxInfo info) { put_info(self, std::move(info)); },
      // A sandbox's VM is gone: its volumes are free (not before: it may still write them).
      [=](released_atom, SandboxInfo info) {
        registry_volumes::detach(self, info.id, info.volumes, "sandbox_ended");
      },
      [=](voladmit_atom, std::string tenant, uint64_t size_mib, uint32_t volumes) -> Answer {
        if (auto r = registry_volumes::admit(self, tenant, size_mib, volumes))
          return Answer::fail(*r);
        return Answer{};
      },
      [=](volcreate_atom, std::string id, VolumeRequest req) -> caf::result<Answer> {
        return registry_volumes::create(self, std::move(id), std::move(req));
      },
      [=](volroute_atom, std::string tenant, std::string id,
          VolumeCommand c) -> caf::result<Answer> {
        return registry_volumes::route(self, tenant, id, std::move(c));
      },
      [=](vollist_atom, ListQuery q) { return registry_volumes::list(self, q); },
      [=](voladopt_atom, VolumeState s) { registry_volumes::adopt(self, std::move(s)); },
      [=](dbroute_atom, std::string tenant, std::string id,
          DatabaseCommand c) -> caf::result<Answer> {
        return registry_databases::command(self, tenant, id, std::move(c));
      },
      [=](dblist_atom, std::string tenant, bool deleted_too) {
        return registry_databases::list(self, tenant, deleted_too);
      },
      [=](dbadopt_atom, DatabaseState s) { registry_databases::adopt(self, s); },
      [=](dbinfo_atom, DatabaseState s) { registry_databases::info(self, s); },
      [=](volinfo_atom, VolumeInfo i) { registry_volumes::info(self, std::move(i)); },
      // A recovered sandbox; `adopt_dir`: the run folder of its VM, still running, to adopt.
      [=](adopt_atom, SandboxState s, std::string adopt_dir) {
        registry_snapshots::persist_missing(self, s);
        if (s.live()) {
          spawn_sandbox(self, s, adopt_dir);
        } else {
          note_ended(self, s);  // answers for it (and its named snapshots)
        }
      },
      [=](delsnap_atom, std::string tenant, std::string snapshot) -> caf::result<Answer> {
        // The tenant's sandbox that took it (alive or ended).
        auto* taken_by = snapshot_owner(self, tenant, snapshot);
        if (!taken_by) return Answer::fail({Code::snapshot_not_found, "no snapshot " + snapshot});
        auto actor = actor_to_record(self, taken_by->id);
        if (!actor) return Answer::fail({Code::snapshot_not_found, "no snapshot " + snapshot});
        return forward(self, actor,
                       caf::make_message(cmd_atom::value, Command{cmd::DeleteSnapshot{snapshot}}));
      },
      [=](tick_atom) {
        int64_t now = now_ms();
        for (auto& [id, i] : self->state.infos) {
          if (i.status != SandboxStatus::running) continue;
          bool expired = i.expires_at_ms <= now;
          if (!expired && i.idle_timeout_seconds == 0) continue;
          auto a = self->state.actors.find(id);
          if (a == self->state.actors.end()) continue;
          if (expired)
            caf::anon_send(a->second, cmd_atom::value, Command{cmd::Reap{}});
          else
            caf::anon_send(a->second, tick_atom::value);  // it knows whether it is idle
        }
        retire_ended(self);
        self->delayed_send(self, self->state.env->config.reaper_interval, tick_atom::value);
      },
      [=](shutdown_atom) -> caf::result<Answer> {
        registry_databases::shutdown(self);
        auto rp = self->make_response_promise();
        auto left = std::make_shared<size_t>(0);
        for (auto& [id, i] : self->state.infos) {
          bool live = i.status != SandboxStatus::none && i.status != SandboxStatus::stopped &&
                      i.status != SandboxStatus::failed && i.status != SandboxStatus::hibernated;
          if (live) ++*left;
        }
        if (*left == 0) {
          rp.deliver(Answer{});
          return rp;
        }
        for (auto& [id, i] : self->state.infos) {
          bool live = i.status != SandboxStatus::none && i.status != SandboxStatus::stopped &&
                      i.status != SandboxStatus::failed && i.status != SandboxStatus::hibernated;
          if (!live) continue;
          Command c = i.persistent ? Command{cmd::Hibernate{}} : Command{cmd::Kill{}};
          self->request(self->state.actors[id], std::chrono::seconds(120), cmd_atom::value, c)
              .then(
                  [rp, left](Answer) mutable {
                    if (--*left == 0) rp.deliver(Answer{});
                  },
                  [rp, left](const caf::error&) mutable {
                    if (--*left == 0) rp.deliver(Answer{});
                  });
        }
        return rp;
      },
  }
      .or_else(registry_snapshots::handlers(self));  // (persist, upload: registry_snapshots.cc)
}

}  // namespace pandastack::actors
