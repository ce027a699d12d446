#include "actors/cluster.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "actors/custom_template.h"
#include "actors/runtime_ids.h"
#include "storage/object_store.h"
#include "storage/record_mac.h"
#include "storage/snapshot_chunks.h"

namespace pandastack::actors {

using namespace std::chrono;
using storage::ErrorCode;
using storage::make_error;
using wire::Json;

namespace {

const std::string kHosts = "/pandastack/hosts/";
const std::string kOwners = "/pandastack/owners/";
const std::string kMembers = "/pandastack/members/";
const std::string kParked = "/pandastack/parked/";
constexpr const char* kParkedRecord = "pandastack parked hibernation v1";
constexpr auto kCacheFor = milliseconds(1000);

int64_t now_ms() {
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::optional<HostInfo> parse_host(const std::string& text) {
  auto j = Json::parse(text);
  if (!j || !j->is_object() || !(*j)["id"].is_string()) return std::nullopt;
  HostInfo h;
  h.id = (*j)["id"].as_string();
  h.peer = (*j)["peer"].is_string() ? (*j)["peer"].as_string() : "";
  h.url = (*j)["url"].is_string() ? (*j)["url"].as_string() : "";
  h.accel = (*j)["accel"].is_string() ? (*j)["accel"].as_string() : "";
  h.free_mib = uint64_t((*j)["free_mib"].as_int());
  h.total_mib = uint64_t((*j)["total_mib"].as_int());
  h.sandboxes = uint32_t((*j)["sandboxes"].as_int());
  h.draining = (*j)["draining"].is_bool() && (*j)["draining"].as_bool();
  h.started_ms = (*j)["started_ms"].as_int();
  h.updated_ms = (*j)["updated_ms"].as_int();
  if ((*j)["templates"].is_array())
    for (auto& t : (*j)["templates"].as_array())
      if (t.is_string()) h.templates.push_back(t.as_string());
  return h;
}

}  // namespace

Json HostInfo::json() const {
  Json j = Json::object();
  j.set("id", id);
  j.set("peer", peer);
  j.set("url", url);
  j.set("accel", accel);
  j.set("free_mib", free_mib);
  j.set("total_mib", total_mib);
  j.set("sandboxes", uint64_t(sandboxes));
  j.set("draining", draining);
  Json ts = Json::array();
  for (auto& t : templates) ts.push(t);
  j.set("templates", ts);
  j.set("started_ms", started_ms);
  j.set("updated_ms", updated_ms);
  return j;
}

std::optional<tools::TlsFiles> etcd_tls(const ClusterConfig& c) {
  if (!c.tls) return std::nullopt;
  return c.tls->etcd_files();
}

Cluster::Cluster(ClusterConfig config, Capacity capacity)
    : config_(std::move(config)),
      capacity_(std::move(capacity)),
      etcd_(std::make_unique<storage::Etcd>(config_.etcd, etcd_tls(config_))),
      reader_(std::make_unique<storage::Etcd>(config_.etcd, etcd_tls(config_))),
      started_ms_(now_ms()) {}

storage::Result<std::unique_ptr<Cluster>> Cluster::join(ClusterConfig config, Capacity capacity) {
  std::unique_ptr<Cluster> c(new Cluster(std::move(config), std::move(capacity)));
  if (!c->etcd_->valid())
    return make_error(ErrorCode::invalid_argument,
                      "--cluster " + c->config_.etcd + ": " + c->etcd_->setup_error());
  // Another live host with this id: refuse (two daemons would answer for one host's ids).
  auto other = c->etcd_->get(kHosts + c->config_.host_id);
  if (!other) return other.error();
  if (other->has_value()) {
    auto h = parse_host((*other)->value);
    if (h && h->peer != c->config_.peer)
      return make_error(ErrorCode::conflict,
                        "host id " + c->config_.host_id + " is held by a live host at " + h->peer +
                            " (its lease expires within " +
                            std::to_string(c->config_.lease_ttl.count()) + " s of it stopping)");
  }
  if (auto m = c->etcd_->put(kMembers + c->config_.host_id, c->config_.peer); !m) return m.error();
  auto lease = c->etcd_->grant(c->config_.lease_ttl);
  if (!lease) return lease.error();
  c->lease_ = *lease;
  auto put = c->publish(*c->etcd_);
  if (!put) return put.error();
  c->thread_ = std::thread([p = c.get()] { p->keepalive_loop(); });
  spdlog::info("cluster: host {} joined through {} (lease {} s, peers at {})", c->config_.host_id,
               c->config_.etcd, c->config_.lease_ttl.count(), c->config_.peer);
  return c;
}

Cluster::~Cluster() { leave(); }

void Cluster::leave() {
  {
    std::lock_guard l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (int64_t lease = lease_.exchange(0); lease != 0) {
    if (auto r = etcd_->revoke(lease); !r)
      spdlog::warn("cluster: cannot revoke the lease: {}", r.error().message);
    else
      spdlog::info("cluster: host {} left", config_.host_id);
  }
}

storage::Status Cluster::publish(storage::Etcd& etcd) {
  HostInfo h = capacity_ ? capacity_() : HostInfo{};
  h.draining = draining_;
  h.id = config_.host_id;
  h.peer = config_.peer;
  h.url = config_.url;
  h.started_ms = started_ms_;
  h.updated_ms = now_ms();
  return etcd.put(kHosts + config_.host_id, h.json().dump(), lease_);
}

void Cluster::keepalive_loop() {
  // A third of the TTL between keepalives: two may fail before the lease expires.
  auto every = duration_cast<milliseconds>(config_.lease_ttl) / 3;
  bool member = true;  // (false from a lost lease until a new one is published)
  for (;;) {
    {
      std::unique_lock l(mu_);
      if (cv_.wait_for(l, every, [this] { return stopping_; })) return;
    }
    auto ttl = etcd_->keepalive(lease_);
    if (ttl && *ttl > 0) {
      if (!member) spdlog::info("cluster: host {} is a member again", config_.host_id);
      member = true;
      if (auto p = publish(*etcd_); !p)
        spdlog::warn("cluster: cannot publish this host: {}", p.error().message);
      continue;
    }
    if (!ttl) {
      spdlog::warn("cluster: lease keepalive failed: {}", ttl.error().message);
      continue;  // etcd away: the lease may still be current when it is back
    }
    // The lease expired (etcd was away longer than the TTL, or restarted without it): a new one.
    member = false;
    auto lease = etcd_->grant(config_.lease_ttl);
    if (!lease) {
      spdlog::warn("cluster: cannot grant a new lease: {}", lease.error().message);
      continue;
    }
    lease_ = *lease;
    if (auto p = publish(*etcd_); p) {
      member = true;
      spdlog::info("cluster: host {} rejoined with a new lease", config_.host_id);
    }
  }
}

storage::Result<std::vector<HostInfo>> Cluster::hosts() {
  auto rows = reader_->list(kHosts);
  if (!rows) return rows.error();
  std::vector<HostInfo> out;
  for (auto& kv : *rows)
    if (auto h = parse_host(kv.value)) {
      h->self = h->id == config_.host_id;
      out.push_back(std::move(*h));
    }
  std::lock_guard l(cache_mu_);
  hosts_cache_.clear();
  for (auto& h : out) hosts_cache_[h.id] = h;
  hosts_at_ = steady_clock::now();
  return out;
}

storage::Result<std::map<std::string, std::string>> Cluster::members() {
  auto rows = reader_->list(kMembers);
  if (!rows) return rows.error();
  std::map<std::string, std::string> out;
  for (auto& kv : *rows) out[kv.key.substr(kMembers.size())] = kv.value;
  return out;
}

Owner Cluster::owner(const std::string& id, bool fresh) {
  auto now = steady_clock::now();
  {
    std::lock_guard l(cache_mu_);
    auto it = owners_.find(id);
    if (!fresh && it != owners_.end() && now - it->second.at < kCacheFor &&
        (it->second.owner.kind == Owner::Kind::self || now - hosts_at_ < kCacheFor))
      return it->second.owner;
  }
  Owner o;
  auto rec = reader_->get(kOwners + id);
  if (!rec) {
    o.kind = Owner::Kind::error;
    o.message = rec.error().message;
    return o;
  }
  if (!rec->has_value()) {
    o.kind = Owner::Kind::unknown;
    return o;  // (not cached: a create may record it in a moment)
  }
  o.host = (*rec)->value;
  if (o.host == config_.host_id) {
    o.kind = Owner::Kind::self;
  } else {
    bool stale;
    {
      std::lock_guard l(cache_mu_);
      stale = now - hosts_at_ >= kCacheFor;
    }
    if (stale) {
      auto hs = hosts();
      if (!hs) {
        o.kind = Owner::Kind::error;
        o.message = hs.error().message;
        return o;
      }
    }
    std::lock_guard l(cache_mu_);
    auto h = hosts_cache_.find(o.host);
    if (h == hosts_cache_.end()) {
      o.kind = Owner::Kind::down;
    } else {
      o.kind = Owner::Kind::peer;
      o.peer = h->second.peer;
    }
  }
  remember(id, o, now);
  return o;
}

void Cluster::remember(const std::string& id, const Owner& owner, steady_clock::time_point at) {
  std::lock_guard l(cache_mu_);
  if (owners_.size() >= kMaxCachedOwners) owners_.clear();  // bounded: looked up again
  owners_[id] = Cached{owner, at};
}

storage::Result<bool> Cluster::claim(const std::string& id) {
  std::optional<storage::EtcdKv> current;
  auto r = reader_->create(kOwners + id, config_.host_id, 0, &current);
  if (!r) return r.error();
  if (!*r && current && current->value == config_.host_id) return true;  // ours already
  if (*r) remember(id, Owner{Owner::Kind::self, config_.host_id, "", ""}, steady_clock::now());
  return *r;
}

namespace {
// The record of `p` as host `host` parked it, sealed with `key`.
std::string sealed_parked(const Parked& p, const std::string& host, const std::string& key) {
  Json j = Json::object();
  j.set("tenant", p.tenant);
  j.set("host", host);
  j.set("prefix", p.prefix);
  j.set("manifest", p.manifest);
  j.set("settings", p.settings);
  return storage::seal_record(key, kParkedRecord, p.id, j.dump());
}
}  // namespace

std::string down_message(const std::string& host) {
  return "host " + host +
         " owns this and is down (its lease expired); it answers again once it is back";
}

bool valid_host_id(const std::string& h) {
  if (h.empty() || h.size() > 64) return false;
  for (char c : h)
    if (!(std::isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

std::string Cluster::records_key() const {
  return config_.tls ? config_.tls->records_key : std::string();
}

storage::Status Cluster::park(const Parked& p) {
  return reader_->put(kParked + p.id, sealed_parked(p, config_.host_id, records_key()));
}

storage::Result<std::optional<Parked>> Cluster::parked(const std::string& id) {
  if (!runtime_id(id, "sbx_") && !runtime_id(id, "snap_")) return std::optional<Parked>();
  auto kv = reader_->get(kParked + id);
  if (!kv) return kv.error();
  if (!kv->has_value()) return std::optional<Parked>();
  auto record = storage::open_record(records_key(), kParkedRecord, id, (*kv)->value);
  auto j = record ? Json::parse(*record) : std::nullopt;
  Parked p;
  p.id = id;
  p.mod_revision = (*kv)->mod_revision;
  std::string why;
  if (!record)
    why = "it does not carry the cluster's MAC";
  else if (!j || !j->is_object() || !(*j)["tenant"].is_string() || !(*j)["host"].is_string() ||
           !(*j)["prefix"].is_string() || !(*j)["manifest"].is_string() ||
           !(*j)["settings"].is_object())
    why = "it is not a parked record";
  if (why.empty()) {
    p.tenant = (*j)["tenant"].as_string();
    p.host = (*j)["host"].as_string();
    p.prefix = (*j)["prefix"].as_string();
    p.manifest = (*j)["manifest"].as_string();
    p.settings = (*j)["settings"];
    if (p.tenant.empty() || p.tenant.size() > 256 || !valid_host_id(p.host) ||
        !storage::valid_key_prefix(p.prefix) || !storage::manifest_key(p.manifest))
      why = "a field is not what a host writes";
  }
  if (!why.empty()) {
    spdlog::warn("cluster: the parked record of {} is ignored: {}", id, why);
    return std::optional<Parked>();
  }
  return std::optional<Parked>(std::move(p));
}

storage::Status Cluster::unpark(const std::string& id, const std::string& manifest) {
  auto p = parked(id);
  if (!p) return p.error();
  if (!*p || (*p)->manifest != manifest || (*p)->host != config_.host_id) return storage::Ok{};
  auto gone = reader_->replace(
      {{kParked + id, "", (*p)->mod_revision, storage::Etcd::Replacement::Op::erase}});
  if (!gone) return gone.error();
  return storage::Ok{};  // (false: replaced meanwhile by a newer record, which stays)
}

storage::Result<bool> Cluster::adopt(const Parked& p) {
  auto owner = reader_->get(kOwners + p.id);
  if (!owner) return owner.error();
  if (!*owner || (*owner)->value != p.host) return false;
  using Op = storage::Etcd::Replacement::Op;
  auto took = reader_->replace({{kOwners + p.id, config_.host_id, (*owner)->mod_revision},
                                {kParked + p.id, "", p.mod_revision, Op::erase},
                                {kHosts + p.host, "", 0, Op::check}});
  if (!took) return took.error();
  if (*took) remember(p.id, Owner{Owner::Kind::self, config_.host_id, "", ""}, steady_clock::now());
  return *took;
}

storage::Status Cluster::unadopt(const Parked& p) {
  auto owner = reader_->get(kOwners + p.id);
  if (!owner) return owner.error();
  if (!*owner || (*owner)->value != config_.host_id)
    return make_error(ErrorCode::conflict, p.id + " is not this host's any more");
  auto back = reader_->replace({{kOwners + p.id, p.host, (*owner)->mod_revision},
                                {kParked + p.id, sealed_parked(p, p.host, records_key()), 0}});
  if (!back) return back.error();
  {
    std::lock_guard l(cache_mu_);
    owners_.erase(p.id);
  }
  if (!*back) return make_error(ErrorCode::conflict, p.id + ": its records moved meanwhile");
  return storage::Ok{};
}

storage::Status Cluster::set_draining(bool draining) {
  draining_ = draining;
  {
    std::lock_guard l(cache_mu_);
    hosts_at_ = {};  // (this host's own view changes at once)
  }
  return publish(*reader_);
}

storage::Result<bool> Cluster::hand_over(const std::vector<std::string>& ids,
                                         const std::string& to) {
  std::vector<storage::Etcd::Replacement> all;
  for (auto& id : ids) {
    auto current = reader_->get(kOwners + id);
    if (!current) return current.error();
    if (!*current || (*current)->value != config_.host_id) return false;
    all.push_back({kOwners + id, to, (*current)->mod_revision});
  }
  auto moved = reader_->replace(all);
  if (!moved) return moved.error();
  std::lock_guard l(cache_mu_);
  for (auto& id : ids) owners_.erase(id);
  return *moved;
}

storage::Result<HostInfo> Cluster::place(const std::string& template_name,
                                         const std::string& pinned) {
  auto hs = hosts();
  if (!hs) return hs.error();
  if (!pinned.empty()) {
    for (auto& h : *hs)
      if (h.id == pinned) {
        if (h.draining) return make_error(ErrorCode::conflict, "host " + pinned + " is draining");
        return h;
      }
    return make_error(ErrorCode::not_found, "no live host " + pinned);
  }
  hs->erase(std::remove_if(hs->begin(), hs->end(), [](const HostInfo& h) { return h.draining; }),
            hs->end());
  if (hs->empty())
    return make_error(ErrorCode::not_found, "no live host in the cluster that is not draining");
  // A tenant's own template (its id: `<name>.<tenant hash>`) is on the hosts that built or
  // published it, and only there; one no live host has is the shipped template of that name
  // (a custom template may not take a shipped one's name).
  auto lists = [](const HostInfo& h, const std::string& t) {
    return std::find(h.templates.begin(), h.templates.end(), t) != h.templates.end();
  };
  std::string wanted = template_name;
  if (auto dot = wanted.find('.');
      dot != std::string::npos &&
      std::none_of(hs->begin(), hs->end(), [&](const HostInfo& h) { return lists(h, wanted); }))
    wanted = wanted.substr(0, dot);
  // A baked template saves a bake (seconds); then the most free memory per sandbox it runs
  // (hosts sharing a machine report the same free memory); equals are drawn at random.
  auto score = [&](const HostInfo& h) {
    return std::make_pair(lists(h, wanted) ? 1 : 0, h.free_mib / (uint64_t(h.sandboxes) + 1));
  };
  std::vector<const HostInfo*> best;
  for (auto& h : *hs) {
    if (!best.empty() && score(h) < score(*best[0])) continue;
    if (!best.empty() && score(*best[0]) < score(h)) best.clear();
    best.push_back(&h);
  }
  thread_local std::mt19937 rng{std::random_device{}()};
  return *best[std::uniform_int_distribution<size_t>(0, best.size() - 1)(rng)];
}

std::string placement_name(const std::string& tenant, const std::string& name) {
  return !tenant.empty() && valid_template_name(name) ? template_id(tenant, name) : name;
}

}  // namespace pandastack::actors
