// A TCP port of the host forwarded to a port of the guest (Network::expose): a listener on the
// host, and one thread in the sandbox's network namespace that connects to the guest for each
// client and moves bytes both ways (half-closes passed on; at most kMaxForwardConnections at once,
// more wait in the backlog). Ends with its owner.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// A TCP connection to `guest_port` of the guest, made from inside the namespace `netns_fd` names
// (on a short-lived thread: the socket keeps that namespace). Blocking mode, close-on-exec; the
// caller owns it. connection_refused / timeout / io_error.
Result<int> connect_guest(int netns_fd, uint16_t guest_port, std::chrono::milliseconds timeout);

class PortForward {
 public:
  // Listens on `bind_host` (an IPv4 address; a port the kernel picks) and forwards to
  // `guest_port` of the guest, from inside the namespace `netns_fd` names.
  static Result<std::unique_ptr<PortForward>> start(int netns_fd, uint16_t guest_port,
                                                    const std::string& bind_host);
  ~PortForward();
  PortForward(const PortForward&) = delete;
  PortForward& operator=(const PortForward&) = delete;
  uint16_t host_port() const { return host_port_; }

 private:
  PortForward() = default;
  struct Conn;
  void loop();
  void accept_one(std::vector<std::unique_ptr<Conn>>& conns);

  uint16_t guest_port_ = 0, host_port_ = 0;
  int listen_fd_ = -1;
  int stop_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace pandastack::vmm
