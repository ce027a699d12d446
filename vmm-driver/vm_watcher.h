// Watches QEMU processes for their end: one thread waits on a pidfd per process (epoll), so a VM
// that dies on its own (a guest kernel panic, an OOM kill, `kill -9` from the host) is reported
// the moment it happens, whether QEMU is our child or was adopted from a previous host process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

class VmWatcher {
 public:
  VmWatcher();
  ~VmWatcher();  // stops watching; no callback runs afterwards
  VmWatcher(const VmWatcher&) = delete;
  VmWatcher& operator=(const VmWatcher&) = delete;

  using OnExit = std::function<void()>;
  // Calls `on_exit` once, on the watcher's thread, when process `pid` ends (at once if it already
  // has). It must be quick (send a message). Returns a token for unwatch().
  Result<uint64_t> watch(pid_t pid, OnExit on_exit);
  // Stops watching `token`. When it returns, that callback is not running and never will: call it
  // before stopping a process on purpose.
  void unwatch(uint64_t token);
  size_t watched();
  // From now on no callback runs (a shutdown: their receivers are going); watch and unwatch
  // still work.
  void mute();

 private:
  void run();

  struct Entry {
    int pidfd;
    OnExit on_exit;
  };
  int epoll_ = -1, wake_ = -1;
  std::mutex mu_;  // held while a callback runs: unwatch() waits for it
  std::map<uint64_t, Entry> entries_;
  uint64_t next_ = 1;
  bool stop_ = false;
  bool muted_ = false;
  std::thread thread_;
};

}  // namespace pandastack::vmm
