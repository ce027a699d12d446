// An object store: named blobs in a bucket, over the S3 protocol (AWS S3, Ceph RGW, MinIO, R2,
// s3rver), where hibernations go to survive the loss of their host (issue 39; what is kept
// there and how: storage/snapshot_chunks.h). The interface lets unit tests use a store in memory;
// the product path has only S3Store.
//
// Configured per host: `--object-store URL` (http(s)://HOST[:PORT]/BUCKET[/PREFIX][?region=R],
// path-style requests, region us-east-1 by default; plain http only to a loopback host) and
// `--object-store-credentials FILE` (lines `access_key_id = ...` and `secret_access_key = ...`;
// `aws_`-prefixed names as in ~/.aws/credentials also read; `#` comments).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/error.h"
#include "storage/sigv4.h"

namespace pandastack::tools {
class HttpClient;
}

namespace pandastack::storage {

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // Writes `key` (replacing it).
  virtual Status put(const std::string& key, const std::string& bytes) = 0;
  // not_found when there is no `key`; invalid_argument when it is larger than `max_bytes`.
  virtual Result<std::string> get(const std::string& key, uint64_t max_bytes) = 0;
  virtual Result<bool> exists(const std::string& key) = 0;
  // Removes `key` (none is not an error).
  virtual Status remove(const std::string& key) = 0;
  // Every key starting with `prefix`, sorted.
  virtual Result<std::vector<std::string>> list(const std::string& prefix) = 0;
  // For logs and the API: where it is (no credentials).
  virtual std::string describe() const = 0;
  // This store's key prefix ("" or ending in '/').
  virtual std::string prefix() const { return ""; }
  // The same bucket, with the same credentials, under key prefix `prefix` (another host's: a
  // wake of a sandbox whose host is gone reads its hibernation there, actors/cluster.h). Null
  // when `prefix` is not valid_key_prefix, or the store cannot.
  virtual std::unique_ptr<ObjectStore> under(const std::string& prefix) const {
    (void)prefix;
    return nullptr;
  }
};

// "" or at most 256 characters ending in '/': segments of letters, digits, '-', '_' and '.',
// none empty, "." or "..".
bool valid_key_prefix(const std::string& prefix);

struct ObjectStoreConfig {
  std::string endpoint;  // http(s)://HOST[:PORT]
  std::string bucket;
  std::string prefix;  // "" or ending in '/': every key is written under it
  std::string region = "us-east-1";
  AwsCredentials credentials;
  std::string ca_file = "/etc/ssl/certs/ca-certificates.crt";  // https: whom to trust
  std::chrono::milliseconds timeout{60000};                    // per request
};

// Reads the URL and the credentials file (invalid_argument saying what is wrong).
Result<ObjectStoreConfig> parse_object_store(const std::string& url,
                                             const std::string& credentials_file);

// One keep-alive connection, requests one at a time (a mutex): the host's uploads are serial.
class S3Store : public ObjectStore {
 public:
  explicit S3Store(ObjectStoreConfig config);
  ~S3Store() override;
  Status put(const std::string& key, const std::string& bytes) override;
  Result<std::string> get(const std::string& key, uint64_t max_bytes) override;
  Result<bool> exists(const std::string& key) override;
  Status remove(const std::string& key) override;
  Result<std::vector<std::string>> list(const std::string& prefix) override;
  std::string describe() const override;
  std::string prefix() const override { return config_.prefix; }
  std::unique_ptr<ObjectStore> under(const std::string& prefix) const override;

 private:
  struct Answer;
  Answer call(const std::string& method, const std::string& key,
              const std::vector<std::pair<std::string, std::string>>& query,
              const std::string& body, uint64_t max_bytes);

  ObjectStoreConfig config_;
  std::mutex mu_;
  std::unique_ptr<tools::HttpClient> http_;
};

}  // namespace pandastack::storage
