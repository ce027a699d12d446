// The egress proxy against real upstreams on loopback (an HTTPS server with a CA of the test's
// own, and a plain HTTP one), with a guest-side TLS client that trusts only the sandbox's CA.
#include "vmm-driver/egress_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <kj/compat/tls.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "vmm-driver/egress_proxy_host.h"
#include "vmm-driver/netns.h"
#include "vmm-driver/network.h"

namespace pandastack::vmm {
namespace {

// The upstream: answers each request with what it received (Host, Authorization, the target).
class Echo final : public kj::HttpService {
 public:
  explicit Echo(kj::HttpHeaderTable& t, kj::HttpHeaderId auth) : table_(t), auth_(auth) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override {
    ++requests;
    auto head = kj::str("host=", headers.get(kj::HttpHeaderId::HOST).orDefault(""),
                        "\nauth=", headers.get(auth_).orDefault(""), "\nurl=", url, "\n");
    return body.readAllText().then([this, method, &response,
                                    head = kj::mv(head)](kj::String got) mutable {
      auto text = method == kj::HttpMethod::GET ? kj::mv(head) : kj::str(head, "body=", got, "\n");
      kj::HttpHeaders h(table_);
      auto out = response.send(200, "OK", h, text.size());
      auto& o = *out;
      return o.write(text.begin(), text.size()).attach(kj::mv(out), kj::mv(text));
    });
  }
  int requests = 0;

 private:
  kj::HttpHeaderTable& table_;
  kj::HttpHeaderId auth_;
};

struct Reply {
  unsigned status = 0;
  std::string body;
};

// (Held by a unique_ptr: kj's TLS types have throwing destructors, a gtest fixture may not.)
struct World {
  World() {
    auth_ = builder_.add("Authorization");
    table_ = builder_.build();
    upstream_ca_ = *EgressCa::make("upstream-test");
    sandbox_ca_ = *EgressCa::make("sbx_test");
    echo_ = kj::heap<Echo>(*table_, auth_);
    auto& net = io_.provider->getNetwork();
    auto& timer = io_.provider->getTimer();
    // HTTPS upstream.
    auto leaf = *upstream_ca_->leaf("api.test");
    up_keypair_ = kj::heap<kj::TlsKeypair>(
        kj::TlsKeypair{kj::TlsPrivateKey(leaf.key.c_str()), kj::TlsCertificate(leaf.cert.c_str())});
    up_sni_ = kj::heap<CaSni>(upstream_ca_);  // (a certificate per name, of the test's own CA)
    kj::TlsContext::Options so;
    so.useSystemTrustStore = false;
    so.defaultKeypair = *up_keypair_;
    so.sniCallback = *up_sni_;
    up_tls_ = kj::heap<kj::TlsContext>(kj::mv(so));
    auto tls_listener = net.parseAddress("127.0.0.1", 0).wait(io_.waitScope)->listen();
    tls_port_ = tls_listener->getPort();
    tls_receiver_ = up_tls_->wrapPort(kj::mv(tls_listener));
    plain_receiver_ = net.parseAddress("127.0.0.1", 0).wait(io_.waitScope)->listen();
    plain_port_ = plain_receiver_->getPort();
    up_server_ = kj::heap<kj::HttpServer>(timer, *table_, *echo_);
    up_tls_served_ = up_server_->listenHttp(*tls_receiver_).eagerlyEvaluate(nullptr);
    up_plain_served_ = up_server_->listenHttp(*plain_receiver_).eagerlyEvaluate(nullptr);
    // The guest's TLS: the sandbox's CA only.
    guest_ca_ =
        kj::heapArray<kj::TlsCertificate>({kj::TlsCertificate(sandbox_ca_->ca().cert.c_str())});
    kj::TlsContext::Options co;
    co.useSystemTrustStore = false;
    co.trustedCertificates = guest_ca_;
    guest_tls_ = kj::heap<kj::TlsContext>(kj::mv(co));
    placeholder_ = EgressProxy::new_placeholder();
    value_ = "ghp_the-real-value-1";
  }

  ProxyOptions options(bool trust_upstream = true) {
    ProxyOptions o;
    o.ca = sandbox_ca_;
    o.secrets = [this] {
      return std::vector<ProxySecret>{
          {"GITHUB_TOKEN", placeholder_, value_, {"api.test"}, in_query_, in_body_, plain_http_}};
    };
    o.connect = [this](const std::string& host, const std::string&, uint16_t port) {
      connected_.push_back(host + ":" + std::to_string(port));
      return io_.provider->getNetwork()
          .parseAddress("127.0.0.1", port == 443 ? tls_port_ : plain_port_)
          .then([](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); });
    };
    if (trust_upstream) o.extra_ca_pems = {upstream_ca_->ca().cert};
    o.use_system_trust_store = false;
    o.on_use = [this](const ProxyUse& u) { uses_.push_back(u); };
    return o;
  }

  // One request through `proxy` as a guest would send it to `name` (TLS when `tls`).
  Reply call(EgressProxy& proxy, const std::string& name, bool tls, const std::string& auth,
             const std::string& host_header = "", const std::string& body = "",
             bool chunked = false) {
    auto pipe = kj::newTwoWayPipe();
    auto served =
        proxy.serve(kj::mv(pipe.ends[0]), "10.0.0.9", tls ? 443 : 80, tls).eagerlyEvaluate(nullptr);
    kj::Own<kj::AsyncIoStream> stream = kj::mv(pipe.ends[1]);
    if (tls) stream = guest_tls_->wrapClient(kj::mv(stream), name.c_str()).wait(io_.waitScope);
    auto client = kj::newHttpClient(*table_, *stream);
    kj::HttpHeaders h(*table_);
    h.set(kj::HttpHeaderId::HOST, kj::str(host_header.empty() ? name : host_header));
    if (!auth.empty()) h.set(auth_, kj::str(auth));
    kj::Maybe<uint64_t> length = uint64_t(body.size());
    if (chunked) length = nullptr;
    auto req = client->request(body.empty() ? kj::HttpMethod::GET : kj::HttpMethod::POST,
                               url_.c_str(), h, length);
    if (!body.empty()) req.body->write(body.data(), body.size()).wait(io_.waitScope);
    req.body = nullptr;  // (the end of the request's body)
    auto r = req.response.wait(io_.waitScope);
    auto text = r.body->readAllText().wait(io_.waitScope);
    Reply out{r.statusCode, std::string(text.begin(), text.size())};  // (NULs kept)
    return out;
  }

  kj::AsyncIoContext io_ = kj::setupAsyncIo();
  kj::HttpHeaderTable::Builder builder_;
  kj::HttpHeaderId auth_;
  kj::Own<kj::HttpHeaderTable> table_;
  std::shared_ptr<EgressCa> upstream_ca_, sandbox_ca_;
  kj::Own<Echo> echo_;
  kj::Own<kj::TlsKeypair> up_keypair_;
  kj::Own<CaSni> up_sni_;
  kj::Own<kj::TlsContext> up_tls_;
  kj::Own<kj::ConnectionReceiver> tls_receiver_, plain_receiver_;
  uint16_t tls_port_ = 0, plain_port_ = 0;
  kj::Own<kj::HttpServer> up_server_;
  kj::Promise<void> up_tls_served_ = nullptr, up_plain_served_ = nullptr;
  kj::Array<kj::TlsCertificate> guest_ca_;
  kj::Own<kj::TlsContext> guest_tls_;
  std::string placeholder_, value_;
  bool in_query_ = false, in_body_ = false, plain_http_ = false;  // the secret's opt-ins
  std::string url_ = "/repos?q=1";                                // what call() asks for
  std::vector<std::string> connected_;
  std::vector<ProxyUse> uses_;
};

TEST(EgressProxy, TheSecretsHostGetsTheValueOverHttps) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  auto r = w.call(proxy, "api.test", true, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer " + w.value_ + "\nurl=/repos?q=1\n");
  EXPECT_EQ(w.connected_, std::vector<std::string>{"api.test:443"});
  ASSERT_EQ(w.uses_.size(), 1u);
  EXPECT_EQ(w.uses_[0].injected, std::vector<std::string>{"GITHUB_TOKEN"});
  EXPECT_TRUE(w.uses_[0].refused.empty());
  EXPECT_TRUE(w.uses_[0].tls);
  // Rotation: the next request carries the new value.
  w.value_ = "ghp_rotated-2";
  r = w.call(proxy, "api.test", true, "token " + w.placeholder_);
  EXPECT_EQ(r.body, "host=api.test\nauth=token ghp_rotated-2\nurl=/repos?q=1\n");
  // A request without a placeholder is forwarded as it is and not reported.
  r = w.call(proxy, "api.test", true, "Bearer mine");
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer mine\nurl=/repos?q=1\n");
  EXPECT_EQ(w.uses_.size(), 2u);
}

// Header rules (E2B's network rules): over HTTPS their headers replace the guest's of the same
// name; a secret that cannot go in refuses the request (403, not sent); plain HTTP is not
// transformed (its secrets reported refused).
TEST(EgressProxy, HeaderRulesSetHeadersOverHttpsOnly) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  auto o = w.options();
  ProxyHeaders rules;  // what the caller resolves for the next request
  std::vector<std::pair<std::string, bool>> asked;
  o.headers = [&](const std::string& host, bool tls) {
    asked.emplace_back(host, tls);
    return rules;
  };
  EgressProxy proxy(w.io_.provider->getTimer(), std::move(o));
  rules.set = {{"authorization", "Bearer rule-1"}};
  rules.injected = {"openai-key"};
  auto r = w.call(proxy, "api.test", true, "Bearer guest");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer rule-1\nurl=/repos?q=1\n");
  EXPECT_EQ(asked, (std::vector<std::pair<std::string, bool>>{{"api.test", true}}));
  ASSERT_EQ(w.uses_.size(), 1u);
  EXPECT_EQ(w.uses_[0].injected, std::vector<std::string>{"openai-key"});
  // A guest's placeholder still works beside a rule of another header.
  rules.set = {{"X-Team", "agents"}};
  rules.injected.clear();
  r = w.call(proxy, "api.test", true, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer " + w.value_ + "\nurl=/repos?q=1\n");
  // A secret the rule needs cannot be put in: refused, nothing sent.
  int before = w.echo_->requests;
  rules = {};
  rules.refused = {"openai-key"};
  rules.why = "unknown_secret";
  r = w.call(proxy, "api.test", true, "Bearer guest");
  EXPECT_EQ(r.status, 403u);
  EXPECT_NE(r.body.find("openai-key"), std::string::npos) << r.body;
  EXPECT_EQ(w.echo_->requests, before);
  EXPECT_EQ(w.uses_.back().refused, std::vector<std::string>{"openai-key"});
  EXPECT_EQ(w.uses_.back().why, "unknown_secret");
  // Plain HTTP: forwarded untransformed, the rule's secrets reported refused.
  rules = {};
  rules.set = {{"Authorization", "Bearer rule-1"}};
  rules.refused = {"openai-key"};
  rules.why = "plain_http";
  r = w.call(proxy, "api.test", false, "Bearer guest");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer guest\nurl=/repos?q=1\n");
  EXPECT_EQ(w.uses_.back().why, "plain_http");
  EXPECT_FALSE(w.uses_.back().blocked);
}

// Bodies go through as they are, with a length or chunked; the headers still get the value.
TEST(EgressProxy, RequestBodiesPassWithLengthOrChunked) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  std::string body = "{\"title\": \"x\", \"note\": \"" + std::string(100000, 'a') + "\"}";
  for (bool chunked : {false, true}) {
    auto r = w.call(proxy, "api.test", true, "Bearer " + w.placeholder_, "", body, chunked);
    EXPECT_EQ(r.status, 200u) << r.body.substr(0, 200);
    EXPECT_EQ(r.body,
              "host=api.test\nauth=Bearer " + w.value_ + "\nurl=/repos?q=1\nbody=" + body + "\n")
        << "chunked=" << chunked;
  }
}

TEST(EgressProxy, AnotherHostGetsThePlaceholderAndTheUseIsReported) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  auto r = w.call(proxy, "other.test", true, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=other.test\nauth=Bearer " + w.placeholder_ + "\nurl=/repos?q=1\n");
  ASSERT_EQ(w.uses_.size(), 1u);
  EXPECT_TRUE(w.uses_[0].injected.empty());
  EXPECT_EQ(w.uses_[0].refused, std::vector<std::string>{"GITHUB_TOKEN"});
  EXPECT_EQ(w.uses_[0].host, "other.test");
}

TEST(EgressProxy, AHostHeaderOtherThanTheConnectionsNameIsRefused) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  // TLS made for other.test (checked for it), then a request naming api.test: 421, not sent.
  auto r = w.call(proxy, "other.test", true, "Bearer " + w.placeholder_, "api.test");
  EXPECT_EQ(r.status, 421u) << r.body;
  EXPECT_EQ(w.echo_->requests, 0);
  EXPECT_TRUE(w.uses_.empty());
}

TEST(EgressProxy, PlainHttpNeverCarriesASecret) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  auto r = w.call(proxy, "api.test", false, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 403u) << r.body;
  EXPECT_EQ(w.echo_->requests, 0);
  ASSERT_EQ(w.uses_.size(), 1u);
  EXPECT_TRUE(w.uses_[0].blocked);
  EXPECT_EQ(w.uses_[0].refused, std::vector<std::string>{"GITHUB_TOKEN"});
  // Without a placeholder it goes through as it is.
  r = w.call(proxy, "api.test", false, "Bearer mine");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer mine\nurl=/repos?q=1\n");
  EXPECT_EQ(w.connected_, std::vector<std::string>{"api.test:80"});
}

// Query strings, bodies and plain HTTP carry the value only for a secret opted into them; a body
// is then held whole (its length rewritten), at most kMaxBody.
TEST(EgressProxy, OptedInQueriesBodiesAndPlainHttpGetTheValue) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  EgressProxy proxy(w.io_.provider->getTimer(), w.options());
  std::string body = "token=" + w.placeholder_ + std::string("&\0x=1", 5);  // (a NUL kept)
  w.url_ = "/repos?k=" + w.placeholder_;
  // Not opted in: both forwarded as they are, the use refused as not opted in.
  auto r = w.call(proxy, "api.test", true, "", "", body);
  EXPECT_EQ(r.body, "host=api.test\nauth=\nurl=" + w.url_ + "\nbody=" + body + "\n");
  ASSERT_EQ(w.uses_.size(), 1u);  // (the body is not held: no secret may go into it)
  EXPECT_EQ(w.uses_[0].why, "not_opted_in");
  EXPECT_EQ(w.uses_[0].refused, std::vector<std::string>{"GITHUB_TOKEN"});
  // Opted in: replaced in both, with a length or chunked.
  w.in_query_ = w.in_body_ = true;
  for (bool chunked : {false, true}) {
    r = w.call(proxy, "api.test", true, "", "", body, chunked);
    EXPECT_EQ(r.status, 200u) << r.body;
    EXPECT_EQ(r.body, "host=api.test\nauth=\nurl=/repos?k=" + w.value_ +
                          "\nbody=token=" + w.value_ + std::string("&\0x=1", 5) + "\n");
    EXPECT_EQ(w.uses_.back().injected, std::vector<std::string>{"GITHUB_TOKEN"});
    EXPECT_TRUE(w.uses_.back().refused.empty());
  }
  // Another host still gets the placeholder, in the body too.
  r = w.call(proxy, "other.test", true, "", "", body);
  EXPECT_EQ(r.body, "host=other.test\nauth=\nurl=" + w.url_ + "\nbody=" + body + "\n");
  EXPECT_EQ(w.uses_.back().why, "not_secret_host");
  // Past kMaxBody: 413, nothing sent.
  int before = w.echo_->requests;
  r = w.call(proxy, "api.test", true, "", "", std::string(EgressProxy::kMaxBody + 1, 'a'), true);
  EXPECT_EQ(r.status, 413u);
  EXPECT_EQ(w.echo_->requests, before);
  // Plain HTTP: only a secret allowed it.
  w.url_ = "/x";
  r = w.call(proxy, "api.test", false, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 403u);
  w.plain_http_ = true;
  r = w.call(proxy, "api.test", false, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(r.body, "host=api.test\nauth=Bearer " + w.value_ + "\nurl=/x\n");
  EXPECT_FALSE(w.uses_.back().tls);
  EXPECT_EQ(w.uses_.back().injected, std::vector<std::string>{"GITHUB_TOKEN"});
}

TEST(EgressProxy, AnUpstreamItCannotVerifyGetsNothing) {
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  // The proxy trusts neither the system's store nor the test's CA: the upstream is not verified,
  // so the value is never sent (502).
  EgressProxy proxy(w.io_.provider->getTimer(), w.options(/*trust_upstream=*/false));
  auto r = w.call(proxy, "api.test", true, "Bearer " + w.placeholder_);
  EXPECT_EQ(r.status, 502u) << r.body;
  EXPECT_EQ(w.echo_->requests, 0);
}

TEST(EgressCa, LeavesChainToTheCaAndNameTheirHost) {
  auto ca = EgressCa::make("sbx_x");
  ASSERT_TRUE(ca) << ca.error().message;
  auto a = (*ca)->leaf("api.example.com");
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_NE(a->cert.find("BEGIN CERTIFICATE"), std::string::npos);
  // The chain: the leaf, then the CA.
  EXPECT_NE(a->cert.find((*ca)->ca().cert), std::string::npos);
  auto again = (*ca)->leaf("api.example.com");
  EXPECT_EQ(again->cert, a->cert);  // minted once
  EXPECT_TRUE((*ca)->leaf("10.1.2.3"));
  EXPECT_FALSE((*ca)->leaf(""));
  EXPECT_FALSE((*ca)->leaf("a b"));
  EXPECT_FALSE((*ca)->leaf("evil/../x"));
  // Kept and loaded again (a daemon restart): the same CA signs.
  auto loaded = EgressCa::load((*ca)->ca());
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ((*loaded)->ca().cert, (*ca)->ca().cert);
  auto other = EgressCa::make("sbx_y");
  EXPECT_FALSE(EgressCa::load(PemPair{(*ca)->ca().cert, (*other)->ca().key}));
  // Placeholders: unique, of one shape.
  auto p = EgressProxy::new_placeholder();
  EXPECT_EQ(p.rfind("pds_secret_", 0), 0u);
  EXPECT_EQ(p.size(), 11u + 32u);
  EXPECT_NE(p, EgressProxy::new_placeholder());
}

// The proxy host: listeners made inside a namespace of the test's own, a connection redirected
// to them by nftables (as a sandbox's ruleset will), the original destination read back, the
// proxy's upstream connection made from the host's namespace to the test's upstream.
TEST(ProxyHost, ServesConnectionsRedirectedInsideANamespace) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a network namespace, nftables)";
  auto wp = std::make_unique<World>();
  auto& w = *wp;
  // A namespace with its loopback up.
  int ns = -1;
  std::thread([&] {
    if (::unshare(CLONE_NEWNET) != 0) return;
    ns = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    ::ioctl(s, SIOCGIFFLAGS, &ifr);
    ifr.ifr_flags |= IFF_UP;
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
    ::close(s);
  }).join();
  ASSERT_GE(ns, 0);
  auto st = apply_nft(
      "table ip pst_proxy_test {\n chain out {\n  type nat hook output priority -100; policy "
      "accept;\n  ip daddr 127.0.0.5 tcp dport 443 redirect to :15443\n  ip daddr 127.0.0.5 tcp "
      "dport 80 redirect to :15080\n }\n}\n",
      ns);
  ASSERT_TRUE(st) << st.error().message;
  std::vector<std::string> dests;
  std::mutex dests_mu;
  {
    ProxyHost host;
    auto o = w.options();
    uint16_t tls_port = w.tls_port_;
    o.connect = [&, tls_port](const std::string& h, const std::string& address, uint16_t port) {
      {
        std::lock_guard lock(dests_mu);
        dests.push_back(h + "@" + address + ":" + std::to_string(port));
      }
      return ProxyHost::connect("127.0.0.1", tls_port);
    };
    std::vector<ProxyUse> uses;
    o.on_use = [&](const ProxyUse& u) {
      std::lock_guard lock(dests_mu);
      uses.push_back(u);
    };
    auto started = host.start("sbx_t", ns, std::move(o), "0.0.0.0");
    ASSERT_TRUE(started) << started.error().message;
    EXPECT_EQ(host.serving(), 1u);
    // A client in the namespace, headed for 127.0.0.5:443: redirected to the proxy.
    int fd = -1;
    in_netns(ns, [&] {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(443);
      ::inet_pton(AF_INET, "127.0.0.5", &a.sin_addr);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(fd);
        fd = -1;
      }
    });
    ASSERT_GE(fd, 0);
    auto raw =
        w.io_.lowLevelProvider->wrapSocketFd(fd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
    auto stream = w.guest_tls_->wrapClient(kj::mv(raw), "api.test").wait(w.io_.waitScope);
    auto client = kj::newHttpClient(*w.table_, *stream);
    kj::HttpHeaders h(*w.table_);
    h.set(kj::HttpHeaderId::HOST, "api.test");
    h.set(w.auth_, kj::str("Bearer ", w.placeholder_.c_str()));
    auto req = client->request(kj::HttpMethod::GET, "/x", h, uint64_t(0));
    auto r = req.response.wait(w.io_.waitScope);
    EXPECT_EQ(r.statusCode, 200u);
    EXPECT_EQ(std::string(r.body->readAllText().wait(w.io_.waitScope).cStr()),
              "host=api.test\nauth=Bearer " + w.value_ + "\nurl=/x\n");
    {
      std::lock_guard lock(dests_mu);
      EXPECT_EQ(dests, std::vector<std::string>{"api.test@127.0.0.5:443"});
      ASSERT_EQ(uses.size(), 1u);
      EXPECT_EQ(uses[0].injected, std::vector<std::string>{"GITHUB_TOKEN"});
    }
    host.stop("sbx_t");
    EXPECT_EQ(host.serving(), 0u);
    // Stopped: nothing listens on its ports in the namespace any more.
    int refused = -1;
    in_netns(ns, [&] {
      int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(ProxyHost::kTlsPort);
      ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
      refused = ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ? errno : 0;
      ::close(c);
    });
    EXPECT_EQ(refused, ECONNREFUSED);
  }
  ::close(ns);
}

}  // namespace
}  // namespace pandastack::vmm
