// The Cap'n Proto RPC gateway (wire/pandastack.capnp): Login -> Platform -> Sandbox capabilities
// over the runtime facade, on the same KJ event loop as the REST gateway. Like REST, it never
// touches a VMM, a VM socket or the database; runtime calls run on its own worker pool.
#pragma once

#include <capnp/capability.h>
#include <kj/async-io.h>

#include <functional>
#include <memory>

#include "actors/runtime.h"
#include "gateway/rest.h"

namespace pandastack::gateway {

class RpcServer {
 public:
  // Connections are capped (limits.max_connections); one that has not logged in may send 64 KiB
  // within 10 s; a logged-in session's key is verified again on every call (revocation reaches
  // open sessions).
  RpcServer(actors::Runtime& runtime, kj::Timer& timer, Limits limits = {});
  // Cancels commands in flight and joins the workers.
  ~RpcServer();

  // Accepts connections on `listener` (TCP or unix socket) until the promise is cancelled.
  kj::Promise<void> listen(kj::ConnectionReceiver& listener);

  // Cluster mode. A Platform for `key` served by this host (a peer's Peer.platform).
  kj::Promise<capnp::Capability::Client> platform_for(std::string key);
  // How this host reaches another host's Platform for a key (host `host` at its peer address
  // `address`; its certificate must name `host`): once set,
  // get, create and getDatabase for what other hosts own are answered by them (proxied).
  using RemotePlatform = std::function<kj::Promise<capnp::Capability::Client>(
      const std::string& host, const std::string& address, const std::string& key)>;
  void route_to(RemotePlatform remote);

  // Files over RPC: one message carries the whole file.
  static constexpr size_t kMaxFileBytes = 32 << 20;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::gateway
