#include "storage/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "storage/etcd.h"
#include "storage/record_mac.h"
#include "wire/sha256.h"

namespace pandastack::storage {

namespace {

constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";  // base32, lower case
constexpr size_t kIdLen = 12, kSecretLen = 40;                    // 60 and 200 bits

std::string random_token(size_t n) {
  std::string raw(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), int(n)) != 1) return "";
  std::string out;
  for (unsigned char c : raw) out += kAlphabet[c & 31];
  return out;
}

// record: admin(1) created(8) hash(32) tenant
std::string encode(const ApiKey& k, const std::string& hash) {
  std::string r(1, k.admin ? '\1' : '\0');
  for (int i = 7; i >= 0; --i) r += char((uint64_t(k.created_ms) >> (8 * i)) & 0xff);
  r += hash;
  r += k.tenant;
  return r;
}

bool decode(const std::string& id, const std::string& r, ApiKey& k, std::string& hash) {
  if (r.size() < 1 + 8 + 32) return false;
  k.id = id;
  k.admin = r[0] == '\1';
  uint64_t t = 0;
  for (int i = 0; i < 8; ++i) t = (t << 8) | uint8_t(r[1 + i]);
  k.created_ms = int64_t(t);
  hash = r.substr(9, 32);
  k.tenant = r.substr(41);
  return true;
}

bool valid_chars(const std::string& s) {
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '2' && c <= '7'))) return false;
  return true;
}

const std::string kSharedPrefix = "/pandastack/keys/";

}  // namespace

KeyStore::KeyStore(EventStore& db) : db_(db) {}
KeyStore::~KeyStore() = default;

void KeyStore::share(std::unique_ptr<Etcd> etcd, std::string records_key) {
  shared_ = std::move(etcd);
  records_key_ = std::move(records_key);
}

namespace {
constexpr const char* kKeyRecord = "pandastack key record v1";
}

// Bound to the id: a valid record copied under another id does not verify.
std::string KeyStore::seal(const std::string& id, const std::string& record) const {
  return seal_record(records_key_, kKeyRecord, id, record);
}

std::optional<std::string> KeyStore::open(const std::string& id, const std::string& sealed) const {
  return open_record(records_key_, kKeyRecord, id, sealed);
}

Result<std::optional<std::string>> KeyStore::get_record(const std::string& id) {
  if (!shared_) return db_.get("k" + id);
  auto kv = shared_->get(kSharedPrefix + id);
  if (!kv) return kv.error();
  if (!kv->has_value()) return std::optional<std::string>();
  auto record = open(id, (*kv)->value);
  if (!record) {
    spdlog::warn(
        "api keys: the record of key {} in etcd does not carry the cluster's MAC "
        "(written by something that does not hold records.key): ignored",
        id);
    return std::optional<std::string>();
  }
  return record;
}

Status KeyStore::put_record(const std::string& id, const std::string& record) {
  if (!shared_) return db_.put("k" + id, record, true);
  return shared_->put(kSharedPrefix + id, seal(id, record));
}

Status KeyStore::remove_record(const std::string& id) {
  if (!shared_) return db_.remove("k" + id, true);
  {
    std::lock_guard l(cache_mu_);
    for (auto it = verified_.begin(); it != verified_.end();)
      it = it->second.first.id == id ? verified_.erase(it) : std::next(it);
    found_.erase(id);
  }
  return shared_->erase(kSharedPrefix + id);
}

Result<std::pair<std::string, ApiKey>> KeyStore::create(const std::string& tenant, bool admin) {
  if (tenant.empty() || tenant.size() > 128)
    return make_error(ErrorCode::invalid_argument, "tenant must be 1..128 bytes");
  ApiKey k;
  k.id = random_token(kIdLen);
  std::string secret = random_token(kSecretLen);
  if (k.id.empty() || secret.empty())
    return make_error(ErrorCode::io_error, "no randomness for a key");
  k.tenant = tenant;
  k.admin = admin;
  k.created_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  auto put = put_record(k.id, encode(k, wire::sha256(secret)));
  if (!put) return put.error();
  return std::make_pair("pds_" + k.id + "_" + secret, k);
}

Result<ApiKey> KeyStore::verify(const std::string& token) {
  auto not_found = make_error(ErrorCode::not_found, "unknown API key");
  if (token.size() != 4 + kIdLen + 1 + kSecretLen || token.rfind("pds_", 0) != 0 ||
      token[4 + kIdLen] != '_')
    return not_found;
  std::string id = token.substr(4, kIdLen), secret = token.substr(5 + kIdLen);
  if (!valid_chars(id) || !valid_chars(secret)) return not_found;
  std::string presented = wire::sha256(secret);
  if (shared_) {
    std::lock_guard l(cache_mu_);
    auto it = verified_.find(id + presented);
    if (it != verified_.end() &&
        std::chrono::steady_clock::now() - it->second.second < kSharedCacheFor)
      return it->second.first;
  }
  auto rec = get_record(id);
  if (!rec) return rec.error();
  // Hash even when the id is unknown. (The store lookup still takes longer for an id that exists:
  // ids are not secret, and the 200-bit secret is compared in constant time.)
  ApiKey k;
  std::string stored(32, '\0');
  bool known = rec->has_value() && decode(id, **rec, k, stored);
  bool match = CRYPTO_memcmp(presented.data(), stored.data(), 32) == 0;
  if (!known || !match) return not_found;
  if (shared_) {
    std::lock_guard l(cache_mu_);
    if (verified_.size() > 4096) verified_.clear();  // bounded: re-verified on the next call
    verified_[id + presented] = {k, std::chrono::steady_clock::now()};
  }
  return k;
}

Result<ApiKey> KeyStore::find(const std::string& id) {
  auto not_found = make_error(ErrorCode::not_found, "no key " + id);
  if (id.size() != kIdLen || !valid_chars(id)) return not_found;
  if (shared_) {
    std::lock_guard l(cache_mu_);
    auto it = found_.find(id);
    if (it != found_.end() &&
        std::chrono::steady_clock::now() - it->second.second < kSharedCacheFor)
      return it->second.first;
  }
  auto rec = get_record(id);
  if (!rec) return rec.error();
  ApiKey k;
  std::string hash;
  if (!rec->has_value() || !decode(id, **rec, k, hash)) return not_found;
  if (shared_) {
    std::lock_guard l(cache_mu_);
    if (found_.size() > 4096) found_.clear();  // bounded: read again on the next call
    found_[id] = {k, std::chrono::steady_clock::now()};
  }
  return k;
}

Status KeyStore::revoke(const std::string& id) {
  auto rec = get_record(id);
  if (!rec) return rec.error();
  if (!rec->has_value()) return make_error(ErrorCode::not_found, "no key " + id);
  return remove_record(id);
}

Result<std::vector<ApiKey>> KeyStore::list() {
  std::vector<std::pair<std::string, std::string>> rows;  // (id, record)
  if (shared_) {
    auto kvs = shared_->list(kSharedPrefix);
    if (!kvs) return kvs.error();
    for (auto& kv : *kvs) {
      std::string id = kv.key.substr(kSharedPrefix.size());
      if (auto record = open(id, kv.value)) rows.emplace_back(id, *record);
    }
  } else {
    auto local = db_.scan("k");
    if (!local) return local.error();
    for (auto& [key, value] : *local) rows.emplace_back(key.substr(1), value);
  }
  std::vector<ApiKey> out;
  for (auto& [id, value] : rows) {
    ApiKey k;
    std::string hash;
    if (decode(id, value, k, hash)) out.push_back(k);
  }
  return out;
}

}  // namespace pandastack::storage
