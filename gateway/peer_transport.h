// How hosts reach each other's peer port: mutual TLS under the cluster CA (each host presents
// its own certificate, actors/cluster_tls.h; a peer's host id is the CN of the certificate it
// proved, never what it says), or, only for an --insecure-cluster, plain TCP with the shared
// secret sent at login. Both sides; internal to gateway/.
#pragma once

#include <kj/async-io.h>
#include <kj/timer.h>

#include <memory>
#include <optional>
#include <string>

#include "actors/cluster_tls.h"

namespace pandastack::gateway {

struct PeerAuth {
  std::string self;                       // this host's id
  std::optional<actors::ClusterTls> tls;  // none: an insecure cluster
  std::string secret;                     // an insecure cluster's shared secret
};

class PeerTransport {
 public:
  // `timer`: bounds a server-side handshake (kHandshakeTimeout).
  PeerTransport(const PeerAuth& auth, kj::Timer& timer);
  ~PeerTransport();
  bool secure() const;

  struct Accepted {
    kj::Own<kj::AsyncIoStream> stream;
    std::string host;  // the host id its certificate names ("" when insecure)
  };
  // The server side of a connection: a TLS handshake that requires a certificate issued by the
  // cluster CA. Fails (the connection is dropped) on any other.
  kj::Promise<Accepted> accept(kj::Own<kj::AsyncIoStream> raw);
  // The client side: connects to `address` (HOST:PORT); the server's certificate must be the
  // cluster's for host `host`, whatever etcd said its address was.
  kj::Promise<kj::Own<kj::AsyncIoStream>> connect(kj::Network& network, const std::string& address,
                                                  const std::string& host);

  static constexpr auto kHandshakeTimeout = 10 * kj::SECONDS;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::gateway
