#include "vmm-driver/pool.h"

#include <spdlog/spdlog.h>

namespace pandastack::vmm {

RestorePool::RestorePool(IoThread& io, Snapshot snapshot, VmConfig base, size_t size,
                         NetworkFactory make_network)
    : io_(io),
      snapshot_(std::move(snapshot)),
      base_(std::move(base)),
      size_(size),
      make_network_(std::move(make_network)) {
  thread_ = std::thread([this] { refill(); });
}

RestorePool::~RestorePool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  idle_.clear();  // kills the waiting processes and removes their folders
}

size_t RestorePool::ready() {
  std::lock_guard lock(mu_);
  return idle_.size();
}

void RestorePool::refill() {
  for (;;) {
    VmConfig c;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || idle_.size() < size_; });
      if (stop_) return;
      c = base_;
      c.run_dir = base_.run_dir.string() + "-" + std::to_string(seq_++);
      c.name = c.run_dir.filename().string();
    }
    if (make_network_) {
      auto net = make_network_();
      if (!net) {
        spdlog::warn("restore pool: no network for a member: {}", net.error().message);
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
        continue;
      }
      c.network = *net;
    }
    auto vm = Vm::prespawn(io_, snapshot_, c);
    // Warm: the state is loaded and the guest runs until its agent answers, so a create only
    // makes it unique (clock, RNG, hostname). Nobody has used it: no sandbox is ever reused.
    if (vm) {
      auto started = (*vm)->start_guest(snapshot_);
      if (!started) vm = started.error();
    }
    // A waiting process that outlives a crashed host must be found (and killed) by the next one.
    if (vm && !c.die_with_parent) {
      auto saved = (*vm)->save_record();
      if (!saved) vm = saved.error();
    }
    if (!vm) {
      spdlog::warn("restore pool: cannot prespawn: {}", vm.error().message.substr(0, 200));
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
      continue;
    }
    std::lock_guard lock(mu_);
    idle_.push_back(std::move(*vm));
  }
}

Result<std::unique_ptr<Vm>> RestorePool::create(const std::string& name,
                                                const std::string& hostname) {
  std::unique_ptr<Vm> vm;
  {
    std::lock_guard lock(mu_);
    while (!idle_.empty() && !vm) {
      vm = std::move(idle_.front());
      idle_.pop_front();
      if (!vm->alive()) vm.reset();  // died while waiting: discard
    }
  }
  cv_.notify_all();
  if (!vm) {
    VmConfig c = base_;
    c.run_dir = base_.run_dir.string() + "-direct-" + name;
    c.name = name;
    c.hostname = hostname;
    if (make_network_) {
      auto net = make_network_();
      if (!net) return net.error();
      c.network = *net;
    }
    return Vm::restore(io_, snapshot_, c);
  }
  vm->set_identity(name, hostname);
  auto personal = vm->personalize();
  if (!personal) return personal.error();
  if (!base_.die_with_parent) {
    auto saved = vm->save_record();  // now under its sandbox's name
    if (!saved) return saved.error();
  }
  return vm;
}

}  // namespace pandastack::vmm
