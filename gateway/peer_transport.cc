#include "gateway/peer_transport.h"

#include <kj/debug.h>

#include "gateway/tls_stream.h"

namespace pandastack::gateway {

struct PeerTransport::Impl {
  kj::Timer& timer;
  std::unique_ptr<TlsConfig> tls;  // null: insecure
  explicit Impl(kj::Timer& t) : timer(t) {}
};

PeerTransport::PeerTransport(const PeerAuth& auth, kj::Timer& timer)
    : impl_(std::make_unique<Impl>(timer)) {
  if (!auth.tls) return;
  impl_->tls = std::make_unique<TlsConfig>(auth.tls->ca_pem, auth.tls->cert_pem, auth.tls->key_pem);
}

PeerTransport::~PeerTransport() = default;

bool PeerTransport::secure() const { return impl_->tls != nullptr; }

kj::Promise<PeerTransport::Accepted> PeerTransport::accept(kj::Own<kj::AsyncIoStream> raw) {
  if (!secure()) return Accepted{kj::mv(raw), ""};
  auto shaken = impl_->tls->server(kj::mv(raw)).then([](TlsConfig::Connected c) {
    KJ_REQUIRE(!c.peer.empty(), "a peer certificate without a host id");
    return Accepted{kj::mv(c.stream), std::move(c.peer)};
  });
  return impl_->timer.timeoutAfter(kHandshakeTimeout, kj::mv(shaken));
}

kj::Promise<kj::Own<kj::AsyncIoStream>> PeerTransport::connect(kj::Network& network,
                                                               const std::string& address,
                                                               const std::string& host) {
  auto connected = network.parseAddress(address).then(
      [](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); });
  if (!secure()) return connected;
  return connected
      .then([this, host](kj::Own<kj::AsyncIoStream> s) {
        return impl_->tls->client(kj::mv(s), host);
      })
      .then([](TlsConfig::Connected c) { return kj::mv(c.stream); });
}

}  // namespace pandastack::gateway
