// Entering a sandbox's network namespace for one job: sockets, netlink sockets and nftables
// contexts belong to the namespace of the thread that makes them.
#pragma once

#include <sched.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace pandastack::vmm {

// Runs `f` on a short-lived thread that entered network namespace `netns_fd` (-1: stays in the
// host's) and waits for it: what `f` makes there belongs to that namespace while the caller's
// thread stays where it is. "" when `f` ran; otherwise why the namespace could not be entered
// (and `f` did not run).
inline std::string in_netns(int netns_fd, const std::function<void()>& f) {
  std::string failed;
  std::thread([&] {
    if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
      failed = std::string("entering the sandbox namespace: ") + std::strerror(errno);
      return;
    }
    f();
  }).join();
  return failed;
}

}  // namespace pandastack::vmm
