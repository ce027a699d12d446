#include "vmm-driver/egress_proxy_host.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <kj/debug.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "vmm-driver/netns.h"

namespace pandastack::vmm {

namespace {

thread_local kj::Network* t_network = nullptr;  // the proxy thread's
thread_local kj::LowLevelAsyncIoProvider* t_lowlevel = nullptr;

// One sandbox's listeners, proxy and connections (on the proxy thread only).
struct Served final : kj::TaskSet::ErrorHandler {
  std::string id;
  std::unique_ptr<EgressProxy> proxy;
  kj::Own<kj::ConnectionReceiver> tls, plain;
  size_t open = 0;
  kj::TaskSet tasks{*this};  // (declared last: its connections go first)

  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("egress proxy: sandbox={}: {}", id, e.getDescription().cStr());
  }

  kj::Promise<void> accept(kj::ConnectionReceiver& r, bool tls_port) {
    return r.accept().then([this, &r, tls_port](kj::Own<kj::AsyncIoStream> c) {
      if (open >= ProxyHost::kMaxConnections) {
        spdlog::info("egress proxy: sandbox={}: {} connections open, one closed", id, open);
      } else {
        // Where the guest was going (the ruleset redirected it here).
        std::string address = "0.0.0.0";
        uint16_t port = tls_port ? 443 : 80;
        sockaddr_in dst{};
        kj::uint len = sizeof dst;
        KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                            [&] { c->getsockopt(SOL_IP, SO_ORIGINAL_DST, &dst, &len); })) {
          (void)e;  // (not redirected: a test's direct connection)
        } else {
          char text[INET_ADDRSTRLEN] = {};
          ::inet_ntop(AF_INET, &dst.sin_addr, text, sizeof text);
          address = text;
          port = ntohs(dst.sin_port);
        }
        ++open;
        tasks.add(
            proxy->serve(kj::mv(c), address, port, tls_port).attach(kj::defer([this] { --open; })));
      }
      return accept(r, tls_port);
    });
  }
};

// A listening TCP socket on `address`:`port`, made in namespace `netns_fd`.
Result<int> listen_in(int netns_fd, const std::string& address, uint16_t port) {
  int fd = -1, err = 0;
  std::string what;
  std::string entering = in_netns(netns_fd, [&] {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno, what = "socket";
      return;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
      err = EINVAL, what = "address " + address;
    } else if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      err = errno, what = "bind " + address + ":" + std::to_string(port);
    } else if (::listen(fd, 128) != 0) {
      err = errno, what = "listen";
    }
    if (err) {
      ::close(fd);
      fd = -1;
    }
  });
  if (!entering.empty()) return make_error(ErrorCode::io_error, entering);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "egress proxy listener: " + what + ": " + std::strerror(err));
  return fd;
}

}  // namespace

struct ProxyHost::Impl {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  const kj::Executor* executor = nullptr;
  kj::LowLevelAsyncIoProvider* lowlevel = nullptr;
  kj::Timer* timer = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> stop;
  std::map<std::string, kj::Own<Served>> served;  // (proxy thread only)
  std::atomic<size_t> count{0};

  void run() {
    auto io = kj::setupAsyncIo();
    auto paf = kj::newPromiseAndFulfiller<void>();
    t_network = &io.provider->getNetwork();
    t_lowlevel = io.lowLevelProvider.get();
    {
      std::lock_guard lock(mu);
      executor = &kj::getCurrentThreadExecutor();
      lowlevel = io.lowLevelProvider.get();
      timer = &io.provider->getTimer();
      stop = kj::mv(paf.fulfiller);
    }
    cv.notify_all();
    paf.promise.wait(io.waitScope);
    served.clear();
    count = 0;
    t_network = nullptr;
    t_lowlevel = nullptr;
  }
};

ProxyHost::ProxyHost() : impl_(std::make_unique<Impl>()) {
  impl_->thread = std::thread([this] { impl_->run(); });
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [this] { return impl_->executor != nullptr; });
}

ProxyHost::~ProxyHost() {
  impl_->executor->executeSync([this] { impl_->stop->fulfill(); });
  impl_->thread.join();
}

Status ProxyHost::start(const std::string& id, int netns_fd, ProxyOptions options,
                        const std::string& bind_address) {
  stop(id);  // (its ports are taken again below)
  auto tls = listen_in(netns_fd, bind_address, kTlsPort);
  if (!tls) return tls.error();
  auto plain = listen_in(netns_fd, bind_address, kPlainPort);
  if (!plain) {
    ::close(*tls);
    return plain.error();
  }
  impl_->executor->executeSync([&] {
    auto s = kj::heap<Served>();
    s->id = id;
    s->proxy = std::make_unique<EgressProxy>(*impl_->timer, std::move(options));
    s->tls = impl_->lowlevel->wrapListenSocketFd(*tls, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
    s->plain =
        impl_->lowlevel->wrapListenSocketFd(*plain, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
    s->tasks.add(s->accept(*s->tls, true));
    s->tasks.add(s->accept(*s->plain, false));
    impl_->served[id] = kj::mv(s);
    impl_->count = impl_->served.size();
  });
  return Ok{};
}

void ProxyHost::stop(const std::string& id) {
  impl_->executor->executeSync([&] {
    impl_->served.erase(id);
    impl_->count = impl_->served.size();
  });
}

size_t ProxyHost::serving() const { return impl_->count; }

kj::Promise<kj::Own<kj::AsyncIoStream>> ProxyHost::connect(const std::string& host, uint16_t port) {
  KJ_REQUIRE(t_network != nullptr, "ProxyHost::connect off the proxy thread");
  return t_network->parseAddress(host.c_str(), port).then([](kj::Own<kj::NetworkAddress> a) {
    return a->connect().attach(kj::mv(a));
  });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> ProxyHost::connect_in(int netns_fd,
                                                              const std::string& address,
                                                              uint16_t port) {
  KJ_REQUIRE(t_lowlevel != nullptr, "ProxyHost::connect_in off the proxy thread");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1)
    return KJ_EXCEPTION(FAILED, "not an IPv4 address", address.c_str());
  int fd = -1, err = 0;
  std::string entering = in_netns(netns_fd, [&] {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) err = errno;
  });
  if (!entering.empty()) return KJ_EXCEPTION(FAILED, "entering the namespace", entering.c_str());
  if (fd < 0) return KJ_EXCEPTION(FAILED, "socket", std::strerror(err));
  return t_lowlevel->wrapConnectingSocketFd(fd, reinterpret_cast<sockaddr*>(&a), sizeof a,
                                            kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
}

}  // namespace pandastack::vmm
