#include "vmm-driver/vm_watcher.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pandastack::vmm {

VmWatcher::VmWatcher() {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // token 0: the wake-up descriptor
  if (epoll_ < 0 || wake_ < 0 || ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev) != 0)
    spdlog::critical("vm watcher: cannot set up epoll: {}", strerror(errno));
  thread_ = std::thread([this] { run(); });
}

VmWatcher::~VmWatcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  ssize_t w = ::write(wake_, &one, sizeof one);
  (void)w;
  thread_.join();
  for (auto& [token, e] : entries_) ::close(e.pidfd);
  ::close(wake_);
  ::close(epoll_);
}

Result<uint64_t> VmWatcher::watch(pid_t pid, OnExit on_exit) {
  int fd = int(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "pidfd_open(" + std::to_string(pid) + "): " + strerror(errno));
  std::lock_guard lock(mu_);
  uint64_t token = next_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(ErrorCode::io_error, std::string("epoll_ctl: ") + strerror(e));
  }
  entries_[token] = {fd, std::move(on_exit)};
  return token;
}

void VmWatcher::unwatch(uint64_t token) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(token);
  if (it == entries_.end()) return;
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
  ::close(it->second.pidfd);
  entries_.erase(it);
}

void VmWatcher::mute() {
  std::lock_guard lock(mu_);
  muted_ = true;
}

size_t VmWatcher::watched() {
  std::lock_guard lock(mu_);
  return entries_.size();
}

void VmWatcher::run() {
  epoll_event events[16];
  for (;;) {
    int n = ::epoll_wait(epoll_, events, 16, -1);
    if (n < 0 && errno == EINTR) continue;
    std::lock_guard lock(mu_);
    if (stop_) return;
    for (int i = 0; i < n; ++i) {
      uint64_t token = events[i].data.u64;
      if (token == 0) continue;
      auto it = entries_.find(token);
      if (it == entries_.end()) continue;  // unwatched meanwhile
      ::epoll_ctl(epoll_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
      ::close(it->second.pidfd);
      auto on_exit = std::move(it->second.on_exit);
      entries_.erase(it);
      if (!muted_) on_exit();  // under mu_: unwatch() returns only once no callback runs
    }
  }
}

}  // namespace pandastack::vmm
