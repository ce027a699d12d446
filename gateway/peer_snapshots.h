// Snapshots between hosts (wire/cluster.capnp's receiveSnapshot, start, discard): the receiving
// host's side, served on its event loop for a logged-in peer, and the sending host's side, a
// blocking session a request handler runs on its worker thread (its own event loop and
// connection: a handler never touches the gateway's loop). A cross-host fork and a migration
// (gateway/cluster_moves.cc) ship a snapshot with it and start sandboxes from it there. Internal
// to gateway/.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actors/runtime.h"
#include "gateway/peer_transport.h"
#include "wire/cluster.capnp.h"
#include "wire/json.h"

namespace pandastack::gateway {

struct Server;

// What a logged-in peer may act on, one per login (gateway/peers.cc's PeerImpl): a peer is
// trusted with nothing beyond it (security review 3, H1). It starts sandboxes only from a
// snapshot it sent on this connection, for the tenant that snapshot was received for (whose API
// key it presented), and discards only what it started on this connection. A snapshot received
// and never started is removed when the connection ends.
struct PeerScope {
  PeerScope(actors::Runtime& r, std::string h) : rt(r), host(std::move(h)) {}
  ~PeerScope();
  PeerScope(const PeerScope&) = delete;
  PeerScope& operator=(const PeerScope&) = delete;

  actors::Runtime& rt;
  const std::string host;  // the peer's host id (its certificate's)
  std::mutex mu;
  std::map<std::string, std::string> received;  // snapshot id -> tenant: committed, not started
  std::map<std::string, std::string> started;   // sandbox id -> tenant
  std::set<std::string> volumes;                // arrived with a migration started here
};

// The receiving side (PeerImpl's methods), each within `scope`.
kj::Promise<void> receive_snapshot(Server& server, std::shared_ptr<PeerScope> scope,
                                   capnp::CallContext<wire::cluster::Peer::ReceiveSnapshotParams,
                                                      wire::cluster::Peer::ReceiveSnapshotResults>
                                       ctx);
kj::Promise<void> start_from_snapshot(
    Server& server, std::shared_ptr<PeerScope> scope,
    capnp::CallContext<wire::cluster::Peer::StartParams, wire::cluster::Peer::StartResults> ctx);
kj::Promise<void> discard_sandboxes(
    Server& server, std::shared_ptr<PeerScope> scope,
    capnp::CallContext<wire::cluster::Peer::DiscardParams, wire::cluster::Peer::DiscardResults>
        ctx);

// Whether API key `key` verifies and may act for `tenant` (its own key, or an admin's): "" when
// it may, else why not. Blocking (a key lookup): on a worker.
std::string peer_may_act(actors::Runtime& rt, const std::string& key, const std::string& tenant);

// The sending side: a session with one host, on the calling thread.
class PeerSession {
 public:
  // Connects to the host `host` at `address` (HOST:PORT; over mutual TLS its certificate must
  // name `host`) and logs in. `api_key`: the key of the request this session serves; the host
  // checks it before it takes a snapshot or starts a sandbox (PeerScope).
  static actors::Reply<std::unique_ptr<PeerSession>> open(const std::string& host,
                                                          const std::string& address,
                                                          const PeerAuth& auth,
                                                          const std::string& api_key = "");
  ~PeerSession();

  struct Shipped {
    std::string snapshot;  // its id on the receiving host
    uint64_t bytes = 0;    // sent (data extents of the files the host lacked)
    uint32_t files = 0, files_offered = 0;
  };
  // Sends the snapshot `offer` describes (Runtime::offer_snapshot, offer_hibernation) for
  // `tenant`: only the files the host lacks, only their data extents.
  actors::Reply<Shipped> ship(const std::string& tenant, const actors::SnapshotOffer& offer);

  struct Start {
    std::string snapshot, tenant, parent;
    std::vector<std::string> ids;
    wire::Json settings;  // the source sandbox as the API shows it
    bool migrated = false;
    wire::Json volumes = wire::Json::array();  // StartRequest.volumes
  };
  // Starts sandboxes from a shipped snapshot: them as the API shows them.
  actors::Reply<std::vector<wire::Json>> start(const Start& s);
  // A request served by the host as a client's (its auth and tenancy checked there): the status
  // and body of its answer (at most kMaxBody bytes).
  struct HttpAnswer {
    unsigned status = 0;
    std::string body;
  };
  static constexpr size_t kMaxBody = 64 << 20;
  actors::Reply<HttpAnswer> http(const std::string& method, const std::string& url,
                                 const std::vector<std::pair<std::string, std::string>>& headers);
  // Kills sandboxes start() made (an undo); `volumes` that came with a migrated one go back.
  void discard(const std::string& tenant, const std::vector<std::string>& ids,
               const std::vector<std::string>& volumes = {});

  struct Impl;

 private:
  explicit PeerSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::gateway
