#include "vmm-driver/io_thread.h"

namespace pandastack::vmm {

IoThread::IoThread() {
  thread_ = std::thread([this] { main(); });
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return ready_; });
}

IoThread::~IoThread() {
  stop_->fulfill();
  thread_.join();
}

void IoThread::main() {
  auto io = kj::setupAsyncIo();
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  {
    std::lock_guard lock(mu_);
    io_ = &io;
    executor_ = &kj::getCurrentThreadExecutor();
    stop_ = kj::mv(paf.fulfiller);
    ready_ = true;
  }
  cv_.notify_all();
  paf.promise.wait(io.waitScope);
}

}  // namespace pandastack::vmm
