// Warm restores of one snapshot, ready to hand out: each member is a fresh QEMU process that was
// spawned (`-incoming defer`), loaded with the snapshot's state and resumed until its agent
// answered, then left waiting. Nobody has used a member: no sandbox is ever reused. A create only
// makes the guest its own (clock, RNG reseed, hostname: Vm::personalize), so it skips QEMU's
// start-up, the state load and the restored guest's first (cold-cache) answers. A background
// thread keeps the pool full.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "vmm-driver/network.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"

namespace pandastack::vmm {

class IoThread;

class RestorePool {
 public:
  // `base` gives the VM shape; pool members run in folders `base.run_dir`-<n>.
  // With `make_network`, every member is spawned on a network of its own (made while it waits).
  using NetworkFactory = std::function<Result<std::shared_ptr<Network>>()>;
  RestorePool(IoThread& io, Snapshot snapshot, VmConfig base, size_t size,
              NetworkFactory make_network = nullptr);
  ~RestorePool();
  RestorePool(const RestorePool&) = delete;
  RestorePool& operator=(const RestorePool&) = delete;

  // A running VM restored from the snapshot, from a pre-spawned process when one is ready, else
  // restored from scratch. `hostname` is set in the guest.
  Result<std::unique_ptr<Vm>> create(const std::string& name, const std::string& hostname);
  size_t ready();

 private:
  void refill();

  IoThread& io_;
  Snapshot snapshot_;
  VmConfig base_;
  size_t size_;
  NetworkFactory make_network_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Vm>> idle_;
  bool stop_ = false;
  int seq_ = 0;
  std::thread thread_;
};

}  // namespace pandastack::vmm
