// Blocking work for the gateways (runtime calls) runs on a pool of threads, never on the KJ event
// loop; results come back to the loop through cross-thread promise fulfillers.
#pragma once

#include <kj/async.h>
#include <kj/debug.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace pandastack::gateway {

class WorkerPool {
 public:
  WorkerPool(unsigned threads, size_t max_queued) : max_queued_(max_queued) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  // Runs the queued jobs to the end, then joins.
  ~WorkerPool() {
    {
      std::lock_guard l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False when the queue is full.
  bool submit(std::function<void()> job) {
    {
      std::lock_guard l(mu_);
      if (jobs_.size() >= max_queued_) return false;
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }

  // Runs `f` on a worker; the promise (on the calling loop's thread) resolves with its result.
  // When the queue is full the promise resolves with `overloaded` at once. A job that throws
  // rejects the promise.
  template <typename T>
  kj::Promise<T> offload(std::function<T()> f, T overloaded) {
    auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
    auto ful = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>(kj::mv(paf.fulfiller));
    bool queued = submit([f = std::move(f), ful]() mutable {
      try {
        (*ful)->fulfill(f());
      } catch (const std::exception& e) {
        (*ful)->reject(KJ_EXCEPTION(FAILED, e.what()));
      }
    });
    if (!queued) (*ful)->fulfill(kj::mv(overloaded));
    return kj::mv(paf.promise);
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock l(mu_);
        cv_.wait(l, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  size_t max_queued_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Items produced on another thread, consumed on a KJ loop: push()/close() from any thread;
// ready() and take() on the loop. At most `max_bytes` wait at once: a consumer that does not keep
// up (a client that stops reading) makes push() refuse instead of growing the daemon without end.
template <typename T>
class CrossThreadQueue {
 public:
  explicit CrossThreadQueue(size_t max_bytes = SIZE_MAX) : max_bytes_(max_bytes) {}
  // False (and nothing queued) when `bytes` more would pass the bound.
  bool push(T item, size_t bytes = 0) {
    std::lock_guard l(mu_);
    if (bytes > max_bytes_ - std::min(max_bytes_, bytes_)) return false;
    bytes_ += bytes;
    items_.push_back(std::move(item));
    wake();
    return true;
  }
  void close() {
    std::lock_guard l(mu_);
    closed_ = true;
    wake();
  }
  // Resolves when there are items or the queue is closed.
  kj::Promise<void> ready() {
    auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    std::lock_guard l(mu_);
    if (!items_.empty() || closed_) return kj::READY_NOW;
    waiter_ = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }
  // The items so far, and whether the queue is closed (no more will come).
  std::pair<std::deque<T>, bool> take() {
    std::lock_guard l(mu_);
    std::deque<T> out;
    out.swap(items_);
    bytes_ = 0;
    return {std::move(out), closed_};
  }

 private:
  void wake() {
    if (waiter_) {
      waiter_->fulfill();
      waiter_ = nullptr;
    }
  }
  std::mutex mu_;
  std::deque<T> items_;
  size_t max_bytes_, bytes_ = 0;
  bool closed_ = false;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;
};

}  // namespace pandastack::gateway
