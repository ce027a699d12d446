// Pools of QEMU processes made ahead of the requests that need them, kept full by a background
// thread. Nobody has used a member: no sandbox is ever reused.
//
//  - RestorePool: warm restores of one snapshot (a template's). Each member was spawned
//    (`-incoming defer`), loaded with the snapshot's state and resumed until its agent answered,
//    then left waiting. A create only makes the guest its own (clock, RNG reseed, hostname:
//    Vm::personalize), so it skips QEMU's start-up, the state load and the restored guest's first
//    (cold-cache) answers.
//  - SparePool: spares (Vm::spare) of one VM shape, for restores of snapshots nobody can predict
//    (forks, wakes, creates from named snapshots): each skips QEMU's start-up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "vmm-driver/network.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"

namespace pandastack::vmm {

class IoThread;
class SparePool;

// How a pool follows demand: it is kept at its size while members are taken; once none was
// taken for `shrink_after` it keeps at most `shrunk` (the extra waiting members are killed), and
// after `drop_after` none. The next take brings it back to its size.
struct PoolDemand {
  std::chrono::milliseconds shrink_after{std::chrono::minutes(5)};
  size_t shrunk = 1;
  std::chrono::milliseconds drop_after{std::chrono::minutes(30)};
};

// `size` members made by `make` from `base` (folders `base.run_dir`-<n>). With `make_network`,
// every member is spawned on a network of its own (made while it waits).
class VmPool {
 public:
  using NetworkFactory = std::function<Result<std::shared_ptr<Network>>()>;
  using Maker = std::function<Result<std::unique_ptr<Vm>>(VmConfig)>;
  VmPool(std::string what, VmConfig base, size_t size, NetworkFactory make_network, Maker make,
         PoolDemand demand = {});
  ~VmPool();
  VmPool(const VmPool&) = delete;
  VmPool& operator=(const VmPool&) = delete;

  // A ready member (null when none is), renamed `name`/`hostname`; the pool starts replacing it.
  std::unique_ptr<Vm> take(const std::string& name, const std::string& hostname);
  size_t ready();
  // How many members it keeps now (its size, or less after it idled: PoolDemand).
  size_t target();
  const VmConfig& base() const { return base_; }
  const NetworkFactory& network_factory() const { return make_network_; }

 private:
  void refill();
  size_t target_locked() const;  // (under mu_)

  std::string what_;
  VmConfig base_;
  size_t size_;
  PoolDemand demand_;
  std::chrono::steady_clock::time_point last_take_ = std::chrono::steady_clock::now();
  NetworkFactory make_network_;
  Maker make_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Vm>> idle_;
  bool stop_ = false;
  int seq_ = 0;
  std::thread thread_;
};

class RestorePool {
 public:
  using NetworkFactory = VmPool::NetworkFactory;
  // `memory_base` (a MemoryBase of the snapshot's RAM file): members and direct restores map it
  // copy-on-write instead of each copying the RAM file.
  RestorePool(IoThread& io, Snapshot snapshot, VmConfig base, size_t size,
              NetworkFactory make_network = nullptr, PoolDemand demand = {},
              std::shared_ptr<const MemoryBase> memory_base = nullptr);

  // A running VM restored from the snapshot, from a warm member when one is ready, else into a
  // new process over the memory base (when there is one), else restored into a spare of
  // `spares` (when given and one is ready), else into a new process. `hostname` is set in the
  // guest.
  Result<std::unique_ptr<Vm>> create(const std::string& name, const std::string& hostname,
                                     SparePool* spares = nullptr);
  size_t ready() { return pool_.ready(); }
  // The memory base its VMs share (null when they copy the RAM file).
  const std::shared_ptr<const MemoryBase>& memory_base() const { return memory_base_; }

 private:
  IoThread& io_;
  Snapshot snapshot_;
  std::shared_ptr<const MemoryBase> memory_base_;  // (before pool_: its members use it)
  VmPool pool_;
};

class SparePool : public VmPool {
 public:
  // (Spares idle away entirely by default: a shrunk template keeps one warm member, no spare.)
  SparePool(IoThread& io, VmConfig base, size_t size, NetworkFactory make_network = nullptr,
            PoolDemand demand = {std::chrono::minutes(5), 0, std::chrono::minutes(5)});
};

// Restores `snapshot` into a spare of `spares` when one is ready (and takes it), else (no spare,
// or the spare failed) restores it into a new process of `config` (`config.network` made by
// `make_network` then, when given). The result is named as `config`.
Result<std::unique_ptr<Vm>> restore_with_spare(IoThread& io, SparePool* spares,
                                               const Snapshot& snapshot, VmConfig config,
                                               bool consume,
                                               const VmPool::NetworkFactory& make_network);

}  // namespace pandastack::vmm
