// Accepting connections so that no client can stop the daemon from accepting more: a failed
// accept (EMFILE when the descriptors run out, ENFILE, ENOBUFS) pauses and tries again instead of
// ending the listener (kj's own loops end on the first failure), and connections beyond a cap
// (in all, and optionally per source address) are closed at once instead of taking descriptors
// and memory from everyone else.
#pragma once

#include <kj/async-io.h>
#include <kj/function.h>
#include <kj/timer.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>

namespace pandastack::gateway {

class Acceptor final : private kj::TaskSet::ErrorHandler {
 public:
  // `serve` owns one accepted connection until its promise ends. `name` labels the logs.
  // `max_per_source` (0: no cap of its own): connections open at once from one IP address.
  Acceptor(std::string name, kj::Timer& timer, size_t max_connections,
           kj::Function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>)> serve,
           size_t max_per_source = 0);

  // Accepts on `listener` until the promise is cancelled. Several listeners may share one
  // Acceptor (and its cap).
  kj::Promise<void> listen(kj::ConnectionReceiver& listener);

  size_t open() const { return open_; }
  uint64_t refused() const { return refused_; }
  uint64_t accept_failures() const { return accept_failures_; }

 private:
  void taskFailed(kj::Exception&& e) override;

  std::string name_;
  kj::Timer& timer_;
  size_t max_;
  kj::Function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>)> serve_;
  size_t open_ = 0;
  size_t max_per_source_;
  std::map<std::string, size_t> by_source_;  // (only with a per-source cap)
  std::atomic<uint64_t> refused_{0}, accept_failures_{0};
  kj::TaskSet tasks_;
};

// Raises this process's soft limit on open descriptors to its hard limit (each sandbox holds a
// handful: QMP, agent, pidfd, network namespace, resolver). The new soft limit.
uint64_t raise_fd_limit();

}  // namespace pandastack::gateway
