#include "vmm-driver/port_forward.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "vmm-driver/netns.h"
#include "vmm-driver/network.h"

namespace pandastack::vmm {

namespace {

std::string errno_text(const std::string& what, int err) { return what + ": " + strerror(err); }

struct Pipe {
  int from, to;
  std::string buf;  // read from `from`, not yet written to `to`
  bool eof = false;
};

// Moves bytes along `p` (`in` readable from p.from, `out` writable to p.to). False: reset.
bool pump(Pipe& p, short in, short out, char* buf, size_t cap) {
  if ((in & (POLLIN | POLLHUP)) && !p.eof && p.buf.size() < cap) {
    ssize_t n = ::read(p.from, buf, cap - p.buf.size());
    if (n > 0)
      p.buf.append(buf, size_t(n));
    else if (n == 0)
      p.eof = true;
    else if (errno != EAGAIN && errno != EINTR)
      return false;
  } else if ((in & POLLERR) && p.buf.empty()) {
    return false;
  }
  if (!p.buf.empty() && (out & POLLOUT)) {
    ssize_t n = ::send(p.to, p.buf.data(), p.buf.size(), MSG_NOSIGNAL);
    if (n > 0)
      p.buf.erase(0, size_t(n));
    else if (n < 0 && errno != EAGAIN && errno != EINTR)
      return false;
  }
  if (p.eof && p.buf.empty()) ::shutdown(p.to, SHUT_WR);  // pass the half-close on
  return true;
}

}  // namespace

Result<int> connect_guest(int netns_fd, uint16_t guest_port, std::chrono::milliseconds timeout) {
  int fd = -1, err = 0;
  std::string what;
  // A thread of its own enters the namespace (and ends there): the caller's stays where it is.
  std::string entering = in_netns(netns_fd, [&] {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) err = errno, what = "socket";
  });
  if (!entering.empty()) return make_error(ErrorCode::io_error, entering);
  if (fd < 0) return make_error(ErrorCode::io_error, errno_text(what, err));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(guest_port);
  ::inet_pton(AF_INET, kGuestAddress, &a.sin_addr);
  auto fail = [&](ErrorCode code, const std::string& why) {
    ::close(fd);
    return make_error(code, why);
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) return fail(ErrorCode::io_error, errno_text("connect", errno));
    pollfd p{fd, POLLOUT, 0};
    int n;
    do n = ::poll(&p, 1, int(timeout.count()));
    while (n < 0 && errno == EINTR);
    if (n == 0)
      return fail(ErrorCode::timeout, "no answer from guest port " + std::to_string(guest_port) +
                                          " within " + std::to_string(timeout.count()) + " ms");
    socklen_t l = sizeof err;
    err = 0;
    if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0 || err != 0)
      return fail(ErrorCode::io_error, errno_text("connect", err ? err : errno));
  }
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

struct PortForward::Conn {
  int client = -1, guest = -1;
  bool connected = false;
  Pipe up{-1, -1, {}}, down{-1, -1, {}};  // client -> guest, guest -> client
};

Result<std::unique_ptr<PortForward>> PortForward::start(int netns_fd, uint16_t guest_port,
                                                        const std::string& bind_host) {
  std::unique_ptr<PortForward> f(new PortForward());
  f->guest_port_ = guest_port;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (::inet_pton(AF_INET, bind_host.c_str(), &a.sin_addr) != 1)
    return make_error(ErrorCode::invalid_argument, "bad bind address " + bind_host);
  f->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(f->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof a;
  if (f->listen_fd_ < 0 || ::bind(f->listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(f->listen_fd_, 64) != 0 ||
      ::getsockname(f->listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return make_error(ErrorCode::io_error, errno_text("listening on " + bind_host, errno));
  f->host_port_ = ntohs(a.sin_port);
  if (::pipe2(f->stop_, O_CLOEXEC | O_NONBLOCK) != 0)
    return make_error(ErrorCode::io_error, errno_text("pipe", errno));
  int ns = ::fcntl(netns_fd, F_DUPFD_CLOEXEC, 0);  // (dup() would clear close-on-exec)
  f->thread_ = std::thread([p = f.get(), ns] {
    int entered = ::setns(ns, CLONE_NEWNET);
    ::close(ns);
    if (entered != 0) {
      spdlog::error("port forward: cannot enter the sandbox namespace: {}", strerror(errno));
      return;
    }
    p->loop();
  });
  return f;
}
PortForward::~PortForward() {
  if (stop_[1] >= 0) {
    ssize_t w = ::write(stop_[1], "x", 1);
    (void)w;
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, stop_[0], stop_[1]})
    if (fd >= 0) ::close(fd);
}
void PortForward::loop() {
  std::vector<std::unique_ptr<Conn>> conns;
  constexpr size_t kBuf = 64 * 1024;
  char buf[kBuf];
  for (;;) {
    std::vector<pollfd> fds;
    fds.push_back({stop_[0], POLLIN, 0});
    fds.push_back({listen_fd_, short(conns.size() < kMaxForwardConnections ? POLLIN : 0), 0});
    for (auto& c : conns) {
      short g = 0, cl = 0;
      if (!c->connected) {
        g = POLLOUT;
      } else {
        if (!c->up.eof && c->up.buf.size() < kBuf) cl |= POLLIN;
        if (!c->down.eof && c->down.buf.size() < kBuf) g |= POLLIN;
        if (!c->up.buf.empty()) g |= POLLOUT;
        if (!c->down.buf.empty()) cl |= POLLOUT;
      }
      fds.push_back({c->client, cl, 0});
      fds.push_back({c->guest, g, 0});
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) break;
    // Only the connections that were polled have results (a new one is polled next round).
    const size_t polled = conns.size();
    if (fds[1].revents & POLLIN) accept_one(conns);
    for (size_t i = 0; i < polled; ++i) {
      auto& c = *conns[i];
      short crev = fds[2 + 2 * i].revents, grev = fds[3 + 2 * i].revents;
      bool dead = false;
      if (!c.connected) {
        if (grev & (POLLOUT | POLLERR | POLLHUP)) {
          int err = 0;
          socklen_t l = sizeof err;
          ::getsockopt(c.guest, SOL_SOCKET, SO_ERROR, &err, &l);
          if (err != 0)
            dead = true;
          else
            c.connected = true;
        }
      } else {
        dead = !pump(c.up, crev, grev, buf, kBuf) || !pump(c.down, grev, crev, buf, kBuf);
        // Both directions ended and flushed: done.
        if (c.up.eof && c.down.eof && c.up.buf.empty() && c.down.buf.empty()) dead = true;
      }
      if (dead) {
        ::close(c.client);
        ::close(c.guest);
        c.client = c.guest = -1;
      }
    }
    std::erase_if(conns, [](auto& c) { return c->client < 0; });
  }
  for (auto& c : conns) {
    ::close(c->client);
    ::close(c->guest);
  }
}

void PortForward::accept_one(std::vector<std::unique_ptr<Conn>>& conns) {
  int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (client < 0) return;
  // Made in this thread, so in the sandbox's namespace.
  int guest = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(guest_port_);
  ::inet_pton(AF_INET, kGuestAddress, &a.sin_addr);
  if (guest < 0 ||
      (::connect(guest, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)) {
    ::close(client);
    if (guest >= 0) ::close(guest);
    return;
  }
  auto c = std::make_unique<Conn>();
  c->client = client;
  c->guest = guest;
  c->up = Pipe{client, guest, {}};
  c->down = Pipe{guest, client, {}};
  conns.push_back(std::move(c));
}

}  // namespace pandastack::vmm
