// A thread running a KJ event loop, on which every agent connection of the driver lives.
// Other threads hand it work with `run()` (blocking) and never touch its KJ objects directly.
#pragma once

#include <kj/async-io.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace pandastack::vmm {

class IoThread {
 public:
  IoThread();
  ~IoThread();
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  // Runs `f` on the loop thread and blocks until it (and the promise it returns, if any) is done.
  // Must not be called from the loop thread itself. Exceptions propagate to the caller.
  template <typename F>
  auto run(F&& f) {
    return executor_->executeSync(std::forward<F>(f));
  }

  // Queues `f` on the loop thread without waiting.
  template <typename F>
  void post(F&& f) {
    executor_->executeAsync(std::forward<F>(f)).detach([](kj::Exception&&) {});
  }

  // Only valid on the loop thread.
  kj::AsyncIoProvider& provider() { return *io_->provider; }
  kj::LowLevelAsyncIoProvider& low_level() { return *io_->lowLevelProvider; }
  kj::Timer& timer() { return io_->provider->getTimer(); }
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void main();

  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  const kj::Executor* executor_ = nullptr;
  kj::AsyncIoContext* io_ = nullptr;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
  std::thread thread_;
};

}  // namespace pandastack::vmm
