#include "storage/secrets.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>

namespace pandastack::storage {

namespace {

constexpr size_t kKeyLen = 32, kNonceLen = 12, kTagLen = 16;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string row_key(const std::string& tenant, const std::string& name) {
  std::string k = "x" + tenant;
  k += '\0';
  return k + name;
}

void put_u(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out += char((v >> (8 * i)) & 0xff);
}

bool get_u(const std::string& in, size_t& at, int bytes, uint64_t& v) {
  if (at + size_t(bytes) > in.size()) return false;
  v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | uint8_t(in[at++]);
  return true;
}

// The additional data a value is sealed with: it opens only as this tenant's secret of this name.
std::string aad(const SecretInfo& i) {
  std::string a = "pandastack secret v1";
  a += '\0';
  a += i.tenant;
  a += '\0';
  return a + i.name;
}

std::string binding_key(const std::string& sandbox) { return "b" + sandbox; }

// A binding's record opens only as this sandbox's.
std::string binding_aad(const std::string& sandbox) {
  std::string a = "pandastack secret binding v1";
  a += '\0';
  return a + sandbox;
}

void put_str(std::string& out, const std::string& s) {
  put_u(out, s.size(), 4);
  out += s;
}

bool get_str(const std::string& in, size_t& at, std::string& s) {
  uint64_t n = 0;
  if (!get_u(in, at, 4, n) || at + n > in.size()) return false;
  s = in.substr(at, n);
  at += n;
  return true;
}

}  // namespace

// record: "s2" created(8) updated(8) expires(8) version(4) use(1: bit 0 query, 1 body, 2 plain
// HTTP) hosts(2) [len(2) host]... sealed. "s1" records (before `use`) have no use byte.
struct SecretStore::Record {
  SecretInfo info;
  std::string sealed;

  std::string encode() const {
    std::string r = "s2";
    put_u(r, uint64_t(info.created_ms), 8);
    put_u(r, uint64_t(info.updated_ms), 8);
    put_u(r, uint64_t(info.expires_ms), 8);
    put_u(r, info.version, 4);
    put_u(r,
          uint64_t(info.use.in_query) | uint64_t(info.use.in_body) << 1 |
              uint64_t(info.use.allow_plain_http) << 2,
          1);
    put_u(r, info.hosts.size(), 2);
    for (auto& h : info.hosts) {
      put_u(r, h.size(), 2);
      r += h;
    }
    return r + sealed;
  }
  static std::optional<Record> decode(const std::string& tenant, const std::string& name,
                                      const std::string& r) {
    bool v2 = r.compare(0, 2, "s2") == 0;
    if (!v2 && r.compare(0, 2, "s1") != 0) return std::nullopt;
    Record rec;
    rec.info.tenant = tenant;
    rec.info.name = name;
    size_t at = 2;
    uint64_t created, updated, expires, version, use = 0, n;
    if (!get_u(r, at, 8, created) || !get_u(r, at, 8, updated) || !get_u(r, at, 8, expires) ||
        !get_u(r, at, 4, version) || (v2 && !get_u(r, at, 1, use)) || !get_u(r, at, 2, n))
      return std::nullopt;
    rec.info.use = {bool(use & 1), bool(use & 2), bool(use & 4)};
    rec.info.created_ms = int64_t(created);
    rec.info.updated_ms = int64_t(updated);
    rec.info.expires_ms = int64_t(expires);
    rec.info.version = uint32_t(version);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t len;
      if (!get_u(r, at, 2, len) || at + len > r.size()) return std::nullopt;
      rec.info.hosts.push_back(r.substr(at, len));
      at += len;
    }
    rec.sealed = r.substr(at);
    return rec;
  }
};

Result<std::unique_ptr<SecretStore>> SecretStore::open(EventStore& db,
                                                       const std::filesystem::path& key_file) {
  std::string key(kKeyLen, '\0');
  int fd = ::open(key_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), int(kKeyLen)) != 1)
      return make_error(ErrorCode::io_error, "no randomness for the secrets key");
    auto tmp = key_file.string() + ".tmp";
    int w = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    bool ok =
        w >= 0 && ::write(w, key.data(), key.size()) == ssize_t(key.size()) && ::fsync(w) == 0;
    if (w >= 0) ::close(w);
    if (!ok || ::rename(tmp.c_str(), key_file.c_str()) != 0)
      return make_error(ErrorCode::io_error, "cannot write the secrets key " + key_file.string());
    return std::unique_ptr<SecretStore>(new SecretStore(db, std::move(key)));
  }
  if (fd < 0)
    return make_error(ErrorCode::io_error, "cannot read the secrets key " + key_file.string());
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == off_t(kKeyLen) &&
            (st.st_mode & 077) == 0 && ::read(fd, key.data(), kKeyLen) == ssize_t(kKeyLen);
  ::close(fd);
  if (!ok)
    return make_error(ErrorCode::corrupt, "the secrets key " + key_file.string() +
                                              " must be a 32-byte file only its owner reads");
  return std::unique_ptr<SecretStore>(new SecretStore(db, std::move(key)));
}

std::string SecretStore::seal(const SecretInfo& info, const std::string& value) const {
  return seal_with(aad(info), value);
}

std::optional<std::string> SecretStore::unseal(const SecretInfo& info,
                                               const std::string& sealed) const {
  return unseal_with(aad(info), sealed);
}

std::string SecretStore::seal_with(const std::string& a, const std::string& value) const {
  std::string nonce(kNonceLen, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), int(kNonceLen)) != 1) return "";
  std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                      EVP_CIPHER_CTX_free);
  std::string out(value.size(), '\0'), tag(kTagLen, '\0');
  int len = 0, fin = 0;
  bool ok =
      ctx &&
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key_.data()),
                         reinterpret_cast<const unsigned char*>(nonce.data())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(a.data()),
                        int(a.size())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len,
                        reinterpret_cast<const unsigned char*>(value.data()),
                        int(value.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()) + len, &fin) ==
          1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, int(kTagLen), tag.data()) == 1;
  if (!ok) return "";
  return nonce + out + tag;
}

std::optional<std::string> SecretStore::unseal_with(const std::string& a,
                                                    const std::string& sealed) const {
  if (sealed.size() < kNonceLen + kTagLen) return std::nullopt;
  std::string nonce = sealed.substr(0, kNonceLen);
  std::string body = sealed.substr(kNonceLen, sealed.size() - kNonceLen - kTagLen);
  std::string tag = sealed.substr(sealed.size() - kTagLen);
  std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                      EVP_CIPHER_CTX_free);
  std::string out(body.size(), '\0');
  int len = 0, fin = 0;
  bool ok =
      ctx &&
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key_.data()),
                         reinterpret_cast<const unsigned char*>(nonce.data())) == 1 &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(a.data()),
                        int(a.size())) == 1 &&
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len,
                        reinterpret_cast<const unsigned char*>(body.data()),
                        int(body.size())) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, int(kTagLen), tag.data()) == 1 &&
      EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()) + len, &fin) == 1;
  if (!ok) return std::nullopt;
  return out;
}

Result<std::optional<SecretStore::Record>> SecretStore::load(const std::string& tenant,
                                                             const std::string& name) {
  auto raw = db_.get(row_key(tenant, name));
  if (!raw) return raw.error();
  if (!*raw) return std::optional<Record>();
  auto rec = Record::decode(tenant, name, **raw);
  if (!rec)
    return make_error(ErrorCode::corrupt, "secret " + name + ": its record does not decode");
  if (rec->info.expires_ms && rec->info.expires_ms <= now_ms()) {
    (void)db_.remove(row_key(tenant, name), true);  // (expired: gone for good)
    return std::optional<Record>();
  }
  return rec;
}

Status SecretStore::save(const Record& r, bool sync) {
  return db_.put(row_key(r.info.tenant, r.info.name), r.encode(), sync);
}

Result<SecretInfo> SecretStore::create(const SecretInfo& info, const std::string& value) {
  auto old = load(info.tenant, info.name);
  if (!old) return old.error();
  if (*old) return make_error(ErrorCode::conflict, "secret " + info.name + " exists");
  Record r;
  r.info = info;
  r.info.created_ms = r.info.updated_ms = now_ms();
  r.info.version = 1;
  r.sealed = seal(r.info, value);
  if (r.sealed.empty()) return make_error(ErrorCode::io_error, "cannot seal the secret's value");
  auto st = save(r, true);
  if (!st) return st.error();
  return r.info;
}

Result<SecretInfo> SecretStore::update(const std::string& tenant, const std::string& name,
                                       const std::optional<std::string>& value,
                                       const std::optional<std::vector<std::string>>& hosts,
                                       std::optional<int64_t> expires_ms,
                                       std::optional<SecretUse> use) {
  auto old = load(tenant, name);
  if (!old) return old.error();
  if (!*old) return make_error(ErrorCode::not_found, "no secret " + name);
  Record r = std::move(**old);
  r.info.updated_ms = now_ms();
  if (hosts) r.info.hosts = *hosts;
  if (expires_ms) r.info.expires_ms = *expires_ms;
  if (use) r.info.use = *use;
  if (value) {
    r.info.version += 1;
    r.sealed = seal(r.info, *value);
    if (r.sealed.empty()) return make_error(ErrorCode::io_error, "cannot seal the secret's value");
  }
  auto st = save(r, true);
  if (!st) return st.error();
  return r.info;
}

Result<std::vector<SecretInfo>> SecretStore::list(const std::string& tenant) {
  std::string prefix = "x" + tenant;
  prefix += '\0';
  auto rows = db_.scan(prefix);
  if (!rows) return rows.error();
  std::vector<SecretInfo> out;
  for (auto& [key, value] : *rows) {
    auto rec = load(tenant, key.substr(prefix.size()));
    if (rec && *rec) out.push_back((*rec)->info);
  }
  return out;
}

Result<SecretInfo> SecretStore::get(const std::string& tenant, const std::string& name) {
  auto rec = load(tenant, name);
  if (!rec) return rec.error();
  if (!*rec) return make_error(ErrorCode::not_found, "no secret " + name);
  return (*rec)->info;
}

Result<std::string> SecretStore::reveal(const std::string& tenant, const std::string& name,
                                        SecretInfo* info) {
  auto rec = load(tenant, name);
  if (!rec) return rec.error();
  if (!*rec) return make_error(ErrorCode::not_found, "no secret " + name);
  if (info) *info = (*rec)->info;
  auto value = unseal((*rec)->info, (*rec)->sealed);
  if (!value)
    return make_error(ErrorCode::corrupt,
                      "secret " + name + " does not open with this host's secrets key");
  return *value;
}

Status SecretStore::remove(const std::string& tenant, const std::string& name) {
  auto rec = load(tenant, name);
  if (!rec) return rec.error();
  if (!*rec) return make_error(ErrorCode::not_found, "no secret " + name);
  return db_.remove(row_key(tenant, name), true);
}

// binding record: "b2" sealed(tenant, count(4), [name, placeholder]..., ca_cert, ca_key,
// count(4), [host, header, value]...), each string a 4-byte length and its bytes. "b1" records
// (before header rules) end after ca_key.
Status SecretStore::bind(const SecretBinding& b) {
  std::string plain;
  put_str(plain, b.tenant);
  put_u(plain, b.placeholders.size(), 4);
  for (auto& [name, placeholder] : b.placeholders) {
    put_str(plain, name);
    put_str(plain, placeholder);
  }
  put_str(plain, b.ca_cert);
  put_str(plain, b.ca_key);
  put_u(plain, b.rules.size(), 4);
  for (auto& r : b.rules) {
    put_str(plain, r.host);
    put_str(plain, r.header);
    put_str(plain, r.value);
  }
  auto sealed = seal_with(binding_aad(b.sandbox), plain);
  if (sealed.empty()) return make_error(ErrorCode::io_error, "cannot seal the binding");
  return db_.put(binding_key(b.sandbox), "b2" + sealed, true);
}

Result<std::optional<SecretBinding>> SecretStore::binding(const std::string& sandbox) {
  auto raw = db_.get(binding_key(sandbox));
  if (!raw) return raw.error();
  if (!*raw) return std::optional<SecretBinding>();
  auto corrupt = [&] {
    return make_error(ErrorCode::corrupt, "the secrets binding of " + sandbox + " does not open");
  };
  bool v2 = (*raw)->rfind("b2", 0) == 0;
  if (!v2 && (*raw)->rfind("b1", 0) != 0) return corrupt();
  auto plain = unseal_with(binding_aad(sandbox), (*raw)->substr(2));
  if (!plain) return corrupt();
  SecretBinding b;
  b.sandbox = sandbox;
  size_t at = 0;
  uint64_t n = 0;
  if (!get_str(*plain, at, b.tenant) || !get_u(*plain, at, 4, n) || n > 1000) return corrupt();
  for (uint64_t i = 0; i < n; ++i) {
    std::string name, placeholder;
    if (!get_str(*plain, at, name) || !get_str(*plain, at, placeholder)) return corrupt();
    b.placeholders.emplace_back(std::move(name), std::move(placeholder));
  }
  if (!get_str(*plain, at, b.ca_cert) || !get_str(*plain, at, b.ca_key)) return corrupt();
  if (v2) {
    if (!get_u(*plain, at, 4, n) || n > 10000) return corrupt();
    for (uint64_t i = 0; i < n; ++i) {
      HeaderRule r;
      if (!get_str(*plain, at, r.host) || !get_str(*plain, at, r.header) ||
          !get_str(*plain, at, r.value))
        return corrupt();
      b.rules.push_back(std::move(r));
    }
  }
  if (at != plain->size()) return corrupt();
  return std::optional<SecretBinding>(std::move(b));
}

Status SecretStore::unbind(const std::string& sandbox) {
  return db_.remove(binding_key(sandbox), true);
}

Result<std::vector<std::string>> SecretStore::bound() {
  auto rows = db_.scan("b");
  if (!rows) return rows.error();
  std::vector<std::string> out;
  for (auto& [k, v] : *rows) out.push_back(k.substr(1));
  return out;
}

}  // namespace pandastack::storage
