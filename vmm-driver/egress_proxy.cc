#include "vmm-driver/egress_proxy.h"

#include <kj/compat/tls.h>
#include <kj/debug.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>

#include "vmm-driver/dns.h"

namespace pandastack::vmm {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A Host header's name (its port and a trailing dot dropped, lower case).
std::string host_of(kj::StringPtr header) {
  std::string h(header.cStr());
  if (auto colon = h.rfind(':'); colon != std::string::npos && h.find(']') == std::string::npos)
    h.resize(colon);
  if (!h.empty() && h.back() == '.') h.pop_back();
  return lower(h);
}

// Why secret `s` may not go into a request to `host` (`tls` or not) at a place it `opted` into;
// nullptr when it may.
const char* why_not(const ProxySecret& s, const std::string& host, bool tls, bool opted) {
  if (!tls && !s.plain_http) return "plain_http";
  if (!dns::allowed(host, s.hosts)) return "not_secret_host";
  if (!opted) return "not_opted_in";
  return nullptr;
}

// `text` with the placeholder of every secret that `may` allows (nullptr) replaced by its value;
// the names put in go to use.injected, the others to use.refused (left as they are: use.why says
// why the first was, use.blocked that plain HTTP may not carry one of them).
template <typename May>
std::string substitute(std::string text, const std::vector<ProxySecret>& secrets, May&& may,
                       ProxyUse& use) {
  for (auto& s : secrets) {
    if (s.placeholder.empty() || text.find(s.placeholder) == std::string::npos) continue;
    const char* no = may(s);
    auto& list = no ? use.refused : use.injected;
    if (std::find(list.begin(), list.end(), s.name) == list.end()) list.push_back(s.name);
    if (no) {
      if (use.why.empty()) use.why = no;
      if (std::string_view(no) == "plain_http") use.blocked = true;
      continue;
    }
    for (size_t at = 0; (at = text.find(s.placeholder, at)) != std::string::npos;
         at += s.value.size())
      text.replace(at, s.placeholder.size(), s.value);
  }
  return text;
}

}  // namespace

kj::Maybe<kj::TlsKeypair> CaSni::getKey(kj::StringPtr hostname) {
  name = lower(hostname.cStr());
  auto leaf = ca_->leaf(name);
  if (!leaf) return nullptr;  // (the default: the client's check of the name fails)
  return kj::TlsKeypair{kj::TlsPrivateKey(leaf->key.c_str()),
                        kj::TlsCertificate(leaf->cert.c_str())};
}

struct EgressProxy::Impl {
  kj::Timer& timer;
  ProxyOptions o;
  kj::Own<kj::HttpHeaderTable> table = kj::heap<kj::HttpHeaderTable>();
  kj::Array<kj::TlsCertificate> extra;
  kj::Own<kj::TlsContext> upstream_tls;

  Impl(kj::Timer& t, ProxyOptions opts) : timer(t), o(std::move(opts)) {
    auto certs = kj::heapArrayBuilder<kj::TlsCertificate>(o.extra_ca_pems.size());
    for (auto& pem : o.extra_ca_pems) certs.add(kj::TlsCertificate(pem.c_str()));
    extra = certs.finish();
    kj::TlsContext::Options to;
    to.useSystemTrustStore = o.use_system_trust_store;
    to.trustedCertificates = extra;
    upstream_tls = kj::heap<kj::TlsContext>(kj::mv(to));
  }

  kj::Promise<void> serve_http(kj::Own<kj::AsyncIoStream> guest, std::string tls_name,
                               std::string address, uint16_t port, bool tls);
};

namespace {

// One guest connection's requests, forwarded over one upstream connection (made at the first).
class Forwarder final : public kj::HttpService {
 public:
  Forwarder(EgressProxy::Impl& p, std::string tls_name, std::string address, uint16_t port,
            bool tls)
      : p_(p),
        tls_name_(std::move(tls_name)),
        address_(std::move(address)),
        port_(port),
        tls_(tls) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override {
    std::string host;
    KJ_IF_MAYBE (h, headers.get(kj::HttpHeaderId::HOST)) {
      host = host_of(*h);
    }
    if (host.empty()) return answer(response, 400, "Bad Request", "a request names its Host");
    // A TLS connection's requests go to the host it was made for, whose certificate the upstream
    // side checks: another Host would get that host's secrets under an unchecked name.
    if (tls_ && host != tls_name_)
      return answer(response, 421, "Misdirected Request",
                    "this connection is for " + tls_name_ + ", not " + host);
    auto secrets = p_.o.secrets ? p_.o.secrets() : std::vector<ProxySecret>{};
    ProxyUse use;
    use.host = host;
    use.port = port_;
    use.address = address_;
    use.tls = tls_;
    use.method = kj::str(method).cStr();
    bool tls = tls_;
    // Headers: placeholders replaced for their hosts; the target and the body only for secrets
    // opted into them.
    auto in_headers = [&](const ProxySecret& s) { return why_not(s, host, tls, true); };
    auto in_query = [&](const ProxySecret& s) { return why_not(s, host, tls, s.in_query); };
    // The host's header rules: over TLS their headers replace the guest's of those names; a
    // secret one of them cannot carry refuses the request (never sent without it).
    auto rules = p_.o.headers ? p_.o.headers(host, tls) : ProxyHeaders{};
    use.injected = rules.injected;
    use.refused = rules.refused;
    use.why = rules.why;
    if (tls && !rules.refused.empty()) {
      if (p_.o.on_use) p_.o.on_use(use);
      return answer(response, 403, "Forbidden",
                    "a network rule for " + host + " needs secret " + rules.refused.front() +
                        ", which cannot be put in (" + rules.why + "): not sent");
    }
    std::vector<std::string> replaced;  // (lower case)
    if (tls)
      for (auto& [name, v] : rules.set) replaced.push_back(lower(name));
    auto kept = [&](kj::StringPtr name) {
      return replaced.empty() ||
             std::find(replaced.begin(), replaced.end(), lower(name.cStr())) == replaced.end();
    };
    auto out = kj::heap<kj::HttpHeaders>(*p_.table);
    headers.forEach(
        [&](kj::HttpHeaderId id, kj::StringPtr v) {
          if (kept(id.toString()))
            out->set(id, kj::str(substitute(v.cStr(), secrets, in_headers, use)));
        },
        [&](kj::StringPtr name, kj::StringPtr v) {
          if (kept(name))
            out->add(kj::str(name), kj::str(substitute(v.cStr(), secrets, in_headers, use)));
        });
    if (tls)
      for (auto& [name, v] : rules.set) out->add(kj::str(name), kj::str(v));
    auto target = kj::str(substitute(url.cStr(), secrets, in_query, use));
    // A body is held only when a secret may go into it (and one that would be blocked anyway is
    // not read at all).
    bool hold = false;
    for (auto& s : secrets) hold = hold || (s.in_body && !why_not(s, host, tls, true));
    if (!hold || use.blocked)
      return forward(method, kj::mv(target), kj::mv(out), body, nullptr, kj::mv(use), response);
    KJ_IF_MAYBE (n, body.tryGetLength()) {
      if (*n > EgressProxy::kMaxBody) return too_large(response);
    }
    return body.readAllBytes(EgressProxy::kMaxBody)
        .then(
            [this, method, target = kj::mv(target), out = kj::mv(out), &body, &response,
             secrets = std::move(secrets),
             use = std::move(use)](kj::Array<kj::byte> bytes) mutable -> kj::Promise<void> {
              auto in_body = [&](const ProxySecret& s) {
                return why_not(s, use.host, use.tls, s.in_body);
              };
              auto text = substitute(std::string(bytes.asChars().begin(), bytes.size()), secrets,
                                     in_body, use);
              // (its bytes as they are: a body may hold NULs)
              return forward(method, kj::mv(target), kj::mv(out), body,
                             kj::heapString(text.data(), text.size()), kj::mv(use), response);
            },
            [this, &response](kj::Exception&&) { return too_large(response); });
  }

 private:
  kj::Promise<void> too_large(Response& response) {
    return answer(response, 413, "Content Too Large",
                  "a body a secret may go into is held whole: at most " +
                      std::to_string(EgressProxy::kMaxBody) + " bytes (not sent)");
  }

  // Sends the request upstream (its body from `body`, or `replaced` when the proxy rewrote it) and
  // the answer back; or, when plain HTTP would carry a secret that may not go in the clear,
  // answers 403 and sends nothing.
  kj::Promise<void> forward(kj::HttpMethod method, kj::String url, kj::Own<kj::HttpHeaders> out,
                            kj::AsyncInputStream& body, kj::Maybe<kj::String> replaced,
                            ProxyUse use, Response& response) {
    bool carried = !use.injected.empty() || !use.refused.empty();
    if (use.blocked) {
      // The value would cross the network in the clear: not forwarded at all.
      use.refused.insert(use.refused.end(), use.injected.begin(), use.injected.end());
      use.injected.clear();
      use.why = "plain_http";
      if (p_.o.on_use) p_.o.on_use(use);
      return answer(response, 403, "Forbidden",
                    "a secret's placeholder is sent over HTTPS only (this request was plain HTTP "
                    "to " +
                        use.host + " and was not sent)");
    }
    if (carried && p_.o.on_use) p_.o.on_use(use);
    return upstream(use.host).then([this, method, url = kj::mv(url), out = kj::mv(out), &body,
                                    replaced = kj::mv(replaced), &response](
                                       kj::HttpClient* client) mutable -> kj::Promise<void> {
      if (!client) return answer(response, 502, "Bad Gateway", failure_);
      if (out->isWebSocket()) return websocket(*client, kj::mv(url), kj::mv(out), response);
      kj::Maybe<uint64_t> length = body.tryGetLength();
      KJ_IF_MAYBE (r, replaced) {
        length = uint64_t(r->size());
      }
      auto req = client->request(method, url, *out, length);
      kj::Promise<void> sent = nullptr;
      KJ_IF_MAYBE (r, replaced) {
        auto& sink = *req.body;
        sent = sink.write(r->begin(), r->size()).attach(kj::mv(req.body), kj::mv(*r));
      } else {
        sent = body.pumpTo(*req.body).ignoreResult().attach(kj::mv(req.body));
      }
      auto upload = sent.eagerlyEvaluate([](kj::Exception&& e) {
        spdlog::debug("egress proxy: upload ended early: {}", e.getDescription().cStr());
      });
      auto answered = std::make_shared<bool>(false);
      return p_.timer.timeoutAfter(p_.o.upstream_timeout, kj::mv(req.response))
          .then([&response, answered](kj::HttpClient::Response r) -> kj::Promise<void> {
            *answered = true;
            auto down =
                response.send(r.statusCode, r.statusText, *r.headers, r.body->tryGetLength());
            auto& in = *r.body;
            return in.pumpTo(*down).ignoreResult().attach(kj::mv(r.body), kj::mv(down));
          })
          .catch_([this, &response, answered](kj::Exception&& e) -> kj::Promise<void> {
            if (*answered) return kj::mv(e);  // mid-answer: the connection closes
            return answer(response, 502, "Bad Gateway",
                          std::string("no answer from the upstream: ") + e.getDescription().cStr());
          })
          .attach(kj::mv(out), kj::mv(url), kj::mv(upload));
    });
  }

  kj::Promise<void> answer(Response& response, unsigned status, kj::StringPtr text,
                           const std::string& why) {
    kj::HttpHeaders h(*p_.table);
    h.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; charset=utf-8");
    auto body = kj::str("pandastack egress proxy: ", why.c_str(), "\n");
    auto out = response.send(status, text, h, body.size());
    auto& o = *out;
    return o.write(body.begin(), body.size()).attach(kj::mv(out), kj::mv(body));
  }

  // The upstream client (made at the first request); null when it cannot be had (failure_ says
  // why).
  kj::Promise<kj::HttpClient*> upstream(const std::string& host) {
    if (client_) return client_.get();
    if (!failure_.empty()) return static_cast<kj::HttpClient*>(nullptr);
    return p_.timer.timeoutAfter(p_.o.upstream_timeout, p_.o.connect(host, address_, port_))
        .then([this,
               host](kj::Own<kj::AsyncIoStream> raw) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
          if (!tls_) return kj::mv(raw);
          return p_.timer.timeoutAfter(p_.o.upstream_timeout,
                                       p_.upstream_tls->wrapClient(kj::mv(raw), host.c_str()));
        })
        .then(
            [this](kj::Own<kj::AsyncIoStream> s) -> kj::HttpClient* {
              stream_ = kj::mv(s);
              kj::HttpClientSettings settings;
              client_ = kj::newHttpClient(*p_.table, *stream_, settings);
              return client_.get();
            },
            [this, host](kj::Exception&& e) -> kj::HttpClient* {
              failure_ = "cannot reach " + host + ":" + std::to_string(port_) + ": " +
                         e.getDescription().cStr();
              spdlog::info("egress proxy: {}", failure_);
              return nullptr;
            });
  }

  kj::Promise<void> websocket(kj::HttpClient& client, kj::String url, kj::Own<kj::HttpHeaders> out,
                              Response& response) {
    return p_.timer.timeoutAfter(p_.o.upstream_timeout, client.openWebSocket(url, *out))
        .then([&response](kj::HttpClient::WebSocketResponse r) -> kj::Promise<void> {
          KJ_SWITCH_ONEOF(r.webSocketOrBody) {
            KJ_CASE_ONEOF(ws, kj::Own<kj::WebSocket>) {
              auto down = response.acceptWebSocket(*r.headers);
              auto& up = *ws;
              auto& d = *down;
              return d.pumpTo(up).exclusiveJoin(up.pumpTo(d)).attach(kj::mv(ws), kj::mv(down));
            }
            KJ_CASE_ONEOF(b, kj::Own<kj::AsyncInputStream>) {
              auto down = response.send(r.statusCode, r.statusText, *r.headers, b->tryGetLength());
              auto& in = *b;
              return in.pumpTo(*down).ignoreResult().attach(kj::mv(b), kj::mv(down));
            }
          }
          KJ_UNREACHABLE;
        })
        .attach(kj::mv(url), kj::mv(out));
  }

  EgressProxy::Impl& p_;
  std::string tls_name_, address_;
  uint16_t port_;
  bool tls_;
  kj::Own<kj::AsyncIoStream> stream_;  // (declared before client_: destroyed after it)
  kj::Own<kj::HttpClient> client_;
  std::string failure_;
};

}  // namespace

kj::Promise<void> EgressProxy::Impl::serve_http(kj::Own<kj::AsyncIoStream> guest,
                                                std::string tls_name, std::string address,
                                                uint16_t port, bool tls) {
  auto service = kj::heap<Forwarder>(*this, kj::mv(tls_name), kj::mv(address), port, tls);
  auto server = kj::heap<kj::HttpServer>(timer, *table, *service);
  auto& s = *server;
  return s.listenHttp(kj::mv(guest)).attach(kj::mv(server), kj::mv(service));
}

EgressProxy::EgressProxy(kj::Timer& timer, ProxyOptions options)
    : impl_(std::make_unique<Impl>(timer, std::move(options))) {}

EgressProxy::~EgressProxy() = default;

kj::Promise<void> EgressProxy::serve(kj::Own<kj::AsyncIoStream> guest, const std::string& address,
                                     uint16_t port, bool tls) {
  kj::Promise<void> done = nullptr;
  if (!tls) {
    done = impl_->serve_http(kj::mv(guest), "", address, port, false);
  } else {
    // A context per connection: its SNI callback tells this connection's name. Without SNI the
    // guest named the address it connected to.
    auto fallback = impl_->o.ca->leaf(address);
    if (!fallback) {
      spdlog::info("egress proxy: no certificate for {}: {}", address, fallback.error().message);
      return kj::READY_NOW;
    }
    auto keypair = kj::heap<kj::TlsKeypair>(kj::TlsKeypair{
        kj::TlsPrivateKey(fallback->key.c_str()), kj::TlsCertificate(fallback->cert.c_str())});
    auto sni = kj::heap<CaSni>(impl_->o.ca);
    sni->name = address;
    kj::TlsContext::Options to;
    to.useSystemTrustStore = false;
    to.defaultKeypair = *keypair;
    to.sniCallback = *sni;
    to.timer = impl_->timer;
    to.acceptTimeout = impl_->o.upstream_timeout;
    auto ctx = kj::heap<kj::TlsContext>(kj::mv(to));
    auto& named = *sni;
    done = ctx->wrapServer(kj::mv(guest))
               .then([this, &named, address, port](kj::Own<kj::AsyncIoStream> s) {
                 return impl_->serve_http(kj::mv(s), named.name, address, port, true);
               })
               .attach(kj::mv(ctx), kj::mv(sni), kj::mv(keypair));
  }
  return done.catch_([](kj::Exception&& e) {
    spdlog::debug("egress proxy: connection ended: {}", e.getDescription().cStr());
  });
}

std::string EgressProxy::new_placeholder() {
  static const char* kAlphabet = "abcdefghijklmnopqrstuvwxyz234567";
  unsigned char r[32];
  if (RAND_bytes(r, sizeof r) != 1) throw std::runtime_error("RAND_bytes failed");
  std::string out = "pds_secret_";
  for (unsigned char c : r) out += kAlphabet[c & 31];
  return out;
}

}  // namespace pandastack::vmm
