// GCC 12 reports -Wmaybe-uninitialized inside kj's ExceptionOr<T> move-assignment
// (async-inl.h, XThreadFulfiller::fulfill) for any non-trivial T fulfilled across threads: a
// false positive of its inliner, silenced for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "gateway/rpc.h"

#include <capnp/rpc-twoparty.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <optional>
#include <stop_token>

#include "actors/cluster.h"
#include "actors/secrets.h"
#include "gateway/acceptor.h"
#include "gateway/guarded_stream.h"
#include "gateway/http_util.h"
#include "gateway/rate_limit.h"
#include "gateway/rpc_convert.h"
#include "gateway/worker_pool.h"
#include "wire/pandastack.capnp.h"

namespace pandastack::gateway {

namespace api = wire::api;
using actors::Rejection;
using actors::Reply;
using namespace rpc;

// One connection's login. Every call made through the capabilities a login handed out verifies
// its key again first: a revoked key's open session fails its next call (as REST would).
// Each call also takes a token of the key's requests-per-second bucket.
struct Session {
  std::string key, tenant;
  RateLimiter* limiter = nullptr;
  std::optional<Rejection> check(actors::Runtime& rt) const {
    auto k = rt.authenticate(key);
    if (!k)
      return Rejection{k.error().code,
                       "this session's API key no longer works: " + k.error().message};
    uint32_t rate = rt.quota_limits(k->tenant).requests_per_second;
    if (limiter && !limiter->take(k->id, rate))
      return Rejection{Code::too_many_requests, "this key sent more than " + std::to_string(rate) +
                                                    " requests per second (its tenant's quota)"};
    return std::nullopt;
  }
};

struct RpcServer::Impl {
  actors::Runtime& rt;
  kj::Timer& timer;
  Limits limits;
  std::stop_source shutting_down;  // cancels commands in flight at shutdown (outlives the pool)
  WorkerPool pool;
  RateLimiter limiter;
  std::unique_ptr<Acceptor> acceptor;
  RemotePlatform remote;  // (cluster mode)

  Impl(actors::Runtime& r, kj::Timer& t, Limits l);
  kj::Promise<void> serve(kj::Own<kj::AsyncIoStream> connection);
  ~Impl() { shutting_down.request_stop(); }

  // Runs `f` on the pool; its Reply becomes the promise's value.
  // (The reply travels by pointer: GCC 12 warns falsely about strings moved inside kj's
  // ExceptionOr<Reply<T>>.)
  template <typename T>
  kj::Promise<std::shared_ptr<Reply<T>>> offload(std::function<Reply<T>()> f) {
    return pool.offload<std::shared_ptr<Reply<T>>>(
        [f = std::move(f)] { return std::make_shared<Reply<T>>(f()); },
        std::make_shared<Reply<T>>(Rejection{Code::too_many_requests, "the server is busy"}));
  }
  // The same, after the session's key verified again.
  template <typename T>
  kj::Promise<std::shared_ptr<Reply<T>>> offload(std::shared_ptr<const Session> s,
                                                 std::function<Reply<T>()> f) {
    return offload<T>([s = std::move(s), rt = &rt, f = std::move(f)]() -> Reply<T> {
      if (auto refused = s->check(*rt)) return *refused;
      return f();
    });
  }
};

namespace {

class SandboxImpl final : public api::Sandbox::Server {
 public:
  SandboxImpl(RpcServer::Impl& ctx, std::shared_ptr<const Session> session, std::string id)
      : ctx_(ctx), session_(std::move(session)), tenant_(session_->tenant), id_(std::move(id)) {}

  kj::Promise<void> info(InfoContext context) override {
    return info_call(context, [t = target()] { return t.rt->get(t.tenant, t.id); });
  }
  kj::Promise<void> hibernate(HibernateContext context) override {
    return info_call(context, [t = target()] { return t.rt->hibernate(t.tenant, t.id); });
  }
  kj::Promise<void> wake(WakeContext context) override {
    return info_call(context, [t = target()] { return t.rt->wake(t.tenant, t.id); });
  }
  kj::Promise<void> kill(KillContext context) override {
    return info_call(context, [t = target()] { return t.rt->kill(t.tenant, t.id); });
  }
  kj::Promise<void> egressLog(EgressLogContext context) override {
    auto p = context.getParams();
    auto q = to_egress_query(p.getAfter(), p.getLimit(), text(p.getKind()), text(p.getVerdict()));
    return offload<vmm::EgressPage>([t = target(), q] { return t.rt->egress(t.tenant, t.id, q); })
        .then([context](std::shared_ptr<Reply<vmm::EgressPage>> r) mutable {
          auto page = take(*r);
          auto res = context.getResults();
          auto list = res.initEntries(unsigned(page.entries.size()));
          for (size_t i = 0; i < page.entries.size(); ++i)
            fill_egress(list[unsigned(i)], page.entries[i]);
          res.setNextAfter(page.next_after);
          res.setDropped(page.dropped);
          res.setLost(page.lost);
        });
  }
  kj::Promise<void> setTtl(SetTtlContext context) override {
    uint32_t ttl = context.getParams().getTtlSeconds();
    return info_call(context, [t = target(), ttl] { return t.rt->set_ttl(t.tenant, t.id, ttl); });
  }

  kj::Promise<void> exec(ExecContext context) override {
    context.allowCancellation();
    auto req = to_exec(context.getParams().getRequest(), ctx_.limits);
    auto stop = std::make_shared<std::stop_source>();
    auto guard = kj::defer([stop] { stop->request_stop(); });
    return offload<vmm::ExecResult>([t = target(), req, stop] {
             std::stop_callback on_shutdown(t.shutdown, [stop] { stop->request_stop(); });
             return t.rt->exec(t.tenant, t.id, req, stop->get_token());
           })
        .then([context](std::shared_ptr<Reply<vmm::ExecResult>> r) mutable {
          fill_result(context.getResults().initResult(), take(*r));
        })
        .attach(kj::mv(guard));
  }

  kj::Promise<void> execStream(ExecStreamContext context) override {
    context.allowCancellation();
    auto params = context.getParams();
    auto req = to_exec(params.getRequest(), ctx_.limits);
    auto sink = params.getSink();
    using Chunk = std::pair<vmm::StreamKind, std::string>;
    // A sink that does not keep up: once its unsent output passes the bound, the command is
    // stopped and the call fails with client_too_slow (the daemon does not buffer without end).
    auto queue = std::make_shared<CrossThreadQueue<Chunk>>(ctx_.limits.max_stream_buffer_bytes);
    auto stop = std::make_shared<std::stop_source>();
    auto result = std::make_shared<std::optional<Reply<vmm::ExecResult>>>();
    bool queued = ctx_.pool.submit([t = target(), s = session_, req, queue, stop, result] {
      if (auto refused = s->check(*t.rt)) {
        result->emplace(*refused);
        return queue->close();
      }
      std::stop_callback on_shutdown(t.shutdown, [stop] { stop->request_stop(); });
      auto overflow = std::make_shared<std::atomic<bool>>(false);
      auto r = t.rt->exec_stream(
          t.tenant, t.id, req,
          [queue, stop, overflow](vmm::StreamKind k, std::string_view d) {
            if (*overflow) return;
            if (!queue->push({k, std::string(d)}, d.size())) {
              *overflow = true;
              stop->request_stop();
            }
          },
          stop->get_token());
      if (*overflow)
        r = Rejection{Code::client_too_slow, "the output sink did not keep up: more than " +
                                                 std::to_string(t.max_buffer >> 20) +
                                                 " MiB waited; the command was stopped"};
      result->emplace(std::move(r));
      queue->close();
    });
    if (!queued) fail({Code::too_many_requests, "the server is busy"});
    // Dropping this call (the client cancelled) stops the command in the guest.
    auto guard = kj::defer([stop] { stop->request_stop(); });
    return pump(queue, sink)
        .then([context, result]() mutable {
          auto& r = **result;
          fill_result(context.getResults().initResult(), take(r));
        })
        .attach(kj::mv(guard));
  }

  kj::Promise<void> readFile(ReadFileContext context) override {
    auto path = checked_path(context.getParams().getPath(), ctx_.limits);
    return offload<std::string>([t = target(), path] {
             return t.rt->read_file(t.tenant, t.id, path, RpcServer::kMaxFileBytes);
           })
        .then([context](std::shared_ptr<Reply<std::string>> r) mutable {
          auto data = take(*r);
          context.getResults().setData(
              capnp::Data::Reader(reinterpret_cast<const kj::byte*>(data.data()), data.size()));
        });
  }

  kj::Promise<void> writeFile(WriteFileContext context) override {
    auto params = context.getParams();
    auto path = checked_path(params.getPath(), ctx_.limits);
    auto d = params.getData();
    if (d.size() > RpcServer::kMaxFileBytes)
      fail({Code::file_too_large, "files over RPC are at most 32 MiB"});
    std::string data(reinterpret_cast<const char*>(d.begin()), d.size());
    return offload<bool>([t = target(), path, data = std::move(data)] {
             return t.rt->write_file(t.tenant, t.id, path, data);
           })
        .then([](std::shared_ptr<Reply<bool>> r) { take(*r); });
  }

  kj::Promise<void> listDir(ListDirContext context) override {
    auto path = checked_path(context.getParams().getPath(), ctx_.limits);
    return offload<std::vector<vmm::FileStat>>(
               [t = target(), path] { return t.rt->list_dir(t.tenant, t.id, path); })
        .then([context](std::shared_ptr<Reply<std::vector<vmm::FileStat>>> r) mutable {
          static const char* types[] = {"file", "directory", "symlink", "other"};
          auto entries = take(*r);
          auto list = context.getResults().initEntries(entries.size());
          for (size_t i = 0; i < entries.size(); ++i) {
            list[i].setName(entries[i].name);
            list[i].setType(types[int(entries[i].type)]);
            list[i].setSize(entries[i].size);
            list[i].setMode(entries[i].mode);
            list[i].setMtimeMs(entries[i].mtime_ms);
          }
        });
  }

  kj::Promise<void> snapshot(SnapshotContext context) override {
    return offload<std::string>([t = target()] { return t.rt->snapshot(t.tenant, t.id); })
        .then([context](std::shared_ptr<Reply<std::string>> r) mutable {
          context.getResults().setSnapshotId(take(*r));
        });
  }

  kj::Promise<void> forkOne(ForkOneContext context) override {
    return offload<std::vector<actors::SandboxInfo>>(
               [t = target()] { return t.rt->fork(t.tenant, t.id, 1); })
        .then([this, context](std::shared_ptr<Reply<std::vector<actors::SandboxInfo>>> r) mutable {
          auto kids = take(*r);
          if (kids.size() != 1) throw KJ_EXCEPTION(FAILED, "internal: a fork made no child");
          auto results = context.getResults();
          results.setSandbox(kj::heap<SandboxImpl>(ctx_, session_, kids[0].id));
          fill_info(results.initInfo(), kids[0]);
        });
  }

  kj::Promise<void> fork(ForkContext context) override {
    uint32_t count = context.getParams().getCount();
    bool inherit = context.getParams().getInheritSecrets();
    return offload<std::vector<actors::SandboxInfo>>([t = target(), count, inherit] {
             return t.rt->fork(t.tenant, t.id, count, inherit);
           })
        .then([this, context](std::shared_ptr<Reply<std::vector<actors::SandboxInfo>>> r) mutable {
          auto kids = take(*r);
          auto results = context.getResults();
          auto caps = results.initChildren(kids.size());
          auto infos = results.initInfos(kids.size());
          for (size_t i = 0; i < kids.size(); ++i) {
            caps.set(i, kj::heap<SandboxImpl>(ctx_, session_, kids[i].id));
            fill_info(infos[i], kids[i]);
          }
        });
  }

 private:
  // What a worker needs: copies, so a call outliving this capability (cancelled) stays valid.
  struct Target {
    actors::Runtime* rt;
    std::string tenant, id;
    std::stop_token shutdown;
    size_t max_buffer;
  };
  Target target() const {
    return {&ctx_.rt, tenant_, id_, ctx_.shutting_down.get_token(),
            ctx_.limits.max_stream_buffer_bytes};
  }

  template <typename Context, typename F>
  kj::Promise<void> info_call(Context context, F f) {
    return offload<actors::SandboxInfo>(std::move(f))
        .then([context](std::shared_ptr<Reply<actors::SandboxInfo>> r) mutable {
          fill_info(context.getResults().initInfo(), take(*r));
        });
  }

  static kj::Promise<void> pump(
      std::shared_ptr<CrossThreadQueue<std::pair<vmm::StreamKind, std::string>>> queue,
      api::OutputSink::Client sink) {
    return queue->ready().then([queue, sink]() mutable -> kj::Promise<void> {
      auto [items, closed] = queue->take();
      kj::Promise<void> sent = kj::READY_NOW;
      for (auto& [kind, data] : items) {
        auto w = sink.writeRequest();
        w.setKind(kind == vmm::StreamKind::out ? api::StreamKind::STDOUT : api::StreamKind::STDERR);
        w.setData(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(data.data()), data.size()));
        sent = sent.then([w = kj::mv(w)]() mutable { return w.send(); });
      }
      if (closed) return sent;
      return sent.then([queue, sink]() mutable { return pump(queue, sink); });
    });
  }

  template <typename T>
  kj::Promise<std::shared_ptr<Reply<T>>> offload(std::function<Reply<T>()> f) {
    return ctx_.offload<T>(session_, std::move(f));
  }

  RpcServer::Impl& ctx_;
  std::shared_ptr<const Session> session_;
  std::string tenant_, id_;
};

// One database of the session's tenant (the runtime checks the tenant on every call).
class DatabaseImpl final : public api::Database::Server {
 public:
  DatabaseImpl(RpcServer::Impl& ctx, std::shared_ptr<const Session> session, std::string id)
      : ctx_(ctx), session_(std::move(session)), tenant_(session_->tenant), id_(std::move(id)) {}

  kj::Promise<void> info(InfoContext context) override {
    return call(context, [](actors::Runtime& rt, const std::string& t, const std::string& id) {
      return rt.get_database(t, id);
    });
  }
  kj::Promise<void> hibernate(HibernateContext context) override {
    return call(context, [](actors::Runtime& rt, const std::string& t, const std::string& id) {
      return rt.hibernate_database(t, id);
    });
  }
  kj::Promise<void> wake(WakeContext context) override {
    return call(context, [](actors::Runtime& rt, const std::string& t, const std::string& id) {
      return rt.wake_database(t, id);
    });
  }
  kj::Promise<void> rotatePassword(RotatePasswordContext context) override {
    return call(context, [](actors::Runtime& rt, const std::string& t, const std::string& id) {
      return rt.rotate_database_password(t, id);
    });
  }
  kj::Promise<void> deleteBackup(DeleteBackupContext context) override {
    auto bk = text(context.getParams().getBackupId());
    return call(context, [bk](actors::Runtime& rt, const std::string& t, const std::string& id) {
      return rt.delete_database_backup(t, id, bk);
    });
  }

  kj::Promise<void> backup(BackupContext context) override {
    return offload<actors::DatabaseBackup>(
               [rt = &ctx_.rt, t = tenant_, id = id_] { return rt->backup_database(t, id); })
        .then([context](std::shared_ptr<Reply<actors::DatabaseBackup>> r) mutable {
          fill_backup(context.getResults().initBackup(), take(*r));
        });
  }

  kj::Promise<void> logs(LogsContext context) override {
    uint32_t lines = context.getParams().getLines();
    if (lines == 0) lines = 200;
    if (lines > 10000) fail({Code::invalid_argument, "lines is 1..10000 (0 = 200)"});
    return offload<std::string>([rt = &ctx_.rt, t = tenant_, id = id_, lines] {
             return rt->database_logs(t, id, lines);
           })
        .then([context](std::shared_ptr<Reply<std::string>> r) mutable {
          context.getResults().setLog(take(*r));
        });
  }

  kj::Promise<void> delete_(DeleteContext) override {
    return offload<actors::DatabaseInfo>(
               [rt = &ctx_.rt, t = tenant_, id = id_] { return rt->delete_database(t, id); })
        .then([](std::shared_ptr<Reply<actors::DatabaseInfo>> r) { take(*r); });
  }

 private:
  // The calls that answer the database's info.
  template <typename Context, typename F>
  kj::Promise<void> call(Context context, F f) {
    return offload<actors::DatabaseInfo>(
               [rt = &ctx_.rt, t = tenant_, id = id_, f] { return f(*rt, t, id); })
        .then([context](std::shared_ptr<Reply<actors::DatabaseInfo>> r) mutable {
          fill_database(context.getResults().initInfo(), take(*r));
        });
  }

  template <typename T>
  kj::Promise<std::shared_ptr<Reply<T>>> offload(std::function<Reply<T>()> f) {
    return ctx_.offload<T>(session_, std::move(f));
  }

  RpcServer::Impl& ctx_;
  std::shared_ptr<const Session> session_;
  std::string tenant_, id_;
};

class PlatformImpl final : public api::Platform::Server {
 public:
  PlatformImpl(RpcServer::Impl& ctx, std::shared_ptr<const Session> session)
      : ctx_(ctx), session_(std::move(session)), tenant_(session_->tenant) {}

  kj::Promise<void> create(CreateContext context) override {
    auto r = context.getParams().getRequest();
    actors::CreateRequest c;
    c.tenant = tenant_;
    c.template_name = r.getTemplate().size() ? text(r.getTemplate()) : "base";
    c.ttl_seconds = r.getTtlSeconds();
    for (auto e : r.getMetadata()) c.metadata[text(e.getKey())] = text(e.getValue());
    c.persistent = r.getPersistent();
    c.auto_wake = r.getAutoWake();
    c.from_snapshot = text(r.getFromSnapshot());
    c.memory_mib = r.getMemoryMib();
    c.vcpus = r.getVcpus();
    if (r.getSecrets().size() > actors::Secrets::kMaxPerSandbox)
      fail({Code::invalid_argument, "at most 16 secrets per sandbox"});
    for (auto s : r.getSecrets()) c.secrets.push_back(text(s));
    if (r.getVolumes().size() > actors::kVolumeSlots)
      fail({Code::invalid_argument, "at most 4 volumes per sandbox"});
    for (auto v : r.getVolumes())
      c.volumes.push_back({text(v.getVolume()), text(v.getMount()), v.getReadOnly()});
    // In a cluster: made where what it is made from lives, else where placement puts it.
    std::string from = !c.from_snapshot.empty() ? c.from_snapshot
                       : c.volumes.empty()      ? ""
                                                : c.volumes[0].volume;
    auto elsewhere =
        from.empty() ? placed(c.template_name) : owner_platform(from, !c.from_snapshot.empty());
    return elsewhere.then(
        [this, context, c](kj::Maybe<api::Platform::Client> remote) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE (p, remote) {
            auto req = p->createRequest();
            req.setRequest(context.getParams().getRequest());
            return context.tailCall(kj::mv(req));
          }
          return offload<actors::SandboxInfo>([rt = &ctx_.rt, c] { return rt->create(c); })
              .then([this, context](std::shared_ptr<Reply<actors::SandboxInfo>> r) mutable {
                if (!*r && r->error().code == Code::sandbox_failed)
                  fail({Code::start_failed, r->error().message});
                answer(context.getResults(), take(*r));
              });
        });
  }

  kj::Promise<void> get(GetContext context) override {
    auto id = text(context.getParams().getId());
    return owner_platform(id).then(
        [this, context, id](kj::Maybe<api::Platform::Client> remote) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE (p, remote) {
            auto req = p->getRequest();
            req.setId(id);
            return context.tailCall(kj::mv(req));
          }
          return offload<actors::SandboxInfo>(
                     [rt = &ctx_.rt, t = tenant_, id] { return rt->get(t, id); })
              .then([this, context](std::shared_ptr<Reply<actors::SandboxInfo>> r) mutable {
                answer(context.getResults(), take(*r));
              });
        });
  }

  kj::Promise<void> deleteSnapshot(DeleteSnapshotContext context) override {
    auto id = text(context.getParams().getSnapshotId());
    return offload<actors::SandboxInfo>(
               [rt = &ctx_.rt, t = tenant_, id] { return rt->delete_snapshot(t, id); })
        .then([](std::shared_ptr<Reply<actors::SandboxInfo>> r) { take(*r); });
  }

  kj::Promise<void> createVolume(CreateVolumeContext context) override {
    actors::VolumeRequest req;
    req.tenant = tenant_;
    req.name = text(context.getParams().getName());
    req.size_mib = context.getParams().getSizeMib();
    return offload<actors::VolumeInfo>([rt = &ctx_.rt, req] { return rt->create_volume(req); })
        .then([context](std::shared_ptr<Reply<actors::VolumeInfo>> r) mutable {
          fill_volume(context.getResults().initInfo(), take(*r));
        });
  }

  kj::Promise<void> listVolumes(ListVolumesContext context) override {
    return offload<std::vector<actors::VolumeInfo>>(
               [rt = &ctx_.rt, t = tenant_] { return rt->list_volumes(t); })
        .then([context](std::shared_ptr<Reply<std::vector<actors::VolumeInfo>>> r) mutable {
          auto all = take(*r);
          auto list = context.getResults().initVolumes(all.size());
          for (size_t i = 0; i < all.size(); ++i) fill_volume(list[i], all[i]);
        });
  }

  kj::Promise<void> deleteVolume(DeleteVolumeContext context) override {
    auto id = text(context.getParams().getId());
    return offload<actors::VolumeInfo>(
               [rt = &ctx_.rt, t = tenant_, id] { return rt->delete_volume(t, id); })
        .then([](std::shared_ptr<Reply<actors::VolumeInfo>> r) { take(*r); });
  }

  kj::Promise<void> createDatabase(CreateDatabaseContext context) override {
    auto r = context.getParams().getRequest();
    actors::DatabaseRequest req;
    req.tenant = tenant_;
    req.name = text(r.getName());
    for (auto e : r.getMetadata()) req.metadata[text(e.getKey())] = text(e.getValue());
    req.from_backup = text(r.getFromBackup());
    return offload<actors::DatabaseInfo>([rt = &ctx_.rt, req] { return rt->create_database(req); })
        .then([this, context](std::shared_ptr<Reply<actors::DatabaseInfo>> r) mutable {
          answer_database(context.getResults(), take(*r));
        });
  }

  kj::Promise<void> getDatabase(GetDatabaseContext context) override {
    auto id = text(context.getParams().getId());
    return owner_platform(id).then(
        [this, context, id](kj::Maybe<api::Platform::Client> remote) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE (p, remote) {
            auto req = p->getDatabaseRequest();
            req.setId(id);
            return context.tailCall(kj::mv(req));
          }
          return offload<actors::DatabaseInfo>(
                     [rt = &ctx_.rt, t = tenant_, id] { return rt->get_database(t, id); })
              .then([this, context](std::shared_ptr<Reply<actors::DatabaseInfo>> r) mutable {
                answer_database(context.getResults(), take(*r));
              });
        });
  }

  kj::Promise<void> listSecrets(ListSecretsContext context) override {
    return offload<std::vector<storage::SecretInfo>>(
               [rt = &ctx_.rt, t = tenant_] { return rt->secrets().list(t); })
        .then([context](std::shared_ptr<Reply<std::vector<storage::SecretInfo>>> r) mutable {
          auto all = take(*r);
          auto list = context.getResults().initSecrets(unsigned(all.size()));
          for (size_t i = 0; i < all.size(); ++i) fill_secret(list[unsigned(i)], all[i]);
        });
  }

  kj::Promise<void> listDatabases(ListDatabasesContext context) override {
    return offload<std::vector<actors::DatabaseInfo>>(
               [rt = &ctx_.rt, t = tenant_] { return rt->list_databases(t); })
        .then([context](std::shared_ptr<Reply<std::vector<actors::DatabaseInfo>>> r) mutable {
          auto all = take(*r);
          auto list = context.getResults().initDatabases(all.size());
          for (size_t i = 0; i < all.size(); ++i) fill_database(list[i], all[i]);
        });
  }

  kj::Promise<void> list(ListContext context) override {
    auto state = text(context.getParams().getState());
    std::optional<actors::SandboxStatus> status;
    if (!state.empty()) {
      status = actors::status_from_string(state);
      if (!status) fail({Code::invalid_argument, "unknown state '" + state + "'"});
    }
    return offload<std::vector<actors::SandboxInfo>>(
               [rt = &ctx_.rt, t = tenant_, status] { return rt->list(t, status); })
        .then([context](std::shared_ptr<Reply<std::vector<actors::SandboxInfo>>> r) mutable {
          auto all = take(*r);
          auto list = context.getResults().initSandboxes(all.size());
          for (size_t i = 0; i < all.size(); ++i) fill_info(list[i], all[i]);
        });
  }

 private:
  // Cluster mode: the Platform of the host that owns `id` when that is another host (the calls
  // go there; this host proxies them), or null (here: a local id, or an unknown one).
  // `from_store`: a create from `id`, whose host is down, is made here (from a snapshot parked
  // in the object store: Runtime::create; host_unavailable when there is none).
  kj::Promise<kj::Maybe<api::Platform::Client>> owner_platform(const std::string& id,
                                                               bool from_store = false) {
    auto* cluster = ctx_.rt.cluster();
    if (cluster == nullptr || !ctx_.remote) return kj::Maybe<api::Platform::Client>(nullptr);
    return offload<actors::Owner>(
               [cluster, id]() -> Reply<actors::Owner> { return cluster->owner(id); })
        .then([this, from_store](std::shared_ptr<Reply<actors::Owner>> r) {
          auto o = take(*r);
          switch (o.kind) {
            case actors::Owner::Kind::peer:
              return platform_at(o.host, o.peer);
            case actors::Owner::Kind::down:
              if (from_store)
                return kj::Promise<kj::Maybe<api::Platform::Client>>(
                    kj::Maybe<api::Platform::Client>(nullptr));
              fail({Code::host_unavailable, "host " + o.host +
                                                " owns this and is down (its lease expired); it "
                                                "answers again once it is back"});
            case actors::Owner::Kind::error:
              fail({Code::cluster_unavailable, "cannot reach etcd: " + o.message});
            default:
              return kj::Promise<kj::Maybe<api::Platform::Client>>(
                  kj::Maybe<api::Platform::Client>(nullptr));
          }
        });
  }
  // Cluster mode: the Platform of the host placement picks for a create, or null (this one).
  kj::Promise<kj::Maybe<api::Platform::Client>> placed(const std::string& template_name) {
    auto* cluster = ctx_.rt.cluster();
    if (cluster == nullptr || !ctx_.remote) return kj::Maybe<api::Platform::Client>(nullptr);
    return offload<actors::HostInfo>(
               [cluster, template_name, tenant = tenant_]() -> Reply<actors::HostInfo> {
                 auto h = cluster->place(actors::placement_name(tenant, template_name), "");
                 if (!h)
                   return Rejection{Code::cluster_unavailable,
                                    "cannot place the sandbox: " + h.error().message};
                 return *h;
               })
        .then([this](std::shared_ptr<Reply<actors::HostInfo>> r) {
          auto h = take(*r);
          if (h.self)
            return kj::Promise<kj::Maybe<api::Platform::Client>>(
                kj::Maybe<api::Platform::Client>(nullptr));
          return platform_at(h.id, h.peer);
        });
  }
  kj::Promise<kj::Maybe<api::Platform::Client>> platform_at(const std::string& host,
                                                            const std::string& peer) {
    return ctx_.remote(host, peer, session_->key).then([](capnp::Capability::Client c) {
      return kj::Maybe<api::Platform::Client>(c.castAs<api::Platform>());
    });
  }

  // create and get answer alike: the sandbox's capability and its info.
  template <typename Results>
  void answer(Results results, const actors::SandboxInfo& info) {
    results.setSandbox(kj::heap<SandboxImpl>(ctx_, session_, info.id));
    fill_info(results.initInfo(), info);
  }
  template <typename Results>
  void answer_database(Results results, const actors::DatabaseInfo& info) {
    results.setDatabase(kj::heap<DatabaseImpl>(ctx_, session_, info.id));
    fill_database(results.initInfo(), info);
  }

  template <typename T>
  kj::Promise<std::shared_ptr<Reply<T>>> offload(std::function<Reply<T>()> f) {
    return ctx_.offload<T>(session_, std::move(f));
  }

  RpcServer::Impl& ctx_;
  std::shared_ptr<const Session> session_;
  std::string tenant_;
};

// What one connection may do before it logged in: a login's bytes (64 KiB) within 10 s. Until
// then nobody without a key makes the daemon hold more than that per connection.
constexpr size_t kPreLoginBytes = 64 << 10;
// The largest message after login: a 32 MiB file plus its framing (the default is 64 MiB).
constexpr uint64_t kMaxMessageWords = (RpcServer::kMaxFileBytes + (1 << 20)) / 8;

using Connection = PreLogin;

// The Platform of the tenant `key` belongs to (verified first).
kj::Promise<api::Platform::Client> platform_for(RpcServer::Impl& ctx, const std::string& key) {
  return ctx.offload<actors::KeyInfo>([rt = &ctx.rt, key] { return rt->authenticate(key); })
      .then([&ctx, key](std::shared_ptr<Reply<actors::KeyInfo>> r) -> api::Platform::Client {
        auto k = take(*r);
        auto session = std::make_shared<Session>();
        session->key = key;
        session->tenant = k.tenant;
        session->limiter = &ctx.limiter;
        return kj::heap<PlatformImpl>(ctx, std::move(session));
      });
}

class LoginImpl final : public api::Login::Server {
 public:
  LoginImpl(RpcServer::Impl& ctx, std::shared_ptr<Connection> c) : ctx_(ctx), c_(std::move(c)) {}

  kj::Promise<void> login(LoginContext context) override {
    auto key = text(context.getParams().getApiKey());
    if (!well_formed_key(key))
      fail({Code::unauthorized, "malformed API key (keys look like pds_<id>_<secret>)"});
    return platform_for(ctx_, key).then([this, context](api::Platform::Client p) mutable {
      c_->logged_in = true;
      context.getResults().setPlatform(kj::mv(p));
    });
  }

 private:
  RpcServer::Impl& ctx_;
  std::shared_ptr<Connection> c_;
};

// One accepted connection: its own RPC system whose bootstrap is a Login (what
// capnp::TwoPartyServer does, with a message limit and the pre-login guard).
struct RpcConnection {
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  RpcConnection(kj::Own<kj::AsyncIoStream> s, capnp::Capability::Client bootstrap,
                capnp::ReaderOptions options)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, options),
        rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
};

}  // namespace

kj::Promise<void> RpcServer::Impl::serve(kj::Own<kj::AsyncIoStream> connection) {
  auto c = std::make_shared<Connection>(kPreLoginBytes);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kMaxMessageWords;
  auto conn = kj::heap<RpcConnection>(kj::heap<GuardedStream>(kj::mv(connection), c),
                                      kj::heap<LoginImpl>(*this, c), options);
  auto ended = conn->network.onDisconnect();
  return ended.exclusiveJoin(login_deadline(timer, c, "no login within 10 s")).attach(kj::mv(conn));
}

RpcServer::Impl::Impl(actors::Runtime& r, kj::Timer& t, Limits l)
    : rt(r), timer(t), limits(l), pool(16, limits.max_queued_requests) {
  acceptor =
      std::make_unique<Acceptor>("rpc", t, l.max_connections,
                                 [this](kj::Own<kj::AsyncIoStream> c) { return serve(kj::mv(c)); });
}

RpcServer::RpcServer(actors::Runtime& runtime, kj::Timer& timer, Limits limits)
    : impl_(std::make_unique<Impl>(runtime, timer, limits)) {}

RpcServer::~RpcServer() {
  impl_->shutting_down.request_stop();
  impl_->acceptor = nullptr;  // drops the connections and their capabilities
}

kj::Promise<capnp::Capability::Client> RpcServer::platform_for(std::string key) {
  if (!well_formed_key(key))
    return KJ_EXCEPTION(FAILED,
                        "unauthorized: malformed API key (keys look like pds_<id>_<secret>)");
  return gateway::platform_for(*impl_, key)
      .then([](api::Platform::Client p) -> capnp::Capability::Client { return p; });
}

void RpcServer::route_to(RemotePlatform remote) { impl_->remote = std::move(remote); }

kj::Promise<void> RpcServer::listen(kj::ConnectionReceiver& listener) {
  return impl_->acceptor->listen(listener);
}

}  // namespace pandastack::gateway
