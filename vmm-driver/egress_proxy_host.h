// Where sandboxes' egress proxies run (vmm-driver/egress_proxy.h): one host thread, a kj event
// loop, serving a pair of listeners per sandbox made inside the sandbox's network namespace. The
// sandbox's ruleset redirects the guest's HTTPS (443) and HTTP (80) connections to them; the
// address the guest asked for comes back from conntrack (SO_ORIGINAL_DST).
#pragma once

#include <kj/async-io.h>

#include <cstdint>
#include <memory>
#include <string>

#include "vmm-driver/egress_proxy.h"
#include "vmm-driver/error.h"
#include "vmm-driver/network.h"

namespace pandastack::vmm {

class ProxyHost {
 public:
  // The ports the listeners take in each sandbox's namespace (what the ruleset redirects to).
  static constexpr uint16_t kTlsPort = kEgressProxyTlsPort, kPlainPort = kEgressProxyPlainPort;
  // Connections served at once per sandbox; past it a new one is closed at once.
  static constexpr size_t kMaxConnections = 256;

  ProxyHost();
  ~ProxyHost();  // (stops every proxy, closes every connection)
  ProxyHost(const ProxyHost&) = delete;
  ProxyHost& operator=(const ProxyHost&) = delete;

  // Serves `options`'s proxy for sandbox `id` on kTlsPort (TLS) and kPlainPort (HTTP) of
  // `bind_address` in namespace `netns_fd`, replacing one it served before. `options.connect`
  // and `options.secrets` are called on the proxy thread (connect() below is for them).
  Status start(const std::string& id, int netns_fd, ProxyOptions options,
               const std::string& bind_address);
  // Stops its listeners and closes its connections; nothing when it has none.
  void stop(const std::string& id);
  size_t serving() const;  // sandboxes with a proxy now

  // On the proxy thread: a TCP connection to `host`:`port` (an address, or a name the host's
  // resolver answers), from the host's namespace.
  static kj::Promise<kj::Own<kj::AsyncIoStream>> connect(const std::string& host, uint16_t port);
  // On the proxy thread: a TCP connection to IPv4 `address`:`port` from inside namespace
  // `netns_fd` (a sandbox's: its egress rules and its address translation apply, as to the
  // guest's own connections).
  static kj::Promise<kj::Own<kj::AsyncIoStream>> connect_in(int netns_fd,
                                                            const std::string& address,
                                                            uint16_t port);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::vmm
