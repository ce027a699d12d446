// A client of etcd's v3 API through its JSON gateway (POST /v3/kv/..., /v3/lease/...; keys and
// values travel base64). The cluster's coordination store: membership leases, ownership records,
// shared API keys. Blocking calls over one keep-alive HTTP/1.1 connection, serialized by a mutex;
// every call has a deadline (etcd answers on loopback or a LAN in milliseconds).
//
// Why the JSON gateway and not gRPC: the gateway is part of every etcd v3 server (3.4 in Debian),
// needs no generated code or extra library (Debian's libgrpc++ would add a second RPC stack next
// to Cap'n Proto), and the calls here are few and small. Watches are not used: the cluster polls.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "storage/error.h"
#include "tools/http_client.h"
#include "wire/json.h"

namespace pandastack::storage {

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, lease = 0;
};

class Etcd {
 public:
  // `endpoint`: https://HOST:PORT of one etcd member, with `tls` (the cluster CA and this
  // host's certificate, which etcd's --client-cert-auth checks), or http://HOST:PORT (only with
  // --insecure-cluster).
  explicit Etcd(const std::string& endpoint, std::optional<tools::TlsFiles> tls = std::nullopt,
                std::chrono::milliseconds timeout = std::chrono::seconds(3));
  // Why the client cannot be used (a bad URL, unreadable TLS files), or "".
  const std::string& setup_error() const;
  ~Etcd();
  bool valid() const;

  // Leases: grant returns the lease id; keepalive the TTL left (0: the lease has expired).
  Result<int64_t> grant(std::chrono::seconds ttl);
  Result<int64_t> keepalive(int64_t lease);
  Status revoke(int64_t lease);

  Status put(const std::string& key, const std::string& value, int64_t lease = 0);
  Result<std::optional<EtcdKv>> get(const std::string& key);
  // Every key that starts with `prefix`, in key order (at most `limit`, 0: all).
  Result<std::vector<EtcdKv>> list(const std::string& prefix, int64_t limit = 0);
  Status erase(const std::string& key);
  // A transaction: writes `value` only if `key` does not exist. False (and the current value in
  // `*current` when given) when it exists.
  Result<bool> create(const std::string& key, const std::string& value, int64_t lease = 0,
                      std::optional<EtcdKv>* current = nullptr);
  // A transaction: writes `value` only if `key`'s mod revision is still `mod_revision`.
  Result<bool> replace(const std::string& key, const std::string& value, int64_t mod_revision);
  // One transaction over several keys: all are written, or none (a revision moved). Each key's
  // mod revision must still be `mod_revision` (0: the key must not exist); then it is written
  // (put), deleted (erase) or only compared (check).
  struct Replacement {
    std::string key, value;
    int64_t mod_revision = 0;
    enum class Op { put, erase, check } op = Op::put;
  };
  Result<bool> replace(const std::vector<Replacement>& all);

 private:
  // POSTs `request` to the gateway; its JSON answer (`first_line`: of a streamed answer).
  Result<wire::Json> call(const std::string& path, const wire::Json& request,
                          bool first_line = false);
  // Comparisons (all must hold), the operations on success, optionally those on failure.
  Result<wire::Json> txn(wire::Json::Array compare, wire::Json::Array success,
                         std::optional<wire::Json::Array> failure);

  std::string endpoint_;
  std::mutex mu_;
  std::unique_ptr<tools::HttpClient> http_;
};

// The end of a key range covering every key with `prefix` (etcd's range_end convention).
std::string etcd_prefix_end(const std::string& prefix);

}  // namespace pandastack::storage
