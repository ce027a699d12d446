# Host-to-host protocol of a PandaStack cluster (actors/cluster.h). A host that receives a
# request for an id another host owns forwards it over this: the request as it came (method,
# URL, headers, body), the response streamed back through a sink with flow control. The owner
# serves it as its own client's request: it authenticates the key and checks the tenant again.
# Peers authenticate with the cluster's shared secret (a file every host is given).
@0xcfee688706cc487c;

$import "/capnp/c++.capnp".namespace("pandastack::wire::cluster");

struct Header {
  name @0 :Text;
  value @1 :Text;
}

struct HttpRequest {
  method @0 :Text;        # GET, POST, ...
  url @1 :Text;           # path and query, as the client sent them
  headers @2 :List(Header);
  body @3 :Data;          # (bounded by the receiving host's body limits)
  fromHost @4 :Text;      # the forwarding host's id (logs)
}

interface ResponseSink {
  # The status line and headers, once, first. `length` -1: not known (a stream).
  start @0 (status :UInt16, statusText :Text, headers :List(Header), length :Int64) -> stream;
  write @1 (data :Data) -> stream;
  # The end of the body.
  end @2 ();
}

interface Peer {
  # Serves `request` as this host's own, writing the response to `sink`. Returns when the
  # response has ended.
  http @0 (request :HttpRequest, sink :ResponseSink);
}

interface PeerLogin {
  # The bootstrap capability: the cluster secret (compared in constant time) for a Peer.
  login @0 (secret :Data, host :Text) -> (peer :Peer);
}
