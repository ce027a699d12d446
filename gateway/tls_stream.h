// TLS over a kj stream with large buffers, for the peer port (gateway/peer_transport.h).
//
// kj-tls (kj::TlsContext) moves bytes between OpenSSL and the socket through 8 KiB buffers: one
// event-loop turn and one system call per 8 KiB each way, which held a snapshot transfer between
// hosts to ~40% of plain TCP's rate here. This connection reads the socket up to kIoBytes at a
// time into OpenSSL's memory BIO and writes whole records out the same way; the cipher work is
// OpenSSL's as before.
//
// Also the public API's TLS (pandastackd --tls-cert): a server that asks no client certificate.
//
// Identity is checked as kj-tls checked it: the peer's certificate must chain to the trusted CA
// (ca.pem), both sides present one (mutual TLS), and a client names the host id the server's
// certificate must carry (X509_VERIFY_PARAM_set1_host). TLS 1.2 at least.
#pragma once

#include <kj/async-io.h>
#include <kj/timer.h>

#include <memory>
#include <string>

namespace pandastack::gateway {

// The credentials and trust of one side (PEM text), made once and shared by its connections.
class TlsConfig {
 public:
  // `ca_pem` may hold several certificates (a CA rotation). Throws (kj) on a bad PEM.
  TlsConfig(const std::string& ca_pem, const std::string& cert_pem, const std::string& key_pem);
  // A server only, asking no client certificate (clients authenticate in HTTP: API keys, tokens).
  // `cert_pem`: the certificate, then any intermediates.
  TlsConfig(const std::string& cert_pem, const std::string& key_pem);
  ~TlsConfig();
  TlsConfig(const TlsConfig&) = delete;
  TlsConfig& operator=(const TlsConfig&) = delete;

  struct Connected {
    kj::Own<kj::AsyncIoStream> stream;
    std::string peer;  // the common name of the certificate the other side proved
  };
  // The client side: the server's certificate must name `host`.
  kj::Promise<Connected> client(kj::Own<kj::AsyncIoStream> raw, const std::string& host);
  // The server side: a client certificate is required (but with the two-argument constructor).
  kj::Promise<Connected> server(kj::Own<kj::AsyncIoStream> raw);

  // What one system call reads or writes at most.
  static constexpr size_t kIoBytes = 256 << 10;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pandastack::gateway
