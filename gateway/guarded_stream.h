// A connection's bytes, cut off once a peer that has not logged in sent more than a login's worth:
// until it logs in, nobody without a credential makes the daemon hold more than `limit` bytes
// for it (the RPC port, gateway/rpc.cc; the peer port, gateway/peer_transport.cc). Internal to
// gateway/.
#pragma once

#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/timer.h>

#include <algorithm>
#include <memory>

namespace pandastack::gateway {

struct PreLogin {
  size_t limit;
  bool logged_in = false;
  size_t read = 0;
  explicit PreLogin(size_t l) : limit(l) {}
};

class GuardedStream final : public kj::AsyncIoStream {
 public:
  GuardedStream(kj::Own<kj::AsyncIoStream> inner, std::shared_ptr<PreLogin> c)
      : inner_(kj::mv(inner)), c_(std::move(c)) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    if (c_->logged_in) return inner_->tryRead(buffer, min, max);
    size_t left = c_->limit - std::min(c_->limit, c_->read);
    if (left == 0) return size_t(0);  // end of stream: the RPC system drops the connection
    max = std::min(max, left);
    min = std::min(min, max);
    return inner_->tryRead(buffer, min, max).then([c = c_](size_t n) {
      c->read += n;
      return n;
    });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }

 private:
  kj::Own<kj::AsyncIoStream> inner_;
  std::shared_ptr<PreLogin> c_;
};

// How long a connection may take to log in.
inline constexpr auto kLoginTimeout = 10 * kj::SECONDS;

// Fails (DISCONNECTED: the connection is dropped) when `c` has not logged in within
// kLoginTimeout; never resolves once it has. `what`: the error's description.
inline kj::Promise<void> login_deadline(kj::Timer& timer, std::shared_ptr<PreLogin> c,
                                        const char* what) {
  return timer.afterDelay(kLoginTimeout).then([c = std::move(c), what]() -> kj::Promise<void> {
    if (c->logged_in) return kj::NEVER_DONE;
    return KJ_EXCEPTION(DISCONNECTED, what);
  });
}

}  // namespace pandastack::gateway
