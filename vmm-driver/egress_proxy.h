// The egress proxy that puts secrets into a sandbox's requests (issue 35): the guest holds only a
// placeholder for each secret; its HTTPS and HTTP connections are redirected here, and the proxy
// replaces a placeholder with the secret's value in the headers of requests to the secret's
// hosts, and nowhere else.
//
// HTTPS: the proxy answers the guest's TLS handshake as the host the guest named (SNI), with a
// certificate of the sandbox's own CA (vmm-driver/egress_ca.h), which the guest trusts; it
// connects to that host itself and checks the host's certificate against the system's trust store
// (and the operator's extra CAs) for that name. A request whose Host is not the name of its TLS
// connection is refused (421), so a placeholder never reaches a host by a name it was not checked
// for.
//
// Plain HTTP: a request carrying a placeholder is refused (403, never forwarded): the value would
// cross the network in the clear. Other requests are forwarded as they are.
//
// A placeholder sent to a host that is not one of its secret's hosts is forwarded unreplaced and
// reported as a refused use. Every request that carried a placeholder is reported (on_use).
//
// Header rules (E2B's network rules): an HTTPS request to a host with rules has the headers they
// set (the guest's headers of those names dropped), their secrets' values resolved by the caller
// per request; when one cannot be put in (a secret deleted, or not for this host, or a value that
// is not one line) the request is refused (403), never sent without it. Plain HTTP requests are
// not transformed (a rule's secrets are reported refused).
//
// A secret may opt into query strings and bodies (a body is then held whole, at most kMaxBody)
// and into plain HTTP. HTTP/2 is not offered (ALPN: the guest speaks HTTP/1.1).
#pragma once

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/compat/tls.h>
#include <kj/timer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vmm-driver/egress_ca.h"

namespace pandastack::vmm {

// A secret as the proxy uses it.
struct ProxySecret {
  std::string name;
  std::string placeholder;         // what the guest holds instead of the value
  std::string value;               // what requests to `hosts` carry instead
  std::vector<std::string> hosts;  // names, or "*.domain" (the egress allowlist's syntax)
  // Opted in: the value also goes into query strings / bodies (at most kMaxBody), and into plain
  // HTTP requests.
  bool in_query = false, in_body = false, plain_http = false;
};

// One request that carried placeholders: which secrets were put in (`injected`) and which were
// not because the host is not theirs, or the request was plain HTTP (`refused`).
struct ProxyUse {
  std::string host;
  uint16_t port = 0;
  bool tls = false;
  std::string method;
  std::vector<std::string> injected, refused;
  bool blocked = false;  // the request was answered by the proxy, not forwarded (plain HTTP)
  // Why the first of `refused` was: "not_secret_host", "not_opted_in" (a query or body of a
  // secret that is not opted in), "plain_http".
  std::string why;
  std::string address;  // where the guest connected (IPv4)
};

// What a host's header rules give a request: the headers to set (name, value), the secrets whose
// values they carry (`injected`), and those that could not be put in (`refused`, `why`: the
// first's reason: "unknown_secret", "not_secret_host", "bad_value", "plain_http"). Empty: no rule
// for the host.
struct ProxyHeaders {
  std::vector<std::pair<std::string, std::string>> set;
  std::vector<std::string> injected, refused;
  std::string why;
  bool empty() const { return set.empty() && injected.empty() && refused.empty(); }
};

struct ProxyOptions {
  std::shared_ptr<EgressCa> ca;
  // The sandbox's secrets now (asked per request: a rotation takes effect on the next request).
  std::function<std::vector<ProxySecret>()> secrets;
  // The header rules' headers for a request to `host` (lower case), over TLS or not (asked per
  // request; absent: no rules).
  std::function<ProxyHeaders(const std::string& host, bool tls)> headers;
  // A TCP connection to where the guest was going: `address`:`port` (the IPv4 address it
  // connected to), for the name it used (`host`: the TLS connection's name or the Host header).
  // The caller applies the sandbox's egress policy.
  std::function<kj::Promise<kj::Own<kj::AsyncIoStream>>(const std::string& host,
                                                        const std::string& address, uint16_t port)>
      connect;
  // Certificates (PEM) trusted for upstream hosts besides the system's store.
  std::vector<std::string> extra_ca_pems;
  bool use_system_trust_store = true;
  std::function<void(const ProxyUse&)> on_use;
  // An upstream's connect, TLS handshake and response head, each at most this long.
  kj::Duration upstream_timeout = 30 * kj::SECONDS;
};

// A TLS server's certificate for whatever host a client names (SNI), signed by `ca` (minted once
// per host); the name asked for is kept in `name`. The proxy's guest side, and the upstreams of
// tests and benchmarks.
class CaSni final : public kj::TlsSniCallback {
 public:
  explicit CaSni(std::shared_ptr<EgressCa> ca) : ca_(std::move(ca)) {}
  kj::Maybe<kj::TlsKeypair> getKey(kj::StringPtr hostname) override;
  std::string name;  // lower case

 private:
  std::shared_ptr<EgressCa> ca_;
};

class EgressProxy {
 public:
  EgressProxy(kj::Timer& timer, ProxyOptions options);
  ~EgressProxy();
  EgressProxy(const EgressProxy&) = delete;
  EgressProxy& operator=(const EgressProxy&) = delete;

  // Serves one guest connection that was headed for `address` (the IPv4 address the guest
  // connected to: its name when the TLS client sends none) and `port`: TLS first when `tls`.
  // Resolves when the connection ends (errors end it too; nothing is thrown).
  kj::Promise<void> serve(kj::Own<kj::AsyncIoStream> guest, const std::string& address,
                          uint16_t port, bool tls);

  // A body a secret may go into is held whole to replace its placeholders: at most this long
  // (413 past it, never forwarded cut).
  static constexpr size_t kMaxBody = 1 << 20;

  // Placeholders as the proxy expects them: "pds_secret_" + 32 random base32 characters.
  static std::string new_placeholder();

  struct Impl;  // (egress_proxy.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::vmm
