#include "actors/sandbox_actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <shared_mutex>

#include "actors/deadlines.h"
#include "actors/event_codec.h"
#include "actors/secrets.h"
#include "actors/snapshot_uploader.h"
#include "actors/vm_worker.h"
#include "vmm-driver/qcow2.h"
#include "vmm-driver/usage.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

void pump(SandboxSelf* self);

// True when the sandbox has an idle timeout and nothing used it for that long: no command in
// flight, no agent call (files, processes, streams) in flight or within the timeout.
bool idle_due(const SandboxActorState& st, int64_t now) {
  if (st.s.status != SandboxStatus::running || st.s.idle_timeout_seconds == 0) return false;
  if (!st.s.running_execs.empty() || st.handle->calls_in_flight.load() > 0) return false;
  int64_t last = std::max(st.last_active_ms, st.handle->last_call_ms.load());
  return now - last >= int64_t(st.s.idle_timeout_seconds) * 1000;
}

// A sandbox that ended (stopped, failed) with nothing left to do gives its threads back: the
// registry keeps its state (and answers for it), its VM worker ends after what it was asked
// (destroying the VM first), and so does this actor. Nothing of it stays running but its record.
void maybe_retire(SandboxSelf* self) {
  auto& st = self->state;
  if (st.retired || st.s.status == SandboxStatus::none || st.s.live() || st.persisting ||
      !st.queue.empty() || st.adopting || st.fork_in_flight || st.releasing)
    return;
  st.retired = true;
  st.env->forget_egress_log(st.s.id);
  if (st.env->secrets) st.env->secrets->unbind(st.s.id);  // (its placeholders are useless now)
  caf::anon_send(st.registry, ended_atom::value, st.s);
  if (st.worker) caf::anon_send(st.worker, retire_atom::value);
  self->quit();
}

void internal(SandboxSelf* self, Command c) {
  self->state.queue.emplace_back(std::move(c), caf::response_promise());
  pump(self);
}

void report_dead_vm(SandboxSelf* self);

// What its egress log holds since the last summary, recorded in its audit log (nothing when it
// reached nothing, or has no network).
void summarize_egress(SandboxSelf* self) {
  auto& st = self->state;
  if (!st.s.network || st.retired) return;
  auto log = st.env->egress_log(st.s.id, false);
  if (!log) return;
  auto summary = log->take_summary(now_ms());
  if (!summary.empty()) internal(self, cmd::RecordEgress{std::move(summary)});
}

// The hibernation it is in, copied onto the data disk and synced, in the background (the hibernate
// answered once it was on tmpfs): recorded as `hibernation-persisted` once it is there, so that
// it survives a host reboot. A wake meanwhile waits for the copy (the worker does one thing at a
// time); a copy of a hibernation woken since is not recorded (decide).
void persist_hibernation(SandboxSelf* self) {
  auto& st = self->state;
  if (!st.worker || st.s.status != SandboxStatus::hibernated) return;
  auto snap = st.s.hibernation_snapshot;
  self->request(st.worker, deadline::kVmEffect.limit, persist_atom::value,
                st.env->hibernated_dir(st.s.id).string(), st.env->persisted_dir(st.s.id).string())
      .then(
          [self, snap](WorkerResult r) {
            if (r.ok) return internal(self, cmd::HibernationPersisted{snap});
            spdlog::warn("sandbox {}: its hibernation is on tmpfs only: {}", self->state.s.id,
                         r.error);
          },
          [self](const caf::error& e) {
            spdlog::warn("sandbox {}: its hibernation is on tmpfs only: {}", self->state.s.id,
                         caf::to_string(e));
          });
}

// Whether an event ends the VM (see release_vm).
bool ends_vm(const Event& e) {
  return e.kind == Event::Kind::killed || e.kind == Event::Kind::migrated ||
         e.kind == Event::Kind::failed ||
         (e.kind == Event::Kind::reaped && e.reap_action != ReapAction::hibernate);
}

// Destroys the VM (the guest syncs its volumes first, see the worker) and only then lets the
// registry detach its volumes and answers the kill: a next sandbox that attaches a volume never
// mounts it while this VM may still write it.
void release_vm(SandboxSelf* self) {
  auto& st = self->state;
  st.handle->cancel_calls();  // commands in flight end now, not when the worker gets there
  auto released = [self] {
    auto& st = self->state;
    st.releasing = false;
    summarize_egress(self);  // its last period (it reaches nothing more)
    caf::anon_send(st.registry, released_atom::value, info_of(st.s));
    Answer a;
    a.info = info_of(st.s);
    for (auto& rp : std::exchange(st.after_release, {})) rp.deliver(a);
    maybe_retire(self);
  };
  if (!st.worker) return released();
  st.releasing = true;
  self->request(st.worker, deadline::kVmEffect.limit, destroy_atom::value)
      .then([released](WorkerResult) { released(); },
            [self, released](const caf::error& e) {
              spdlog::warn("sandbox {}: destroying its VM: {}", self->state.s.id,
                           caf::to_string(e));
              released();
            });
}

// The answer for a caller that waited for a transition, now that the sandbox is in a stable state.
Answer outcome_for(SandboxActorState& st, SandboxActorState::Awaits what) {
  using A = SandboxActorState::Awaits;
  auto status = st.s.status;
  auto fail = [&](Code code, const std::string& what_failed) {
    return Answer::fail(
        {code, what_failed + " of sandbox " + st.s.id + " failed: " +
                   (st.transition_failure.empty() ? "unknown reason" : st.transition_failure)});
  };
  if (status == SandboxStatus::failed)
    return Answer::fail(
        {Code::sandbox_failed, "sandbox " + st.s.id + " failed: " + st.s.failure_reason});
  if (status == SandboxStatus::stopped)
    return Answer::fail({Code::sandbox_stopped, "sandbox " + st.s.id + " was stopped meanwhile"});
  Answer a;
  a.info = info_of(st.s);
  switch (what) {
    case A::create:
      if (status != SandboxStatus::running) return fail(Code::start_failed, "the start");
      break;
    case A::snapshot:
      if (!st.transition_failure.empty() || st.s.snapshots.empty())
        return fail(Code::snapshot_failed, "a snapshot");
      a.text = st.s.snapshots.back();
      break;
    case A::fork:
      if (!st.transition_failure.empty()) return fail(Code::fork_failed, "a fork");
      a.infos = st.fork_children;
      break;
    case A::hibernate:
      if (status != SandboxStatus::hibernated) return fail(Code::hibernate_failed, "hibernating");
      break;
    case A::wake:
      if (status != SandboxStatus::running) return fail(Code::wake_failed, "waking");
      break;
  }
  return a;
}

void finish_transition(SandboxSelf* self) {
  auto& st = self->state;
  if (st.s.status == SandboxStatus::running || st.s.status == SandboxStatus::hibernated ||
      st.s.status == SandboxStatus::stopped || st.s.status == SandboxStatus::failed) {
    for (auto& [what, rp] : st.waiting) rp.deliver(outcome_for(st, what));
    st.waiting.clear();
    st.fork_children.clear();
    if (st.s.status == SandboxStatus::running) {
      for (auto& [c, rp] : st.after_wake) st.queue.emplace_back(c, rp);
      st.after_wake.clear();
      for (auto& rp : st.leases_after_wake) {
        Answer lease;
        lease.vm = st.handle;
        lease.info = info_of(st.s);
        rp.deliver(lease);
      }
      st.leases_after_wake.clear();
      if (st.vm_dead) report_dead_vm(self);  // it died during the transition
    } else if (st.s.status != SandboxStatus::hibernated) {
      for (auto& [c, rp] : st.after_wake)
        rp.deliver(Answer::fail({Code::sandbox_failed, "the sandbox did not wake"}));
      st.after_wake.clear();
      for (auto& rp : st.leases_after_wake)
        rp.deliver(Answer::fail({Code::sandbox_failed, "the sandbox did not wake"}));
      st.leases_after_wake.clear();
    } else if (!st.transition_failure.empty()) {
      // A wake failed: those who wanted it running hear why.
      Answer why = Answer::fail(
          {Code::wake_failed, "waking sandbox " + st.s.id + " failed: " + st.transition_failure});
      for (auto& [c, rp] : st.after_wake) rp.deliver(why);
      st.after_wake.clear();
      for (auto& rp : st.leases_after_wake) rp.deliver(why);
      st.leases_after_wake.clear();
    }
  }
}

// The adoption of the VM (after a restart) ended: the sandbox runs on it, or fails with the
// reason. Commands that waited go on either way.
void adoption_done(SandboxSelf* self, bool ok, const std::string& why) {
  auto& st = self->state;
  st.adopting = false;
  if (ok) {
    ++st.env->adopted;
    finish_transition(self);  // leases that waited get the VM
  } else {
    ++st.env->adopt_failed;
    spdlog::info("recovery: {}: VM not adopted: {}", st.s.id, why.substr(0, why.find('\n')));
    st.queue.emplace_front(Command{cmd::Fail{"host_restart: " + why.substr(0, why.find('\n'))}},
                           caf::response_promise());
  }
  pump(self);
}

// The VM died on its own (the watcher said so): asks the worker how, then records the failure.
void report_dead_vm(SandboxSelf* self) {
  auto& st = self->state;
  st.vm_dead = false;
  if (st.vm_dead_reported) return;
  st.vm_dead_reported = true;
  self->request(st.worker, deadline::kQuery.limit, exited_atom::value)
      .then(
          [self](std::string why) {
            auto& st = self->state;
            ++st.env->vm_exits;
            spdlog::warn("sandbox {}: its VM died: {}", st.s.id, why.substr(0, 300));
            constexpr size_t kMaxReason = 1500;  // the console tail is the end of it
            if (why.size() > kMaxReason) why = "..." + why.substr(why.size() - kMaxReason);
            internal(self, cmd::Fail{"vm_exited: " + why});
          },
          [self](const caf::error& err) {
            internal(self,
                     cmd::Fail{"vm_exited: " +
                               deadline::missed(err, deadline::kQuery, self->system()).message});
          });
}

// Runs the side effect an applied event calls for.
void effect(SandboxSelf* self, const Event& e) {
  auto& st = self->state;
  auto to = [self](Command ok, std::function<Command(std::string)> bad) {
    return [self, ok, bad](WorkerResult r) { internal(self, r.ok ? ok : bad(r.error)); };
  };
  // A request that failed (its deadline passed, or the other actor died): the sandbox fails.
  auto lost_to = [self](deadline::Deadline d) {
    return [self, d](const caf::error& err) {
      internal(self, cmd::Fail{deadline::missed(err, d, self->system()).message});
    };
  };
  auto lost = lost_to(deadline::kVmEffect);
  // A restore's outcome: started (with the subnet its network got) or failed.
  auto started = [self](WorkerResult r) {
    internal(self, r.ok ? Command{cmd::Started{r.subnet}} : Command{cmd::StartFailed{r.error}});
  };
  switch (e.kind) {
    case Event::Kind::created: {
      auto restore = [self, started, lost](std::string dir, bool pooled) {
        auto& s = self->state.s;
        self->request(self->state.worker, deadline::kVmEffect.limit, restore_atom::value, dir,
                      false, pooled, NetSpec{s.network, s.egress, s.ports, std::nullopt},
                      VolumeSpec{s.volumes, /*mount=*/true})
            .then(started, lost);
      };
      if (!e.from_snapshot.empty()) {
        restore(st.env->snapshot_dir(e.from_snapshot).string(), false);
        break;
      }
      // The template's actor bakes it (once) and answers with the staged snapshot.
      self->request(st.registry, deadline::kQuery.limit, template_atom::value, e.template_name)
          .then(
              [self, restore, lost_to](caf::actor tmpl) {
                self->request(tmpl, deadline::kBake.limit, bake_atom::value)
                    .then(
                        [self, restore](Answer a) {
                          if (!a.ok) return internal(self, cmd::StartFailed{a.error.message});
                          restore(a.text, true);
                        },
                        lost_to(deadline::kBake));
              },
              lost_to(deadline::kQuery));
      break;
    }
    case Event::Kind::transition_started:
      switch (e.transition) {
        case Transition::snapshotting:
          self->request(st.worker, deadline::kVmEffect.limit, snapshot_atom::value,
                        st.env->snapshot_dir(e.snapshot_id).string(), /*all_volumes=*/true)
              .then(to(cmd::TransitionDone{},
                       [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                    lost);
          break;
        case Transition::hibernating:
          self->request(st.worker, deadline::kVmEffect.limit, hibernate_atom::value,
                        st.env->hibernated_dir(st.s.id).string(), !e.disk_only)
              .then(to(cmd::TransitionDone{},
                       [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                    lost);
          break;
        case Transition::waking:
          self->request(st.worker, deadline::kVmEffect.limit, restore_atom::value,
                        st.env->hibernated_dir(st.s.id).string(), true, false,
                        NetSpec{st.s.network, st.s.egress, st.s.ports, std::nullopt},
                        VolumeSpec{st.s.volumes, /*mount=*/false})
              .then(started, lost);
          break;
        case Transition::forking: {
          uint32_t count = 1;
          if (auto* f = std::get_if<cmd::Fork>(&st.current)) count = f->count;
          ForkRequest fr{st.s.tenant, st.s.template_name, e.snapshot_id, st.s.id, count};
          auto dir = st.env->snapshot_dir(e.snapshot_id).string();
          st.fork_in_flight = true;
          // Ends the fork's own work: a sandbox killed meanwhile may retire now.
          auto done = [self] {
            self->state.fork_in_flight = false;
            maybe_retire(self);
          };
          self->request(st.worker, deadline::kVmEffect.limit, snapshot_atom::value, dir,
                        /*all_volumes=*/false)
              .then(
                  [self, fr, dir, done](WorkerResult r) {
                    if (!r.ok || self->state.s.status != SandboxStatus::forking) {
                      // Failed, or killed meanwhile: no children are made.
                      if (r.ok) self->send(self->state.worker, drop_atom::value, dir);
                      self->state.fork_in_flight = false;
                      if (!r.ok) return internal(self, cmd::TransitionFailed{r.error});
                      return done();
                    }
                    self->request(self->state.registry, deadline::kSandboxCommand.limit,
                                  fork_atom::value, fr)
                        .then(
                            [self, dir, done](Answer a) {
                              // The children run on copies of it (or failed): the fork's
                              // snapshot is not one of the sandbox's snapshots, nobody can use
                              // it again.
                              self->send(self->state.worker, drop_atom::value, dir);
                              auto& st = self->state;
                              st.fork_in_flight = false;
                              if (a.ok && st.s.status != SandboxStatus::forking) {
                                // Killed (or failed) meanwhile: the fork is cancelled and its
                                // children (and their volume copies) must not outlive it,
                                // unknown to anyone.
                                std::vector<std::string> kids;
                                for (auto& kid : a.infos) kids.push_back(kid.id);
                                caf::anon_send(st.registry, unfork_atom::value, std::move(kids));
                                return done();
                              }
                              if (!a.ok) {
                                if (st.s.status != SandboxStatus::forking) return done();
                                return internal(self, cmd::TransitionFailed{a.error.message});
                              }
                              self->state.fork_children = a.infos;
                              std::vector<std::string> ids;
                              for (auto& i : a.infos) ids.push_back(i.id);
                              internal(self, cmd::TransitionDone{ids, std::nullopt});
                            },
                            [self, dir](const caf::error& err) {
                              self->send(self->state.worker, drop_atom::value, dir);
                              self->state.fork_in_flight = false;
                              internal(self, cmd::TransitionFailed{
                                                 deadline::missed(err, deadline::kSandboxCommand,
                                                                  self->system())
                                                     .message});
                            });
                  },
                  [self, lost](const caf::error& err) {
                    self->state.fork_in_flight = false;
                    lost(err);
                  });
          break;
        }
      }
      break;
    case Event::Kind::reaped:
      if (e.reap_action == ReapAction::hibernate) {
        self->request(st.worker, deadline::kVmEffect.limit, hibernate_atom::value,
                      st.env->hibernated_dir(st.s.id).string(), !st.s.timeout_disk_only)
            .then(to(cmd::TransitionDone{},
                     [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                  lost);
      } else {
        release_vm(self);
      }
      break;
    case Event::Kind::egress_changed:
      // The policy is recorded: a VM that cannot take it must not keep running on the old one.
      self->request(st.worker, deadline::kVmEffect.limit, egress_atom::value, e.egress)
          .then(
              [self](WorkerResult r) {
                if (!r.ok) internal(self, cmd::Fail{"egress policy not applied: " + r.error});
              },
              lost);
      break;
    case Event::Kind::hibernated:
      persist_hibernation(self);
      break;
    case Event::Kind::hibernation_persisted:  // on the data disk: into the object store next
      caf::anon_send(st.registry, upload_atom::value, st.s.id, e.snapshot_id,
                     st.s.hibernation_persisted_at);
      break;
    case Event::Kind::woke:  // its hibernation is spent: so is the copy
      caf::anon_send(st.worker, unpersist_atom::value, st.env->persisted_dir(st.s.id).string());
      break;
    case Event::Kind::snapshot_taken:
      // Answered once on tmpfs; its durable copy follows (the registry's snapshot persister).
      caf::anon_send(st.registry, persist_atom::value, st.s.id, e.snapshot_id);
      break;
    case Event::Kind::snapshot_persisted:  // on the data disk: into the object store next
      caf::anon_send(st.registry, upsnap_atom::value, st.s.id, e.snapshot_id);
      break;
    case Event::Kind::snapshot_deleted:
      // Recorded: creates from it are refused from now on. Its files go (VMs restored from it
      // keep theirs: layers are hard links, RAM was copied), and so does its durable copy.
      caf::anon_send(st.worker, drop_atom::value, st.env->snapshot_dir(e.snapshot_id).string());
      caf::anon_send(st.registry, unpersist_atom::value, e.snapshot_id);
      break;
    case Event::Kind::killed:
    case Event::Kind::migrated:  // (its hibernation was copied to the other host)
    case Event::Kind::failed:
      release_vm(self);
      caf::anon_send(st.worker, unpersist_atom::value, st.env->persisted_dir(st.s.id).string());
      if (fs::exists(st.env->hibernated_dir(st.s.id)))
        vmm::remove_snapshot(st.env->hibernated_dir(st.s.id),
                             st.env->disk_twin(st.env->hibernated_dir(st.s.id)));
      break;
    default:
      break;
  }
}

// The durability contract. What a reply acknowledges (a sandbox started, a snapshot taken, a
// fork, a hibernation, a kill, a changed setting) is fsynced before the reply. Records of single
// commands (exec started/finished) and the first step of a transition (created,
// transition-started: nobody hears of it before its outcome, which is synced) are only written to
// the log: they survive a kill -9 of the daemon at once, and a power loss once the store's next
// sync (at most 100 ms later; see storage::Durability).
storage::Durability durability_of(const std::vector<Event>& events) {
  for (auto& e : events) switch (e.kind) {
      case Event::Kind::exec_started:
      case Event::Kind::exec_finished:
      case Event::Kind::created:
      case Event::Kind::transition_started:
        continue;
      default:
        return storage::Durability::synced;
    }
  return storage::Durability::written;
}

void pump(SandboxSelf* self) {
  auto& st = self->state;
  while (!st.persisting && !st.adopting && !st.queue.empty()) {
    auto [c, rp] = std::move(st.queue.front());
    st.queue.pop_front();
    // An idle timeout decided a moment ago no longer holds if the sandbox was used since.
    if (auto* reap = std::get_if<cmd::Reap>(&c); reap && reap->idle && !idle_due(st, now_ms())) {
      rp.deliver(Answer::fail({Code::sandbox_busy, "the sandbox is in use"}));
      continue;
    }
    auto d = decide(st.s, c, now_ms(), st.env->config.limits);
    if (auto* r = std::get_if<Rejection>(&d)) {
      rp.deliver(Answer::fail(*r));
      continue;
    }
    auto events = std::get<std::vector<Event>>(d);
    if (events.empty()) {
      Answer a;
      a.info = info_of(st.s);
      rp.deliver(a);
      continue;
    }
    spdlog::debug("sandbox {}: persisting {} event(s) at version {}", st.s.id, events.size(),
                  st.s.version);
    st.persisting = true;
    st.current = c;
    st.current_rp = rp;
    std::vector<storage::NewEvent> ne;
    for (auto& e : events) ne.push_back({to_string(e.kind), event_format(), encode_event(e)});
    st.pending_events = events;
    append_and_report(*st.env, st.s.id, st.s.version, std::move(ne),
                      caf::actor_cast<caf::actor>(self), durability_of(events));
  }
  maybe_retire(self);
}

void on_persisted(SandboxSelf* self, bool ok, Code code, const std::string& err,
                  const std::vector<Event>& events) {
  auto& st = self->state;
  spdlog::debug("sandbox {}: persisted ok={} {}", st.s.id, ok, err);
  st.persisting = false;
  auto rp = st.current_rp;
  if (!ok) {
    rp.deliver(Answer::fail({code, err}));
    pump(self);
    return;
  }
  for (auto& e : events) {
    if (e.kind == Event::Kind::started || e.kind == Event::Kind::woke)
      st.last_active_ms = now_ms();  // the idle timeout counts from here
    if (e.kind == Event::Kind::transition_started) st.transition_failure.clear();
    if (e.kind == Event::Kind::transition_failed) st.transition_failure = e.reason;
    auto uploaded = st.s.hibernation_manifest;
    auto snapshots_uploaded = st.s.snapshot_manifests;
    st.s = apply(st.s, e);
    // Its hibernation's copy in the object store is spent with it (woken, ended, moved).
    if (!uploaded.empty() && st.s.hibernation_manifest.empty())
      caf::anon_send(st.registry, forget_atom::value, uploaded, st.s.id);
    // So is a named snapshot's, once the snapshot is deleted.
    for (auto& [snap, manifest] : snapshots_uploaded)
      if (!st.s.snapshot_manifests.count(snap))
        caf::anon_send(st.registry, forget_atom::value, manifest, snap);
    caf::anon_send(st.registry, info_atom::value, info_of(st.s));
  }
  if (st.env->config.snapshot_every > 0 &&
      st.s.version >= st.snapshot_version + st.env->config.snapshot_every) {
    auto saved = st.env->store->save_snapshot(
        st.s.id, storage::StateSnapshot{st.s.version, state_format(), encode_state(st.s)});
    if (saved)
      st.snapshot_version = st.s.version;
    else
      spdlog::warn("sandbox {}: state snapshot not saved: {}", st.s.id, saved.error().message);
  }
  // Who waits for what: transitions answer when they end, execs when they finish.
  bool transition =
      st.s.status == SandboxStatus::creating || st.s.status == SandboxStatus::snapshotting ||
      st.s.status == SandboxStatus::forking || st.s.status == SandboxStatus::hibernating ||
      st.s.status == SandboxStatus::waking;
  if (auto* ex = std::get_if<cmd::Exec>(&st.current)) {
    if (events.front().kind == Event::Kind::exec_started) {
      // The caller runs the command against the lease and reports ExecFinished.
      Answer a;
      a.info = info_of(st.s);
      a.vm = st.handle;
      a.exec_id = ex->exec_id;
      rp.deliver(a);
    } else {
      st.after_wake.emplace_back(st.current, rp);  // it started a wake first
    }
  } else if (transition) {
    using A = SandboxActorState::Awaits;
    A what = std::holds_alternative<cmd::Snapshot>(st.current)    ? A::snapshot
             : std::holds_alternative<cmd::Fork>(st.current)      ? A::fork
             : std::holds_alternative<cmd::Hibernate>(st.current) ? A::hibernate
             : std::holds_alternative<cmd::Reap>(st.current)      ? A::hibernate
             : std::holds_alternative<cmd::Wake>(st.current)      ? A::wake
                                                                  : A::create;
    st.waiting.emplace_back(what, rp);
  } else if (std::any_of(events.begin(), events.end(), ends_vm)) {
    st.after_release.push_back(rp);  // answered once the VM is gone (release_vm)
  } else {
    Answer a;
    a.info = info_of(st.s);
    rp.deliver(a);
  }
  for (auto& e : events) effect(self, e);
  finish_transition(self);
  pump(self);
  maybe_retire(self);
}

}  // namespace

namespace {
// One resource sample of the running VM (never waits for the VM's lock: a transition holding it
// skips this sample). Reads /proc and the file system only: not a use of the sandbox.
void sample_metrics(SandboxSelf* self) {
  auto& st = self->state;
  std::shared_lock l(st.handle->mu, std::try_to_lock);
  if (!l.owns_lock() || !st.handle->vm) return;
  pid_t pid = st.handle->vm->pid();
  auto disk = st.handle->vm->disk_file();
  l.unlock();
  auto u = vmm::process_usage(pid);
  if (!u) return;
  int64_t now = now_ms();
  MetricSample m;
  m.at_ms = now;
  m.cpu_count = st.s.vcpus ? st.s.vcpus : 1;
  if (st.sampled_pid == pid && now > st.sampled_ms && u->cpu_usec >= st.sampled_cpu_usec)
    m.cpu_used_pct = cpu_percent(u->cpu_usec - st.sampled_cpu_usec,
                                 uint64_t(now - st.sampled_ms) * 1000, m.cpu_count);
  m.mem_used_bytes = u->rss_bytes;
  m.mem_total_bytes = uint64_t(st.s.memory_mib ? st.s.memory_mib : st.env->config.memory_mib) << 20;
  m.disk_used_bytes = vmm::allocated_bytes(disk);
  if (auto size = vmm::qcow2::virtual_size(disk)) m.disk_total_bytes = *size;
  bool first = st.sampled_pid != pid;  // (a new VM: its CPU share needs a second sample)
  st.sampled_pid = pid;
  st.sampled_ms = now;
  st.sampled_cpu_usec = u->cpu_usec;
  if (!first) st.env->metrics.add(st.s.id, m);
}
}  // namespace

caf::behavior sandbox_actor(SandboxSelf* self, Env* env, caf::actor registry, SandboxState initial,
                            std::string adopt_dir) {
  auto& st = self->state;
  st.env = env;
  st.registry = registry;
  st.s = initial;
  st.snapshot_version = initial.version;  // recovered sandboxes: no need to snapshot at once
  st.last_active_ms = now_ms();
  // Exec ids continue the recorded ones (x1, x2, ...): none is reused in the audit log.
  st.exec_seq = initial.execs_finished + initial.running_execs.size();
  log_exceptions(self, "sandbox " + initial.id);
  if (env->config.metrics_interval.count() > 0)
    self->delayed_send(self, env->config.metrics_interval, sample_atom::value);
  if (env->config.egress_summary_interval.count() > 0)
    self->delayed_send(self, env->config.egress_summary_interval, egress_summary_atom::value);
  // The VM worker knows its template; a new sandbox gets it with its Create command.
  if (!initial.template_name.empty())
    st.worker = self->spawn<caf::detached + caf::linked>(
        vm_worker, env, initial.id, initial.template_name, st.handle, self->address());
  // Hibernated without a recorded copy on the data disk (persisting was cut short): made now.
  if (initial.status == SandboxStatus::hibernated && !initial.hibernation_durable)
    persist_hibernation(self);
  // On the data disk but not (recorded) in the object store: uploaded now (if there is one).
  if (initial.status == SandboxStatus::hibernated && initial.hibernation_durable &&
      initial.hibernation_manifest.empty())
    caf::anon_send(registry, upload_atom::value, initial.id, initial.hibernation_snapshot,
                   initial.hibernation_persisted_at);
  if (!adopt_dir.empty() && st.worker) {
    // Its VM outlived the previous host process: take it over before anything else runs.
    st.adopting = true;
    self->request(st.worker, deadline::kVmEffect.limit, adoptvm_atom::value, adopt_dir,
                  NetSpec{initial.network, initial.egress, initial.ports, initial.subnet})
        .then([self](WorkerResult r) { adoption_done(self, r.ok, r.error); },
              [self](const caf::error& err) {
                adoption_done(self, false,
                              deadline::missed(err, deadline::kVmEffect, self->system()).message);
              });
  }
  return {
      [=](cmd_atom, Command c) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        // (The reaper and the background copy of a snapshot are not uses of the sandbox.)
        if (!std::holds_alternative<cmd::Reap>(c) &&
            !std::holds_alternative<cmd::SnapshotPersisted>(c) &&
            !std::holds_alternative<cmd::HibernationUploaded>(c) &&
            !std::holds_alternative<cmd::SnapshotUploaded>(c))
          self->state.last_active_ms = now_ms();
        if (auto* cr = std::get_if<cmd::Create>(&c); cr && !self->state.worker)
          self->state.worker = self->spawn<caf::detached + caf::linked>(
              vm_worker, self->state.env, self->state.s.id,
              cr->template_name.empty() ? "base" : cr->template_name, self->state.handle,
              self->address());
        self->state.queue.emplace_back(std::move(c), rp);
        pump(self);
        return rp;
      },
      [=](exec_atom, std::string command) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        self->state.last_active_ms = now_ms();
        std::string id = "x" + std::to_string(++self->state.exec_seq);
        self->state.queue.emplace_back(Command{cmd::Exec{id, std::move(command)}}, rp);
        pump(self);
        return rp;
      },
      // A lease on the running VM for agent operations that are not recorded (files, processes).
      [=](lease_atom) -> caf::result<Answer> {
        auto& st = self->state;
        st.last_active_ms = now_ms();
        if (st.s.status == SandboxStatus::running && !st.adopting) {
          Answer a;
          a.info = info_of(st.s);
          a.vm = st.handle;
          return a;
        }
        if (st.s.status == SandboxStatus::hibernated && st.s.auto_wake) {
          auto rp = self->make_response_promise();
          st.leases_after_wake.push_back(rp);
          internal(self, cmd::Wake{});
          return rp;
        }
        if (st.s.status == SandboxStatus::waking || st.adopting) {
          auto rp = self->make_response_promise();
          st.leases_after_wake.push_back(rp);
          return rp;
        }
        return Answer::fail(not_running(st.s, "use it"));
      },
      // The registry's tick for a running sandbox with an idle timeout: hibernate (or kill, per
      // on_timeout) when nothing used it for that long and no background process runs.
      [=](tick_atom) {
        auto& st = self->state;
        if (st.idle_checking || !idle_due(st, now_ms())) return;
        st.idle_checking = true;
        self->request(st.worker, deadline::kQuery.limit, procs_atom::value)
            .then(
                [self](bool busy) {
                  auto& st = self->state;
                  st.idle_checking = false;
                  if (busy) {
                    st.last_active_ms = now_ms();  // a background process runs: not idle
                    return;
                  }
                  if (idle_due(st, now_ms())) internal(self, cmd::Reap{true});
                },
                [self](const caf::error&) { self->state.idle_checking = false; });
      },
      // The watcher: the VM of incarnation `gen` died on its own (crash, OOM kill, kill -9).
      [=](vm_exited_atom, uint64_t gen) {
        auto& st = self->state;
        if (gen != st.handle->generation.load()) return;  // an earlier VM: stopped on purpose
        if (st.s.status == SandboxStatus::running)
          report_dead_vm(self);
        else if (st.s.live() && st.s.status != SandboxStatus::hibernated)
          st.vm_dead = true;  // mid-transition: recorded once it ends
      },
      // Every metrics_interval: a resource sample while its VM runs; the samples go with it.
      [=](sample_atom) {
        auto& st = self->state;
        if (st.s.status == SandboxStatus::stopped || st.s.status == SandboxStatus::failed) {
          st.env->metrics.erase(st.s.id);
          return;
        }
        if (st.s.status == SandboxStatus::running && !st.adopting) sample_metrics(self);
        self->delayed_send(self, st.env->config.metrics_interval, sample_atom::value);
      },
      // Every egress_summary_interval while it lives: its egress log summed up (audit log).
      [=](egress_summary_atom) {
        auto& st = self->state;
        // Ended: its last period was recorded as its VM went. (Not yet created goes on ticking:
        // a create whose first event is still being written must not end the summaries.)
        if (st.s.status == SandboxStatus::stopped || st.s.status == SandboxStatus::failed) return;
        summarize_egress(self);
        self->delayed_send(self, st.env->config.egress_summary_interval,
                           egress_summary_atom::value);
      },
      [=](persisted_atom, bool ok, Code code, std::string err) {
        auto events = std::move(self->state.pending_events);
        on_persisted(self, ok, code, err, events);
      },
      [=](get_atom) -> Answer {
        Answer a;
        a.info = info_of(self->state.s);
        return a;
      },
  };
}

}  // namespace pandastack::actors
