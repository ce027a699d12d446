// GCC 12's false -Wmaybe-uninitialized in kj's ExceptionOr<T> fulfilled across threads (see
// rpc.cc), silenced for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "gateway/peer_snapshots.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "actors/cluster.h"
#include "actors/parked.h"
#include "gateway/api_types.h"
#include "gateway/peers.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace wc = pandastack::wire::cluster;

namespace {

// A snapshot travels in writes of at most this (each a streaming call: flow-controlled).
constexpr size_t kSnapshotChunk = 1 << 20;
// A peer that stops answering a session's call for this long has failed it.
constexpr auto kPeerCallTimeout = 120 * kj::SECONDS;

// An id a host makes ("imp_", "sbx_", "vol_", "vsnap_" + 16 base32 characters): a peer's ids
// become folder names, file names and stream keys here, so nothing else is taken.
bool valid_id(const std::string& id, const std::string& prefix) {
  if (id.size() != prefix.size() + 16 || id.rfind(prefix, 0) != 0) return false;
  for (size_t i = prefix.size(); i < id.size(); ++i)
    if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9'))) return false;
  return true;
}

// The volumes of a start (StartRequest.volumes) into `ir`: a migration's arrivals, or a fork's
// parent volumes. Why not, or "".
std::string volumes_of(const Json& list, bool migrated, actors::ImportRequest& ir) {
  if (!list.is_array()) return "volumes: not a JSON array";
  if (list.size() > actors::kVolumeSlots) return "volumes: more than a sandbox has";
  auto str = [](const Json& j, const char* k) {
    return j[k].is_string() ? j[k].as_string() : std::string();
  };
  auto num = [](const Json& j, const char* k) { return j[k].is_integer() ? j[k].as_int() : -1; };
  for (auto& v : list.as_array()) {
    if (!v.is_object()) return "volumes: not objects";
    int64_t slot = num(v, "slot");
    if (slot < 0 || slot >= int64_t(actors::kVolumeSlots)) return "volumes: a bad slot";
    bool ro = v["read_only"].is_bool() && v["read_only"].as_bool();
    std::string mount = str(v, "mount");
    if (auto bad = actors::check_mount_path(mount)) return "volumes: " + bad->message;
    if (!migrated) {
      // (the parent's id names the copies' origin; read-only volumes stay on their host)
      std::string id = str(v, "volume");
      if (!valid_id(id, "vol_") || ro) return "volumes: a fork's are its parent's read-write ones";
      ir.fork_volumes.push_back({id, mount, false, uint32_t(slot)});
      continue;
    }
    actors::VolumeArrival a;
    a.mount = mount;
    a.read_only = ro;
    a.slot = uint32_t(slot);
    auto& vi = a.volume;
    vi.id = str(v, "id");
    if (!valid_id(vi.id, "vol_")) return "volumes: not a volume id: " + vi.id;
    vi.tenant = ir.create.tenant;
    vi.name = str(v, "name");
    vi.origin = str(v, "origin");
    if (num(v, "size_mib") <= 0) return "volumes: a bad size";
    vi.size_mib = uint64_t(num(v, "size_mib"));
    vi.created_at_ms = std::max<int64_t>(0, num(v, "created_at_ms"));
    if (v["metadata"].is_object())
      for (auto& [k, x] : v["metadata"].as_object())
        if (x.is_string()) vi.metadata[k] = x.as_string();
    if (v["snapshots"].is_array())
      for (auto& sn : v["snapshots"].as_array()) {
        if (!sn.is_object() || !valid_id(str(sn, "id"), "vsnap_") || num(sn, "size_mib") <= 0)
          return "volumes: a bad volume snapshot";
        vi.snapshots.push_back({str(sn, "id"), uint64_t(num(sn, "size_mib")),
                                std::max<int64_t>(0, num(sn, "created_at_ms"))});
      }
    ir.arrivals.push_back(std::move(a));
  }
  return "";
}

class SinkImpl final : public wc::SnapshotSink::Server {
 public:
  SinkImpl(gateway::Server& s, std::shared_ptr<PeerScope> scope,
           std::shared_ptr<actors::SnapshotIntake> intake, std::string tenant)
      : server_(s),
        scope_(std::move(scope)),
        intake_(std::move(intake)),
        id_(intake_->id()),
        tenant_(std::move(tenant)) {}
  ~SinkImpl() {
    if (!committed_) spdlog::info("cluster: snapshot {} not committed by its sender: removed", id_);
  }
  kj::Promise<void> write(WriteContext ctx) override {
    auto p = ctx.getParams();
    auto d = p.getData();
    auto st = intake_->write(p.getFile(), p.getOffset(), d.begin(), d.size());
    if (!st) return KJ_EXCEPTION(FAILED, st.error().message);
    return kj::READY_NOW;
  }
  kj::Promise<void> commit(CommitContext ctx) override {
    auto intake = intake_;
    // Hashing the received layers reads them: on a worker, not on the loop.
    using Committed = std::shared_ptr<actors::Reply<Ok>>;
    return server_
        .offload<Committed>(
            [intake]() { return std::make_shared<actors::Reply<Ok>>(intake->commit()); }, nullptr)
        .then([this, ctx](Committed c) mutable -> kj::Promise<void> {
          if (!c) return KJ_EXCEPTION(OVERLOADED, "the host is busy");
          if (!*c) return KJ_EXCEPTION(FAILED, c->error().message);
          committed_ = true;
          {
            // Only a start on this connection, for this tenant, may use it.
            std::lock_guard lock(scope_->mu);
            scope_->received[id_] = tenant_;
          }
          spdlog::info("cluster: received snapshot {} of tenant {} from host {} ({} bytes)", id_,
                       tenant_, scope_->host, intake_->bytes_received());
          ctx.getResults().setSnapshot(id_);
          return kj::READY_NOW;
        });
  }

 private:
  gateway::Server& server_;
  std::shared_ptr<PeerScope> scope_;
  std::shared_ptr<actors::SnapshotIntake> intake_;
  std::string id_, tenant_;
  bool committed_ = false;
};

actors::CreateRequest settings_of(const std::string& tenant, const Json& j) {
  actors::CreateRequest c;
  c.tenant = tenant;
  actors::settings_from_json(j, c);
  if (j["ttl_seconds"].is_integer()) c.ttl_seconds = uint32_t(j["ttl_seconds"].as_int());
  if (*c.network && j["egress"].is_object()) c.egress = egress_from(j["egress"]);
  return c;
}

Json error_json(const actors::Rejection& r) {
  Json e = Json::object();
  e.set("code", to_string(r.code));
  e.set("message", r.message);
  return e;
}

}  // namespace

PeerScope::~PeerScope() {
  // Received and never started (the sender went away): nothing of it stays.
  for (auto& [id, tenant] : received) {
    spdlog::info("cluster: snapshot {} of tenant {} from host {} was never started: removed", id,
                 tenant, host);
    rt.discard_import(id);
  }
}

std::string peer_may_act(actors::Runtime& rt, const std::string& key, const std::string& tenant) {
  if (tenant.empty()) return "no tenant named";
  auto k = rt.authenticate(key);
  if (!k) return "the API key of the request does not verify here";
  if (!k->admin && k->tenant != tenant) return "the API key is not tenant " + tenant + "'s";
  return "";
}

kj::Promise<void> receive_snapshot(
    Server& server, std::shared_ptr<PeerScope> scope,
    capnp::CallContext<wc::Peer::ReceiveSnapshotParams, wc::Peer::ReceiveSnapshotResults> ctx) {
  auto params = ctx.getParams();
  std::string tenant = params.getTenant(), key = params.getApiKey();
  auto& rt = server.rt;
  // Nothing is written before the peer shows it acts for the tenant (a key it was given).
  return server
      .offload<std::string>([&rt, key, tenant] { return peer_may_act(rt, key, tenant); },
                            "the host is busy")
      .then([&server, scope, tenant, ctx](std::string refused) mutable -> kj::Promise<void> {
        if (!refused.empty()) {
          spdlog::warn("cluster: a snapshot from host {} refused: {}", scope->host, refused);
          return KJ_EXCEPTION(FAILED, "snapshot refused: " + refused);
        }
        auto o = ctx.getParams().getOffer();
        auto meta = Json::parse(o.getMeta().cStr());
        if (!meta) return KJ_EXCEPTION(FAILED, "snapshot offer refused: its metadata is not JSON");
        actors::SnapshotOffer offer;
        offer.meta = *meta;
        for (auto f : o.getFiles())
          offer.files.push_back({f.getName().cStr(), f.getSize(), f.getSha256().cStr()});
        auto r = server.rt.receive_snapshot(tenant, offer);
        if (!r) return KJ_EXCEPTION(FAILED, r.error().message);
        std::shared_ptr<actors::SnapshotIntake> intake(std::move(*r));
        auto res = ctx.getResults();
        auto missing = res.initMissing(uint(intake->missing().size()));
        for (size_t i = 0; i < intake->missing().size(); ++i)
          missing.set(uint(i), intake->missing()[i]);
        res.setSink(kj::heap<SinkImpl>(server, scope, std::move(intake), tenant));
        return kj::READY_NOW;
      });
}

kj::Promise<void> start_from_snapshot(
    Server& server, std::shared_ptr<PeerScope> scope,
    capnp::CallContext<wc::Peer::StartParams, wc::Peer::StartResults> ctx) {
  auto p = ctx.getParams().getRequest();
  actors::ImportRequest ir;
  ir.from_host = scope->host;
  ir.snapshot_id = p.getSnapshot();
  ir.parent = p.getParent();
  auto settings = Json::parse(p.getSettings().cStr());
  bool migrated = p.getMigrated();
  std::string tenant = p.getTenant(), key = p.getApiKey();
  std::string refused;
  if (!valid_id(ir.snapshot_id, "imp_")) refused = "not a received snapshot's id";
  if (!settings || !settings->is_object()) refused = "the settings are not a JSON object";
  if (p.getIds().size() == 0 || p.getIds().size() > server.rt.config().limits.max_fork_children)
    refused = "a start names 1.." + std::to_string(server.rt.config().limits.max_fork_children) +
              " sandboxes";
  if (migrated != ir.parent.empty() || (!migrated && !valid_id(ir.parent, "sbx_")))
    refused = "a fork names its parent, a migration none";
  for (auto id : p.getIds()) {
    std::string s = id;
    if (!s.empty() && !valid_id(s, "sbx_")) refused = "not a sandbox id: " + s;
    if (s.empty() == migrated) refused = "a migration names its sandbox, a fork's children none";
    ir.ids.push_back(s);
  }
  if (refused.empty()) {
    // Only a snapshot this peer sent on this connection, for this tenant: it is used once.
    std::lock_guard lock(scope->mu);
    auto it = scope->received.find(ir.snapshot_id);
    if (it == scope->received.end())
      refused = "snapshot " + ir.snapshot_id + " was not sent on this connection";
    else if (it->second != tenant)
      refused = "snapshot " + ir.snapshot_id + " was sent for another tenant";
    else
      scope->received.erase(it);  // (start_imported removes it, started or not)
  }
  if (!refused.empty()) {
    spdlog::warn("cluster: a start from host {} refused: {}", scope->host, refused);
    return KJ_EXCEPTION(FAILED, "start refused: " + refused);
  }
  ir.create = settings_of(tenant, *settings);
  if (p.hasVolumes() && p.getVolumes().size() > 0) {
    auto vols = Json::parse(p.getVolumes().cStr());
    refused = vols ? volumes_of(*vols, migrated, ir) : "volumes: not JSON";
    if (!refused.empty()) {
      server.rt.discard_import(ir.snapshot_id);
      return KJ_EXCEPTION(FAILED, "start refused: " + refused);
    }
  }
  std::vector<uint32_t> ports;
  if (migrated) {
    // A migrated sandbox keeps its expiry (what is left of its TTL) and its exposed ports.
    const auto& j = *settings;
    if (j["expires_at_ms"].is_integer()) {
      int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
      int64_t left = j["expires_at_ms"].as_int() - now;
      ir.create.ttl_seconds = uint32_t(std::max<int64_t>(1, (left + 999) / 1000));
    }
    if (j["ports"].is_array())
      for (auto& port : j["ports"].as_array())
        if (port.is_integer()) ports.push_back(uint32_t(port.as_int()));
  }
  auto& rt = server.rt;
  return server
      .offload<std::string>(
          [&rt, ir, migrated, ports, key, scope]() -> std::string {
            Json out = Json::object();
            auto refuse = [&](Code code, const std::string& why) {
              spdlog::warn("cluster: a start from host {} refused: {}", scope->host, why);
              rt.discard_import(ir.snapshot_id);
              out.set("error", error_json({code, why}));
              return out.dump();
            };
            // It acts for the tenant whose key it presents, on what etcd says it owns: a fork's
            // parent, or the sandbox it hands over.
            if (auto no = peer_may_act(rt, key, ir.create.tenant); !no.empty())
              return refuse(Code::unauthorized, no);
            if (auto* cluster = rt.cluster()) {
              const auto& subject = migrated ? ir.ids.front() : ir.parent;
              auto owner = cluster->owner(subject, true);
              if (owner.host != scope->host)
                return refuse(Code::forbidden, "host " + scope->host + " does not own " + subject);
            }
            auto started = rt.start_imported(ir, !migrated);
            if (!started) {
              out.set("error", error_json(started.error()));
              return out.dump();
            }
            {
              std::lock_guard lock(scope->mu);
              for (auto& s : *started) scope->started[s.id] = s.tenant;
              for (auto& a : ir.arrivals) scope->volumes.insert(a.volume.id);
            }
            for (auto& s : *started)
              for (auto port : ports)
                if (auto e = rt.expose_port(s.tenant, s.id, port); !e)
                  spdlog::warn("cluster: migrated {}: port {} not exposed again: {}", s.id, port,
                               e.error().message);
            if (!ports.empty())
              for (auto& s : *started)
                if (auto again = rt.get(s.tenant, s.id)) s = *again;
            Json list = Json::array();
            for (auto& s : *started) list.push(sandbox_json(s));
            out.set("sandboxes", list);
            return out.dump();
          },
          error_body(Code::too_many_requests, "the host is busy"))
      .then([ctx](std::string out) mutable {
        auto j = Json::parse(out);
        auto res = ctx.getResults();
        if ((*j)["error"].is_object())
          res.setError((*j)["error"].dump());
        else
          res.setSandboxes((*j)["sandboxes"].dump());
      });
}

kj::Promise<void> discard_sandboxes(
    Server& server, std::shared_ptr<PeerScope> scope,
    capnp::CallContext<wc::Peer::DiscardParams, wc::Peer::DiscardResults> ctx) {
  auto p = ctx.getParams();
  std::string tenant = p.getTenant();
  std::vector<std::string> ids, volumes;
  {
    // Only what this peer started on this connection (and the volumes that came with it).
    std::lock_guard lock(scope->mu);
    for (auto id : p.getIds()) {
      auto it = scope->started.find(id);
      if (it != scope->started.end() && it->second == tenant) {
        ids.push_back(id);
        scope->started.erase(it);
      } else {
        spdlog::warn(
            "cluster: host {} asked to discard {} of tenant {}, which it did not start "
            "on its connection: refused",
            scope->host, id.cStr(), tenant);
      }
    }
    for (auto id : p.getVolumes()) {
      if (scope->volumes.erase(id))
        volumes.push_back(id);
      else
        spdlog::warn(
            "cluster: host {} asked to give back volume {}, which did not come with "
            "its migration: refused",
            scope->host, id.cStr());
    }
  }
  auto& rt = server.rt;
  const std::string from = scope->host;
  return server
      .offload<bool>(
          [&rt, tenant, ids, volumes, from]() {
            for (auto& id : ids) (void)rt.kill(tenant, id);
            // Volumes that came with a migrated sandbox go back (the host that sent them still
            // has their files and their owner records).
            for (auto& v : volumes)
              if (auto left = rt.volume_left(tenant, v, from, ids.empty() ? "" : ids.front());
                  !left)
                spdlog::warn("cluster: volume {} not given back to host {}: {}", v, from,
                             left.error().message);
            return true;
          },
          false)
      .ignoreResult();
}

// --- The sending side. ---

struct PeerSession::Impl {
  kj::AsyncIoContext io = kj::setupAsyncIo();
  std::unique_ptr<PeerTransport> transport;
  kj::Own<PeerConnection> conn;
  wc::Peer::Client peer = nullptr;
  std::string host;
  std::string api_key;  // the request's, presented with every snapshot and start

  // Waits for `p` on this thread's loop; a peer that does not answer in time fails it.
  template <typename T>
  T wait(kj::Promise<T>&& p) {
    return io.provider->getTimer().timeoutAfter(kPeerCallTimeout, kj::mv(p)).wait(io.waitScope);
  }
  actors::Rejection failed(const std::string& what, const kj::Exception& e) const {
    return {Code::peer_error,
            "host " + host + ": " + what + ": " + std::string(e.getDescription().cStr())};
  }
};

PeerSession::PeerSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerSession::~PeerSession() = default;

actors::Reply<std::unique_ptr<PeerSession>> PeerSession::open(const std::string& host,
                                                              const std::string& address,
                                                              const PeerAuth& auth,
                                                              const std::string& api_key) {
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->api_key = api_key;
  try {
    // (this thread's own TLS context: the session's loop is this thread's)
    impl->transport = std::make_unique<PeerTransport>(auth, impl->io.provider->getTimer());
    auto stream =
        impl->wait(impl->transport->connect(impl->io.provider->getNetwork(), address, host));
    impl->conn =
        kj::heap<PeerConnection>(kj::mv(stream), capnp::rpc::twoparty::Side::CLIENT, nullptr);
    auto login = login_request(impl->conn->bootstrap().castAs<wc::PeerLogin>(), auth);
    impl->peer = impl->wait(login.send()).getPeer();
  } catch (kj::Exception& e) {
    return actors::Rejection{
        Code::host_unavailable,
        "cannot reach host " + host + " at " + address + ": " + e.getDescription().cStr()};
  }
  return std::unique_ptr<PeerSession>(new PeerSession(std::move(impl)));
}

actors::Reply<PeerSession::Shipped> PeerSession::ship(const std::string& tenant,
                                                      const actors::SnapshotOffer& offer) {
  Shipped out;
  out.files_offered = uint32_t(offer.files.size());
  try {
    auto req = impl_->peer.receiveSnapshotRequest();
    req.setTenant(tenant);
    req.setApiKey(impl_->api_key);
    auto o = req.initOffer();
    o.setMeta(offer.meta.dump());
    auto files = o.initFiles(uint(offer.files.size()));
    for (size_t i = 0; i < offer.files.size(); ++i) {
      files[uint(i)].setName(offer.files[i].name);
      files[uint(i)].setSize(offer.files[i].size);
      files[uint(i)].setSha256(offer.files[i].sha256);
    }
    auto resp = impl_->wait(req.send());
    auto sink = resp.getSink();
    for (auto i : resp.getMissing()) {
      if (i >= offer.files.size()) return actors::Rejection{Code::peer_error, "a bad missing list"};
      auto file = actors::OfferedFile::open(offer, i);
      if (!file) return file.error();
      for (auto& e : (*file)->extents())
        for (uint64_t at = e.offset; at < e.offset + e.length;) {
          size_t n = size_t(std::min<uint64_t>(kSnapshotChunk, e.offset + e.length - at));
          auto w = sink.writeRequest(capnp::MessageSize{n / 8 + 16, 0});
          w.setFile(i);
          w.setOffset(at);
          auto d = w.initData(uint(n));
          if (!(*file)->read(at, d.begin(), n))
            return actors::Rejection{Code::internal, "cannot read " + (*file)->path().string()};
          impl_->wait(w.send());
          at += n;
          out.bytes += n;
        }
      ++out.files;
    }
    out.snapshot = impl_->wait(sink.commitRequest().send()).getSnapshot();
  } catch (kj::Exception& e) {
    return impl_->failed("sending the snapshot", e);
  }
  return out;
}

actors::Reply<std::vector<Json>> PeerSession::start(const Start& s) {
  try {
    auto req = impl_->peer.startRequest();
    auto r = req.initRequest();
    r.setSnapshot(s.snapshot);
    r.setTenant(s.tenant);
    r.setParent(s.parent);
    auto ids = r.initIds(uint(s.ids.size()));
    for (size_t i = 0; i < s.ids.size(); ++i) ids.set(uint(i), s.ids[i]);
    r.setSettings(s.settings.dump());
    r.setMigrated(s.migrated);
    r.setVolumes(s.volumes.dump());
    r.setApiKey(impl_->api_key);
    auto resp = impl_->wait(req.send());
    if (resp.hasError() && resp.getError().size() > 0) {
      auto e = Json::parse(resp.getError().cStr());
      if (!e || !e->is_object()) return actors::Rejection{Code::peer_error, "a bad error reply"};
      // (another host's code: one of ours, or its failure is a peer error)
      auto code = code_from_string((*e)["code"].is_string() ? (*e)["code"].as_string() : "");
      return actors::Rejection{code.value_or(Code::peer_error),
                               "host " + impl_->host + ": " + (*e)["message"].as_string()};
    }
    auto list = Json::parse(resp.getSandboxes().cStr());
    if (!list || !list->is_array()) return actors::Rejection{Code::peer_error, "a bad start reply"};
    return list->as_array();
  } catch (kj::Exception& e) {
    return impl_->failed("starting sandboxes", e);
  }
}

namespace {
// A forwarded request's answer, kept (bounded).
class KeptAnswer final : public wc::ResponseSink::Server {
 public:
  explicit KeptAnswer(std::shared_ptr<PeerSession::HttpAnswer> a) : a_(kj::mv(a)) {}
  kj::Promise<void> start(StartContext ctx) override {
    a_->status = ctx.getParams().getStatus();
    return kj::READY_NOW;
  }
  kj::Promise<void> write(WriteContext ctx) override {
    auto d = ctx.getParams().getData();
    if (a_->body.size() + d.size() > PeerSession::kMaxBody)
      return KJ_EXCEPTION(FAILED, "the answer is too large");
    a_->body.append(reinterpret_cast<const char*>(d.begin()), d.size());
    return kj::READY_NOW;
  }
  kj::Promise<void> end(EndContext) override { return kj::READY_NOW; }

 private:
  std::shared_ptr<PeerSession::HttpAnswer> a_;
};
}  // namespace

actors::Reply<PeerSession::HttpAnswer> PeerSession::http(
    const std::string& method, const std::string& url,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  auto answer = std::make_shared<HttpAnswer>();
  try {
    auto req = impl_->peer.httpRequest();
    auto r = req.initRequest();
    r.setMethod(method);
    r.setUrl(url);
    auto hs = r.initHeaders(uint(headers.size()));
    for (size_t i = 0; i < headers.size(); ++i) {
      hs[uint(i)].setName(headers[i].first);
      hs[uint(i)].setValue(headers[i].second);
    }
    req.setSink(kj::heap<KeptAnswer>(answer));
    impl_->wait(req.send());
  } catch (kj::Exception& e) {
    return impl_->failed(method + " " + url, e);
  }
  if (answer->status == 0)
    return actors::Rejection{Code::peer_error, "host " + impl_->host + " sent no response"};
  return *answer;
}

void PeerSession::discard(const std::string& tenant, const std::vector<std::string>& ids,
                          const std::vector<std::string>& volumes) {
  try {
    auto req = impl_->peer.discardRequest();
    req.setTenant(tenant);
    auto l = req.initIds(uint(ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) l.set(uint(i), ids[i]);
    auto v = req.initVolumes(uint(volumes.size()));
    for (size_t i = 0; i < volumes.size(); ++i) v.set(uint(i), volumes[i]);
    impl_->wait(req.send());
  } catch (kj::Exception& e) {
    spdlog::warn("cluster: could not undo sandboxes on host {}: {}", impl_->host,
                 e.getDescription().cStr());
  }
}

}  // namespace pandastack::gateway
