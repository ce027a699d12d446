#include "actors/cluster_tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <sstream>

namespace pandastack::actors {

namespace {

using storage::ErrorCode;
using storage::make_error;

storage::Result<std::string> read_file(const std::string& path, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(ErrorCode::not_found, "missing " + path);
  if (secret && (st.st_mode & 077) != 0)
    return make_error(ErrorCode::invalid_argument, path + " is readable by others (mode " +
                                                       std::to_string(st.st_mode & 0777) +
                                                       "): chmod 600 it");
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f.good() && !f.eof()) return make_error(ErrorCode::io_error, "cannot read " + path);
  return ss.str();
}

storage::Result<std::string> read_key(const std::string& path) {
  auto hex = read_file(path, true);
  if (!hex) return hex.error();
  std::string h = *hex;
  while (!h.empty() && (h.back() == '\n' || h.back() == '\r' || h.back() == ' ')) h.pop_back();
  std::string out;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    int a = nibble(h[i]), b = nibble(h[i + 1]);
    if (a < 0 || b < 0) break;
    out += char(a * 16 + b);
  }
  if (out.size() != 32 || h.size() != 64)
    return make_error(ErrorCode::invalid_argument,
                      path + " must hold 32 random bytes as 64 hex digits");
  return out;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<X509, X509Free> parse_cert(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), int(pem.size())));
  return std::unique_ptr<X509, X509Free>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

storage::Result<ClusterTls> ClusterTls::load(const std::string& dir, const std::string& host_id) {
  ClusterTls t;
  t.dir = dir;
  auto ca = read_file(dir + "/ca.pem", false);
  if (!ca) return ca.error();
  auto cert = read_file(dir + "/host.pem", false);
  if (!cert) return cert.error();
  auto key = read_file(dir + "/host.key", true);
  if (!key) return key.error();
  auto records = read_key(dir + "/records.key");
  if (!records) return records.error();
  auto e2b = read_key(dir + "/e2b-tokens.key");
  if (!e2b) return e2b.error();
  t.ca_pem = *ca;
  t.cert_pem = *cert;
  t.key_pem = *key;
  t.records_key = *records;
  t.e2b_tokens_key = *e2b;

  auto ca_cert = parse_cert(t.ca_pem);
  auto host_cert = parse_cert(t.cert_pem);
  if (!ca_cert)
    return make_error(ErrorCode::invalid_argument, dir + "/ca.pem holds no certificate");
  if (!host_cert)
    return make_error(ErrorCode::invalid_argument, dir + "/host.pem holds no certificate");
  std::unique_ptr<EVP_PKEY, KeyFree> ca_key(X509_get_pubkey(ca_cert.get()));
  if (!ca_key || X509_verify(host_cert.get(), ca_key.get()) != 1)
    return make_error(ErrorCode::invalid_argument,
                      dir + "/host.pem is not issued by " + dir + "/ca.pem");
  std::unique_ptr<BIO, BioFree> kbio(BIO_new_mem_buf(t.key_pem.data(), int(t.key_pem.size())));
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(
      PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr));
  if (!pkey || X509_check_private_key(host_cert.get(), pkey.get()) != 1)
    return make_error(ErrorCode::invalid_argument,
                      dir + "/host.key is not the key of " + dir + "/host.pem");
  char cn[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(host_cert.get()), NID_commonName, cn,
                            int(sizeof cn));
  if (host_id != cn)
    return make_error(
        ErrorCode::invalid_argument,
        dir + "/host.pem is host '" + cn + "''s certificate, not --host-id " + host_id + "'s");
  return t;
}

tools::TlsFiles ClusterTls::etcd_files() const {
  return {dir + "/ca.pem", dir + "/host.pem", dir + "/host.key"};
}

}  // namespace pandastack::actors
