// Snapshots between hosts (wire/cluster.capnp's receiveSnapshot, start, discard): the receiving
// host's side, served on its event loop for a logged-in peer, and the sending host's side, a
// blocking session a request handler runs on its worker thread (its own event loop and
// connection: a handler never touches the gateway's loop). A cross-host fork and a migration
// (gateway/cluster_moves.cc) ship a snapshot with it and start sandboxes from it there. Internal
// to gateway/.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "actors/runtime.h"
#include "gateway/peer_transport.h"
#include "vmm-driver/snapshot.h"
#include "wire/cluster.capnp.h"
#include "wire/json.h"

namespace pandastack::gateway {

struct Server;

// The receiving side (PeerImpl's methods).
kj::Promise<void> receive_snapshot(Server& server,
                                   capnp::CallContext<wire::cluster::Peer::ReceiveSnapshotParams,
                                                      wire::cluster::Peer::ReceiveSnapshotResults>
                                       ctx);
// (`from`: the host of the peer that called, as it logged in.)
kj::Promise<void> start_from_snapshot(
    Server& server, const std::string& from,
    capnp::CallContext<wire::cluster::Peer::StartParams, wire::cluster::Peer::StartResults> ctx);
kj::Promise<void> discard_sandboxes(
    Server& server, const std::string& from,
    capnp::CallContext<wire::cluster::Peer::DiscardParams, wire::cluster::Peer::DiscardResults>
        ctx);

// The sending side: a session with one host, on the calling thread.
class PeerSession {
 public:
  // Connects to the host `host` at `address` (HOST:PORT; over mutual TLS its certificate must
  // name `host`) and logs in.
  static actors::Reply<std::unique_ptr<PeerSession>> open(const std::string& host,
                                                          const std::string& address,
                                                          const PeerAuth& auth);
  ~PeerSession();

  struct Shipped {
    std::string snapshot;  // its id on the receiving host
    uint64_t bytes = 0;    // sent (data extents of the files the host lacked)
    uint32_t files = 0, files_offered = 0;
  };
  // Sends `snap` (only the files the host lacks; only their data extents), with files
  // `carried` along (a migrated sandbox's volumes: vmm::offer_of).
  actors::Reply<Shipped> ship(const vmm::Snapshot& snap,
                              const std::vector<std::filesystem::path>& carried = {});

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
