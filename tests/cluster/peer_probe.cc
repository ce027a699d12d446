// A hostile peer for the cluster_trust suite (tests/cluster/trust_test.py): a host certificate the
// cluster CA issued (a compromised host's, or a stolen one), speaking wire/cluster.capnp to a
// host's peer port as pandastackd would, asking for what that host must refuse (security review
// 3, H1: a logged-in peer acts only for a tenant whose key it presents, only on what it sent and
// started on its own connection). Prints one JSON line: {"ok": true} or {"error": "..."}.
//
//   pandastack-peer-probe --tls DIR --self ID --host ID --address HOST:PORT COMMAND ARGS...
//     discard TENANT SANDBOX...        Peer.discard of sandboxes it did not start
//     receive TENANT KEY               Peer.receiveSnapshot of a small offer under KEY
//     start TENANT SNAPSHOT KEY PARENT Peer.start of a fork of PARENT from SNAPSHOT under KEY
#include <capnp/message.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <cstdio>
#include <string>
#include <vector>

#include "actors/cluster_tls.h"
#include "gateway/peer_transport.h"
#include "gateway/peers.h"
#include "wire/cluster.capnp.h"
#include "wire/json.h"

namespace wc = pandastack::wire::cluster;
using pandastack::wire::Json;

namespace {

void print(const std::string& key, const std::string& value) {
  Json j = Json::object();
  if (key == "ok")
    j.set("ok", true);
  else
    j.set(key, value);
  std::printf("%s\n", j.dump().c_str());
}

int usage() {
  std::fprintf(
      stderr,
      "usage: pandastack-peer-probe --tls DIR --self ID --host ID --address HOST:PORT "
      "discard TENANT SANDBOX... | receive TENANT KEY | start TENANT SNAPSHOT KEY PARENT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tls_dir, self, host, address;
  std::vector<std::string> rest;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--tls")
      tls_dir = next();
    else if (a == "--self")
      self = next();
    else if (a == "--host")
      host = next();
    else if (a == "--address")
      address = next();
    else
      rest.push_back(a);
  }
  if (tls_dir.empty() || self.empty() || host.empty() || address.empty() || rest.size() < 2)
    return usage();
  auto tls = pandastack::actors::ClusterTls::load(tls_dir, self);
  if (!tls) {
    print("error", "credentials: " + tls.error().message);
    return 1;
  }
  pandastack::gateway::PeerAuth auth{self, *tls, ""};
  auto io = kj::setupAsyncIo();
  pandastack::gateway::PeerTransport transport(auth, io.provider->getTimer());
  try {
    auto stream = transport.connect(io.provider->getNetwork(), address, host).wait(io.waitScope);
    pandastack::gateway::PeerConnection conn(kj::mv(stream), capnp::rpc::twoparty::Side::CLIENT,
                                             nullptr);
    auto peer = pandastack::gateway::login_request(conn.bootstrap().castAs<wc::PeerLogin>(), auth)
                    .send()
                    .wait(io.waitScope)
                    .getPeer();
    const std::string& command = rest[0];
    if (command == "discard") {
      auto req = peer.discardRequest();
      req.setTenant(rest[1]);
      auto ids = req.initIds(uint(rest.size() - 2));
      for (size_t i = 2; i < rest.size(); ++i) ids.set(uint(i - 2), rest[i]);
      req.send().wait(io.waitScope);
      print("ok", "");
    } else if (command == "receive" && rest.size() == 3) {
      auto req = peer.receiveSnapshotRequest();
      req.setTenant(rest[1]);
      req.setApiKey(rest[2]);
      auto offer = req.initOffer();
      offer.setMeta(R"({"format":4,"layers":["layer-a.qcow2"],"memory_mib":1})");
      auto files = offer.initFiles(3);
      files[0].setName("mem");
      files[1].setName("state");
      files[2].setName("layer-a.qcow2");
      files[2].setSha256(std::string(64, 'a'));
      auto got = req.send().wait(io.waitScope);
      print("ok", std::to_string(got.getMissing().size()));
    } else if (command == "start" && rest.size() == 5) {
      auto req = peer.startRequest();
      auto r = req.initRequest();
      r.setTenant(rest[1]);
      r.setSnapshot(rest[2]);
      r.setApiKey(rest[3]);
      r.setParent(rest[4]);
      r.initIds(1).set(0, "");
      r.setSettings(R"({"template":"base"})");
      auto got = req.send().wait(io.waitScope);
      if (got.hasError() && got.getError().size() > 0)
        print("error", got.getError().cStr());
      else
        print("ok", "");
    } else {
      return usage();
    }
  } catch (kj::Exception& e) {
    print("error", e.getDescription().cStr());
    return 1;
  }
  return 0;
}
