#include "gateway/acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>

namespace pandastack::gateway {

namespace {
// The IP address a connection comes from ("" when the stream cannot say).
std::string source_of(kj::AsyncIoStream& conn) {
  struct sockaddr_storage a {};
  uint len = sizeof a;
  try {
    conn.getpeername(reinterpret_cast<struct sockaddr*>(&a), &len);
  } catch (kj::Exception&) {
    return "";
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, text, sizeof text);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, text, sizeof text);
  return text;
}
}  // namespace

Acceptor::Acceptor(std::string name, kj::Timer& timer, size_t max_connections,
                   kj::Function<kj::Promise<void>(kj::Own<kj::AsyncIoStream>)> serve,
                   size_t max_per_source)
    : name_(std::move(name)),
      timer_(timer),
      max_(max_connections),
      serve_(kj::mv(serve)),
      max_per_source_(max_per_source),
      tasks_(*this) {}

kj::Promise<void> Acceptor::listen(kj::ConnectionReceiver& listener) {
  // (evalNow: kj's accept() may throw at once, EMFILE included, instead of rejecting.)
  return kj::evalNow([&listener] { return listener.accept(); })
      .then(
          [this, &listener](kj::Own<kj::AsyncIoStream> conn) -> kj::Promise<void> {
            std::string source = max_per_source_ ? source_of(*conn) : "";
            if (open_ >= max_) {
              // Closed unanswered: the client sees a reset and may retry; nobody else is starved.
              if (refused_++ % 1000 == 0)
                spdlog::warn("{}: {} connections open (the maximum): refusing more", name_, open_);
            } else if (max_per_source_ && by_source_[source] >= max_per_source_) {
              if (refused_++ % 1000 == 0)
                spdlog::warn("{}: {} connections open from {} (its maximum): refusing more", name_,
                             by_source_[source], source);
            } else {
              ++open_;
              if (max_per_source_) ++by_source_[source];
              tasks_.add(serve_(kj::mv(conn)).attach(kj::defer([this, source] {
                --open_;
                if (max_per_source_ && --by_source_[source] == 0) by_source_.erase(source);
              })));
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
