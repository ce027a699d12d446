#include "actors/vm_worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "actors/egress_proxies.h"
#include "actors/volume_files.h"

namespace pandastack::actors {

namespace {
WorkerResult failed(const std::string& e) {
  WorkerResult r;
  r.ok = false;
  r.error = e;
  return r;
}

}  // namespace

void install_vm(Env& env, VmHandle& h, std::unique_ptr<vmm::Vm> vm, caf::actor_addr owner,
                const std::string& id) {
  // What the VM's network lets out goes to the sandbox's egress log (kept across its VMs).
  if (auto& n = vm->config().network) {
    n->egress_log()->forward_to(env.egress_log(id, true));
    // Its bound secrets' proxy (none for most): requests carrying a placeholder then fail at
    // their host (logged), nothing else.
    if (auto st = start_egress_proxy(env, *n, id); !st)
      spdlog::error("sandbox {}: its egress proxy did not start: {}", id, st.error().message);
  }
  uint64_t gen = ++h.generation;
  pid_t pid = vm->pid();
  {
    std::unique_lock l(h.mu);
    h.vm = std::move(vm);
  }
  if (!env.watcher || pid <= 0) return;
  auto token = env.watcher->watch(pid, [owner, gen] {
    if (auto a = caf::actor_cast<caf::actor>(owner)) caf::anon_send(a, vm_exited_atom::value, gen);
  });
  if (token)
    h.watch_token = *token;
  else
    spdlog::warn("vm of generation {}: not watched: {}", gen, token.error().message);
}

void unwatch_vm(Env& env, VmHandle& h) {
  if (h.watch_token != 0 && env.watcher) env.watcher->unwatch(h.watch_token);
  h.watch_token = 0;
}

caf::behavior vm_worker(caf::stateful_actor<WorkerState>* self, Env* env, std::string id,
                        std::string template_name, std::shared_ptr<VmHandle> handle,
                        caf::actor_addr owner) {
  self->state.owner = owner;
  self->state.env = env;
  self->state.id = id;
  self->state.template_name = template_name;
  self->state.handle = handle;
  log_exceptions(self, "vm worker " + id);
  return {
      [=](restore_atom, std::string snapshot_dir, bool consume, bool pooled, NetSpec net,
          VolumeSpec vols) -> WorkerResult {
        auto& st = self->state;
        spdlog::debug("worker {}: restore from '{}'", st.id, snapshot_dir);
        vmm::Snapshot snap;
        auto loaded = vmm::Snapshot::load(snapshot_dir);
        if (!loaded) return failed(loaded.error().message);
        snap = *loaded;
        std::string run_name = st.id + "." + random_base32(6);  // unique per incarnation
        auto config = st.env->vm_config(st.template_name, st.id, run_name);
        for (auto& v : vols.volumes)
          config.volumes.push_back(
              {v.slot, volume_file(st.env->volumes_dir(), v.volume), v.read_only});
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
        auto vm = [&]() -> vmm::Result<std::unique_ptr<vmm::Vm>> {
          if (snap.memory)
            return pool ? pool->create(run_name, config.hostname, spares)
                        : vmm::restore_with_spare(st.env->io, spares, snap, config, consume,
                                                  make_network);
          // A disk-only hibernation: its guest boots afresh on its disk (volumes then mounted:
          // nothing is mounted in a fresh guest).
          if (make_network) {
            auto n = make_network();
            if (!n) return n.error();
            config.network = *n;
          }
          vols.mount = true;
          snap.volume_slots.clear();
          return vmm::Vm::boot_on(st.env->io, snap, config);
        }();
        if (!vm) return failed(vm.error().message);
        // A warm pool member's guest already runs: its (unused) slots are bound now. The others
        // were bound before their guest ran.
        auto t_bind = std::chrono::steady_clock::now();
        if (auto bound = (*vm)->bind_volumes(config.volumes); !bound)
          return failed("volumes: " + bound.error().message);
        if (vols.mount)
          for (auto& v : vols.volumes) {
            // A snapshot's guest has its volumes mounted already (a fork's child, a create from a
            // snapshot of a sandbox with volumes): its slots are bound to their copies.
            if (std::find(snap.volume_slots.begin(), snap.volume_slots.end(), v.slot) !=
                snap.volume_slots.end())
              continue;
            std::error_code ec;
            auto size =
                std::filesystem::file_size(volume_file(st.env->volumes_dir(), v.volume), ec);
            auto m = (*vm)->agent().mount_volume(v.slot, v.mount, v.read_only, size);
            if (!m)
              return failed("mounting volume " + v.volume + " at " + v.mount + ": " +
                            m.error().message);
          }
        if (!vols.volumes.empty())
          spdlog::debug("worker {}: {} volume(s) bound and mounted in {} us", st.id,
                        vols.volumes.size(),
                        std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - t_bind)
                            .count());
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
        install_vm(*st.env, *st.handle, std::move(*vm), st.owner, st.id);
        // (a restore consumes its snapshot itself; a boot leaves it intact: the VM has its layers)
        if (!snap.memory && consume)
          vmm::remove_snapshot(snapshot_dir, st.env->disk_twin(snapshot_dir));
        return r;
      },
      // A VM that outlived the previous host process (recovery): QMP and a new agent session
      // within a deadline of its own, its network taken over too. A VM that does not answer in
      // time (stuck, stopped) is killed by its record and the sandbox fails with the reason.
      [=](adoptvm_atom, std::string run_dir, NetSpec net) -> WorkerResult {
        auto& st = self->state;
        auto& env = *st.env;
        {
          std::unique_lock l(env.adopt_mu);  // a bounded number at once
          env.adopt_cv.wait(l, [&] { return env.adopting_now < Env::kAdoptAtOnce; });
          ++env.adopting_now;
        }
        auto release = [&] {
          {
            std::lock_guard l(env.adopt_mu);
            --env.adopting_now;
          }
          env.adopt_cv.notify_one();
        };
        auto vm = vmm::Vm::adopt(env.io, run_dir, std::chrono::seconds(3));
        std::shared_ptr<vmm::Network> network;
        if (vm && net.enabled && net.subnet && env.config.network) {
          auto n = vmm::Network::adopt(env.config.net, *net.subnet);
          if (n) {
            env.own(**n);
            auto set = (*n)->set_policy(Env::to_policy(net.egress));
            if (!set) {
              n = set.error();
            } else {
              // The forwards died with the previous host process: expose the ports again.
              expose_ports(**n, net.ports, env.config.ports_host, st.id);
              network = *n;
            }
          }
          if (!n) vm = vmm::make_error(n.error().code, "network: " + n.error().message);
        }
        release();
        if (!vm) {
          // Nothing of it may outlive the failure: the process (by its record), its folders, its
          // network and its subnet.
          vmm::Vm::kill_recorded(run_dir);
          if (net.subnet && env.config.network) {
            if (auto n = vmm::Network::adopt(env.config.net, *net.subnet)) env.own(**n);
            env.release_subnet(*net.subnet);
          }
          return failed(vm.error().message);
        }
        if (network) (*vm)->attach_network(network);
        install_vm(env, *st.handle, std::move(*vm), st.owner, st.id);
        return WorkerResult{};
      },
      [=](egress_atom, Egress egress) -> WorkerResult {
        auto& h = *self->state.handle;
        std::shared_lock l(h.mu);
        if (!h.vm || !h.vm->config().network) return WorkerResult{};  // applied at the next start
        auto set = h.vm->config().network->set_policy(Env::to_policy(egress));
        return set ? WorkerResult{} : failed(set.error().message);
      },
      // A snapshot (or a fork's) never waits for commands in flight: with none, new ones are held
      // off for the moment it takes and the agent's session is handed back first (restores then
      // attach at once); with some, they go on and restores reconnect the stale session. Only
      // this worker replaces or destroys the VM, so it needs no lock to use it.
      // `all_volumes`: a named snapshot copies its read-only volumes too (they may change before
      // a sandbox is made from it); a fork's children share them.
      [=](snapshot_atom, std::string dir, bool all_volumes) -> WorkerResult {
        auto& h = *self->state.handle;
        std::unique_lock quiet(h.mu, std::try_to_lock);
        if (!h.vm) return failed("no VM");
        auto s = h.vm->snapshot(dir, /*quiesce=*/quiet.owns_lock(), self->state.env->disk_twin(dir),
                                all_volumes);
        return s ? WorkerResult{} : failed(s.error().message);
      },
      // Why the VM died (it did on its own: the watcher said so).
      [=](exited_atom) -> std::string {
        auto& h = *self->state.handle;
        std::shared_lock l(h.mu);
        if (!h.vm) return "the VM is gone";
        auto why = h.vm->exit_description();
        return why.empty() ? "the VM stopped answering" : why;
      },
      // A snapshot nobody can name any more (a fork's, once its children run): its RAM file is
      // tmpfs memory. Removed here, off the actor system's shared threads.
      [=](drop_atom, std::string dir) {
        vmm::remove_snapshot(dir, self->state.env->disk_twin(dir));
      },
      // The hibernation at `from` (tmpfs) copied to `to` on the data disk and synced.
      [=](persist_atom, std::string from, std::string to) -> WorkerResult {
        auto t0 = std::chrono::steady_clock::now();
        auto snap = vmm::Snapshot::load(from);
        if (!snap) return failed(snap.error().message);
        auto copy = vmm::persist_snapshot(*snap, to);
        if (!copy) return failed(copy.error().message);
        spdlog::info("worker {}: hibernation persisted to {} in {} ms", self->state.id, to,
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count());
        return WorkerResult{};
      },
      // A durable copy no longer needed (woken, killed): its folder only (it has no disk twin).
      [=](unpersist_atom, std::string dir) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      },
      // `keep_memory` false: a disk-only hibernation (vmm::drop_memory). The guest syncs its file
      // systems first, so that its disk is whole without its memory.
      [=](hibernate_atom, std::string dir, bool keep_memory) -> WorkerResult {
        auto& st = self->state;
        auto& h = *st.handle;
        h.cancel_calls();
        std::unique_lock l(h.mu);
        if (!h.vm) return failed("no VM");
        if (!keep_memory) {
          vmm::ExecRequest sync;
          sync.argv = {"/bin/sync"};
          sync.timeout_ms = uint32_t(vmm::Vm::kHibernateSync.count());
          auto synced = h.vm->agent().exec(sync);
          if (!synced || synced->exit_code != 0)
            return failed("the guest did not sync its disk: " +
                          (synced ? synced->stderr_data : synced.error().message));
        }
        unwatch_vm(*st.env, h);  // it stops on purpose now
        auto s = h.vm->hibernate(dir, st.env->disk_twin(dir));
        if (s && !keep_memory) {
          auto dropped = vmm::drop_memory(dir);
          if (!dropped) spdlog::warn("worker {}: {}: memory kept", st.id, dropped.error().message);
        }
        if (!s) {
          if (h.vm->alive()) {  // still running: watched again
            auto vm = std::move(h.vm);
            l.unlock();
            install_vm(*st.env, h, std::move(vm), st.owner, st.id);
          }
          return failed(s.error().message);
        }
        h.vm.reset();
        return WorkerResult{};
      },
      // Whether a background process runs in the guest (the idle timeout waits for it). A VM that
      // cannot say counts as busy: it is not hibernated on a guess.
      [=](procs_atom) -> bool {
        auto& h = *self->state.handle;
        std::shared_lock l(h.mu);
        if (!h.vm) return false;
        auto procs = h.vm->agent().list_processes();
        if (!procs) return true;
        for (auto& p : *procs)
          if (p.running) return true;
        return false;
      },
      // Its sandbox ended and everything asked of this worker before is done: its thread goes.
      [=](retire_atom) { self->quit(); },
      [=](destroy_atom) -> WorkerResult {
        auto& h = *self->state.handle;
        unwatch_vm(*self->state.env, h);
        h.cancel_calls();
        std::unique_lock l(h.mu);
        // A graceful end: what the guest wrote to its volumes reaches their files (a guest that
        // does not sync within 2 s loses what it had not written, as a crash would).
        if (h.vm)
          if (auto synced = h.vm->sync_volumes(std::chrono::seconds(2)); !synced)
            spdlog::info("worker {}: ending without a volume sync: {}", self->state.id,
                         synced.error().message);
        h.vm.reset();
        return WorkerResult{};
      },
  };
}

}  // namespace pandastack::actors
