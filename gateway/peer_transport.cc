#include "gateway/peer_transport.h"

#include <kj/compat/tls.h>
#include <kj/debug.h>

#include <vector>

namespace pandastack::gateway {

namespace {

// The accepted socket's identity, below TLS (the certificate is what counts).
class SocketIdentity final : public kj::PeerIdentity {
 public:
  kj::String toString() override { return kj::str("peer socket"); }
};

// Every certificate of a PEM bundle (ca.pem may hold two CAs while one replaces the other).
std::vector<kj::TlsCertificate> certificates(const std::string& pem) {
  std::vector<kj::TlsCertificate> out;
  const std::string end = "-----END CERTIFICATE-----";
  size_t pos = 0;
  for (;;) {
    size_t b = pem.find("-----BEGIN CERTIFICATE-----", pos);
    if (b == std::string::npos) break;
    size_t e = pem.find(end, b);
    if (e == std::string::npos) break;
    e += end.size();
    out.emplace_back(kj::StringPtr(kj::heapString(pem.substr(b, e - b) + "\n")));
    pos = e;
  }
  return out;
}

}  // namespace

struct PeerTransport::Impl {
  std::vector<kj::TlsCertificate> trusted;
  kj::Maybe<kj::TlsKeypair> keypair;
  kj::Own<kj::TlsContext> tls;  // null: insecure
};

PeerTransport::PeerTransport(const PeerAuth& auth, kj::Timer& timer)
    : impl_(std::make_unique<Impl>()) {
  if (!auth.tls) return;
  impl_->trusted = certificates(auth.tls->ca_pem);
  KJ_REQUIRE(!impl_->trusted.empty(), "the cluster CA file holds no certificate");
  auto& kp = impl_->keypair.emplace(kj::TlsKeypair{kj::TlsPrivateKey(auth.tls->key_pem.c_str()),
                                                   kj::TlsCertificate(auth.tls->cert_pem.c_str())});
  kj::TlsContext::Options o;
  o.useSystemTrustStore = false;  // the cluster CA only
  o.verifyClients = true;         // mutual: a peer without the cluster's certificate is refused
  o.trustedCertificates = kj::arrayPtr(impl_->trusted.data(), impl_->trusted.size());
  o.minVersion = kj::TlsVersion::TLS_1_2;
  o.defaultKeypair = kp;
  o.timer = timer;
  o.acceptTimeout = kHandshakeTimeout;
  impl_->tls = kj::heap<kj::TlsContext>(kj::mv(o));
}

PeerTransport::~PeerTransport() = default;

bool PeerTransport::secure() const { return impl_->tls.get() != nullptr; }

kj::Promise<PeerTransport::Accepted> PeerTransport::accept(kj::Own<kj::AsyncIoStream> raw) {
  if (!secure()) return Accepted{kj::mv(raw), ""};
  kj::AuthenticatedStream s{kj::mv(raw), kj::heap<SocketIdentity>()};
  return impl_->tls->wrapServer(kj::mv(s)).then([](kj::AuthenticatedStream a) {
    auto& id = kj::downcast<kj::TlsPeerIdentity>(*a.peerIdentity);
    KJ_REQUIRE(id.hasCertificate(), "a peer presented no certificate");
    auto cn = id.getCommonName();
    KJ_REQUIRE(cn.size() > 0, "a peer certificate without a host id");
    return Accepted{kj::mv(a.stream), std::string(cn.cStr())};
  });
}

kj::Promise<kj::Own<kj::AsyncIoStream>> PeerTransport::connect(kj::Network& network,
                                                               const std::string& address,
                                                               const std::string& host) {
  auto connected = network.parseAddress(address).then(
      [](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); });
  if (!secure()) return connected;
  return connected.then([this, host](kj::Own<kj::AsyncIoStream> s) {
    return impl_->tls->wrapClient(kj::mv(s), host);
  });
}

}  // namespace pandastack::gateway
