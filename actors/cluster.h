// This host's membership of a cluster coordinated by etcd (storage/etcd.h), and what the cluster
// knows: which hosts are up (each holds a lease under which its record lives), and which host
// owns each sandbox, snapshot, volume and database (a record per id, written once with a
// create-if-absent transaction, so an id is never owned twice).
//
// etcd holds only that: membership, ownership and the shared API keys. Every sandbox's events stay
// in its owner's RocksDB stream. A host whose lease expired (it died, or lost etcd for longer than
// the TTL) is down: its records stay, and requests for its ids answer host_unavailable until it
// comes back, grants a new lease and republishes itself.
//
// Layout under /pandastack/: hosts/<host id> (JSON, under the host's lease), members/<host id>
// (its peer address, kept), owners/<id> (the owner's host id), keys/<key id> (storage/api_keys.h),
// parked/<sandbox id> (Parked: a hibernation another host can wake from the object store).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/cluster_tls.h"
#include "storage/etcd.h"
#include "wire/json.h"

namespace pandastack::actors {

struct ClusterConfig {
  std::string etcd;     // https://HOST:PORT (http:// only for an insecure cluster)
  std::string host_id;  // [A-Za-z0-9._-]{1,64}
  std::string peer;     // HOST:PORT where this host serves its peers (Cap'n Proto)
  std::string url;      // this host's REST URL (shown in GET /v1/hosts)
  std::chrono::seconds lease_ttl{5};
  // The host's credentials; none only for an --insecure-cluster (plain etcd, a shared secret).
  std::optional<ClusterTls> tls;
};

struct HostInfo {
  std::string id, peer, url, accel;
  bool self = false;
  uint64_t free_mib = 0, total_mib = 0;
  uint32_t sandboxes = 0;
  bool draining = false;               // being drained: placement passes it by
  std::vector<std::string> templates;  // baked here
  int64_t started_ms = 0, updated_ms = 0;
  wire::Json json() const;
};

// Where a request for an id goes.
struct Owner {
  enum class Kind { self, peer, down, unknown, error } kind = Kind::unknown;
  std::string host;     // the owner's id (peer, down)
  std::string peer;     // its peer address (peer)
  std::string message;  // (error)
};

// A hibernated sandbox whose hibernation is in the object store, as its owner recorded it for
// the day its host is gone (issue 39, wake anywhere): another host with the same bucket fetches
// it from the owner's prefix, starts it, and takes it over (Cluster::adopt). Written once the
// manifest is in the store, removed when that copy is spent (woken, ended, moved); sealed with
// the cluster's records key (storage/record_mac.h), every field checked when read. A named
// snapshot in the store is parked likewise (`id` a snapshot id, `settings` its sandbox's): while
// its host is down another host creates sandboxes from it (Runtime::create_from_parked).
struct Parked {
  std::string id, tenant;
  std::string host;      // the owner that parked it
  std::string prefix;    // the owner's key prefix in the bucket (storage::ObjectStore::prefix)
  std::string manifest;  // "manifests/<hex>" under that prefix
  wire::Json settings = wire::Json::object();  // how it was made (actors/parked.h)
  int64_t mod_revision = 0;                    // (as read) the record's revision
};

// What a request for an id whose owner `host` is down is answered (with host_unavailable).
std::string down_message(const std::string& host);

// A host id: 1-64 of [A-Za-z0-9._-] (--host-id, and what a parked record names).
bool valid_host_id(const std::string& host);

// What this host's etcd client presents and trusts (none: an insecure cluster).
std::optional<tools::TlsFiles> etcd_tls(const ClusterConfig& c);

class Cluster {
 public:
  // What this host publishes: free and total RAM, running sandboxes, baked templates, accelerator.
  using Capacity = std::function<HostInfo()>;

  // Connects, grants the lease and publishes this host; fails when etcd cannot be reached or
  // another live host has this host id.
  static storage::Result<std::unique_ptr<Cluster>> join(ClusterConfig config, Capacity capacity);
  ~Cluster();  // leave()
  // Stops the keepalive and revokes the lease: the host is down for the others at once.
  void leave();

  const ClusterConfig& config() const { return config_; }

  // The live hosts (self included), by id.
  storage::Result<std::vector<HostInfo>> hosts();
  // Every host that ever joined (id -> peer address): the hosts() not among them are down.
  storage::Result<std::map<std::string, std::string>> members();
  // The owner of `id` (cached for a second, at most kMaxCachedOwners ids; `fresh`: asked of
  // etcd whatever the cache holds).
  Owner owner(const std::string& id, bool fresh = false);
  // Records this host as the owner of `id`: false when another host owns it.
  storage::Result<bool> claim(const std::string& id);
  // Moves the ownership of `ids` (a sandbox and its volumes) from this host to host `to` in one
  // compare-and-swap transaction (a migration): all move, or none; false when this host does
  // not own one of them (any more).
  storage::Result<bool> hand_over(const std::vector<std::string>& ids, const std::string& to);
  // The host a create goes to: `pinned` when named (it must be up), else the live host with the
  // most free memory, preferring hosts that have `template_name` baked. A custom template's id
  // (placement_name) goes to a host that has it; one no live host has is taken for the shipped
  // template of its name. Empty on error.
  storage::Result<HostInfo> place(const std::string& template_name, const std::string& pinned);
  // Parked hibernations and snapshots (Parked). park: writes this host's record of `p` (p.host
  // is this host). unpark: removes the record of `id` if it still names `manifest`. parked: the
  // record of `id` (a sandbox or snapshot id), none when there is none or it does not verify
  // (logged).
  storage::Status park(const Parked& p);
  storage::Status unpark(const std::string& id, const std::string& manifest);
  storage::Result<std::optional<Parked>> parked(const std::string& id);
  // Takes parked sandbox `p` over, in one transaction: only while its owner's host is down (no
  // hosts/ record: its lease expired), the owner record still names p.host and the parked
  // record is still p, the owner becomes this host and the parked record goes. False when any
  // of that moved (the host came back, another host took it).
  storage::Result<bool> adopt(const Parked& p);
  // Undoes adopt() for a wake that failed after it: the owner is p.host again, the record back.
  storage::Status unadopt(const Parked& p);

  // A draining host is passed by when placing creates (its sandboxes are being moved off it).
  storage::Status set_draining(bool draining);
  bool draining() const { return draining_; }

 private:
  Cluster(ClusterConfig config, Capacity capacity);
  storage::Status publish(storage::Etcd& etcd);
  std::string records_key() const;  // "" for an insecure cluster
  void keepalive_loop();
  void remember(const std::string& id, const Owner& owner,
                std::chrono::steady_clock::time_point at);

  ClusterConfig config_;
  Capacity capacity_;
  std::unique_ptr<storage::Etcd> etcd_;    // the keepalive thread's
  std::unique_ptr<storage::Etcd> reader_;  // requests'
  std::atomic<int64_t> lease_{0};
  std::atomic<bool> draining_{false};
  int64_t started_ms_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;

  struct Cached {
    Owner owner;
    std::chrono::steady_clock::time_point at;
  };
  std::mutex cache_mu_;
  static constexpr size_t kMaxCachedOwners = 4096;
  std::map<std::string, Cached> owners_;
  std::map<std::string, HostInfo> hosts_cache_;
  std::chrono::steady_clock::time_point hosts_at_{};
};

// What Cluster::place knows `tenant`'s create naming template `name` by: the id its own
// template of that name would have (hosts list the ready ones they hold), else `name`.
std::string placement_name(const std::string& tenant, const std::string& name);

}  // namespace pandastack::actors
