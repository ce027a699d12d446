#include "gateway/tls_stream.h"

#include <kj/debug.h>
#include <kj/vector.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace pandastack::gateway {

namespace {

// The OpenSSL errors queued on this thread, as one line (and the queue emptied).
std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(e, line, sizeof line);
    out += (out.empty() ? "" : "; ") + std::string(line);
  }
  return out.empty() ? "no detail" : out;
}

// One side of a TLS session: OpenSSL reads and writes through a BIO on this class's buffers,
// which move to and from the socket in large reads and writes. At most one read and one write are
// under way at a time (kj's contract); what OpenSSL produces while reading (a key update's answer)
// is written by the same ordered chain as the writes.
class TlsConnection final : public kj::AsyncIoStream {
 public:
  TlsConnection(kj::Own<kj::AsyncIoStream> inner, SSL* ssl)
      : inner_(kj::mv(inner)),
        ssl_(ssl),
        in_(kj::heapArray<kj::byte>(TlsConfig::kIoBytes)),
        tail_(kj::Promise<void>(kj::READY_NOW).fork()) {
    BIO* bio = BIO_new(bio_methods());
    KJ_REQUIRE(bio != nullptr, "no memory for a TLS BIO");
    BIO_set_data(bio, this);
    BIO_set_init(bio, 1);
    SSL_set_bio(ssl_, bio, bio);  // (the SSL owns it from now on)
  }
  ~TlsConnection() noexcept(false) { SSL_free(ssl_); }

  // Runs the handshake to its end (its last bytes flushed).
  kj::Promise<void> handshake() {
    int r = SSL_do_handshake(ssl_);
    if (r == 1) return flush();
    int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ) {
      if (eof_) return KJ_EXCEPTION(DISCONNECTED, "the TLS peer closed during the handshake");
      return flush().then([this]() { return fill(); }).then([this]() { return handshake(); });
    }
    std::string why = openssl_errors();
    long verify = SSL_get_verify_result(ssl_);
    if (verify != X509_V_OK)
      why += " (certificate: " + std::string(X509_verify_cert_error_string(verify)) + ")";
    // (an alert may be waiting to go out: best effort)
    auto alert = flush();
    return alert.then(
        [why]() -> kj::Promise<void> {
          return KJ_EXCEPTION(DISCONNECTED, "TLS handshake failed", why);
        },
        [why](kj::Exception&&) -> kj::Promise<void> {
          return KJ_EXCEPTION(DISCONNECTED, "TLS handshake failed", why);
        });
  }

  // The common name of the certificate the other side proved ("" if none).
  std::string peer_name() const {
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (cert == nullptr) return "";
    char cn[256] = {};
    int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
    X509_free(cert);
    return n > 0 ? std::string(cn, size_t(n)) : "";
  }

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return read(static_cast<kj::byte*>(buffer), min, max, 0);
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    if (size == 0) return kj::READY_NOW;
    auto bytes = static_cast<const kj::byte*>(buffer);
    // Encrypted a part at a time (the memory BIO holds one part's records, not a whole message).
    size_t n = std::min(size, kPart);
    int w = SSL_write(ssl_, bytes, int(n));
    if (w <= 0) return KJ_EXCEPTION(DISCONNECTED, "TLS write failed", openssl_errors());
    auto sent = flush();
    if (size_t(w) == size) return sent;
    return sent.then([this, bytes, w, size]() { return write(bytes + w, size - size_t(w)); });
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (pieces.size() == 0) return kj::READY_NOW;
    auto first = pieces[0];
    auto rest = pieces.slice(1, pieces.size());
    return write(first.begin(), first.size()).then([this, rest]() { return write(rest); });
  }

  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override {
    (void)SSL_shutdown(ssl_);  // a close_notify, written after what is queued
    shutdown_ =
        flush().then([this]() { inner_->shutdownWrite(); }).eagerlyEvaluate([](kj::Exception&&) {});
  }
  void abortRead() override { inner_->abortRead(); }
  // The socket's descriptor, for what only looks at the connection (whether the client hung up,
  // its address): never read or written around the TLS session.
  kj::Maybe<int> getFd() const override { return inner_->getFd(); }
  void getsockopt(int level, int option, void* value, uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, uint* length) override {
    inner_->getsockname(addr, length);
  }
  void getpeername(struct sockaddr* addr, uint* length) override {
    inner_->getpeername(addr, length);
  }

 private:
  static constexpr size_t kPart = 1 << 20;

  // Everything OpenSSL has written so far goes out after what is already on its way; resolves
  // once it has (the chain runs whether or not anyone waits: the read side does not).
  kj::Promise<void> flush() {
    if (out_.size() > 0) {
      // The records as OpenSSL made them, in one gathered write.
      auto records = out_.releaseAsArray();
      auto pieces = kj::heapArray<kj::ArrayPtr<const kj::byte>>(records.size());
      for (size_t i = 0; i < records.size(); ++i) pieces[i] = records[i];
      tail_ = tail_.addBranch()
                  .then([this, records = kj::mv(records), pieces = kj::mv(pieces)]() mutable {
                    auto& p = pieces;
                    return inner_->write(p).attach(kj::mv(pieces), kj::mv(records));
                  })
                  .fork();
    }
    return tail_.addBranch();
  }

  // Reads from the socket once (up to kIoBytes): what OpenSSL reads next.
  kj::Promise<void> fill() {
    return inner_->tryRead(in_.begin(), 1, in_.size()).then([this](size_t n) {
      in_pos_ = 0;
      in_len_ = n;
      if (n == 0) eof_ = true;
    });
  }

  // OpenSSL's I/O, on our buffers: it reads the socket's bytes from `in_` and writes its records
  // into `out_` (no copy through a BIO of its own).
  static int bio_read(BIO* b, char* to, int n) {
    auto* c = static_cast<TlsConnection*>(BIO_get_data(b));
    BIO_clear_retry_flags(b);
    size_t left = c->in_len_ - c->in_pos_;
    if (left == 0) {
      if (c->eof_) return 0;
      BIO_set_retry_read(b);
      return -1;
    }
    size_t k = std::min(left, size_t(n));
    memcpy(to, c->in_.begin() + c->in_pos_, k);
    c->in_pos_ += k;
    return int(k);
  }
  static int bio_write(BIO* b, const char* from, int n) {
    auto* c = static_cast<TlsConnection*>(BIO_get_data(b));
    BIO_clear_retry_flags(b);
    auto bytes = reinterpret_cast<const kj::byte*>(from);
    c->out_.add(kj::heapArray<kj::byte>(bytes, size_t(n)));  // (a record: ~16 KiB)
    return n;
  }
  static long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }
  static const BIO_METHOD* bio_methods() {
    static BIO_METHOD* m = [] {
      BIO_METHOD* v = BIO_meth_new(BIO_TYPE_SOURCE_SINK | BIO_get_new_index(), "pandastack tls");
      BIO_meth_set_read(v, bio_read);
      BIO_meth_set_write(v, bio_write);
      BIO_meth_set_ctrl(v, bio_ctrl);
      return v;
    }();
    return m;
  }

  kj::Promise<size_t> read(kj::byte* out, size_t min, size_t max, size_t done) {
    while (done < max) {
      int r = SSL_read(ssl_, out + done, int(std::min<size_t>(max - done, INT_MAX)));
      if (r > 0) {
        done += size_t(r);
        continue;
      }
      int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_ZERO_RETURN) return done;  // the peer's close_notify
      if (e != SSL_ERROR_WANT_READ)
        return KJ_EXCEPTION(DISCONNECTED, "TLS read failed", openssl_errors());
      // What reading produced (a key update's answer) goes out, unawaited: a read never waits
      // for a write.
      if (out_.size() > 0) {
        auto queued = flush();  // (dropped: the ordered chain goes on without a waiter)
      }
      if (done >= min || eof_) return done;
      return fill().then([this, out, min, max, done]() { return read(out, min, max, done); });
    }
    return done;
  }

  kj::Own<kj::AsyncIoStream> inner_;
  SSL* ssl_;
  kj::Array<kj::byte> in_;  // read from the socket: [in_pos_, in_len_) not yet OpenSSL's
  size_t in_pos_ = 0, in_len_ = 0;
  bool eof_ = false;
  kj::Vector<kj::Array<kj::byte>> out_;  // OpenSSL's records, not yet handed to the socket
  kj::ForkedPromise<void> tail_;         // the last write to the socket, in order
  kj::Promise<void> shutdown_ = kj::READY_NOW;
};

}  // namespace

struct TlsConfig::Impl {
  SSL_CTX* ctx = nullptr;
  ~Impl() {
    if (ctx) SSL_CTX_free(ctx);
  }
};

namespace {

// A context with this side's certificate and key, TLS 1.2 at least.
SSL_CTX* make_context(const std::string& cert_pem, const std::string& key_pem) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  KJ_REQUIRE(ctx != nullptr, "cannot make a TLS context", openssl_errors());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // AES-128-GCM first: as safe here, and the fastest of TLS 1.3's with AES instructions.
  SSL_CTX_set_ciphersuites(
      ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  struct Free {
    SSL_CTX* ctx;
    bool keep = false;
    ~Free() {
      if (!keep) SSL_CTX_free(ctx);
    }
  } guard{ctx};
  // The certificate and its chain (intermediates after the leaf, as servers send them).
  BIO* b = BIO_new_mem_buf(cert_pem.data(), int(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(b, nullptr, nullptr, nullptr);
  KJ_REQUIRE(cert != nullptr, "cannot read the certificate", openssl_errors());
  int used = SSL_CTX_use_certificate(ctx, cert);
  X509_free(cert);
  while (X509* more = PEM_read_bio_X509(b, nullptr, nullptr, nullptr))
    if (SSL_CTX_add_extra_chain_cert(ctx, more) != 1) X509_free(more);  // (owned by ctx on success)
  BIO_free(b);
  ERR_clear_error();  // (the read past the last certificate)
  KJ_REQUIRE(used == 1, "cannot use the certificate", openssl_errors());
  b = BIO_new_mem_buf(key_pem.data(), int(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(b, nullptr, nullptr, nullptr);
  BIO_free(b);
  KJ_REQUIRE(key != nullptr, "cannot read the private key", openssl_errors());
  used = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  KJ_REQUIRE(used == 1 && SSL_CTX_check_private_key(ctx) == 1,
             "the private key is not the certificate's", openssl_errors());
  guard.keep = true;
  return ctx;
}

}  // namespace

TlsConfig::TlsConfig(const std::string& ca_pem, const std::string& cert_pem,
                     const std::string& key_pem)
    : impl_(std::make_unique<Impl>()) {
  SSL_CTX* ctx = make_context(cert_pem, key_pem);
  impl_->ctx = ctx;
  // Trust: the cluster CA(s) only, never the system's store.
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  BIO* b = BIO_new_mem_buf(ca_pem.data(), int(ca_pem.size()));
  int trusted = 0;
  while (X509* x = PEM_read_bio_X509(b, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, x) == 1) ++trusted;
    X509_free(x);
  }
  BIO_free(b);
  ERR_clear_error();  // (the read past the last certificate)
  KJ_REQUIRE(trusted > 0, "the CA file holds no certificate");
  // Mutual: each side must prove a certificate of the trusted CA.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
}

TlsConfig::TlsConfig(const std::string& cert_pem, const std::string& key_pem)
    : impl_(std::make_unique<Impl>()) {
  impl_->ctx = make_context(cert_pem, key_pem);
  SSL_CTX_set_verify(impl_->ctx, SSL_VERIFY_NONE, nullptr);  // (clients prove themselves in HTTP)
}

TlsConfig::~TlsConfig() = default;

kj::Promise<TlsConfig::Connected> TlsConfig::client(kj::Own<kj::AsyncIoStream> raw,
                                                    const std::string& host) {
  SSL* ssl = SSL_new(impl_->ctx);
  KJ_REQUIRE(ssl != nullptr, "cannot make a TLS session", openssl_errors());
  auto conn = kj::heap<TlsConnection>(kj::mv(raw), ssl);
  KJ_REQUIRE(
      SSL_set_tlsext_host_name(ssl, host.c_str()) == 1 && SSL_set1_host(ssl, host.c_str()) == 1,
      "cannot name the TLS server", host, openssl_errors());
  SSL_set_connect_state(ssl);
  auto& c = *conn;
  return c.handshake().then([conn = kj::mv(conn)]() mutable {
    std::string peer = conn->peer_name();
    return Connected{kj::mv(conn), std::move(peer)};
  });
}

kj::Promise<TlsConfig::Connected> TlsConfig::server(kj::Own<kj::AsyncIoStream> raw) {
  SSL* ssl = SSL_new(impl_->ctx);
  KJ_REQUIRE(ssl != nullptr, "cannot make a TLS session", openssl_errors());
  auto conn = kj::heap<TlsConnection>(kj::mv(raw), ssl);
  SSL_set_accept_state(ssl);
  auto& c = *conn;
  return c.handshake().then([conn = kj::mv(conn)]() mutable {
    std::string peer = conn->peer_name();
    return Connected{kj::mv(conn), std::move(peer)};
  });
}

}  // namespace pandastack::gateway
