#include "vmm-driver/pool.h"

#include <spdlog/spdlog.h>

namespace pandastack::vmm {

namespace {
// Members are made at a low priority: the requests they serve come first on a busy host.
constexpr int kMemberNice = 10;
// A member is made once no restore has run for kQuiet (or after kMaxDefer regardless).
constexpr std::chrono::milliseconds kQuiet{100}, kMaxDefer{2000};
}  // namespace

VmPool::VmPool(std::string what, VmConfig base, size_t size, NetworkFactory make_network,
               Maker make, PoolDemand demand)
    : what_(std::move(what)),
      base_(std::move(base)),
      size_(size),
      demand_(demand),
      make_network_(std::move(make_network)),
      make_(std::move(make)) {
  thread_ = std::thread([this] { refill(); });
}

VmPool::~VmPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  idle_.clear();  // kills the waiting processes and removes their folders
}

size_t VmPool::ready() {
  std::lock_guard lock(mu_);
  return idle_.size();
}

size_t VmPool::target_locked() const {
  auto idle = std::chrono::steady_clock::now() - last_take_;
  if (idle >= demand_.drop_after) return 0;
  if (idle >= demand_.shrink_after) return std::min(size_, demand_.shrunk);
  return size_;
}

size_t VmPool::target() {
  std::lock_guard lock(mu_);
  return target_locked();
}

void VmPool::refill() {
  for (;;) {
    VmConfig c;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        if (stop_) return;
        size_t want = target_locked();
        if (idle_.size() > want) {  // idled: the extra members go (killed outside the lock)
          std::vector<std::unique_ptr<Vm>> extra;
          while (idle_.size() > want) {
            extra.push_back(std::move(idle_.back()));
            idle_.pop_back();
          }
          spdlog::info("{} pool {}: unused for a while, keeps {} member(s)", what_, base_.name,
                       want);
          lock.unlock();
          extra.clear();
          lock.lock();
          continue;
        }
        if (idle_.size() < want) break;
        cv_.wait_for(lock, std::chrono::seconds(1));  // (taken, stopped, or time to shrink)
      }
      // Not next to a restore (see RestoreActivity), but stopping at once when the pool is.
      auto give_up = std::chrono::steady_clock::now() + kMaxDefer;
      while (!stop_ && !RestoreActivity::quiet_for(kQuiet) &&
             std::chrono::steady_clock::now() < give_up)
        cv_.wait_for(lock, std::chrono::milliseconds(10));
      if (stop_) return;
      c = base_;
      c.nice = kMemberNice;
      // A name no folder has: a member taken by a sandbox keeps its folder for the VM's life,
      // also across a restart of the host (whose pools count from 0 again).
      std::string suffix;
      std::error_code ec;
      do {
        suffix = "-" + std::to_string(seq_++);
      } while (std::filesystem::exists(base_.run_dir.string() + suffix, ec) ||
               (!base_.disk_dir.empty() &&
                std::filesystem::exists(base_.disk_dir.string() + suffix, ec)));
      c.run_dir = base_.run_dir.string() + suffix;
      if (!base_.disk_dir.empty()) c.disk_dir = base_.disk_dir.string() + suffix;
      c.name = c.run_dir.filename().string();
    }
    if (make_network_) {
      auto net = make_network_();
      if (!net) {
        spdlog::warn("{} pool: no network for a member: {}", what_, net.error().message);
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
        continue;
      }
      c.network = *net;
    }
    bool record = !c.die_with_parent;
    auto vm = make_(std::move(c));
    // A waiting process that outlives a crashed host must be found (and killed) by the next one.
    if (vm && record) {
      auto saved = (*vm)->save_record();
      if (!saved) vm = saved.error();
    }
    if (!vm) {
      spdlog::warn("{} pool: cannot make a member: {}", what_, vm.error().message.substr(0, 200));
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
      continue;
    }
    std::lock_guard lock(mu_);
    idle_.push_back(std::move(*vm));
  }
}

std::unique_ptr<Vm> VmPool::take(const std::string& name, const std::string& hostname) {
  std::unique_ptr<Vm> vm;
  {
    std::lock_guard lock(mu_);
    last_take_ = std::chrono::steady_clock::now();  // in demand again: back to its size
    while (!idle_.empty() && !vm) {
      vm = std::move(idle_.front());
      idle_.pop_front();
      if (!vm->alive()) vm.reset();  // died while waiting: discard
    }
  }
  cv_.notify_all();
  if (vm) {
    vm->set_identity(name, hostname);
    vm->set_nice(base_.nice);
  }
  return vm;
}

RestorePool::RestorePool(IoThread& io, Snapshot snapshot, VmConfig base, size_t size,
                         NetworkFactory make_network, PoolDemand demand,
                         std::shared_ptr<const MemoryBase> memory_base)
    : io_(io),
      snapshot_(std::move(snapshot)),
      memory_base_(std::move(memory_base)),
      pool_(
          "restore", std::move(base), size, std::move(make_network),
          [this](VmConfig c) -> Result<std::unique_ptr<Vm>> {
            c.memory_base = memory_base_;
            auto vm = Vm::prespawn(io_, snapshot_, std::move(c));
            // Warm: the state is loaded and the guest runs until its agent answers, so a
            // create only makes it unique (clock, RNG, hostname).
            if (vm) {
              auto started = (*vm)->start_guest(snapshot_);
              if (!started) return started.error();
            }
            return vm;
          },
          demand) {}

Result<std::unique_ptr<Vm>> RestorePool::create(const std::string& name,
                                                const std::string& hostname, SparePool* spares) {
  RestoreActivity busy;
  auto vm = pool_.take(name, hostname);
  if (!vm) {
    VmConfig c = pool_.base();
    c.run_dir = c.run_dir.string() + "-direct-" + name;
    if (!c.disk_dir.empty()) c.disk_dir = c.disk_dir.string() + "-direct-" + name;
    c.name = name;
    c.hostname = hostname;
    // Over the memory base, a new process (a spare would hold a copy of the RAM file for as
    // long as the sandbox lives: ~70 MiB more for ~80 ms less).
    c.memory_base = memory_base_;
    return restore_with_spare(io_, memory_base_ ? nullptr : spares, snapshot_, c, false,
                              pool_.network_factory());
  }
  auto personal = vm->personalize();
  if (!personal) return personal.error();
  if (!vm->config().die_with_parent) {
    auto saved = vm->save_record();  // now under its sandbox's name
    if (!saved) return saved.error();
  }
  return vm;
}

SparePool::SparePool(IoThread& io, VmConfig base, size_t size, NetworkFactory make_network,
                     PoolDemand demand)
    : VmPool(
          "spare", std::move(base), size, std::move(make_network),
          [&io](VmConfig c) { return Vm::spare(io, std::move(c)); }, demand) {}

Result<std::unique_ptr<Vm>> restore_with_spare(IoThread& io, SparePool* spares,
                                               const Snapshot& snapshot, VmConfig config,
                                               bool consume,
                                               const VmPool::NetworkFactory& make_network) {
  // Marked before the take: the pool's refill (woken by it) waits until this restore is done
  // instead of spawning a QEMU beside it.
  RestoreActivity busy;
  // A spare runs today's machine: a snapshot of an older one (a hibernation made before an
  // upgrade) is restored into a new process of its own machine.
  bool fits = spares && spares->base().machine == snapshot.machine;
  if (auto vm = fits ? spares->take(config.name, config.hostname) : nullptr) {
    vm->set_volumes(config.volumes);
    auto restored = vm->restore_into(snapshot, consume);
    if (restored) return vm;
    // The snapshot is intact (restore_into copies its RAM): a new process can still restore it.
    spdlog::warn("vm {}: restore into a spare failed, restoring into a new process: {}",
                 config.name, restored.error().message.substr(0, 300));
  }
  if (make_network) {
    auto net = make_network();
    if (!net) return net.error();
    config.network = *net;
  }
  return Vm::restore(io, snapshot, std::move(config), consume);
}

}  // namespace pandastack::vmm
