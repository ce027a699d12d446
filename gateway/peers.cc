#include "gateway/peers.h"

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/debug.h>
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <deque>

#include "gateway/acceptor.h"
#include "gateway/guarded_stream.h"
#include "gateway/peer_bodies.h"
#include "gateway/peer_snapshots.h"
#include "gateway/rpc.h"
#include "gateway/server.h"
#include "wire/cluster.capnp.h"

namespace pandastack::gateway {

namespace wc = pandastack::wire::cluster;

namespace {

// --- The owner's side: a peer's request served as this host's own. ---

class SinkOutput final : public kj::AsyncOutputStream {
 public:
  explicit SinkOutput(wc::ResponseSink::Client sink) : sink_(kj::mv(sink)) {}
  // In parts of at most kPeerPart, one after another (each a streaming call: it resolves when
  // the peer can take more). The caller keeps `buffer` alive until the promise resolves.
  kj::Promise<void> write(const void* buffer, size_t size) override {
    auto bytes = static_cast<const kj::byte*>(buffer);
    size_t n = std::min(size, kPeerPart);
    auto r = sink_.writeRequest(capnp::MessageSize{n / 8 + 8, 0});
    r.setData(kj::arrayPtr(bytes, n));
    auto sent = r.send();
    if (n == size) return sent;
    return sent.then([this, bytes, n, size]() { return write(bytes + n, size - n); });
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    size_t total = 0;
    for (auto& p : pieces) total += p.size();
    auto joined = kj::heapArray<kj::byte>(total);
    size_t at = 0;
    for (auto& p : pieces) {
      memcpy(joined.begin() + at, p.begin(), p.size());
      at += p.size();
    }
    auto& ref = joined;
    return write(ref.begin(), ref.size()).attach(kj::mv(joined));
  }
  kj::Promise<void> whenWriteDisconnected() override { return kj::NEVER_DONE; }

 private:
  wc::ResponseSink::Client sink_;
};

class SinkResponse final : public kj::HttpService::Response {
 public:
  explicit SinkResponse(wc::ResponseSink::Client sink) : sink_(kj::mv(sink)) {}
  kj::Own<kj::AsyncOutputStream> send(uint status, kj::StringPtr text,
                                      const kj::HttpHeaders& headers,
                                      kj::Maybe<uint64_t> size) override {
    auto r = sink_.startRequest();
    r.setStatus(uint16_t(status));
    r.setStatusText(text);
    copy_headers(headers, [&](size_t n) { return r.initHeaders(uint(n)); });
    KJ_IF_MAYBE (s, size) {
      r.setLength(int64_t(*s));
    } else {
      r.setLength(-1);
    }
    started = r.send();
    return kj::heap<SinkOutput>(sink_);
  }
  kj::Own<kj::WebSocket> acceptWebSocket(const kj::HttpHeaders&) override {
    KJ_FAIL_REQUIRE("a WebSocket is not forwarded between hosts");
  }
  kj::Promise<void> finish() {
    return started.then(
        [sink = sink_]() mutable { return sink.endRequest().send().ignoreResult(); });
  }

 private:
  wc::ResponseSink::Client sink_;
  kj::Promise<void> started = kj::READY_NOW;
};

// --- WebSockets: the owner's end. ---

// The client's messages as the owner's handler receives them (fed by UpSink).
struct Inbox {
  std::deque<kj::WebSocket::Message> queue;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<kj::WebSocket::Message>>> waiter;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> room;  // a sender waiting for room
  bool ended = false;
  uint64_t received = 0;
  kj::Own<kj::PromiseFulfiller<void>> abort_fulfiller;
  kj::ForkedPromise<void> aborted = nullptr;
  static constexpr size_t kMaxQueued = 16;

  Inbox() {
    auto pf = kj::newPromiseAndFulfiller<void>();
    abort_fulfiller = kj::mv(pf.fulfiller);
    aborted = pf.promise.fork();
  }
  kj::Promise<void> push(kj::WebSocket::Message m, size_t bytes) {
    received += bytes;
    KJ_IF_MAYBE (w, waiter) {
      (*w)->fulfill(kj::mv(m));
      waiter = nullptr;
      return kj::READY_NOW;
    }
    queue.push_back(kj::mv(m));
    if (queue.size() < kMaxQueued) return kj::READY_NOW;
    auto pf = kj::newPromiseAndFulfiller<void>();
    room = kj::mv(pf.fulfiller);
    return kj::mv(pf.promise);
  }
  kj::Promise<kj::WebSocket::Message> next() {
    if (!queue.empty()) {
      auto m = kj::mv(queue.front());
      queue.pop_front();
      KJ_IF_MAYBE (r, room) {
        (*r)->fulfill();
        room = nullptr;
      }
      return kj::mv(m);
    }
    if (ended) return KJ_EXCEPTION(DISCONNECTED, "the forwarding host went away");
    auto pf = kj::newPromiseAndFulfiller<kj::WebSocket::Message>();
    waiter = kj::mv(pf.fulfiller);
    return kj::mv(pf.promise);
  }
  void end() {
    ended = true;
    KJ_IF_MAYBE (w, waiter) {
      (*w)->reject(KJ_EXCEPTION(DISCONNECTED, "the forwarding host went away"));
      waiter = nullptr;
    }
    if (abort_fulfiller->isWaiting()) abort_fulfiller->fulfill();
  }
};

// `up`: the client's messages, from the forwarding host.
class UpSink final : public wc::WebSocketSink::Server {
 public:
  explicit UpSink(std::shared_ptr<Inbox> in) : in_(kj::mv(in)) {}
  ~UpSink() { in_->end(); }  // the forwarding host dropped it: the client is gone
  kj::Promise<void> message(MessageContext ctx) override {
    auto p = ctx.getParams();
    auto d = p.getData();
    if (p.getText())
      return in_->push(kj::heapString(reinterpret_cast<const char*>(d.begin()), d.size()),
                       d.size());
    return in_->push(kj::heapArray<kj::byte>(d.begin(), d.size()), d.size());
  }
  kj::Promise<void> close(CloseContext ctx) override {
    auto p = ctx.getParams();
    return in_->push(kj::WebSocket::Close{p.getCode(), kj::str(p.getReason())}, 0);
  }

 private:
  std::shared_ptr<Inbox> in_;
};

// The WebSocket the owner's handler talks to: its messages go to `down`, the client's come from
// the inbox.
class RelayedWebSocket final : public kj::WebSocket {
 public:
  RelayedWebSocket(wc::WebSocketSink::Client down, std::shared_ptr<Inbox> in)
      : down_(kj::mv(down)), in_(kj::mv(in)) {}
  kj::Promise<void> send(kj::ArrayPtr<const kj::byte> m) override { return message(m, false); }
  kj::Promise<void> send(kj::ArrayPtr<const char> m) override { return message(m.asBytes(), true); }
  kj::Promise<void> close(uint16_t code, kj::StringPtr reason) override {
    auto r = down_.closeRequest();
    r.setCode(code);
    r.setReason(reason);
    return r.send().ignoreResult();
  }
  kj::Promise<void> disconnect() override { return kj::READY_NOW; }
  void abort() override { in_->end(); }
  kj::Promise<void> whenAborted() override { return in_->aborted.addBranch(); }
  kj::Promise<Message> receive(size_t maxSize) override {
    return in_->next().then([maxSize](Message m) -> kj::Promise<Message> {
      size_t n = 0;
      if (m.is<kj::String>()) n = m.get<kj::String>().size();
      if (m.is<kj::Array<kj::byte>>()) n = m.get<kj::Array<kj::byte>>().size();
      if (n > maxSize) return KJ_EXCEPTION(FAILED, "WebSocket message too large");
      return kj::mv(m);
    });
  }
  uint64_t sentByteCount() override { return sent_; }
  uint64_t receivedByteCount() override { return in_->received; }

 private:
  kj::Promise<void> message(kj::ArrayPtr<const kj::byte> m, bool text) {
    sent_ += m.size();
    auto r = down_.messageRequest(capnp::MessageSize{m.size() / 8 + 8, 0});
    r.setData(m);
    r.setText(text);
    return r.send();
  }
  wc::WebSocketSink::Client down_;
  std::shared_ptr<Inbox> in_;
  uint64_t sent_ = 0;
};

// The owner's response to a forwarded WebSocket request: a plain reply goes to the sink; an
// accepted WebSocket resolves the peer's call with `up`.
class WsResponse final : public kj::HttpService::Response {
 public:
  WsResponse(wc::ResponseSink::Client sink, wc::WebSocketSink::Client down,
             kj::Own<kj::PromiseFulfiller<wc::WebSocketSink::Client>> accepted)
      : plain_(kj::mv(sink)), down_(kj::mv(down)), accepted_(kj::mv(accepted)) {}
  kj::Own<kj::AsyncOutputStream> send(uint status, kj::StringPtr text,
                                      const kj::HttpHeaders& headers,
                                      kj::Maybe<uint64_t> size) override {
    return plain_.send(status, text, headers, size);
  }
  kj::Own<kj::WebSocket> acceptWebSocket(const kj::HttpHeaders&) override {
    auto in = std::make_shared<Inbox>();
    accepted_->fulfill(kj::heap<UpSink>(in));
    taken_ = true;
    return kj::heap<RelayedWebSocket>(kj::mv(down_), kj::mv(in));
  }
  kj::Promise<void> finish() { return taken_ ? kj::READY_NOW : plain_.finish(); }

 private:
  SinkResponse plain_;
  wc::WebSocketSink::Client down_;
  kj::Own<kj::PromiseFulfiller<wc::WebSocketSink::Client>> accepted_;
  bool taken_ = false;
};

class PeerImpl final : public wc::Peer::Server {
 public:
  PeerImpl(gateway::Server& server, std::string from)
      : server_(server),
        from_(kj::str(from.c_str())),
        scope_(std::make_shared<PeerScope>(server.rt, from)) {}
  kj::Promise<void> http(HttpContext ctx) override {
    auto p = ctx.getParams();
    auto rq = p.getRequest();
    kj::HttpMethod method;
    KJ_IF_MAYBE (m, kj::tryParseHttpMethod(rq.getMethod())) {
      method = *m;
    } else {
      KJ_FAIL_REQUIRE("unknown HTTP method", rq.getMethod());
    }
    struct State {
      OwnedHeaders headers;
      kj::String url;
      kj::Own<kj::AsyncInputStream> body;
      SinkResponse response;
      State(const kj::HttpHeaderTable& t, wc::ResponseSink::Client sink)
          : headers(t), response(kj::mv(sink)) {}
    };
    auto st = kj::heap<State>(*server_.table, p.getSink());
    for (auto h : rq.getHeaders()) st->headers.add(h.getName(), h.getValue());
    st->headers.add_raw(Peers::kForwardedHeader, from_);
    st->url = kj::str(rq.getUrl());
    if (rq.hasBodySource()) {
      st->body = kj::heap<SourceInput>(rq.getBodySource(), rq.getBodyLength());
    } else {
      auto body = rq.getBody();
      st->body = bytes_input(kj::heapArray<kj::byte>(body.begin(), body.size()));
    }
    auto& s = *st;
    // The forwarding host cancels the call when its client hangs up: what the request asked for
    // is cancelled here as a hang-up of our own client's would be (security review 3, L2).
    ctx.allowCancellation();
    auto stop = std::make_shared<std::stop_source>();
    auto done = std::make_shared<bool>(false);
    auto cancelled = kj::defer([stop, done]() {
      if (!*done) stop->request_stop();
    });
    return server_
        .handle_request(-1, method, s.url, s.headers.headers, *s.body, s.response, true, stop,
                        std::string(rq.getClientAddress().cStr()).substr(0, 64))
        .then([st = &s, done]() {
          *done = true;
          return st->response.finish();
        })
        .attach(kj::mv(st), kj::mv(cancelled));
  }
  kj::Promise<void> webSocket(WebSocketContext ctx) override {
    auto p = ctx.getParams();
    auto rq = p.getRequest();
    struct State {
      OwnedHeaders headers;
      kj::String url;
      kj::Own<kj::AsyncInputStream> body = bytes_input(nullptr);
      WsResponse response;
      State(const kj::HttpHeaderTable& t, wc::ResponseSink::Client sink,
            wc::WebSocketSink::Client down,
            kj::Own<kj::PromiseFulfiller<wc::WebSocketSink::Client>> accepted)
          : headers(t), response(kj::mv(sink), kj::mv(down), kj::mv(accepted)) {}
    };
    auto accepted = kj::newPromiseAndFulfiller<wc::WebSocketSink::Client>();
    auto st = kj::heap<State>(*server_.table, p.getSink(), p.getDown(), kj::mv(accepted.fulfiller));
    for (auto h : rq.getHeaders()) st->headers.add(h.getName(), h.getValue());
    st->headers.add_raw("Connection", "Upgrade");
    st->headers.add_raw("Upgrade", "websocket");
    st->headers.add_raw(Peers::kForwardedHeader, from_);
    st->url = kj::str(rq.getUrl());
    auto& s = *st;
    auto handled =
        server_
            .handle_request(-1, kj::HttpMethod::GET, s.url, s.headers.headers, *s.body, s.response,
                            true, nullptr, std::string(rq.getClientAddress().cStr()).substr(0, 64))
            .then([st = &s]() { return st->response.finish(); })
            .attach(kj::mv(st))
            .fork();
    // The WebSocket lives on after this call returns: its handling is kept by the host.
    server_.peers->keep(handled.addBranch());
    auto taken = accepted.promise.then([ctx](wc::WebSocketSink::Client up) mutable {
      // (Results with a size hint here and below: GCC 12 under ASan warns that the default, empty
      // one may be read uninitialized.)
      auto r = ctx.getResults(capnp::MessageSize{4, 1});
      r.setUp(kj::mv(up));
      r.setAccepted(true);
    });
    return taken.exclusiveJoin(handled.addBranch());
  }
  kj::Promise<void> platform(PlatformContext ctx) override {
    if (server_.rpc == nullptr) return KJ_EXCEPTION(FAILED, "this host serves no RPC API");
    return server_.rpc->platform_for(ctx.getParams().getApiKey())
        .then([ctx](capnp::Capability::Client p) mutable {
          ctx.getResults(capnp::MessageSize{4, 1}).setPlatform(p.castAs<wire::api::Platform>());
        });
  }
  kj::Promise<void> receiveSnapshot(ReceiveSnapshotContext ctx) override {
    return receive_snapshot(server_, scope_, ctx);
  }
  kj::Promise<void> start(StartContext ctx) override {
    return start_from_snapshot(server_, scope_, ctx);
  }
  kj::Promise<void> discard(DiscardContext ctx) override {
    return discard_sandboxes(server_, scope_, ctx);
  }

 private:
  gateway::Server& server_;
  kj::String from_;
  std::shared_ptr<PeerScope> scope_;  // what this login may act on
};

// A connection's login: whether it happened, and how to close the connection at once (on the
// first bad credential: no second guess on the same connection).
struct LoginState {
  std::shared_ptr<PreLogin> pre;
  kj::Own<kj::PromiseFulfiller<void>> refused;
};

class LoginImpl final : public wc::PeerLogin::Server {
 public:
  // `cert_host`: the host id the connection's certificate proved ("": an insecure cluster).
  LoginImpl(gateway::Server& server, const PeerAuth& auth, std::string cert_host,
            std::shared_ptr<LoginState> state)
      : server_(server), auth_(auth), cert_host_(std::move(cert_host)), state_(std::move(state)) {}
  kj::Promise<void> login(LoginContext ctx) override {
    auto p = ctx.getParams();
    std::string host;
    if (!cert_host_.empty()) {  // mutual TLS: the certificate is the identity
      host = cert_host_;
      if (p.getHost() != host)
        return refuse("host '" + host + "' logged in as '" + std::string(p.getHost().cStr()) + "'");
    } else {
      auto s = p.getSecret();
      const auto& secret = auth_.secret;
      if (secret.empty() || s.size() != secret.size() ||
          CRYPTO_memcmp(s.begin(), secret.data(), secret.size()) != 0)
        return refuse("a wrong cluster secret (host '" + std::string(p.getHost().cStr()) + "')");
      host = p.getHost().cStr();
    }
    if (host == auth_.self) return refuse("a peer presented this host's own id " + host);
    state_->pre->logged_in = true;
    ctx.getResults(capnp::MessageSize{4, 1}).setPeer(kj::heap<PeerImpl>(server_, host));
    return kj::READY_NOW;
  }

 private:
  kj::Promise<void> refuse(const std::string& why) {
    spdlog::warn("cluster: peer login refused: {}; the connection is closed", why);
    if (state_->refused->isWaiting()) state_->refused->fulfill();
    return KJ_EXCEPTION(FAILED, "cluster login refused");
  }
  gateway::Server& server_;
  const PeerAuth& auth_;
  std::string cert_host_;
  std::shared_ptr<LoginState> state_;
};

// --- The forwarding side: a peer's answer written to our client. ---

struct ForwardState {
  kj::HttpService::Response* response;  // null once the forward ended (or was cancelled)
  const kj::HttpHeaderTable& table;
  kj::Own<OwnedHeaders> headers;
  kj::String status_text;
  kj::Own<kj::AsyncOutputStream> out;
  bool started = false;
  ForwardState(kj::HttpService::Response& r, const kj::HttpHeaderTable& t)
      : response(&r), table(t) {}
};

class ForwardSink final : public wc::ResponseSink::Server {
 public:
  explicit ForwardSink(std::shared_ptr<ForwardState> st) : st_(kj::mv(st)) {}
  kj::Promise<void> start(StartContext ctx) override {
    if (st_->response == nullptr || st_->started)
      return KJ_EXCEPTION(DISCONNECTED, "the forwarded request has ended");
    auto p = ctx.getParams();
    st_->headers = kj::heap<OwnedHeaders>(st_->table);
    for (auto h : p.getHeaders()) st_->headers->add(h.getName(), h.getValue());
    st_->status_text = kj::str(p.getStatusText());
    kj::Maybe<uint64_t> length = nullptr;
    if (p.getLength() >= 0) length = uint64_t(p.getLength());
    st_->out = st_->response->send(p.getStatus(), st_->status_text, st_->headers->headers, length);
    st_->started = true;
    return kj::READY_NOW;
  }
  kj::Promise<void> write(WriteContext ctx) override {
    if (st_->response == nullptr || !st_->out)
      return KJ_EXCEPTION(DISCONNECTED, "the forwarded request has ended");
    auto d = ctx.getParams().getData();
    return st_->out->write(d.begin(), d.size());
  }
  kj::Promise<void> end(EndContext) override {
    st_->out = nullptr;
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<ForwardState> st_;
};

// --- WebSockets: the forwarding end. ---

// The client's WebSocket (once accepted), which the owner's messages go to.
struct Relay {
  kj::Own<kj::WebSocket> ws;  // null until accepted, and again once the forward ended
  kj::ForkedPromise<void> ready = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> ready_fulfiller;
  kj::ForkedPromise<void> closed = nullptr;  // the owner closed its end
  kj::Own<kj::PromiseFulfiller<void>> closed_fulfiller;
  Relay() {
    auto r = kj::newPromiseAndFulfiller<void>();
    ready_fulfiller = kj::mv(r.fulfiller);
    ready = r.promise.fork();
    auto c = kj::newPromiseAndFulfiller<void>();
    closed_fulfiller = kj::mv(c.fulfiller);
    closed = c.promise.fork();
  }
};

class DownSink final : public wc::WebSocketSink::Server {
 public:
  explicit DownSink(std::shared_ptr<Relay> r) : relay_(kj::mv(r)) {}
  kj::Promise<void> message(MessageContext ctx) override {
    auto p = ctx.getParams();
    auto data = kj::heapArray<kj::byte>(p.getData());
    bool text = p.getText();
    return relay_->ready.addBranch().then(
        [relay = relay_, data = kj::mv(data), text]() mutable -> kj::Promise<void> {
          if (!relay->ws) return KJ_EXCEPTION(DISCONNECTED, "the client went away");
          if (text) return relay->ws->send(data.asChars()).attach(kj::mv(data));
          return relay->ws->send(data.asPtr()).attach(kj::mv(data));
        });
  }
  kj::Promise<void> close(CloseContext ctx) override {
    auto p = ctx.getParams();
    uint16_t code = p.getCode();
    auto reason = kj::str(p.getReason());
    return relay_->ready.addBranch().then(
        [relay = relay_, code, reason = kj::mv(reason)]() mutable -> kj::Promise<void> {
          if (!relay->ws) return kj::READY_NOW;
          return relay->ws->close(code, reason).then([relay]() {
            if (relay->closed_fulfiller->isWaiting()) relay->closed_fulfiller->fulfill();
          });
        });
  }

 private:
  std::shared_ptr<Relay> relay_;
};

// The client's messages to the owner, until the client closes or goes away.
kj::Promise<void> pump_up(std::shared_ptr<Relay> relay, wc::WebSocketSink::Client up,
                          size_t max_message) {
  if (!relay->ws) return kj::READY_NOW;
  return relay->ws->receive(max_message)
      .then([relay, up, max_message](kj::WebSocket::Message m) mutable -> kj::Promise<void> {
        if (m.is<kj::WebSocket::Close>()) {
          auto r = up.closeRequest();
          r.setCode(m.get<kj::WebSocket::Close>().code);
          r.setReason(m.get<kj::WebSocket::Close>().reason);
          return r.send().ignoreResult();
        }
        auto r = up.messageRequest();
        if (m.is<kj::String>()) {
          r.setData(m.get<kj::String>().asBytes());
          r.setText(true);
        } else {
          r.setData(m.get<kj::Array<kj::byte>>());
        }
        return r.send().then(
            [relay, up, max_message]() mutable { return pump_up(relay, up, max_message); });
      });
}

}  // namespace

capnp::Request<wc::PeerLogin::LoginParams, wc::PeerLogin::LoginResults> login_request(
    wc::PeerLogin::Client login, const PeerAuth& auth) {
  auto req = login.loginRequest();
  if (!auth.tls)  // (with TLS the certificate said who we are: no secret travels)
    req.setSecret(
        kj::arrayPtr(reinterpret_cast<const kj::byte*>(auth.secret.data()), auth.secret.size()));
  req.setHost(auth.self);
  return req;
}

kj::Own<kj::AsyncInputStream> bytes_input(kj::Array<kj::byte> bytes) {
  return kj::heap<BytesInput>(kj::mv(bytes));
}

struct Peers::Impl {
  Server& server;
  kj::AsyncIoProvider& io;
  PeerAuth auth;
  PeerTransport transport;
  std::unique_ptr<Acceptor> acceptor;
  struct Client {
    kj::Own<PeerConnection> conn;
    wc::Peer::Client peer = nullptr;
    bool broken = false;
  };
  std::map<std::string, std::shared_ptr<Client>> clients;  // by host id + address
  kj::TaskSet tasks;
  struct Errors final : public kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      spdlog::debug("cluster: peer connection: {}", e.getDescription().cStr());
    }
  } errors;

  Impl(Server& s, kj::AsyncIoProvider& i, PeerAuth a)
      : server(s), io(i), auth(std::move(a)), transport(auth, s.timer), tasks(errors) {}

  // One accepted connection: at most kPeerPreLoginBytes and kLoginTimeout until it logged in
  // (the TLS handshake included), closed on the first refused login.
  kj::Promise<void> serve(kj::Own<kj::AsyncIoStream> raw) {
    auto pre = std::make_shared<PreLogin>(kPeerPreLoginBytes);
    auto deadline = login_deadline(server.timer, pre, "no cluster login within 10 s");
    auto session = transport.accept(kj::heap<GuardedStream>(kj::mv(raw), pre))
                       .then(
                           [this, pre](PeerTransport::Accepted a) -> kj::Promise<void> {
                             auto refused = kj::newPromiseAndFulfiller<void>();
                             auto state = std::make_shared<LoginState>();
                             state->pre = pre;
                             state->refused = kj::mv(refused.fulfiller);
                             auto conn = kj::heap<PeerConnection>(
                                 kj::mv(a.stream), capnp::rpc::twoparty::Side::SERVER,
                                 capnp::Capability::Client(
                                     kj::heap<LoginImpl>(server, auth, std::move(a.host), state)));
                             auto ended = conn->network.onDisconnect();
                             return ended.exclusiveJoin(kj::mv(refused.promise))
                                 .attach(kj::mv(conn), kj::mv(state));
                           },
                           [](kj::Exception&& e) {
                             spdlog::warn("cluster: a peer connection failed its TLS handshake: {}",
                                          e.getDescription().cStr());
                           });
    return session.exclusiveJoin(kj::mv(deadline));
  }

  kj::Promise<wc::Peer::Client> connect(const std::string& host, const std::string& address) {
    std::string key = host + "@" + address;
    auto it = clients.find(key);
    if (it != clients.end() && !it->second->broken) return wc::Peer::Client(it->second->peer);
    return transport.connect(io.getNetwork(), address, host)
        .then([this, key](kj::Own<kj::AsyncIoStream> stream) {
          auto c = std::make_shared<Client>();
          c->conn =
              kj::heap<PeerConnection>(kj::mv(stream), capnp::rpc::twoparty::Side::CLIENT, nullptr);
          c->peer = login_request(c->conn->bootstrap().castAs<wc::PeerLogin>(), auth)
                        .send()
                        .getPeer();  // (pipelined: the first call rides with the login)
          tasks.add(c->conn->network.onDisconnect().then([c]() { c->broken = true; }));
          clients[key] = c;
          return wc::Peer::Client(c->peer);
        });
  }
};

Peers::Peers(Server& server, kj::AsyncIoProvider& io, PeerAuth auth)
    : impl_(std::make_unique<Impl>(server, io, std::move(auth))) {
  impl_->acceptor = std::make_unique<Acceptor>(
      "peers", server.timer, server.limits.max_connections,
      [this](kj::Own<kj::AsyncIoStream> c) { return impl_->serve(kj::mv(c)); },
      kPeerConnectionsPerSource);
}

Peers::~Peers() {
  impl_->acceptor = nullptr;
  impl_->clients.clear();
}

kj::Promise<capnp::Capability::Client> Peers::platform(const std::string& host,
                                                       const std::string& address,
                                                       const std::string& key) {
  return impl_->connect(host, address)
      .then([key](wc::Peer::Client peer) -> capnp::Capability::Client {
        auto req = peer.platformRequest();
        req.setApiKey(key);
        return req.send().getPlatform();  // (pipelined: the caller's first call rides with it)
      });
}

void Peers::keep(kj::Promise<void> task) { impl_->tasks.add(kj::mv(task)); }

kj::Promise<void> Peers::forward_websocket(const std::string& address, const std::string& host,
                                           kj::StringPtr url, const kj::HttpHeaders& headers,
                                           kj::HttpService::Response& response,
                                           const std::string& client) {
  auto st = std::make_shared<ForwardState>(response, *impl_->server.table);
  auto relay = std::make_shared<Relay>();
  auto request = kj::heap<capnp::MallocMessageBuilder>();
  auto rq = request->initRoot<wc::HttpRequest>();
  rq.setMethod("GET");
  rq.setUrl(url);
  copy_headers(headers, [&](size_t n) { return rq.initHeaders(uint(n)); });
  rq.setFromHost(impl_->auth.self);
  rq.setClientAddress(client);
  size_t max_message = impl_->server.limits.max_body_bytes;
  auto guard = kj::defer([st, relay]() {
    st->response = nullptr;
    relay->ws = nullptr;  // (the owner's late messages find no client)
  });
  return impl_->connect(host, address)
      .then([st, relay, request = kj::mv(request)](wc::Peer::Client peer) mutable {
        auto req = peer.webSocketRequest();
        req.setRequest(request->getRoot<wc::HttpRequest>().asReader());
        req.setDown(kj::heap<DownSink>(relay));
        req.setSink(kj::heap<ForwardSink>(st));
        return req.send().attach(kj::mv(request));
      })
      .then(
          [this, st, relay, host, &response,
           max_message](capnp::Response<wc::Peer::WebSocketResults> r) -> kj::Promise<void> {
            if (!r.getAccepted()) {  // a plain answer (an error), written by the sink
              st->out = nullptr;
              if (st->started) return kj::READY_NOW;
              return impl_->server.send(
                  *st->response,
                  error_reply(Code::peer_error, "host " + host + " sent no response"),
                  Clock::now());
            }
            kj::HttpHeaders none(*impl_->server.table);
            relay->ws = response.acceptWebSocket(none);
            relay->ready_fulfiller->fulfill();
            return pump_up(relay, r.getUp(), max_message).exclusiveJoin(relay->closed.addBranch());
          },
          [this, st, host](kj::Exception&& e) -> kj::Promise<void> {
            if (st->started || st->response == nullptr) return kj::READY_NOW;
            spdlog::warn("cluster: forwarding a WebSocket to host {} failed: {}", host,
                         e.getDescription().cStr());
            return impl_->server.send(
                *st->response,
                error_reply(Code::peer_error, "host " + host +
                                                  " did not answer the forwarded "
                                                  "WebSocket: " +
                                                  std::string(e.getDescription().cStr())),
                Clock::now());
          })
      .attach(kj::mv(guard));
}

const PeerAuth& Peers::auth() const { return impl_->auth; }
const std::string& Peers::self() const { return impl_->auth.self; }

kj::Promise<void> Peers::listen(kj::ConnectionReceiver& listener) {
  return impl_->acceptor->listen(listener);
}

kj::Promise<void> Peers::forward(const std::string& address, const std::string& host,
                                 kj::HttpMethod method, kj::StringPtr url,
                                 const kj::HttpHeaders& headers, kj::Array<kj::byte> body,
                                 kj::HttpService::Response& response, const std::string& client) {
  auto st = std::make_shared<ForwardState>(response, *impl_->server.table);
  auto request = kj::heap<capnp::MallocMessageBuilder>();
  auto rq = request->initRoot<wc::HttpRequest>();
  rq.setMethod(kj::str(method));
  rq.setUrl(url);
  copy_headers(headers, [&](size_t n) { return rq.initHeaders(uint(n)); });
  if (body.size() <= kInlineBody) rq.setBody(body);  // (a larger one: a BodySource, below)
  rq.setFromHost(impl_->auth.self);
  rq.setClientAddress(client);
  auto fail = [this, st, host](kj::Exception&& e) -> kj::Promise<void> {
    if (st->started || st->response == nullptr) return kj::READY_NOW;  // (mid-stream: it ends)
    spdlog::warn("cluster: forwarding to host {} failed: {}", host, e.getDescription().cStr());
    HttpReply r =
        error_reply(Code::peer_error, "host " + host + " did not answer the forwarded request: " +
                                          std::string(e.getDescription().cStr()));
    auto t0 = Clock::now();
    return impl_->server.send(*st->response, std::move(r), t0);
  };
  auto guard = kj::defer([st]() { st->response = nullptr; });
  return impl_->connect(host, address)
      .then([st, request = kj::mv(request), body = kj::mv(body)](wc::Peer::Client peer) mutable {
        auto req = peer.httpRequest();
        req.setRequest(request->getRoot<wc::HttpRequest>().asReader());
        if (body.size() > kInlineBody) {
          auto r = req.getRequest();
          r.setBodyLength(body.size());
          r.setBodySource(kj::heap<BodySourceImpl>(kj::mv(body)));
        }
        req.setSink(kj::heap<ForwardSink>(st));
        return req.send().ignoreResult().attach(kj::mv(request));
      })
      .then(
          [this, st, host]() -> kj::Promise<void> {
            st->out = nullptr;
            if (st->started) return kj::READY_NOW;
            return impl_->server.send(
                *st->response, error_reply(Code::peer_error, "host " + host + " sent no response"),
                Clock::now());
          },
          kj::mv(fail))
      .attach(kj::mv(guard));
}

}  // namespace pandastack::gateway
