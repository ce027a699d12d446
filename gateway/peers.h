// Host-to-host forwarding in a cluster (wire/cluster.capnp): the server side, which serves a
// peer's forwarded request as this host's own, and the client side, which forwards a request for
// an id another host owns and streams the answer back to the client. Internal to gateway/.
#pragma once

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/timer.h>

#include <map>
#include <memory>
#include <string>

#include "gateway/peer_transport.h"
#include "wire/cluster.capnp.h"

namespace pandastack::gateway {

struct Server;
class Acceptor;

class Peers {
 public:
  // `auth`: this host's id and credentials (its certificate, or an insecure cluster's secret).
  Peers(Server& server, kj::AsyncIoProvider& io, PeerAuth auth);
  ~Peers();

  // Serves peers on `listener` until the promise is cancelled.
  kj::Promise<void> listen(kj::ConnectionReceiver& listener);

  // Forwards a request to the host at `address` (HOST:PORT) and writes its answer to `response`.
  // `client`: the client's IP address, told to the owner (a preview's X-Forwarded-For).
  kj::Promise<void> forward(const std::string& address, const std::string& host,
                            kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::Array<kj::byte> body,
                            kj::HttpService::Response& response, const std::string& client = "");

  // Forwards a WebSocket request: once the owner takes it, the client's WebSocket is accepted
  // here and messages flow both ways (each direction flow-controlled) until either end closes.
  kj::Promise<void> forward_websocket(const std::string& address, const std::string& host,
                                      kj::StringPtr url, const kj::HttpHeaders& headers,
                                      kj::HttpService::Response& response,
                                      const std::string& client = "");
  // The public RPC API's Platform of host `host` at `address` for `key` (Peer.platform).
  kj::Promise<capnp::Capability::Client> platform(const std::string& host,
                                                  const std::string& address,
                                                  const std::string& key);
  // Keeps a forwarded WebSocket's handling running after the call that started it returned.
  void keep(kj::Promise<void> task);

  const PeerAuth& auth() const;
  const std::string& self() const;

  // The header a forwarded request carries (its owner serves it without routing it again).
  static constexpr const char* kForwardedHeader = "X-Pandastack-Forwarded";

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// What one message carries at most: forwarded bodies and answers, and snapshots, travel in
// parts of kPeerPart; a body up to kInlineBody rides in the request itself.
inline constexpr size_t kPeerPart = 1 << 20;
inline constexpr size_t kInlineBody = 64 << 10;
// After login: a part plus headers, except the public RPC API proxied for another host's client
// (Peer.platform), whose readFile/writeFile carry up to RpcServer::kMaxFileBytes (32 MiB) in one
// call: messages up to that plus 1 MiB. Before login a connection is cut off at
// kPeerPreLoginBytes (a TLS handshake and a login take a few KiB).
inline constexpr uint64_t kMaxPeerMessageBytes = (32ull << 20) + (1ull << 20);
inline constexpr size_t kPeerPreLoginBytes = 64 << 10;
// Connections open at once from one address: a host keeps one for forwarding plus one per move
// or list fan-out in flight; more are refused at accept (before a handshake is read).
inline constexpr size_t kPeerConnectionsPerSource = 64;

// One Cap'n Proto connection between two hosts (either side).
struct PeerConnection {
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  PeerConnection(kj::Own<kj::AsyncIoStream> s, capnp::rpc::twoparty::Side side,
                 kj::Maybe<capnp::Capability::Client> bootstrap)
      : stream(kj::mv(s)),
        network(*stream, side, options()),
        rpc(side == capnp::rpc::twoparty::Side::SERVER
                ? capnp::makeRpcServer(network, KJ_ASSERT_NONNULL(kj::mv(bootstrap)))
                : capnp::makeRpcClient(network)) {}
  static capnp::ReaderOptions options() {
    capnp::ReaderOptions o;
    o.traversalLimitInWords = kMaxPeerMessageBytes / 8;
    return o;
  }
  // The other host's bootstrap capability (the client side).
  capnp::Capability::Client bootstrap() {
    capnp::MallocMessageBuilder vat;
    auto id = vat.initRoot<capnp::rpc::twoparty::VatId>();
    id.setSide(capnp::rpc::twoparty::Side::SERVER);
    return rpc.bootstrap(id);
  }
};

// A login to the host whose PeerLogin is `login`, as `auth` logs in (both sending sides).
capnp::Request<wire::cluster::PeerLogin::LoginParams, wire::cluster::PeerLogin::LoginResults>
login_request(wire::cluster::PeerLogin::Client login, const PeerAuth& auth);

// A request body already read, as a stream (for handle_request).
kj::Own<kj::AsyncInputStream> bytes_input(kj::Array<kj::byte> bytes);

}  // namespace pandastack::gateway
