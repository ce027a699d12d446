#include "gateway/acceptor.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

namespace pandastack::gateway {

Acceptor::Acceptor(std::string name, kj::Timer& timer, size_t max_connections,
                   kj::Function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>)> serve)
    : name_(std::move(name)), timer_(timer), max_(max_connections), serve_(kj::mv(serve)),
      tasks_(*this) {}

kj::Promise<void> Acceptor::listen(kj::ConnectionReceiver& listener) {
  // (evalNow: kj's accept() may throw at once, EMFILE included, instead of rejecting.)
  return kj::evalNow([&listener] { return listener.accept(); }).then(
      [this, &listener](kj::Own<kj::AsyncIoStream> conn) -> kj::Promise<void> {
        if (open_ >= max_) {
          // Closed unanswered: the client sees a reset and may retry; nobody else is starved.
          if (refused_++ % 1000 == 0)
            spdlog::warn("{}: {} connections open (the maximum): refusing more", name_, open_);
        } else {
          ++open_;
          tasks_.add(serve_(kj::mv(conn)).attach(kj::defer([this] { --open_; })));
        }
        return listen(listener);
      },
      [this, &listener](kj::Exception&& e) -> kj::Promise<void> {
        // EMFILE and friends: the descriptors come back as connections close. Pause, retry.
        if (accept_failures_++ % 100 == 0)
          spdlog::warn("{}: accept failed ({}): retrying in 100 ms", name_,
                       e.getDescription().cStr());
        return timer_.afterDelay(100 * kj::MILLISECONDS).then([this, &listener] {
          return listen(listener);
        });
      });
}

void Acceptor::taskFailed(kj::Exception&& e) {
  spdlog::debug("{}: connection ended: {}", name_, e.getDescription().cStr());
}

uint64_t raise_fd_limit() {
  struct rlimit r {};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &r) != 0) spdlog::warn("cannot raise the descriptor limit");
    ::getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur;
}

}  // namespace pandastack::gateway
