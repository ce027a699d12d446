#include "actors/runtime.h"

#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <caf/all.hpp>
#include <cctype>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <stop_token>

#include "actors/event_codec.h"
#include "storage/api_keys.h"
#include "storage/event_store.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/pool.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/templates.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

// One sandbox's VM, shared by its VM worker (which creates, snapshots and destroys it under the
// exclusive lock) and the callers of agent operations (exec, files, processes), which run
// concurrently under the shared lock on their own threads. Hibernate and kill first cancel the
// calls in flight, so they never wait for a long command; snapshot and fork wait for them.
struct VmHandle {
  std::shared_mutex mu;
  std::unique_ptr<vmm::Vm> vm;  // guarded by mu

  // Cancels every agent call in flight (their stop tokens fire).
  void cancel_calls() {
    std::lock_guard l(stop_mu_);
    stop_->request_stop();
    stop_ = std::make_shared<std::stop_source>();
  }
  std::shared_ptr<std::stop_source> calls_stop() {
    std::lock_guard l(stop_mu_);
    return stop_;
  }

 private:
  std::mutex stop_mu_;
  std::shared_ptr<std::stop_source> stop_ = std::make_shared<std::stop_source>();
};

// One reply type for every request inside the runtime.
struct Answer {
  bool ok = true;
  Rejection error;
  SandboxInfo info;
  std::vector<SandboxInfo> infos;
  std::string text;
  std::shared_ptr<VmHandle> vm;  // a lease: agent operations run against it
  std::string exec_id;

  static Answer fail(Rejection r) {
    Answer a;
    a.ok = false;
    a.error = std::move(r);
    return a;
  }
};

// What a VM worker reports back.
struct WorkerResult {
  bool ok = true;
  std::string error;
  std::optional<uint32_t> subnet;  // restores of a sandbox with a network: the subnet it got
};

// What a restore needs to know of the sandbox's network.
struct NetSpec {
  bool enabled = false;
  Egress egress;
  std::set<uint32_t> ports;  // exposed again on the new VM
};

struct ListQuery {
  std::string tenant;
  std::optional<Status> status;
  std::map<std::string, std::string> metadata;
};

struct ForkRequest {
  std::string tenant, template_name, snapshot_id, parent;
  uint32_t count = 1;
};

}  // namespace pandastack::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Answer)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::WorkerResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::NetSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Egress)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Command)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::CreateRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::SandboxState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::SandboxInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::ListQuery)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::ForkRequest)

namespace pandastack::actors {

namespace {

using cmd_atom = caf::atom_constant<caf::atom("cmd")>;
using persisted_atom = caf::atom_constant<caf::atom("persisted")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using hibernate_atom = caf::atom_constant<caf::atom("hibernate")>;
using destroy_atom = caf::atom_constant<caf::atom("destroy")>;
using exec_atom = caf::atom_constant<caf::atom("exec")>;
using lease_atom = caf::atom_constant<caf::atom("lease")>;
using create_atom = caf::atom_constant<caf::atom("create")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using route_atom = caf::atom_constant<caf::atom("route")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using adopt_atom = caf::atom_constant<caf::atom("adopt")>;
using fork_atom = caf::atom_constant<caf::atom("forkkids")>;
using template_atom = caf::atom_constant<caf::atom("template")>;
using bake_atom = caf::atom_constant<caf::atom("bake")>;
using egress_atom = caf::atom_constant<caf::atom("egress")>;
using drop_atom = caf::atom_constant<caf::atom("dropsnap")>;
using delsnap_atom = caf::atom_constant<caf::atom("delsnap")>;

// A handler that throws is a bug: log it loudly (CAF would end the actor silently).
template <typename Self>
void log_exceptions(Self* self, std::string what) {
  self->set_exception_handler(
      [what](caf::scheduled_actor*, std::exception_ptr& eptr) -> caf::error {
        try {
          std::rethrow_exception(eptr);
        } catch (const std::exception& e) {
          spdlog::critical("{}: handler threw: {}", what, e.what());
        } catch (...) {
          spdlog::critical("{}: handler threw a non-std exception", what);
        }
        return caf::make_error(caf::sec::runtime_error);
      });
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_base32(size_t n) {
  static const char* a = "abcdefghijklmnopqrstuvwxyz234567";
  std::string raw(n, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), int(n));
  std::string out;
  for (unsigned char c : raw) out += a[c & 31];
  return out;
}

SandboxInfo info_of(const SandboxState& s) {
  SandboxInfo i;
  i.id = s.id;
  i.tenant = s.tenant;
  i.template_name = s.template_name;
  i.parent = s.parent;
  i.status = s.status;
  i.metadata = s.metadata;
  i.created_at_ms = s.created_at_ms;
  i.expires_at_ms = s.expires_at_ms;
  i.persistent = s.persistent;
  i.snapshots = s.snapshots;
  i.failure_reason = s.failure_reason;
  i.version = s.version;
  i.network = s.network;
  i.egress = s.egress;
  i.ports = s.ports;
  return i;
}

Rejection not_found(const std::string& id) {
  return Rejection{"sandbox_not_found", "no sandbox " + id};
}

}  // namespace

// Shared by every actor; owned by Runtime::Impl, which outlives the actor system.
struct Env {
  RuntimeConfig config;
  std::unique_ptr<storage::EventStore> store;
  vmm::IoThread io;
  std::unique_ptr<vmm::TemplateStore> templates;
  std::mutex staged_mu;
  std::map<std::string, vmm::Snapshot> staged;  // template -> baked snapshot staged in state_dir
  // VMs re-adopted at recovery, taken by their sandbox actors when they start.
  std::mutex adopted_mu;
  std::map<std::string, std::unique_ptr<vmm::Vm>> adopted;
  // Pre-spawned QEMU processes per template, for the staged snapshot they wait for. (Declared
  // after `io`: destroyed first, killing the idle processes.)
  std::mutex pools_mu;
  std::map<std::string, std::pair<std::string, std::unique_ptr<vmm::RestorePool>>> pools;
  // Spare QEMU processes per template (and per template without network).
  std::map<std::string, std::unique_ptr<vmm::SparePool>> spares;

  // Host subnets in use (by sandboxes' VMs and waiting pool members). Persisted through the
  // sandboxes' network_attached events: recovery marks the adopted VMs' subnets used again.
  std::mutex subnets_mu;
  std::set<uint32_t> subnets_used;
  uint32_t subnet_capacity = 0, subnet_next = 0;

  std::optional<uint32_t> take_subnet() {
    std::lock_guard lock(subnets_mu);
    for (uint32_t i = 0; i < subnet_capacity; ++i) {
      uint32_t idx = (subnet_next + i) % subnet_capacity;
      if (subnets_used.insert(idx).second) {
        subnet_next = (idx + 1) % subnet_capacity;
        return idx;
      }
    }
    return std::nullopt;
  }
  void release_subnet(uint32_t idx) {
    std::lock_guard lock(subnets_mu);
    subnets_used.erase(idx);
  }
  void own(vmm::Network& n) {
    n.set_on_release([this](uint32_t idx) { release_subnet(idx); });
  }

  // A new sandbox network on a free subnet, with `egress`.
  vmm::Result<std::shared_ptr<vmm::Network>> make_network(const Egress& egress) {
    auto idx = take_subnet();
    if (!idx)
      return vmm::make_error(vmm::ErrorCode::invalid_argument,
                             "subnet pool " + config.net.pool_cidr + " is exhausted");
    auto n = vmm::Network::create(config.net, *idx, to_policy(egress));
    if (!n) {
      release_subnet(*idx);
      return n.error();
    }
    own(**n);
    return n;
  }

  static vmm::EgressPolicy to_policy(const Egress& e) {
    vmm::EgressPolicy p;
    p.mode = vmm::egress_mode_from_string(e.mode).value_or(vmm::EgressPolicy::Mode::deny_all);
    p.cidrs = e.cidrs;
    p.domains = e.domains;
    return p;
  }

  // Pools (warm and spare) are per template and network mode. With networking on, members wait
  // on networks of their own (deny_all until claimed), and sandboxes without a network have pools
  // of their own, made on first use. The mode's name suffix ("" or "-nonet") and its factory.
  std::pair<std::string, vmm::VmPool::NetworkFactory> pool_mode(bool networked) {
    if (!config.network) return {"", nullptr};
    if (!networked) return {"-nonet", nullptr};
    return {"", [this] { return make_network(Egress{}); }};
  }

  // The template's warm pool for `snap` (a new one when the template was baked again), or null.
  vmm::RestorePool* pool_for(const std::string& template_name, const vmm::Snapshot& snap,
                             bool networked) {
    if (config.pool_size == 0) return nullptr;
    auto [suffix, factory] = pool_mode(networked);
    std::lock_guard lock(pools_mu);
    auto& [dir, pool] = pools[template_name + suffix];
    if (!pool || dir != snap.dir.string()) {
      auto base = vm_config(template_name, "pool", "pool-" + template_name + suffix);
      pool = std::make_unique<vmm::RestorePool>(io, snap, base, config.pool_size, factory);
      dir = snap.dir.string();
    }
    return pool.get();
  }

  // The template's spares (made on first use), or null.
  vmm::SparePool* spares_for(const std::string& template_name, bool networked) {
    if (config.spare_pool_size == 0) return nullptr;
    auto [suffix, factory] = pool_mode(networked);
    std::lock_guard lock(pools_mu);
    auto& pool = spares[template_name + suffix];
    if (!pool) {
      auto base = vm_config(template_name, "spare", "spare-" + template_name + suffix);
      pool = std::make_unique<vmm::SparePool>(io, base, config.spare_pool_size, factory);
    }
    return pool.get();
  }

  std::unique_ptr<vmm::Vm> take_adopted(const std::string& id) {
    std::lock_guard lock(adopted_mu);
    auto it = adopted.find(id);
    if (it == adopted.end()) return nullptr;
    auto vm = std::move(it->second);
    adopted.erase(it);
    return vm;
  }

  fs::path run_dir(const std::string& id) const { return config.state_dir / "run" / id; }
  fs::path snapshot_dir(const std::string& snap) const {
    return config.state_dir / "snapshots" / snap;
  }
  fs::path hibernated_dir(const std::string& id) const {
    return config.state_dir / "hibernated" / id;
  }

  // `run_name`: the VM's run folder (one per VM incarnation, so a VM still being torn down never
  // shares files with its successor).
  vmm::VmConfig vm_config(const std::string& template_name, const std::string& id,
                          const std::string& run_name) const {
    auto c = templates->config(template_name, run_dir(run_name));
    c.accel = config.accel;
    c.vcpus = config.vcpus;
    c.memory_mib = config.memory_mib;
    c.jail = config.jail;
    c.die_with_parent = !config.vms_outlive_host;
    c.hostname = id;
    for (auto& ch : c.hostname)
      if (ch == '_') ch = '-';
    return c;
  }

  // The template's baked snapshot, staged next to the run folders (bakes once; blocking).
  vmm::Result<vmm::Snapshot> template_snapshot(const std::string& template_name) {
    {
      std::lock_guard lock(staged_mu);
      auto it = staged.find(template_name);
      if (it != staged.end() && fs::exists(it->second.dir / "meta.json")) return it->second;
    }
    auto baked = templates->baked(template_name, vm_config(template_name, "shape", "shape"));
    if (!baked) return baked.error();
    auto s = vmm::stage_snapshot(*baked, config.state_dir / "templates" / baked->dir.filename());
    if (!s) return s.error();
    std::lock_guard lock(staged_mu);
    staged[template_name] = *s;
    return *s;
  }
};

namespace {

// ---------------------------------------------------------------------------------------------
// Template actor: one per template (detached: a bake is a cold boot). Its mailbox serializes the
// requests, so the first bakes (once) and every later one gets the staged snapshot at once.

caf::behavior template_actor(caf::event_based_actor* self, Env* env, std::string name) {
  log_exceptions(self, "template " + name);
  return {
      [=](bake_atom) -> Answer {
        auto t = env->template_snapshot(name);
        if (!t)
          return Answer::fail({"start_failed", "template " + name + ": " + t.error().message});
        Answer a;
        a.text = t->dir.string();
        return a;
      },
  };
}

// ---------------------------------------------------------------------------------------------
// VM worker: a detached actor (its own thread) owning one sandbox's VM; every call blocks.

struct WorkerState {
  Env* env = nullptr;
  std::string id, template_name;
  std::shared_ptr<VmHandle> handle;
};

// Forwards a sandbox's recorded guest ports on its (new or adopted) network; a port that cannot
// be forwarded is logged and stays recorded (GET .../ports shows it without a host port).
void expose_ports(vmm::Network& n, const std::set<uint32_t>& ports, const std::string& host,
                  const std::string& id) {
  for (auto p : ports) {
    auto e = n.expose(uint16_t(p), host);
    if (!e) spdlog::warn("sandbox {}: port {} not exposed: {}", id, p, e.error().message);
  }
}

WorkerResult failed(const std::string& e) {
  WorkerResult r;
  r.ok = false;
  r.error = e;
  return r;
}

caf::behavior vm_worker(caf::stateful_actor<WorkerState>* self, Env* env, std::string id,
                        std::string template_name, std::shared_ptr<VmHandle> handle) {
  self->state.env = env;
  self->state.id = id;
  self->state.template_name = template_name;
  self->state.handle = handle;
  log_exceptions(self, "vm worker " + id);
  return {
      [=](restore_atom, std::string snapshot_dir, bool consume, bool pooled,
          NetSpec net) -> WorkerResult {
        auto& st = self->state;
        spdlog::debug("worker {}: restore from '{}'", st.id, snapshot_dir);
        vmm::Snapshot snap;
        auto loaded = vmm::Snapshot::load(snapshot_dir);
        if (!loaded) return failed(loaded.error().message);
        snap = *loaded;
        std::string run_name = st.id + "." + random_base32(6);  // unique per incarnation
        auto config = st.env->vm_config(st.template_name, st.id, run_name);
        auto* pool = pooled ? st.env->pool_for(st.template_name, snap, net.enabled) : nullptr;
        // Without a warm pool member (forks, wakes, creates from named snapshots, an empty pool):
        // into a spare QEMU when one is ready.
        vmm::VmPool::NetworkFactory make_network;
        if (net.enabled)
          make_network = [&]() -> vmm::Result<std::shared_ptr<vmm::Network>> {
            auto n = st.env->make_network(net.egress);
            if (!n) return vmm::make_error(n.error().code, "network: " + n.error().message);
            return n;
          };
        auto* spares = st.env->spares_for(st.template_name, net.enabled);
        auto vm =
            pool ? pool->create(run_name, config.hostname, spares)
                 : vmm::restore_with_spare(st.env->io, spares, snap, config, consume, make_network);
        if (!vm) return failed(vm.error().message);
        WorkerResult r;
        if (auto n = (*vm)->config().network) {
          auto policy = Env::to_policy(net.egress);
          if (n->policy() != policy) {
            auto set = n->set_policy(policy);
            if (!set) return failed("network policy: " + set.error().message);
          }
          r.subnet = n->index();
          expose_ports(*n, net.ports, st.env->config.ports_host, st.id);
        }
        std::unique_lock l(st.handle->mu);
        st.handle->vm = std::move(*vm);
        return r;
      },
      [=](egress_atom, Egress egress) -> WorkerResult {
        auto& h = *self->state.handle;
        std::shared_lock l(h.mu);
        if (!h.vm || !h.vm->config().network) return WorkerResult{};  // applied at the next start
        auto set = h.vm->config().network->set_policy(Env::to_policy(egress));
        return set ? WorkerResult{} : failed(set.error().message);
      },
      [=](snapshot_atom, std::string dir) -> WorkerResult {
        auto& h = *self->state.handle;
        std::unique_lock l(h.mu);  // waits for commands in flight
        if (!h.vm) return failed("no VM");
        auto s = h.vm->snapshot(dir);
        return s ? WorkerResult{} : failed(s.error().message);
      },
      // A snapshot nobody can name any more (a fork's, once its children run): its RAM file is
      // tmpfs memory. Removed here, off the actor system's shared threads.
      [=](drop_atom, std::string dir) { vmm::remove_snapshot(dir); },
      [=](hibernate_atom, std::string dir) -> WorkerResult {
        auto& h = *self->state.handle;
        h.cancel_calls();
        std::unique_lock l(h.mu);
        if (!h.vm) return failed("no VM");
        auto s = h.vm->hibernate(dir);
        if (!s) return failed(s.error().message);
        h.vm.reset();
        return WorkerResult{};
      },
      [=](destroy_atom) -> WorkerResult {
        auto& h = *self->state.handle;
        h.cancel_calls();
        std::unique_lock l(h.mu);
        h.vm.reset();
        return WorkerResult{};
      },
  };
}

// ---------------------------------------------------------------------------------------------
// Sandbox actor: decide -> persist -> apply -> effects -> reply.

struct SandboxActorState {
  Env* env = nullptr;
  caf::actor registry, worker;
  SandboxState s;
  bool persisting = false;
  std::deque<std::pair<Command, caf::response_promise>> queue;
  Command current;
  caf::response_promise current_rp;
  std::vector<caf::response_promise> waiting;  // for the end of a transition (create, wake, ...)
  std::vector<std::pair<Command, caf::response_promise>> after_wake;  // execs that woke the sandbox
  std::vector<caf::response_promise> leases_after_wake;  // agent operations that woke it
  std::shared_ptr<VmHandle> handle = std::make_shared<VmHandle>();
  std::vector<SandboxInfo> fork_children;
  std::vector<Event> pending_events;  // being persisted
  uint64_t exec_seq = 0;
  uint64_t snapshot_version = 0;  // version of the newest state snapshot stored
};

using SandboxSelf = caf::stateful_actor<SandboxActorState>;

void pump(SandboxSelf* self);

void internal(SandboxSelf* self, Command c) {
  self->state.queue.emplace_back(std::move(c), caf::response_promise());
  pump(self);
}

void finish_transition(SandboxSelf* self) {
  auto& st = self->state;
  if (st.s.status == Status::running || st.s.status == Status::hibernated ||
      st.s.status == Status::stopped || st.s.status == Status::failed) {
    Answer a;
    a.info = info_of(st.s);
    if (st.s.status == Status::failed)
      a = Answer::fail(
          {"sandbox_failed", "sandbox " + st.s.id + " failed: " + st.s.failure_reason});
    if (!st.s.snapshots.empty()) a.text = st.s.snapshots.back();
    a.infos = st.fork_children;
    for (auto& rp : st.waiting) rp.deliver(a);
    st.waiting.clear();
    st.fork_children.clear();
    if (st.s.status == Status::running) {
      for (auto& [c, rp] : st.after_wake) st.queue.emplace_back(c, rp);
      st.after_wake.clear();
      for (auto& rp : st.leases_after_wake) {
        Answer lease;
        lease.vm = st.handle;
        lease.info = info_of(st.s);
        rp.deliver(lease);
      }
      st.leases_after_wake.clear();
    } else if (st.s.status != Status::hibernated) {
      for (auto& [c, rp] : st.after_wake)
        rp.deliver(Answer::fail({"sandbox_failed", "the sandbox did not wake"}));
      st.after_wake.clear();
      for (auto& rp : st.leases_after_wake)
        rp.deliver(Answer::fail({"sandbox_failed", "the sandbox did not wake"}));
      st.leases_after_wake.clear();
    }
  }
}

// Runs the side effect an applied event calls for.
void effect(SandboxSelf* self, const Event& e) {
  auto& st = self->state;
  auto to = [self](Command ok, std::function<Command(std::string)> bad) {
    return [self, ok, bad](WorkerResult r) { internal(self, r.ok ? ok : bad(r.error)); };
  };
  auto lost = [self](const caf::error& err) {
    internal(self, cmd::Fail{"worker: " + self->system().render(err)});
  };
  // A restore's outcome: started (with the subnet its network got) or failed.
  auto started = [self](WorkerResult r) {
    internal(self, r.ok ? Command{cmd::Started{r.subnet}} : Command{cmd::StartFailed{r.error}});
  };
  switch (e.kind) {
    case Event::Kind::created: {
      auto restore = [self, started, lost](std::string dir, bool pooled) {
        auto& s = self->state.s;
        self->request(self->state.worker, caf::infinite, restore_atom::value, dir, false, pooled,
                      NetSpec{s.network, s.egress, s.ports})
            .then(started, lost);
      };
      if (!e.from_snapshot.empty()) {
        restore(st.env->snapshot_dir(e.from_snapshot).string(), false);
        break;
      }
      // The template's actor bakes it (once) and answers with the staged snapshot.
      self->request(st.registry, caf::infinite, template_atom::value, e.template_name)
          .then(
              [self, restore, lost](caf::actor tmpl) {
                self->request(tmpl, caf::infinite, bake_atom::value)
                    .then(
                        [self, restore](Answer a) {
                          if (!a.ok) return internal(self, cmd::StartFailed{a.error.message});
                          restore(a.text, true);
                        },
                        lost);
              },
              lost);
      break;
    }
    case Event::Kind::transition_started:
      switch (e.transition) {
        case Transition::snapshotting:
          self->request(st.worker, caf::infinite, snapshot_atom::value,
                        st.env->snapshot_dir(e.snapshot_id).string())
              .then(to(cmd::TransitionDone{},
                       [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                    lost);
          break;
        case Transition::hibernating:
          self->request(st.worker, caf::infinite, hibernate_atom::value,
                        st.env->hibernated_dir(st.s.id).string())
              .then(to(cmd::TransitionDone{},
                       [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                    lost);
          break;
        case Transition::waking:
          self->request(st.worker, caf::infinite, restore_atom::value,
                        st.env->hibernated_dir(st.s.id).string(), true, false,
                        NetSpec{st.s.network, st.s.egress, st.s.ports})
              .then(started, lost);
          break;
        case Transition::forking: {
          uint32_t count = 1;
          if (auto* f = std::get_if<cmd::Fork>(&st.current)) count = f->count;
          ForkRequest fr{st.s.tenant, st.s.template_name, e.snapshot_id, st.s.id, count};
          auto dir = st.env->snapshot_dir(e.snapshot_id).string();
          self->request(st.worker, caf::infinite, snapshot_atom::value, dir)
              .then(
                  [self, fr, dir](WorkerResult r) {
                    if (!r.ok) return internal(self, cmd::TransitionFailed{r.error});
                    self->request(self->state.registry, caf::infinite, fork_atom::value, fr)
                        .then(
                            [self, dir](Answer a) {
                              // The children run on copies of it (or failed): the fork's
                              // snapshot is not one of the sandbox's snapshots, nobody can use
                              // it again.
                              self->send(self->state.worker, drop_atom::value, dir);
                              if (!a.ok)
                                return internal(self, cmd::TransitionFailed{a.error.message});
                              self->state.fork_children = a.infos;
                              std::vector<std::string> ids;
                              for (auto& i : a.infos) ids.push_back(i.id);
                              internal(self, cmd::TransitionDone{ids, std::nullopt});
                            },
                            [self, dir](const caf::error& err) {
                              self->send(self->state.worker, drop_atom::value, dir);
                              internal(self, cmd::TransitionFailed{self->system().render(err)});
                            });
                  },
                  lost);
          break;
        }
      }
      break;
    case Event::Kind::reaped:
      if (e.reap_action == ReapAction::hibernate) {
        self->request(st.worker, caf::infinite, hibernate_atom::value,
                      st.env->hibernated_dir(st.s.id).string())
            .then(to(cmd::TransitionDone{},
                     [](std::string m) { return Command{cmd::TransitionFailed{m}}; }),
                  lost);
      } else {
        st.handle->cancel_calls();
        caf::anon_send(st.worker, destroy_atom::value);
      }
      break;
    case Event::Kind::egress_changed:
      // The policy is recorded: a VM that cannot take it must not keep running on the old one.
      self->request(st.worker, caf::infinite, egress_atom::value, e.egress)
          .then(
              [self](WorkerResult r) {
                if (!r.ok) internal(self, cmd::Fail{"egress policy not applied: " + r.error});
              },
              lost);
      break;
    case Event::Kind::snapshot_deleted:
      // Recorded: creates from it are refused from now on. Its files go (VMs restored from it
      // keep theirs: layers are hard links, RAM was copied).
      caf::anon_send(st.worker, drop_atom::value, st.env->snapshot_dir(e.snapshot_id).string());
      break;
    case Event::Kind::killed:
    case Event::Kind::failed:
      st.handle->cancel_calls();  // commands in flight end now, not when the worker gets there
      caf::anon_send(st.worker, destroy_atom::value);
      if (fs::exists(st.env->hibernated_dir(st.s.id)))
        vmm::remove_snapshot(st.env->hibernated_dir(st.s.id));
      break;
    default:
      break;
  }
}

void pump(SandboxSelf* self) {
  auto& st = self->state;
  while (!st.persisting && !st.queue.empty()) {
    auto [c, rp] = std::move(st.queue.front());
    st.queue.pop_front();
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
    auto me = caf::actor_cast<caf::actor>(self);
    st.env->store->append_async(st.s.id, st.s.version, std::move(ne),
                                [me](storage::Result<storage::AppendResult> r) {
                                  caf::anon_send(me, persisted_atom::value, r.ok(),
                                                 r.ok() ? std::string() : r.error().message);
                                });
  }
}

void on_persisted(SandboxSelf* self, bool ok, const std::string& err,
                  const std::vector<Event>& events) {
  auto& st = self->state;
  spdlog::debug("sandbox {}: persisted ok={} {}", st.s.id, ok, err);
  st.persisting = false;
  auto rp = st.current_rp;
  if (!ok) {
    rp.deliver(Answer::fail({"storage_error", err}));
    pump(self);
    return;
  }
  for (auto& e : events) {
    st.s = apply(st.s, e);
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
  bool transition = st.s.status == Status::creating || st.s.status == Status::snapshotting ||
                    st.s.status == Status::forking || st.s.status == Status::hibernating ||
                    st.s.status == Status::waking;
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
    st.waiting.push_back(rp);
  } else {
    Answer a;
    a.info = info_of(st.s);
    rp.deliver(a);
  }
  for (auto& e : events) effect(self, e);
  finish_transition(self);
  pump(self);
}

caf::behavior sandbox_actor(SandboxSelf* self, Env* env, caf::actor registry,
                            SandboxState initial) {
  auto& st = self->state;
  st.env = env;
  st.registry = registry;
  st.s = initial;
  st.snapshot_version = initial.version;  // recovered sandboxes: no need to snapshot at once
  if (initial.status == Status::running) st.handle->vm = env->take_adopted(initial.id);
  log_exceptions(self, "sandbox " + initial.id);
  // The VM worker knows its template; a new sandbox gets it with its Create command.
  if (!initial.template_name.empty())
    st.worker = self->spawn<caf::detached + caf::linked>(vm_worker, env, initial.id,
                                                         initial.template_name, st.handle);
  return {
      [=](cmd_atom, Command c) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        if (auto* cr = std::get_if<cmd::Create>(&c); cr && !self->state.worker)
          self->state.worker = self->spawn<caf::detached + caf::linked>(
              vm_worker, self->state.env, self->state.s.id,
              cr->template_name.empty() ? "base" : cr->template_name, self->state.handle);
        self->state.queue.emplace_back(std::move(c), rp);
        pump(self);
        return rp;
      },
      [=](exec_atom, std::string command) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        std::string id = "x" + std::to_string(++self->state.exec_seq);
        self->state.queue.emplace_back(Command{cmd::Exec{id, std::move(command)}}, rp);
        pump(self);
        return rp;
      },
      // A lease on the running VM for agent operations that are not recorded (files, processes).
      [=](lease_atom) -> caf::result<Answer> {
        auto& st = self->state;
        if (st.s.status == Status::running) {
          Answer a;
          a.info = info_of(st.s);
          a.vm = st.handle;
          return a;
        }
        if (st.s.status == Status::hibernated && st.s.auto_wake) {
          auto rp = self->make_response_promise();
          st.leases_after_wake.push_back(rp);
          internal(self, cmd::Wake{});
          return rp;
        }
        if (st.s.status == Status::waking) {
          auto rp = self->make_response_promise();
          st.leases_after_wake.push_back(rp);
          return rp;
        }
        return Answer::fail(not_running(st.s, "use it"));
      },
      [=](persisted_atom, bool ok, std::string err) {
        auto events = std::move(self->state.pending_events);
        on_persisted(self, ok, err, events);
      },
      [=](get_atom) -> Answer {
        Answer a;
        a.info = info_of(self->state.s);
        return a;
      },
  };
}

// ---------------------------------------------------------------------------------------------
// Registry: the id space, routing with tenant checks, the TTL reaper, shutdown.

struct RegistryState {
  Env* env = nullptr;
  std::map<std::string, caf::actor> templates;  // template actors, spawned on first use
  std::map<std::string, caf::actor> actors;
  std::map<std::string, SandboxInfo> infos;
  // Recovered sandboxes that ended but still own named snapshots: their actor is spawned when a
  // command needs it (deleting one of those snapshots).
  std::map<std::string, SandboxState> ended;
};

using RegistrySelf = caf::stateful_actor<RegistryState>;

caf::actor spawn_sandbox(RegistrySelf* self, SandboxState s) {
  auto a = self->spawn(sandbox_actor, self->state.env, caf::actor_cast<caf::actor>(self), s);
  self->state.actors[s.id] = a;
  self->state.infos[s.id] = info_of(s);
  return a;
}

// Spawns a sandbox actor and sends it the Create command for `req`; `then` gets its answer.
template <typename Then>
void start_sandbox(RegistrySelf* self, const CreateRequest& req, const std::string& parent,
                   const std::string& snapshot, Then then) {
  SandboxState s;
  s.id = new_sandbox_id();
  auto a = spawn_sandbox(self, s);
  cmd::Create c;
  c.tenant = req.tenant;
  c.template_name = req.template_name;
  c.ttl_seconds = req.ttl_seconds;
  c.metadata = req.metadata;
  c.persistent = req.persistent;
  c.auto_wake = req.auto_wake;
  c.parent = parent;
  c.from_snapshot = snapshot;
  c.vcpus = self->state.env->config.vcpus;
  c.memory_mib = self->state.env->config.memory_mib;
  c.network = req.network.value_or(false);
  if (c.network) c.egress = req.egress.value_or(Egress{});
  self->request(a, caf::infinite, cmd_atom::value, Command{c})
      .then([then](Answer ans) mutable { then(std::move(ans)); },
            [then, self](const caf::error& e) mutable {
              then(Answer::fail({"internal", self->system().render(e)}));
            });
}

caf::result<Answer> create_in(RegistrySelf* self, CreateRequest req, std::string parent,
                              std::string snapshot) {
  auto rp = self->make_response_promise();
  start_sandbox(self, req, parent, snapshot, [rp](Answer ans) mutable { rp.deliver(ans); });
  return rp;
}

// Sends `msg` to `to` and answers the current request with its answer.
caf::result<Answer> forward(RegistrySelf* self, caf::actor to, caf::message msg) {
  auto rp = self->make_response_promise();
  self->request(to, caf::infinite, std::move(msg))
      .then([rp](Answer ans) mutable { rp.deliver(ans); },
            [rp, self](const caf::error& e) mutable {
              rp.deliver(Answer::fail({"internal", self->system().render(e)}));
            });
  return rp;
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
    self->quit(msg.reason);
  });
  self->delayed_send(self, env->config.reaper_interval, tick_atom::value);
  auto find = [self](const std::string& tenant, const std::string& id) -> caf::actor {
    auto it = self->state.infos.find(id);
    if (it == self->state.infos.end() || it->second.tenant != tenant) return caf::actor();
    auto a = self->state.actors.find(id);
    return a == self->state.actors.end() ? caf::actor() : a->second;
  };
  return {
      [=](create_atom, CreateRequest req) -> caf::result<Answer> {
        std::string snapshot;
        if (!req.from_snapshot.empty()) {
          // Only a snapshot taken from one of this tenant's sandboxes.
          bool mine = false;
          for (auto& [id, i] : self->state.infos)
            if (i.tenant == req.tenant)
              for (auto& s : i.snapshots)
                if (s == req.from_snapshot) {
                  mine = true;
                  req.template_name = i.template_name;  // the snapshot's VM shape and image
                }
          if (!mine)
            return Answer::fail({"snapshot_not_found", "no snapshot " + req.from_snapshot});
          snapshot = req.from_snapshot;
        }
        return create_in(self, req, "", snapshot);
      },
      [=](fork_atom, ForkRequest fr) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        struct Collect {
          std::vector<SandboxInfo> infos;
          std::optional<Rejection> error;
          uint32_t left;
        };
        auto col = std::make_shared<Collect>(Collect{{}, std::nullopt, fr.count});
        const auto& parent_info = self->state.infos[fr.parent];
        CreateRequest req;
        req.tenant = fr.tenant;
        req.template_name = fr.template_name;
        req.metadata = parent_info.metadata;
        req.persistent = parent_info.persistent;
        req.network = parent_info.network;  // children get networks of their own, same policy
        req.egress = parent_info.egress;
        for (uint32_t i = 0; i < fr.count; ++i) {
          start_sandbox(self, req, fr.parent, fr.snapshot_id, [rp, col](Answer ans) mutable {
            if (ans.ok)
              col->infos.push_back(ans.info);
            else
              col->error = ans.error;
            if (--col->left == 0) {
              if (col->error) {
                rp.deliver(Answer::fail(*col->error));
              } else {
                Answer a;
                a.infos = col->infos;
                rp.deliver(a);
              }
            }
          });
        }
        return rp;
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
        for (auto& [id, i] : self->state.infos) {
          if ((q.tenant != "*" && i.tenant != q.tenant) || i.status == Status::none) continue;
          if (q.status && i.status != *q.status) continue;
          bool match = true;
          for (auto& [k, v] : q.metadata) {
            auto m = i.metadata.find(k);
            match &= m != i.metadata.end() && m->second == v;
          }
          if (match) a.infos.push_back(i);
        }
        return a;
      },
      [=](route_atom, std::string tenant, std::string id, Command c) -> caf::result<Answer> {
        auto a = find(tenant, id);
        if (!a) return Answer::fail(not_found(id));
        return forward(self, a, caf::make_message(cmd_atom::value, std::move(c)));
      },
      [=](exec_atom, std::string tenant, std::string id,
          std::string command) -> caf::result<Answer> {
        auto a = find(tenant, id);
        if (!a) return Answer::fail(not_found(id));
        return forward(self, a, caf::make_message(exec_atom::value, std::move(command)));
      },
      [=](lease_atom, std::string tenant, std::string id) -> caf::result<Answer> {
        auto a = find(tenant, id);
        if (!a) return Answer::fail(not_found(id));
        return forward(self, a, caf::make_message(lease_atom::value));
      },
      [=](template_atom, std::string name) -> caf::actor {
        auto& t = self->state.templates[name];
        if (!t) t = self->spawn<caf::detached + caf::linked>(template_actor, self->state.env, name);
        return t;
      },
      [=](info_atom, SandboxInfo info) { self->state.infos[info.id] = info; },
      [=](adopt_atom, SandboxState s) {
        if (s.live()) {
          spawn_sandbox(self, s);
        } else {
          self->state.infos[s.id] = info_of(s);
          if (!s.snapshots.empty()) self->state.ended[s.id] = s;
        }
      },
      [=](delsnap_atom, std::string tenant, std::string snapshot) -> caf::result<Answer> {
        // The tenant's sandbox that took it (alive or ended).
        std::string owner;
        for (auto& [id, i] : self->state.infos)
          if (i.tenant == tenant &&
              std::find(i.snapshots.begin(), i.snapshots.end(), snapshot) != i.snapshots.end())
            owner = id;
        if (owner.empty()) return Answer::fail({"snapshot_not_found", "no snapshot " + snapshot});
        auto a = self->state.actors.find(owner);
        caf::actor actor = a == self->state.actors.end() ? caf::actor() : a->second;
        if (!actor) {
          auto e = self->state.ended.find(owner);
          if (e == self->state.ended.end())
            return Answer::fail({"snapshot_not_found", "no snapshot " + snapshot});
          actor = spawn_sandbox(self, e->second);
          self->state.ended.erase(e);
        }
        return forward(self, actor,
                       caf::make_message(cmd_atom::value, Command{cmd::DeleteSnapshot{snapshot}}));
      },
      [=](tick_atom) {
        int64_t now = now_ms();
        for (auto& [id, i] : self->state.infos) {
          if (i.status != Status::running || i.expires_at_ms > now) continue;
          auto a = self->state.actors.find(id);
          if (a != self->state.actors.end())
            caf::anon_send(a->second, cmd_atom::value, Command{cmd::Reap{}});
        }
        self->delayed_send(self, self->state.env->config.reaper_interval, tick_atom::value);
      },
      [=](shutdown_atom) -> caf::result<Answer> {
        auto rp = self->make_response_promise();
        auto left = std::make_shared<size_t>(0);
        for (auto& [id, i] : self->state.infos) {
          bool live = i.status != Status::none && i.status != Status::stopped &&
                      i.status != Status::failed && i.status != Status::hibernated;
          if (live) ++*left;
        }
        if (*left == 0) {
          rp.deliver(Answer{});
          return rp;
        }
        for (auto& [id, i] : self->state.infos) {
          bool live = i.status != Status::none && i.status != Status::stopped &&
                      i.status != Status::failed && i.status != Status::hibernated;
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
  };
}

}  // namespace

std::string new_sandbox_id() { return "sbx_" + random_base32(16); }

// ---------------------------------------------------------------------------------------------

struct Runtime::Impl {
  std::unique_ptr<Env> env;
  std::unique_ptr<storage::KeyStore> keys;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor registry;

  // Every call has a deadline: a stuck effect is an error for the caller, never a hang.
  Answer ask(caf::message msg) {
    caf::scoped_actor self{*sys};
    Answer out = Answer::fail({"internal", "no answer"});
    self->request(registry, std::chrono::seconds(300), std::move(msg))
        .receive([&](Answer& a) { out = std::move(a); },
                 [&](caf::error& e) {
                   out = Answer::fail({"internal", sys->render(e)});
                 });
    return out;
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  if (!impl_ || !impl_->sys) return;
  impl_->ask(caf::make_message(shutdown_atom::value));
  caf::anon_send_exit(impl_->registry, caf::exit_reason::user_shutdown);
  impl_->registry = nullptr;
  impl_->sys.reset();  // waits for every actor (and so every VM worker) to finish
  // Pool members and spares go now, while the subnet book-keeping their networks report to lives.
  impl_->env->pools.clear();
  impl_->env->spares.clear();
  const auto& cfg = impl_->env->config;
  if (cfg.network) {
    // Every VM is gone (hibernated or killed): so are their networks, and the host table.
    vmm::Network::remove_leftovers(cfg.net, {});
    vmm::Network::remove_host_rules(cfg.net);
  }
}

Reply<std::unique_ptr<Runtime>> Runtime::start(RuntimeConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->env = std::make_unique<Env>();
  Env& env = *impl->env;
  if (config.state_dir.empty())
    config.state_dir =
        "/dev/shm/pandastack-" + vmm::fnv1a_hex(fs::absolute(config.data_dir).string());
  env.config = config;
  for (auto sub : {"run", "snapshots", "hibernated", "templates"})
    fs::create_directories(config.state_dir / sub);
  auto store = storage::EventStore::open({config.data_dir / "store", true, 1024, {}});
  if (!store) return Rejection{"storage_error", store.error().message};
  env.store = std::move(*store);
  impl->keys = std::make_unique<storage::KeyStore>(*env.store);
  env.templates = std::make_unique<vmm::TemplateStore>(env.io, config.images_dir);
  if (config.network) {
    auto pool = vmm::SubnetPool::parse(config.net.pool_cidr);
    if (!pool) return Rejection{"invalid_argument", "subnet pool: " + pool.error().message};
    env.subnet_capacity = pool->capacity();
    auto host = vmm::Network::install_host_rules(config.net);
    if (!host) return Rejection{"network_error", "sandbox networking: " + host.error().message};
  }

  // Recovery: replay every sandbox's stream.
  auto streams = env.store->streams("sbx_");
  if (!streams) return Rejection{"storage_error", streams.error().message};
  std::vector<SandboxState> recovered;
  std::set<std::string> keep_run;
  size_t from_snapshots = 0, adopted = 0;
  // Run folders of VMs the previous host process left (named <sandbox id>.<suffix>).
  std::map<std::string, fs::path> run_dirs;
  std::vector<fs::path> recorded;  // every folder with a live record
  {
    std::error_code ec;
    for (auto& d : fs::directory_iterator(config.state_dir / "run", ec)) {
      auto name = d.path().filename().string();
      if (!fs::exists(d.path() / "vm.json")) continue;
      recorded.push_back(d.path());
      // The VM's name (its sandbox id + "." + suffix; pooled VMs were renamed when taken).
      std::ifstream in(d.path() / "vm.json");
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto record = wire::Json::parse(text);
      std::string vm_name =
          record && (*record)["name"].is_string() ? (*record)["name"].as_string() : name;
      run_dirs[vm_name.substr(0, vm_name.find('.'))] = d.path();
    }
  }
  for (auto& id : *streams) {
    SandboxState s;
    s.id = id;
    // The newest state snapshot, then the events after it.
    auto snap = env.store->load_snapshot(id);
    if (!snap) return Rejection{"storage_error", snap.error().message};
    if (*snap && (*snap)->format == state_format()) {
      if (auto decoded = decode_state((*snap)->state);
          decoded && decoded->id == id && decoded->version == (*snap)->version) {
        s = *decoded;
        ++from_snapshots;
      } else {
        spdlog::warn("recovery: {}: unreadable state snapshot, replaying all events", id);
      }
    }
    auto events = env.store->read_stream(id, s.version + 1);
    if (!events) return Rejection{"storage_error", events.error().message};
    for (auto& stored : *events) {
      auto e = decode_event(stored.payload);
      if (!e)
        return Rejection{"storage_error",
                         "undecodable event " + std::to_string(stored.version) + " of " + id};
      s = apply(s, *e);
    }
    std::string lost;
    if (s.status == Status::hibernated && !fs::exists(env.hibernated_dir(id) / "meta.json")) {
      lost = "hibernation_snapshot_lost";
    } else if (s.status == Status::running && run_dirs.count(id)) {
      // Its VM may have outlived the previous host process: take it over.
      auto vm = vmm::Vm::adopt(env.io, run_dirs[id], std::chrono::seconds(10));
      if (vm && s.subnet && config.network) {
        // Its network too (the namespace outlived the host process with the VM).
        auto net = vmm::Network::adopt(config.net, *s.subnet);
        if (net) {
          auto set = (*net)->set_policy(Env::to_policy(s.egress));
          if (!set) net = set.error();
        }
        if (net) {
          env.subnets_used.insert(*s.subnet);
          env.own(**net);
          // The forwards died with the previous host process: expose the ports again.
          expose_ports(**net, s.ports, config.ports_host, id);
          (*vm)->attach_network(*net);
        } else {
          spdlog::warn("recovery: {}: network not adopted: {}", id, net.error().message);
          vm = net.error();
        }
      }
      if (vm) {
        keep_run.insert(run_dirs[id].filename().string());
        env.adopted[id] = std::move(*vm);
        ++adopted;
      } else {
        spdlog::info("recovery: {}: VM not adopted: {}", id,
                     vm.error().message.substr(0, vm.error().message.find('\n')));
        lost = "host_restart";
      }
    } else if (s.live() && s.status != Status::hibernated) {
      lost = "host_restart";  // its VM died with the previous host process, or was mid-change
    }
    if (!lost.empty()) {
      Event f;
      f.kind = Event::Kind::failed;
      f.at_ms = now_ms();
      f.reason = lost;
      auto r =
          env.store->append(id, s.version, {{to_string(f.kind), event_format(), encode_event(f)}});
      if (!r) return Rejection{"storage_error", r.error().message};
      s = apply(s, f);
      spdlog::info("recovery: {} failed ({})", id, lost);
    }
    recovered.push_back(s);
  }
  // Every other VM the previous host left is killed (no orphan QEMU survives unaccounted), and
  // every other run folder (and jail root) goes.
  std::error_code ec;
  for (auto& dir : recorded) {
    if (keep_run.count(dir.filename().string())) continue;
    // (A 1 ms deadline: nothing is wanted from it but its end; the failed adopt kills it.)
    auto orphan = vmm::Vm::adopt(env.io, dir, std::chrono::milliseconds(1));
    if (orphan)
      spdlog::info("recovery: killing the VM in {} (no running sandbox owns it)", dir.string());
    // ~Vm (or the failed adopt) kills the process and removes its folders.
  }
  for (auto& d : fs::directory_iterator(config.state_dir / "run", ec)) {
    auto name = d.path().filename().string();
    bool keep = keep_run.count(name) || (name.size() > 5 && name.ends_with(".jail") &&
                                         keep_run.count(name.substr(0, name.size() - 5)));
    if (!keep) fs::remove_all(d.path(), ec);
  }

  // Snapshot folders no sandbox names (a fork's that a crash left behind, one being taken when the
  // host died): tmpfs memory nobody can use any more. Named snapshots outlive their sandbox.
  {
    std::set<std::string> named;
    for (auto& s : recovered) named.insert(s.snapshots.begin(), s.snapshots.end());
    std::vector<fs::path> unnamed;
    for (auto& d : fs::directory_iterator(config.state_dir / "snapshots", ec))
      if (!named.count(d.path().filename().string())) unnamed.push_back(d.path());
    for (auto& d : unnamed) {
      spdlog::info("recovery: removing snapshot {} (no sandbox names it)", d.filename().string());
      vmm::remove_snapshot(d);
    }
  }

  if (config.network) {
    int removed = vmm::Network::remove_leftovers(config.net, env.subnets_used);
    if (removed) spdlog::info("recovery: removed {} leftover sandbox network parts", removed);
  }

  impl->cfg = std::make_unique<caf::actor_system_config>();
  impl->cfg->set("scheduler.policy", caf::atom("sharing"));
  impl->sys = std::make_unique<caf::actor_system>(*impl->cfg);
  impl->registry = impl->sys->spawn(registry_actor, impl->env.get());
  for (auto& s : recovered) caf::anon_send(impl->registry, adopt_atom::value, s);
  spdlog::info("runtime: {} sandboxes recovered from {} ({} from state snapshots, {} VMs adopted)",
               recovered.size(), (config.data_dir / "store").string(), from_snapshots, adopted);
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

namespace {
template <typename T, typename F>
Reply<T> to_reply(const Answer& a, F&& pick) {
  if (!a.ok) return a.error;
  return pick(a);
}
}  // namespace

namespace {
bool valid_template_name(const std::string& n) {
  if (n.empty() || n.size() > 64 || n == "kernel" || n == "initramfs") return false;
  for (char c : n)
    if (!(std::islower((unsigned char)c) || std::isdigit((unsigned char)c) || c == '-' || c == '_'))
      return false;
  return true;
}
}  // namespace

std::vector<TemplateInfo> Runtime::templates() {
  std::vector<TemplateInfo> out;
  std::error_code ec;
  for (auto& d : fs::directory_iterator(impl_->env->config.images_dir, ec)) {
    auto name = d.path().filename().string();
    if (!valid_template_name(name) || !fs::exists(d.path() / "rootfs.qcow2")) continue;
    bool baked = fs::exists(d.path() / "baked") && !fs::is_empty(d.path() / "baked", ec);
    out.push_back({name, baked});
  }
  std::sort(out.begin(), out.end(),
            [](const TemplateInfo& a, const TemplateInfo& b) { return a.name < b.name; });
  return out;
}

namespace {
// Checks and normalizes an egress policy; domain allowlists are refused until the platform
// resolver exists (501 at the gateway), never silently ignored.
std::optional<Rejection> check_egress(Egress& e, bool have_resolver) {
  auto mode = vmm::egress_mode_from_string(e.mode);
  if (!mode)
    return Rejection{"invalid_argument",
                     "egress mode '" + e.mode + "' is not one of deny_all, allow_all, allowlist"};
  vmm::EgressPolicy p;
  p.mode = *mode;
  p.cidrs = e.cidrs;
  p.domains = e.domains;
  auto v = vmm::validate(p);
  if (!v) return Rejection{"invalid_argument", "egress: " + v.error().message};
  if (!v->domains.empty() && !have_resolver)
    return Rejection{
        "not_implemented",
        "domain names in an egress allowlist need the platform resolver, and this host "
        "has no upstream DNS server (--dns-upstream): allow CIDRs instead"};
  e.cidrs = v->cidrs;
  e.domains = v->domains;
  return std::nullopt;
}
}  // namespace

Reply<SandboxInfo> Runtime::create(const CreateRequest& request) {
  CreateRequest r = request;
  const auto& cfg = impl_->env->config;
  if (r.network.value_or(false) && !cfg.network)
    return Rejection{"network_disabled", "sandbox networking is off on this host"};
  if (!r.network) {
    // The template's default (IMAGES/<template>/network, from its recipe), else on.
    std::ifstream f(cfg.images_dir / r.template_name / "network");
    std::string word;
    f >> word;
    r.network = cfg.network && word != "off";
  }
  if (*r.network) {
    r.egress = r.egress.value_or(cfg.default_egress);
    if (auto bad = check_egress(*r.egress, !cfg.net.dns_upstream.empty())) return *bad;
  } else if (r.egress) {
    return Rejection{"invalid_argument", "an egress policy needs a network (network: false given)"};
  }
  if (r.from_snapshot.empty()) {
    if (!valid_template_name(r.template_name))
      return Rejection{"invalid_argument",
                       "template names are 1-64 characters of a-z, 0-9, '-' and '_'"};
    if (!fs::exists(impl_->env->config.images_dir / r.template_name / "rootfs.qcow2"))
      return Rejection{"template_not_found",
                       "no template '" + r.template_name + "' (build it with make guest)"};
  }
  return to_reply<SandboxInfo>(impl_->ask(caf::make_message(create_atom::value, r)),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::get(const std::string& tenant, const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(caf::make_message(get_atom::value, tenant, id)),
                               [](const Answer& a) { return a.info; });
}

Reply<std::vector<SandboxInfo>> Runtime::list(const std::string& tenant,
                                              std::optional<Status> status,
                                              const std::map<std::string, std::string>& metadata) {
  return to_reply<std::vector<SandboxInfo>>(
      impl_->ask(caf::make_message(list_atom::value, ListQuery{tenant, status, metadata})),
      [](const Answer& a) { return a.infos; });
}

namespace {
caf::message route(const std::string& tenant, const std::string& id, Command c) {
  return caf::make_message(route_atom::value, tenant, id, std::move(c));
}
}  // namespace

Reply<SandboxInfo> Runtime::hibernate(const std::string& tenant, const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::Hibernate{})),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::wake(const std::string& tenant, const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::Wake{})),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::kill(const std::string& tenant, const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::Kill{})),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::set_ttl(const std::string& tenant, const std::string& id,
                                    uint32_t ttl) {
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::SetTtl{ttl})),
                               [](const Answer& a) { return a.info; });
}

namespace {
// The sandbox's exposed ports, after `change` ran on its VM's network (when the VM runs).
Reply<std::vector<PortInfo>> ports_after(Runtime::Impl& impl, const std::string& tenant,
                                         const std::string& id, const SandboxInfo& info,
                                         const std::function<vmm::Status(vmm::Network&)>& change) {
  std::map<uint16_t, uint16_t> live;
  if (info.status == Status::running) {
    Answer a = impl.ask(caf::make_message(lease_atom::value, tenant, id));
    if (a.ok) {
      std::shared_lock l(a.vm->mu);
      if (a.vm->vm && a.vm->vm->config().network) {
        auto& net = *a.vm->vm->config().network;
        if (change) {
          auto st = change(net);
          if (!st) return Rejection{"network_error", st.error().message};
        }
        live = net.exposed();
      }
    }
  }
  std::vector<PortInfo> out;
  for (auto p : info.ports) {
    PortInfo pi;
    pi.port = p;
    pi.host = impl.env->config.ports_host;
    if (auto it = live.find(uint16_t(p)); it != live.end()) pi.host_port = it->second;
    out.push_back(pi);
  }
  return out;
}
}  // namespace

Reply<std::vector<PortInfo>> Runtime::expose_port(const std::string& tenant, const std::string& id,
                                                  uint32_t port) {
  Answer a = impl_->ask(route(tenant, id, cmd::ExposePort{port}));
  if (!a.ok) return a.error;
  const auto& host = impl_->env->config.ports_host;
  return ports_after(*impl_, tenant, id, a.info, [&](vmm::Network& n) -> vmm::Status {
    auto p = n.expose(uint16_t(port), host);
    if (!p) return p.error();
    return vmm::Ok{};
  });
}

Reply<std::vector<PortInfo>> Runtime::unexpose_port(const std::string& tenant,
                                                    const std::string& id, uint32_t port) {
  Answer a = impl_->ask(route(tenant, id, cmd::UnexposePort{port}));
  if (!a.ok) return a.error;
  return ports_after(*impl_, tenant, id, a.info, [&](vmm::Network& n) -> vmm::Status {
    n.unexpose(uint16_t(port));
    return vmm::Ok{};
  });
}

Reply<std::vector<PortInfo>> Runtime::ports(const std::string& tenant, const std::string& id) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  return ports_after(*impl_, tenant, id, *info, nullptr);
}

Reply<SandboxInfo> Runtime::set_egress(const std::string& tenant, const std::string& id,
                                       const Egress& egress) {
  Egress e = egress;
  if (auto bad = check_egress(e, !impl_->env->config.net.dns_upstream.empty())) return *bad;
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::SetEgress{e})),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::set_metadata(const std::string& tenant, const std::string& id,
                                         const std::map<std::string, std::string>& metadata) {
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::SetMetadata{metadata})),
                               [](const Answer& a) { return a.info; });
}

Reply<std::string> Runtime::snapshot(const std::string& tenant, const std::string& id) {
  std::string snap = "snap_" + random_base32(16);
  return to_reply<std::string>(impl_->ask(route(tenant, id, cmd::Snapshot{snap})),
                               [](const Answer& a) { return a.text; });
}

Reply<SandboxInfo> Runtime::delete_snapshot(const std::string& tenant,
                                            const std::string& snapshot_id) {
  return to_reply<SandboxInfo>(
      impl_->ask(caf::make_message(delsnap_atom::value, tenant, snapshot_id)),
      [](const Answer& a) { return a.info; });
}

Reply<std::vector<SandboxInfo>> Runtime::fork(const std::string& tenant, const std::string& id,
                                              uint32_t count) {
  std::string snap = "snap_" + random_base32(16);
  return to_reply<std::vector<SandboxInfo>>(impl_->ask(route(tenant, id, cmd::Fork{snap, count})),
                                            [](const Answer& a) { return a.infos; });
}

// ---------------------------------------------------------------------------------------------
// Agent operations: a lease from the sandbox actor, then the call on the caller's thread.

namespace {

Rejection rejection_of(const vmm::Error& e) {
  if (e.message == "cancelled") return {"cancelled", "the command was cancelled"};
  switch (e.code) {
    case vmm::ErrorCode::not_found:
      return {"file_not_found", e.message};
    case vmm::ErrorCode::invalid_argument:
      return {"invalid_argument", e.message};
    case vmm::ErrorCode::timeout:
      return {"timeout", e.message};
    default:
      return {"agent_error", e.message};
  }
}

// Runs `f(agent, stop)` against the leased VM under its shared lock. `stop` fires when the caller
// asks (`user`) or when the sandbox is hibernated or killed.
template <typename T, typename F>
Reply<T> with_vm(VmHandle& h, std::stop_token user, F&& f) {
  std::stop_source mine;
  auto calls = h.calls_stop();
  std::stop_callback on_user(user, [&] { mine.request_stop(); });
  std::stop_callback on_sandbox(calls->get_token(), [&] { mine.request_stop(); });
  std::shared_lock l(h.mu);
  if (!h.vm) return Rejection{"sandbox_not_running", "the sandbox's VM is gone"};
  auto r = f(h.vm->agent(), mine.get_token());
  if (!r) {
    if (calls->stop_requested() && !user.stop_requested())
      return Rejection{"sandbox_stopped", "the sandbox was stopped or hibernated during the call"};
    return rejection_of(r.error());
  }
  return T(std::move(*r));
}

std::string describe_command(const vmm::ExecRequest& r) {
  std::string c;
  if (r.argv.empty()) {
    c = r.shell;
  } else {
    for (auto& a : r.argv) c += (c.empty() ? "" : " ") + a;
  }
  constexpr size_t kMax = 1024;  // the audit log keeps the start of long commands
  if (c.size() > kMax) c = c.substr(0, kMax) + "...";
  return c;
}

}  // namespace

template <typename T, typename F>
Reply<T> leased(Runtime::Impl& impl, const std::string& tenant, const std::string& id,
                std::stop_token stop, F&& f) {
  Answer a = impl.ask(caf::make_message(lease_atom::value, tenant, id));
  if (!a.ok) return a.error;
  return with_vm<T>(*a.vm, stop, std::forward<F>(f));
}

namespace {
Reply<vmm::ExecResult> run_exec(Runtime::Impl& impl, const std::string& tenant,
                                const std::string& id, const vmm::ExecRequest& req,
                                vmm::OutputCallback cb, std::stop_token stop) {
  Answer a = impl.ask(caf::make_message(exec_atom::value, tenant, id, describe_command(req)));
  if (!a.ok) return a.error;
  auto r = with_vm<vmm::ExecResult>(*a.vm, stop, [&](vmm::AgentClient& agent, std::stop_token t) {
    return cb ? agent.exec_stream(req, cb, t) : agent.exec(req, t);
  });
  cmd::ExecFinished f{a.exec_id, -1, 0, false};
  if (r) f = {a.exec_id, r->exit_code, uint32_t(r->duration_us / 1000), r->timed_out};
  // Recorded before the answer; a sandbox killed meanwhile refuses it (its execs ended with it).
  impl.ask(route(tenant, id, f));
  if (r && !r->error.empty()) return Rejection{"exec_failed", r->error};
  return r;
}
}  // namespace

namespace {
template <typename F>
vmm::Result<bool> as_bool(F&& f) {
  auto s = f();
  if (!s) return s.error();
  return true;
}
}  // namespace

Reply<vmm::ExecResult> Runtime::exec(const std::string& tenant, const std::string& id,
                                     const vmm::ExecRequest& req, std::stop_token stop) {
  return run_exec(*impl_, tenant, id, req, nullptr, stop);
}

Reply<vmm::ExecResult> Runtime::exec_stream(const std::string& tenant, const std::string& id,
                                            const vmm::ExecRequest& req,
                                            vmm::OutputCallback on_output, std::stop_token stop) {
  return run_exec(*impl_, tenant, id, req, std::move(on_output), stop);
}

Reply<uint32_t> Runtime::start_process(const std::string& tenant, const std::string& id,
                                       const vmm::ExecRequest& req) {
  return leased<uint32_t>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return ag.start_process(req);
  });
}

Reply<std::vector<vmm::ProcessInfo>> Runtime::list_processes(const std::string& tenant,
                                                             const std::string& id) {
  return leased<std::vector<vmm::ProcessInfo>>(
      *impl_, tenant, id, {},
      [&](vmm::AgentClient& ag, std::stop_token) { return ag.list_processes(); });
}

Reply<bool> Runtime::kill_process(const std::string& tenant, const std::string& id, uint32_t pid,
                                  int signal) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.kill_process(pid, signal); });
  });
}

Reply<bool> Runtime::write_stdin(const std::string& tenant, const std::string& id, uint32_t pid,
                                 std::string_view data, bool close) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.write_stdin(pid, data, close); });
  });
}

Reply<vmm::ExecResult> Runtime::stream_process(const std::string& tenant, const std::string& id,
                                               uint32_t pid, vmm::OutputCallback on_output,
                                               std::stop_token stop) {
  return leased<vmm::ExecResult>(*impl_, tenant, id, stop,
                                 [&](vmm::AgentClient& ag, std::stop_token t) {
                                   return ag.stream_process(pid, on_output, t);
                                 });
}

Reply<std::string> Runtime::read_file(const std::string& tenant, const std::string& id,
                                      const std::string& path, uint64_t max_bytes) {
  auto r = leased<std::string>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return ag.read_file(path, max_bytes);
  });
  if (!r && r.error().code == "invalid_argument" &&
      r.error().message.find("more than the limit") != std::string::npos)
    return Rejection{"file_too_large", r.error().message};
  return r;
}

Reply<bool> Runtime::write_file(const std::string& tenant, const std::string& id,
                                const std::string& path, std::string_view data, uint32_t mode) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.write_file(path, data, mode, true); });
  });
}

Reply<std::vector<vmm::FileStat>> Runtime::list_dir(const std::string& tenant,
                                                    const std::string& id,
                                                    const std::string& path) {
  return leased<std::vector<vmm::FileStat>>(
      *impl_, tenant, id, {},
      [&](vmm::AgentClient& ag, std::stop_token) { return ag.list_dir(path); });
}

Reply<vmm::FileStat> Runtime::stat(const std::string& tenant, const std::string& id,
                                   const std::string& path) {
  return leased<vmm::FileStat>(
      *impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) { return ag.stat(path); });
}

Reply<bool> Runtime::remove(const std::string& tenant, const std::string& id,
                            const std::string& path, bool recursive) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.remove(path, recursive); });
  });
}

Reply<bool> Runtime::rename(const std::string& tenant, const std::string& id,
                            const std::string& from, const std::string& to) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.rename(from, to); });
  });
}

Reply<bool> Runtime::mkdir(const std::string& tenant, const std::string& id,
                           const std::string& path, bool parents) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.mkdir(path, parents); });
  });
}

// ---------------------------------------------------------------------------------------------
// Audit log, counts, keys.

Reply<std::vector<AuditEvent>> Runtime::audit(const AuditQuery& q) {
  std::optional<std::set<std::string>> allowed;
  if (!q.tenant.empty()) {
    Answer a = impl_->ask(caf::make_message(list_atom::value, ListQuery{q.tenant, {}, {}}));
    if (!a.ok) return a.error;
    allowed.emplace();
    for (auto& i : a.infos) allowed->insert(i.id);
    if (!q.stream.empty() && !allowed->count(q.stream)) return not_found(q.stream);
  }
  auto& store = *impl_->env->store;
  storage::Result<std::vector<storage::StoredEvent>> rows =
      !q.stream.empty() ? store.read_stream(q.stream)
      : q.from_ms > 0   ? store.read_time_range(q.from_ms, q.to_ms > 0 ? q.to_ms : INT64_MAX)
                        : store.read_all(q.after_seq + 1, allowed ? SIZE_MAX : q.limit);
  if (!rows) return Rejection{"storage_error", rows.error().message};
  std::vector<AuditEvent> out;
  for (auto& r : *rows) {
    if (out.size() >= q.limit) break;
    if (r.global_seq <= q.after_seq) continue;
    if (q.from_ms > 0 && r.time_ms < q.from_ms) continue;
    if (q.to_ms > 0 && r.time_ms >= q.to_ms) continue;
    if (allowed && !allowed->count(r.stream)) continue;
    auto e = decode_event(r.payload);
    out.push_back({r.stream, r.version, r.global_seq, r.time_ms, r.type,
                   e ? event_to_json(*e) : std::string("{\"kind\":\"undecodable\"}")});
  }
  return out;
}

RuntimeCounts Runtime::counts() {
  RuntimeCounts c;
  Answer a = impl_->ask(caf::make_message(list_atom::value, ListQuery{"*", {}, {}}));
  for (auto& i : a.infos) ++c.by_status[to_string(i.status)];
  return c;
}

namespace {
KeyInfo key_info(const storage::ApiKey& k) { return {k.id, k.tenant, k.admin, k.created_ms}; }
}  // namespace

Reply<KeyInfo> Runtime::authenticate(const std::string& token) {
  auto k = impl_->keys->verify(token);
  if (!k) {
    if (k.error().code == storage::ErrorCode::not_found)
      return Rejection{"unauthorized", "unknown or revoked API key"};
    return Rejection{"storage_error", k.error().message};
  }
  return key_info(*k);
}

Reply<std::pair<std::string, KeyInfo>> Runtime::create_key(const std::string& tenant, bool admin) {
  // Tenant names are plain words: "*" means every tenant inside the runtime.
  bool ok = !tenant.empty() && tenant.size() <= 128;
  for (char c : tenant) ok &= std::isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
  if (!ok)
    return Rejection{"invalid_argument", "tenant names are 1-128 characters of A-Z a-z 0-9 . - _"};
  auto k = impl_->keys->create(tenant, admin);
  if (!k) return Rejection{"storage_error", k.error().message};
  return std::make_pair(k->first, key_info(k->second));
}

Reply<bool> Runtime::revoke_key(const std::string& key_id) {
  auto s = impl_->keys->revoke(key_id);
  if (!s) {
    if (s.error().code == storage::ErrorCode::not_found)
      return Rejection{"key_not_found", "no key " + key_id};
    return Rejection{"storage_error", s.error().message};
  }
  return true;
}

Reply<std::vector<KeyInfo>> Runtime::list_keys() {
  auto ks = impl_->keys->list();
  if (!ks) return Rejection{"storage_error", ks.error().message};
  std::vector<KeyInfo> out;
  for (auto& k : *ks) out.push_back(key_info(k));
  return out;
}

const RuntimeConfig& Runtime::config() const { return impl_->env->config; }

}  // namespace pandastack::actors
