#include "vmm-driver/egress_ca.h"

#include <arpa/inet.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace pandastack::vmm {

namespace {

template <typename T, void (*F)(T*)>
struct Free {
  void operator()(T* p) const { F(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Free<EVP_PKEY, EVP_PKEY_free>>;
using CertPtr = std::unique_ptr<X509, Free<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Free<BIO, BIO_free_all>>;

Error ssl_error(const std::string& what) {
  std::string detail;
  while (unsigned long e = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(e, line, sizeof line);
    detail += (detail.empty() ? "" : "; ") + std::string(line);
  }
  return make_error(ErrorCode::io_error, what + ": " + (detail.empty() ? "failed" : detail));
}

std::string pem_of(const std::function<int(BIO*)>& write) {
  BioPtr b(BIO_new(BIO_s_mem()));
  if (!b || write(b.get()) != 1) return "";
  char* data = nullptr;
  long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, size_t(n));
}

// One X509v3 extension from its configuration text ("critical,CA:TRUE,pathlen:0").
bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate of `key` for `subject_cn`, issued by `issuer` (null: self-signed) and signed with
// `issuer_key`; `exts`: (nid, value) pairs.
Result<CertPtr> issue(EVP_PKEY* key, const std::string& subject_cn, X509* issuer,
                      EVP_PKEY* issuer_key, const std::vector<std::pair<int, std::string>>& exts) {
  CertPtr cert(X509_new());
  if (!cert) return ssl_error("X509_new");
  X509_set_version(cert.get(), 2);
  // A random 64-bit serial (positive).
  unsigned char serial[8];
  if (RAND_bytes(serial, sizeof serial) != 1) return ssl_error("RAND_bytes");
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  if (!bn || !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()))) {
    BN_free(bn);
    return ssl_error("serial");
  }
  BN_free(bn);
  // Valid from an hour ago (a guest clock a little behind) for kValidDays.
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), long(EgressCa::kValidDays) * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>("PandaStack egress"), -1, -1,
                             0);
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(subject_cn.c_str()), -1, -1,
                                 0) != 1)
    return ssl_error("subject name");
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1) return ssl_error("public key");
  for (auto& [nid, value] : exts)
    if (!add_ext(cert.get(), issuer ? issuer : cert.get(), nid, value))
      return ssl_error("extension " + value);
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return ssl_error("signing");
  return cert;
}

std::string cert_pem(X509* c) {
  return pem_of([c](BIO* b) { return PEM_write_bio_X509(b, c); });
}

std::string key_pem(EVP_PKEY* k) {
  return pem_of([k](BIO* b) {
    return PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr);
  });
}

}  // namespace

struct EgressCa::Keys {
  KeyPtr ca_key;
  CertPtr ca_cert;
  KeyPtr leaf_key;  // one key for every host's certificate (minting stays a signature)
};

EgressCa::~EgressCa() = default;

Result<std::shared_ptr<EgressCa>> EgressCa::make(const std::string& label) {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return ssl_error("CA key");
  auto cert = issue(key.get(), "PandaStack egress CA " + label, nullptr, key.get(),
                    {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                     {NID_key_usage, "critical,keyCertSign,cRLSign"},
                     {NID_subject_key_identifier, "hash"}});
  if (!cert) return cert.error();
  return load(PemPair{cert_pem(cert->get()), key_pem(key.get())});
}

Result<std::shared_ptr<EgressCa>> EgressCa::load(const PemPair& ca) {
  std::shared_ptr<EgressCa> c(new EgressCa());
  c->keys_ = std::make_unique<Keys>();
  BioPtr cb(BIO_new_mem_buf(ca.cert.data(), int(ca.cert.size())));
  BioPtr kb(BIO_new_mem_buf(ca.key.data(), int(ca.key.size())));
  if (!cb || !kb) return ssl_error("BIO");
  c->keys_->ca_cert.reset(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  c->keys_->ca_key.reset(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr));
  if (!c->keys_->ca_cert || !c->keys_->ca_key) return ssl_error("reading the CA");
  if (X509_check_private_key(c->keys_->ca_cert.get(), c->keys_->ca_key.get()) != 1)
    return ssl_error("the CA's key is not its certificate's");
  c->keys_->leaf_key.reset(EVP_EC_gen("P-256"));
  if (!c->keys_->leaf_key) return ssl_error("leaf key");
  c->ca_ = ca;
  return c;
}

Result<PemPair> EgressCa::leaf(const std::string& host) {
  std::lock_guard lock(mu_);
  if (auto it = leaves_.find(host); it != leaves_.end()) return it->second;
  if (host.empty() || host.size() > 253 ||
      host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") !=
          std::string::npos)
    return make_error(ErrorCode::invalid_argument, "no certificate for host '" + host + "'");
  in_addr a{};
  bool ip = ::inet_pton(AF_INET, host.c_str(), &a) == 1;
  auto cert = issue(keys_->leaf_key.get(), host, keys_->ca_cert.get(), keys_->ca_key.get(),
                    {{NID_basic_constraints, "critical,CA:FALSE"},
                     {NID_key_usage, "critical,digitalSignature"},
                     {NID_ext_key_usage, "serverAuth"},
                     {NID_subject_alt_name, (ip ? "IP:" : "DNS:") + host},
                     {NID_authority_key_identifier, "keyid:always"}});
  if (!cert) return cert.error();
  if (leaves_.size() >= kMaxLeaves) leaves_.clear();
  PemPair p{cert_pem(cert->get()) + ca_.cert, key_pem(keys_->leaf_key.get())};
  leaves_.emplace(host, p);
  return p;
}

}  // namespace pandastack::vmm
