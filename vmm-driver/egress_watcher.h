// Watches what every sandbox's network lets out and refuses, for its egress log: one host thread
// waits (epoll) on two netlink sockets per sandbox namespace, made inside that namespace:
//   - conntrack events (NEW, updates, DESTROY) of the connections the guest opened, with byte
//     counters (the namespace's nf_conntrack_acct is switched on): a TCP connection's end is its
//     move to TIME_WAIT or CLOSE, whose counters a GET on the same socket fetches (events carry
//     them only in the DELETE, two minutes later);
//   - NFLOG group `kEgressLogGroup`: the first packets the sandbox's ruleset denied, each with the
//     reason as its log prefix (network.cc, rate-limited there).
// Nothing the guest sends is parsed beyond the IPv4/TCP/UDP header of a denied packet, which the
// kernel copied (at most kDeniedCopyBytes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "vmm-driver/egress_log.h"
#include "vmm-driver/error.h"

namespace pandastack::vmm {

inline constexpr uint16_t kEgressLogGroup = 1;
inline constexpr uint32_t kDeniedCopyBytes = 64;

class EgressWatcher {
 public:
  EgressWatcher();
  ~EgressWatcher();  // stops the thread; subscriptions still alive become no-ops
  EgressWatcher(const EgressWatcher&) = delete;
  EgressWatcher& operator=(const EgressWatcher&) = delete;

  // Ends the watch of one namespace when destroyed (its sockets close: they hold the namespace).
  class Subscription {
   public:
    struct Core;  // (the watcher's state, shared with its thread)
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

   private:
    friend class EgressWatcher;
    Subscription(std::weak_ptr<Core> core, uint64_t token)
        : core_(std::move(core)), token_(token) {}
    std::weak_ptr<Core> core_;
    uint64_t token_;
  };

  // Starts writing the namespace `netns_fd`'s connections and denials into `log`.
  Result<std::unique_ptr<Subscription>> watch(int netns_fd, std::shared_ptr<EgressLog> log);
  size_t watched() const;

 private:
  std::shared_ptr<Subscription::Core> core_;
  std::thread thread_;
};

}  // namespace pandastack::vmm
