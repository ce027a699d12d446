// `pandastack-bench proxy https|https-new [--n N] [--json]`: what the egress proxy
// (vmm-driver/egress_proxy.h) adds to an HTTPS request, measured in one run on loopback: an HTTPS
// upstream of the bench's own (a CA it makes), asked N times directly and N times through the
// proxy (the guest's TLS ends at the proxy, which puts a secret into the Authorization header and
// makes its own verified TLS connection to the upstream).
//   https      one kept-alive connection, N requests (the steady state of an SDK's client)
//   https-new  a new connection per request (TLS handshakes on both legs)
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/compat/tls.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/stats.h"
#include "vmm-driver/egress_proxy.h"

namespace pandastack::tools {

namespace {

using Clock = std::chrono::steady_clock;

class Upstream final : public kj::HttpService {
 public:
  explicit Upstream(kj::HttpHeaderTable& t, kj::HttpHeaderId auth) : table_(t), auth_(auth) {}
  kj::Promise<void> request(kj::HttpMethod, kj::StringPtr, const kj::HttpHeaders& headers,
                            kj::AsyncInputStream&, Response& response) override {
    // Answers 200 only when the secret arrived (so the bench measures a working injection).
    bool ok = headers.get(auth_).orDefault("") == kj::StringPtr("Bearer the-value");
    static const char kBody[] = "{\"ok\":true}";
    kj::HttpHeaders h(table_);
    auto out = response.send(ok ? 200 : 401, ok ? "OK" : "Unauthorized", h, sizeof kBody - 1);
    auto& o = *out;
    return o.write(kBody, sizeof kBody - 1).attach(kj::mv(out));
  }

 private:
  kj::HttpHeaderTable& table_;
  kj::HttpHeaderId auth_;
};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

int proxy_bench(const std::string& scenario, int n, bool json) {
  if (scenario != "https" && scenario != "https-new") {
    std::fprintf(stderr, "pandastack-bench proxy: https|https-new\n");
    return 2;
  }
  bool fresh = scenario == "https-new";
  auto io = kj::setupAsyncIo();
  auto& ws = io.waitScope;
  auto& net = io.provider->getNetwork();
  auto& timer = io.provider->getTimer();
  kj::HttpHeaderTable::Builder builder;
  auto auth = builder.add("Authorization");
  auto table = builder.build();
  auto upstream_ca = *vmm::EgressCa::make("bench-upstream");
  auto sandbox_ca = *vmm::EgressCa::make("bench-sandbox");

  // The upstream: HTTPS on loopback, certificates of its own CA.
  auto leaf = *upstream_ca->leaf("api.bench");
  kj::TlsKeypair keypair{kj::TlsPrivateKey(leaf.key.c_str()),
                         kj::TlsCertificate(leaf.cert.c_str())};
  vmm::CaSni up_sni(upstream_ca);
  kj::TlsContext::Options uo;
  uo.useSystemTrustStore = false;
  uo.defaultKeypair = keypair;
  uo.sniCallback = up_sni;
  kj::TlsContext up_tls(kj::mv(uo));
  auto listener = net.parseAddress("127.0.0.1", 0).wait(ws)->listen();
  uint16_t up_port = uint16_t(listener->getPort());
  auto receiver = up_tls.wrapPort(kj::mv(listener));
  Upstream service(*table, auth);
  kj::HttpServer up_server(timer, *table, service);
  auto up_served = up_server.listenHttp(*receiver).eagerlyEvaluate(nullptr);

  // The proxy, on a loopback port of its own (as it listens in a sandbox's namespace).
  vmm::ProxyOptions po;
  po.ca = sandbox_ca;
  std::string placeholder = vmm::EgressProxy::new_placeholder();
  po.secrets = [&] {
    return std::vector<vmm::ProxySecret>{{"TOKEN", placeholder, "the-value", {"api.bench"}}};
  };
  po.connect = [&](const std::string&, const std::string&, uint16_t) {
    return net.parseAddress("127.0.0.1", up_port).then([](kj::Own<kj::NetworkAddress> a) {
      return a->connect().attach(kj::mv(a));
    });
  };
  po.extra_ca_pems = {upstream_ca->ca().cert};
  po.use_system_trust_store = false;
  vmm::EgressProxy proxy(timer, po);
  auto proxy_listener = net.parseAddress("127.0.0.1", 0).wait(ws)->listen();
  uint16_t proxy_port = uint16_t(proxy_listener->getPort());
  struct Ignore final : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  } ignore;
  kj::TaskSet tasks(ignore);
  kj::Function<kj::Promise<void>()> accept_loop;
  accept_loop = [&]() -> kj::Promise<void> {
    return proxy_listener->accept().then([&](kj::Own<kj::AsyncIoStream> s) {
      tasks.add(proxy.serve(kj::mv(s), "127.0.0.1", 443, true));
      return accept_loop();
    });
  };
  auto accepting = accept_loop().eagerlyEvaluate(nullptr);

  // The client: trusts both CAs (the upstream's directly, the sandbox's through the proxy).
  auto trusted =
      kj::heapArray<kj::TlsCertificate>({kj::TlsCertificate(upstream_ca->ca().cert.c_str()),
                                         kj::TlsCertificate(sandbox_ca->ca().cert.c_str())});
  kj::TlsContext::Options co;
  co.useSystemTrustStore = false;
  co.trustedCertificates = trusted;
  kj::TlsContext client_tls(kj::mv(co));

  auto measure = [&](uint16_t port, const std::string& token) {
    std::vector<double> samples;
    kj::Own<kj::AsyncIoStream> stream;
    kj::Own<kj::HttpClient> client;
    auto t_all = Clock::now();
    for (int i = 0; i < n; ++i) {
      auto t = Clock::now();
      if (!client || fresh) {
        client = nullptr;
        stream = nullptr;
        auto raw = net.parseAddress("127.0.0.1", port).wait(ws)->connect().wait(ws);
        stream = client_tls.wrapClient(kj::mv(raw), "api.bench").wait(ws);
        client = kj::newHttpClient(*table, *stream);
      }
      kj::HttpHeaders h(*table);
      h.set(kj::HttpHeaderId::HOST, "api.bench");
      h.set(auth, kj::str("Bearer ", token.c_str()));
      auto req = client->request(kj::HttpMethod::GET, "/v1/thing", h, uint64_t(0));
      auto r = req.response.wait(ws);
      r.body->readAllText().wait(ws);
      if (r.statusCode != 200) {
        std::fprintf(stderr, "pandastack-bench proxy: status %u\n", r.statusCode);
        std::exit(1);
      }
      samples.push_back(ms_since(t));
    }
    double secs = ms_since(t_all) / 1000;
    return std::make_pair(summarize(samples), double(n) / secs);
  };
  auto [direct, direct_rate] = measure(up_port, "the-value");
  auto [proxied, proxied_rate] = measure(proxy_port, placeholder);
  char extra[256];
  std::snprintf(extra, sizeof extra, "{\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"requests_per_s\":%.0f}",
                direct.p50_ms, direct.p99_ms, direct_rate);
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.0f", proxied_rate);
  char added[32];
  std::snprintf(added, sizeof added, "%.3f", proxied.p50_ms - direct.p50_ms);
  auto line = summary_json("proxy-" + scenario, proxied, "n/a",
                           {{"requests_per_s", rate}, {"direct", extra}, {"added_p50_ms", added}});
  if (json) {
    std::printf("%s\n", line.c_str());
  } else {
    std::printf(
        "%s: through the proxy p50 %.2f ms p99 %.2f ms (%.0f req/s); direct p50 %.2f ms "
        "p99 %.2f ms (%.0f req/s); added p50 %s ms\n",
        scenario.c_str(), proxied.p50_ms, proxied.p99_ms, proxied_rate, direct.p50_ms,
        direct.p99_ms, direct_rate, added);
  }
  return 0;
}

}  // namespace pandastack::tools
