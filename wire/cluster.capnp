# Host-to-host protocol of a PandaStack cluster (actors/cluster.h). A host that receives a
# request for an id another host owns forwards it over this: the request as it came (method,
# URL, headers, body), the response streamed back through a sink with flow control. The owner
# serves it as its own client's request: it authenticates the key and checks the tenant again.
# Peers authenticate with their certificates (mutual TLS under the cluster CA; an insecure
# cluster's shared secret only with --insecure-cluster). A logged-in peer's authority is scoped:
# it moves snapshots and starts sandboxes only for a tenant whose API key it presents (the key of
# the request it serves), only from a snapshot it sent in the same session, and discards only what
# it started in that session (gateway/peer_snapshots.cc).
@0xcfee688706cc487c;

$import "/capnp/c++.capnp".namespace("pandastack::wire::cluster");

using Api = import "pandastack.capnp";

struct Header {
  name @0 :Text;
  value @1 :Text;
}

struct HttpRequest {
  method @0 :Text;        # GET, POST, ...
  url @1 :Text;           # path and query, as the client sent them
  headers @2 :List(Header);
  body @3 :Data;          # a body of at most kInlineBody (64 KiB); larger ones: bodySource
  fromHost @4 :Text;      # the forwarding host's id (logs)
  bodySource @5 :BodySource;  # a larger body, pulled in parts of at most 1 MiB
  bodyLength @6 :UInt64;      # (with bodySource) its length
  clientAddress @7 :Text;     # the client's IP address as the forwarding host saw it ("": unknown)
}

# A forwarded request's body, read by the owner part by part (no message carries more than a
# part: the peer port's messages stay small).
interface BodySource {
  # The next at most `max` bytes (at most 1 MiB); empty at the end.
  read @0 (max :UInt32) -> (data :Data);
}

interface ResponseSink {
  # The status line and headers, once, first. `length` -1: not known (a stream).
  start @0 (status :UInt16, statusText :Text, headers :List(Header), length :Int64) -> stream;
  write @1 (data :Data) -> stream;  # at most 1 MiB a call
  # The end of the body.
  end @2 ();
}

# One direction of a forwarded WebSocket: its messages, then its close.
interface WebSocketSink {
  message @0 (data :Data, text :Bool) -> stream;
  close @1 (code :UInt16, reason :Text);
}

# A snapshot offered to another host (vmm-driver/snapshot_transfer.h): a cross-host fork's or a
# migration's. The receiver answers which files it lacks (layers it holds by hash are not sent).
struct SnapshotFile {
  name @0 :Text;    # "mem", "state" or a disk layer's file name
  size @1 :UInt64;
  sha256 @2 :Text;  # layers: their content's hash
}

struct SnapshotOffer {
  meta @0 :Text;    # the snapshot's meta.json without its folders
  files @1 :List(SnapshotFile);
}

interface SnapshotSink {
  # `data` of offered file `file` (an index into the offer's files) at `offset`.
  write @0 (file :UInt32, offset :UInt64, data :Data) -> stream;
  # Every missing file sent: the receiver checks and keeps it as a snapshot named `snapshot`.
  commit @1 () -> (snapshot :Text);
}

# Sandboxes to start from a received snapshot on the receiving host.
struct StartRequest {
  snapshot @0 :Text;     # what commit() named
  tenant @1 :Text;
  parent @2 :Text;       # a fork's parent (on the sending host); "" for a migration
  ids @3 :List(Text);    # one per sandbox: "" for a new id (fork children), the sandbox's own
                         # id for a migration
  settings @4 :Text;     # the source sandbox as the API shows it (JSON): template, TTL,
                         # metadata, timeouts, network and egress are taken from it
  migrated @5 :Bool;     # a migration: the id keeps its owner record (the sender moves it)
  volumes @6 :Text;      # JSON array. A migration: the volumes that move with the sandbox
                         # (their files carried with the snapshot): each as the API shows it,
                         # plus mount, read_only and slot. A fork: the parent's read-write
                         # volumes {volume, mount, slot} (the snapshot holds their copies).
  apiKey @7 :Text;       # the API key of the request the sender serves: it must verify on the
                         # receiver and be `tenant`'s (or an admin's)
}

interface Peer {
  # Serves `request` as this host's own, writing the response to `sink`. Returns when the
  # response has ended.
  http @0 (request :HttpRequest, sink :ResponseSink);
  # Receives a snapshot: `missing` lists the offered files to send to `sink`. Dropping the sink
  # without commit() leaves nothing.
  # `tenant`: whose snapshot it is; `apiKey` (the request's) must verify here and be the
  # tenant's (or an admin's). Only `start` on this connection may use what commit() names.
  receiveSnapshot @1 (offer :SnapshotOffer, tenant :Text, apiKey :Text)
      -> (sink :SnapshotSink, missing :List(UInt32));
  # Starts sandboxes from a received snapshot (which is removed afterwards, started or not).
  # `sandboxes`: a JSON array of them as the API shows them; or `error` {code, message}.
  start @2 (request :StartRequest) -> (sandboxes :Text, error :Text);
  # Kills sandboxes this host started for the caller on this connection (a fork that failed
  # elsewhere is undone, a migration that could not hand over): `volumes` that came with a
  # migrated one go back. Ids the caller did not start on this connection are refused.
  discard @3 (tenant :Text, ids :List(Text), volumes :List(Text));
  # A WebSocket request served as this host's own. When the owner takes the WebSocket, the call
  # returns `up` (the client's messages go there) and the owner's messages go to `down`; when it
  # answers with a plain response (an error), that goes to `sink` and `up` is null. Dropping
  # `up` ends the WebSocket on the owner.
  webSocket @4 (request :HttpRequest, down :WebSocketSink, sink :ResponseSink)
      -> (up :WebSocketSink, accepted :Bool);
  # The public RPC API (wire/pandastack.capnp) of this host for `apiKey` (verified here, as a
  # Login would): an RPC client of another host reaches the sandboxes and databases this host
  # owns through it (the other host proxies the calls).
  platform @5 (apiKey :Text) -> (platform :Api.Platform);
}

interface PeerLogin {
  # The bootstrap capability: the cluster secret (compared in constant time) for a Peer.
  login @0 (secret :Data, host :Text) -> (peer :Peer);
}
