#include "vmm-driver/agent_client.h"

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "vmm-driver/io_thread.h"
#include "wire/agent.capnp.h"

namespace pandastack::vmm {

namespace w = pandastack::wire::agent;
using namespace std::chrono;

// The session's view of the agent channel: discards what the agent wrote before its answer to
// this session's preamble (wire/agent.capnp sessionAckMagic + nonce), then passes bytes through.
// RPC reads through it, so an earlier session's late bytes (an abort, a late reply) are never
// read as this session's messages. Reads until the answer are exact-size: no RPC byte is taken.
class SessionStream final : public kj::AsyncIoStream {
 public:
  // `answered` (owned by the connection, which outlives this) is set once the answer is read.
  SessionStream(kj::AsyncIoStream& inner, uint64_t nonce, std::atomic<bool>& answered)
      : inner_(inner), nonce_(nonce), answered_flag_(answered) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    if (answered_) return inner_.tryRead(buffer, min, max);
    return seek(0).then([this, buffer, min, max](bool found) -> kj::Promise<size_t> {
      if (!found) return size_t(0);  // EOF before the answer
      answered_ = true;
      answered_flag_ = true;
      if (skipped_ > 0)
        spdlog::debug("agent session: {} stale bytes before the agent's answer", skipped_);
      return inner_.tryRead(buffer, min, max);
    });
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_.write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_.write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_.whenWriteDisconnected(); }
  void shutdownWrite() override { inner_.shutdownWrite(); }
  void abortRead() override { inner_.abortRead(); }

 private:
  // Fills window_ from `have` bytes and slides until it holds the answer. False on EOF.
  kj::Promise<bool> seek(size_t have) {
    return inner_.tryRead(window_ + have, 16 - have, 16 - have)
        .then([this, have](size_t n) mutable -> kj::Promise<bool> {
          if (n == 0) return false;
          have += n;
          if (have < 16) return seek(have);
          auto magic = w::SESSION_ACK_MAGIC.get();
          uint64_t got = 0;
          for (int i = 0; i < 8; ++i) got |= uint64_t(window_[8 + i]) << (8 * i);
          if (memcmp(window_, magic.begin(), 8) == 0 && got == nonce_) return true;
          // Slide to the next byte that may start the answer (or past the whole window).
          auto* start = std::find(window_ + 1, window_ + 16, magic[0]);
          size_t keep = size_t(window_ + 16 - start);
          memmove(window_, start, keep);
          skipped_ += 16 - keep;
          return seek(keep);
        });
  }

  kj::AsyncIoStream& inner_;
  uint64_t nonce_;
  std::atomic<bool>& answered_flag_;
  bool answered_ = false;
  uint64_t skipped_ = 0;
  kj::byte window_[16] = {};
};

struct AgentClient::Conn {
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<SessionStream> session;  // over `stream`, one per session
  kj::Own<capnp::TwoPartyVatNetwork> network;
  kj::Own<capnp::RpcSystem<capnp::rpc::twoparty::VatId>> rpc;
  w::Agent::Client agent = nullptr;
  kj::Maybe<kj::ForkedPromise<Health>> first_health;
  std::atomic<bool> answered{false};  // the agent answered this session's preamble
};

namespace {

kj::Duration kj_ms(milliseconds ms) { return ms.count() * kj::MILLISECONDS; }

template <typename T>
kj::Promise<Result<T>> with_deadline(IoThread& io, kj::Promise<Result<T>> p, milliseconds limit,
                                     std::string what) {
  return p.exclusiveJoin(io.timer().afterDelay(kj_ms(limit)).then([what = kj::mv(what), limit]() {
    return Result<T>(make_error(
        ErrorCode::timeout,
        what + ": no answer from the guest agent within " + std::to_string(limit.count()) + " ms"));
  }));
}

// The host's own deadline for a command: the guest enforces `timeout_ms`, but a starved or hostile
// guest may never answer. After the timeout plus a grace the call is dropped (which kills the
// command in the guest once it gets there) and answered as timed out.
constexpr milliseconds kExecGrace{5000};
kj::Promise<Result<ExecResult>> host_deadline(IoThread& io, uint32_t timeout_ms,
                                              kj::Promise<Result<ExecResult>> p) {
  if (timeout_ms == 0) return p;
  auto limit = milliseconds(timeout_ms) + kExecGrace;
  return p.exclusiveJoin(io.timer().afterDelay(kj_ms(limit)).then([limit]() {
    ExecResult r;
    r.exit_code = -9;
    r.timed_out = true;
    r.duration_us = uint64_t(duration_cast<microseconds>(limit).count());
    r.stderr_data =
        "[pandastack: the guest did not end the command by its timeout; the host did]\n";
    return Result<ExecResult>(r);
  }));
}

// Runs `f` (which returns a Promise<Result<T>>) on the IoThread; KJ exceptions become agent_error.
// A lost connection also sets `*disconnected` (when given).
template <typename T, typename F>
Result<T> on_io(IoThread& io, F&& f, std::atomic<bool>* disconnected = nullptr) {
  try {
    return io.run(std::forward<F>(f));
  } catch (const kj::Exception& e) {
    std::string msg = e.getDescription().cStr();
    if (e.getType() == kj::Exception::Type::DISCONNECTED) {
      msg = "agent disconnected: " + msg;
      if (disconnected != nullptr) *disconnected = true;
    }
    return make_error(ErrorCode::agent_error, msg);
  }
}

Error guest_file_error(w::Error::Reader e) {
  std::string code = e.getCode().cStr();
  Error err{code == "not_found" ? ErrorCode::not_found
                                : (code == "invalid_argument" ? ErrorCode::invalid_argument
                                                              : ErrorCode::guest_error),
            e.getMessage().cStr(), code};
  return err;
}

void fill_request(w::ExecRequest::Builder b, const ExecRequest& r) {
  if (!r.argv.empty()) {
    auto argv = b.initArgv(r.argv.size());
    for (size_t i = 0; i < r.argv.size(); ++i) argv.set(i, r.argv[i]);
  } else {
    b.setShell(r.shell);
  }
  auto env = b.initEnv(r.env.size());
  size_t i = 0;
  for (auto& [k, v] : r.env) {
    env[i].setName(k);
    env[i].setValue(v);
    ++i;
  }
  b.setCwd(r.cwd);
  b.setStdin(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(r.stdin_data.data()), r.stdin_data.size()));
  b.setTimeoutMs(r.timeout_ms);
  b.setMaxOutputBytes(r.max_output_bytes);
  b.setKeepStdinOpen(r.keep_stdin_open);
  b.setPty(r.pty);
  b.setCols(r.cols);
  b.setRows(r.rows);
}

std::string to_string(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

ExecResult read_result(w::ExecResult::Reader r) {
  ExecResult out;
  out.exit_code = r.getExitCode();
  out.timed_out = r.getTimedOut();
  out.stdout_data = to_string(r.getStdout());
  out.stderr_data = to_string(r.getStderr());
  out.stdout_truncated = r.getStdoutTruncated();
  out.stderr_truncated = r.getStderrTruncated();
  out.duration_us = r.getDurationUs();
  out.error = r.getError().cStr();
  return out;
}

FileStat read_stat(w::FileStat::Reader s) {
  FileStat f;
  f.name = s.getName().cStr();
  switch (s.getType()) {
    case w::FileType::REGULAR:
      f.type = FileStat::Type::regular;
      break;
    case w::FileType::DIRECTORY:
      f.type = FileStat::Type::directory;
      break;
    case w::FileType::SYMLINK:
      f.type = FileStat::Type::symlink;
      break;
    default:
      f.type = FileStat::Type::other;
  }
  f.size = s.getSize();
  f.mode = s.getMode();
  f.mtime_ms = s.getMtimeMs();
  return f;
}

// The host's end of an output stream. The guest holds the capability and may call it at any time,
// also after the call it belongs to ended (a hostile guest keeps it; a benign one has writes in
// flight): the callback is revoked when the call ends (see revocable_sink), after which every
// write fails and the caller's objects (the callback's captures) are never touched again.
struct SinkState {
  OutputCallback cb;  // null once revoked; only used on the IoThread
};

class SinkImpl final : public w::OutputSink::Server {
 public:
  explicit SinkImpl(std::shared_ptr<SinkState> st) : st_(kj::mv(st)) {}
  kj::Promise<void> write(WriteContext ctx) override {
    if (!st_->cb) return KJ_EXCEPTION(DISCONNECTED, "the output stream has ended");
    auto p = ctx.getParams();
    auto d = p.getData();
    st_->cb(p.getKind() == w::StreamKind::STDOUT ? StreamKind::out : StreamKind::err,
            std::string_view(reinterpret_cast<const char*>(d.begin()), d.size()));
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<SinkState> st_;
};

// A sink for `cb` and the guard that revokes it: attach the guard to the call's promise, so the
// callback is dropped when the call ends, however it ends (done, failed, cancelled).
std::pair<kj::Own<SinkImpl>, kj::Own<void>> revocable_sink(OutputCallback cb) {
  auto st = std::make_shared<SinkState>(SinkState{std::move(cb)});
  auto guard = kj::heap(kj::defer([st]() { st->cb = nullptr; }));
  return {kj::heap<SinkImpl>(st), kj::Own<void>(kj::mv(guard))};
}

// The host's end of a watch: like SinkImpl, revoked when the call ends. A batch is checked before
// it reaches the callback: at most kMaxWatchBatch events, paths at most kMaxWatchPathBytes.
struct WatchSinkState {
  std::function<void()> on_ready;
  WatchCallback on_events;  // null once revoked
};

class WatchSinkImpl final : public w::WatchSink::Server {
 public:
  explicit WatchSinkImpl(std::shared_ptr<WatchSinkState> st) : st_(kj::mv(st)) {}
  kj::Promise<void> ready(ReadyContext) override {
    if (!st_->on_events) return KJ_EXCEPTION(DISCONNECTED, "the watch has ended");
    if (auto f = std::exchange(st_->on_ready, nullptr)) f();
    return kj::READY_NOW;
  }
  kj::Promise<void> events(EventsContext ctx) override {
    if (!st_->on_events) return KJ_EXCEPTION(DISCONNECTED, "the watch has ended");
    auto list = ctx.getParams().getEvents();
    if (list.size() > kMaxWatchBatch)
      return KJ_EXCEPTION(FAILED, "the guest sent more watch events in a batch than allowed");
    std::vector<WatchEvent> out;
    out.reserve(list.size());
    for (auto e : list) {
      if (e.getPath().size() > kMaxWatchPathBytes)
        return KJ_EXCEPTION(FAILED, "the guest sent a watch path longer than allowed");
      WatchEvent ev;
      switch (e.getKind()) {
        case w::WatchEventKind::CREATE:
          ev.kind = WatchEvent::Kind::create;
          break;
        case w::WatchEventKind::WRITE:
          ev.kind = WatchEvent::Kind::write;
          break;
        case w::WatchEventKind::REMOVE:
          ev.kind = WatchEvent::Kind::remove;
          break;
        case w::WatchEventKind::RENAME:
          ev.kind = WatchEvent::Kind::rename;
          break;
        case w::WatchEventKind::CHMOD:
          ev.kind = WatchEvent::Kind::chmod;
          break;
        default:
          ev.kind = WatchEvent::Kind::overflow;
      }
      ev.path = e.getPath().cStr();
      ev.is_dir = e.getIsDir();
      out.push_back(std::move(ev));
    }
    st_->on_events(out);
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<WatchSinkState> st_;
};

// Lets another thread cancel a call running on the IoThread (std::stop_token -> kj::Canceler).
struct CancelSlot {
  std::mutex mu;
  kj::Canceler* canceler = nullptr;  // set and cleared on the IoThread
};

template <typename T, typename F>
Result<T> cancellable(IoThread& io, std::stop_token stop, F&& make_promise,
                      std::atomic<bool>* disconnected) {
  auto slot = std::make_shared<CancelSlot>();
  std::stop_callback on_stop(stop, [&io, slot] {
    auto cancel = [slot] {
      std::lock_guard lock(slot->mu);
      if (slot->canceler != nullptr) slot->canceler->cancel("cancelled by the host");
    };
    if (io.on_loop_thread())
      cancel();
    else
      io.run(cancel);
  });
  return on_io<T>(
      io,
      [&, slot]() -> kj::Promise<Result<T>> {
        auto canceler = kj::heap<kj::Canceler>();
        {
          std::lock_guard lock(slot->mu);
          slot->canceler = canceler.get();
        }
        if (stop.stop_requested()) canceler->cancel("cancelled by the host");
        auto p = canceler->wrap(make_promise());
        return p
            .then(
                [slot](Result<T> r) {
                  std::lock_guard lock(slot->mu);
                  slot->canceler = nullptr;
                  return r;
                },
                [slot](kj::Exception&& e) -> Result<T> {
                  {
                    std::lock_guard lock(slot->mu);
                    slot->canceler = nullptr;
                  }
                  if (std::string(e.getDescription().cStr()).find("cancelled by the host") !=
                      std::string::npos)
                    return make_error(ErrorCode::agent_error, "cancelled");
                  kj::throwFatalException(kj::mv(e));
                })
            .attach(kj::mv(canceler));
      },
      disconnected);
}

void start_rpc(AgentClient::Conn& conn) {
  // Twice the largest legitimate reply (a command's 16 MiB stdout and 16 MiB stderr, plus
  // framing): a guest cannot make the daemon take a 512 MiB message (capnp's default).
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = kMaxGuestMessageBytes / 8;
  conn.network =
      kj::heap<capnp::TwoPartyVatNetwork>(*conn.session, capnp::rpc::twoparty::Side::CLIENT, opts);
  conn.rpc = kj::heap(capnp::makeRpcClient(*conn.network));
  capnp::MallocMessageBuilder vat;
  auto id = vat.initRoot<capnp::rpc::twoparty::VatId>();
  id.setSide(capnp::rpc::twoparty::Side::SERVER);
  conn.agent = conn.rpc->bootstrap(id).castAs<w::Agent>();
  // Ask once; the answer arrives when the guest's agent opens its port.
  conn.first_health = conn.agent.healthRequest()
                          .send()
                          .then([](auto r) {
                            return Health{r.getVersion().cStr(), r.getProtocolVersion(),
                                          r.getUptimeMs(), r.getBootId().cStr()};
                          })
                          .fork();
}

void stop_rpc(AgentClient::Conn& conn) {
  conn.first_health = nullptr;
  conn.agent = nullptr;
  conn.rpc = nullptr;
  conn.network = nullptr;
}

// Writes the session preamble (wire/agent.capnp sessionMagic + nonce), then starts RPC over a
// SessionStream that waits for the agent's answer to it (the first health call resolves after).
kj::Promise<void> begin_session(AgentClient::Conn& conn) {
  auto magic = w::SESSION_MAGIC.get();
  auto preamble = kj::heapArray<kj::byte>(16);
  memcpy(preamble.begin(), magic.begin(), 8);
  std::random_device rd;
  uint64_t nonce = (uint64_t(rd()) << 32) | rd();
  for (int i = 0; i < 8; ++i) preamble[8 + i] = kj::byte(nonce >> (8 * i));
  auto p = conn.stream->write(preamble.begin(), preamble.size());
  return p.attach(kj::mv(preamble)).then([&conn, nonce]() {
    conn.answered = false;
    conn.network = nullptr;  // (a previous session's, over the previous SessionStream)
    conn.session = kj::heap<SessionStream>(*conn.stream, nonce, conn.answered);
    start_rpc(conn);
  });
}

}  // namespace

Status AgentClient::end_session(milliseconds timeout) {
  return on_io<Ok>(io_, [&]() -> kj::Promise<Result<Ok>> {
    auto done = conn_->agent.endSessionRequest().send().then([this](auto) {
      stop_rpc(*conn_);
      return Result<Ok>(Ok{});
    });
    return with_deadline<Ok>(io_, kj::mv(done), timeout, "endSession");
  });
}

Status AgentClient::reset_session(milliseconds timeout) {
  auto ended = end_session(timeout);
  if (!ended) return ended;
  return start_session();
}

Status AgentClient::start_session() {
  auto s = on_io<Ok>(
      io_, [&]() { return begin_session(*conn_).then([]() { return Result<Ok>(Ok{}); }); });
  if (s) disconnected_ = false;  // (calls of the ended session failed as disconnected)
  return s;
}

template <typename T, typename F>
Result<T> AgentClient::call(F&& f) {
  ++in_flight_;
  auto r = on_io<T>(io_, std::forward<F>(f), &disconnected_);
  --in_flight_;
  return r;
}

template <typename T, typename F>
Result<T> AgentClient::call_cancellable(std::stop_token stop, F&& f) {
  ++in_flight_;
  auto r = cancellable<T>(io_, stop, std::forward<F>(f), &disconnected_);
  --in_flight_;
  return r;
}

AgentClient::AgentClient(IoThread& io, std::unique_ptr<Conn> conn)
    : io_(io), conn_(std::move(conn)) {}

bool AgentClient::answered() const { return conn_->answered; }

AgentClient::~AgentClient() {
  // Capabilities and the network must die on the thread that owns them.
  try {
    io_.run([this]() {
      if (conn_) stop_rpc(*conn_);
      conn_.reset();
    });
  } catch (...) {
  }
}

Result<std::unique_ptr<AgentClient>> AgentClient::connect(IoThread& io,
                                                          const std::string& socket_path,
                                                          int64_t peer_uid, milliseconds deadline) {
  if (socket_path.size() >= 108)
    return make_error(ErrorCode::invalid_argument, "agent socket path too long: " + socket_path);
  auto until = steady_clock::now() + deadline;
  for (;;) {
    auto conn = std::make_unique<Conn>();
    std::string err;
    try {
      io.run([&]() {
        return io.provider()
            .getNetwork()
            .parseAddress(kj::str("unix:", socket_path.c_str()))
            .then([](kj::Own<kj::NetworkAddress> addr) {
              return addr->connect().attach(kj::mv(addr));
            })
            .then([&](kj::Own<kj::AsyncIoStream> stream) {
              if (peer_uid >= 0) {
                ucred cred{};
                uint len = sizeof cred;
                stream->getsockopt(SOL_SOCKET, SO_PEERCRED, &cred, &len);
                if (int64_t(cred.uid) != peer_uid)
                  KJ_FAIL_REQUIRE("the agent socket is served by another uid than this VM's QEMU",
                                  cred.uid, peer_uid);
              }
              conn->stream = kj::mv(stream);
              return begin_session(*conn);
            });
      });
      return std::unique_ptr<AgentClient>(new AgentClient(io, std::move(conn)));
    } catch (const kj::Exception& e) {
      err = e.getDescription().cStr();
      io.run([&]() { conn.reset(); });
    }
    if (steady_clock::now() >= until)
      return make_error(ErrorCode::timeout,
                        "cannot connect to agent socket " + socket_path + ": " + err);
    std::this_thread::sleep_for(microseconds(500));
  }
}

Result<Health> AgentClient::health(milliseconds timeout) {
  return call<Health>([&]() -> kj::Promise<Result<Health>> {
    kj::Promise<Health> p = nullptr;
    KJ_IF_MAYBE (first, conn_->first_health) {
      p = first->addBranch();
    } else {
      p = conn_->agent.healthRequest().send().then([](auto r) {
        return Health{r.getVersion().cStr(), r.getProtocolVersion(), r.getUptimeMs(),
                      r.getBootId().cStr()};
      });
    }
    return with_deadline<Health>(io_, p.then([this](Health h) {
      conn_->first_health = nullptr;  // answered: later calls ask afresh
      return Result<Health>(h);
    }),
                                 timeout, "health");
  });
}

Result<ExecResult> AgentClient::exec(const ExecRequest& request, std::stop_token stop) {
  return call_cancellable<ExecResult>(stop, [&]() -> kj::Promise<Result<ExecResult>> {
    auto req = conn_->agent.execRequest();
    fill_request(req.initRequest(), request);
    return host_deadline(io_, request.timeout_ms, req.send().then([](auto r) {
      return Result<ExecResult>(read_result(r.getResult()));
    }));
  });
}

Result<ExecResult> AgentClient::exec_stream(const ExecRequest& request, OutputCallback on_output,
                                            std::stop_token stop) {
  return call_cancellable<ExecResult>(stop, [&]() -> kj::Promise<Result<ExecResult>> {
    auto req = conn_->agent.execStreamRequest();
    fill_request(req.initRequest(), request);
    auto [sink, guard] = revocable_sink(std::move(on_output));
    req.setSink(kj::mv(sink));
    return host_deadline(
        io_, request.timeout_ms,
        req.send()
            .then([](auto r) { return Result<ExecResult>(read_result(r.getResult())); })
            .attach(kj::mv(guard)));
  });
}

Result<uint32_t> AgentClient::start_process(const ExecRequest& request) {
  return call<uint32_t>([&]() -> kj::Promise<Result<uint32_t>> {
    auto req = conn_->agent.startProcessRequest();
    fill_request(req.initRequest(), request);
    return with_deadline<uint32_t>(io_, req.send().then([](auto r) -> Result<uint32_t> {
      if (r.getError().size() > 0) return make_error(ErrorCode::guest_error, r.getError().cStr());
      return r.getPid();
    }),
                                   kCallTimeout, "startProcess");
  });
}

Result<ExecResult> AgentClient::wait_process(uint32_t pid) {
  return call<ExecResult>([&]() -> kj::Promise<Result<ExecResult>> {
    auto req = conn_->agent.waitProcessRequest();
    req.setPid(pid);
    return req.send().then([](auto r) -> Result<ExecResult> {
      if (r.getError().size() > 0) return make_error(ErrorCode::not_found, r.getError().cStr());
      return read_result(r.getResult());
    });
  });
}

Status AgentClient::kill_process(uint32_t pid, int signal) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.killProcessRequest();
    req.setPid(pid);
    req.setSignal(signal);
    return with_deadline<Ok>(io_, req.send().then([](auto r) -> Result<Ok> {
      if (r.getError().size() > 0) return make_error(ErrorCode::not_found, r.getError().cStr());
      return Ok{};
    }),
                             kCallTimeout, "killProcess");
  });
}

Status AgentClient::write_stdin(uint32_t pid, std::string_view data, bool close) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.writeStdinRequest();
    req.setPid(pid);
    req.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(data.data()), data.size()));
    req.setClose(close);
    return with_deadline<Ok>(io_, req.send().then([](auto r) -> Result<Ok> {
      if (r.getError().size() > 0)
        return make_error(ErrorCode::invalid_argument, r.getError().cStr());
      return Ok{};
    }),
                             kCallTimeout, "writeStdin");
  });
}

Result<ExecResult> AgentClient::stream_process(uint32_t pid, OutputCallback on_output,
                                               std::stop_token stop) {
  return call_cancellable<ExecResult>(stop, [&]() -> kj::Promise<Result<ExecResult>> {
    auto req = conn_->agent.streamProcessRequest();
    req.setPid(pid);
    auto [sink, guard] = revocable_sink(std::move(on_output));
    req.setSink(kj::mv(sink));
    return req.send()
        .then([](auto r) -> Result<ExecResult> {
          if (r.getError().size() > 0) return make_error(ErrorCode::not_found, r.getError().cStr());
          return read_result(r.getResult());
        })
        .attach(kj::mv(guard));
  });
}

Result<std::vector<ProcessInfo>> AgentClient::list_processes() {
  using V = std::vector<ProcessInfo>;
  return call<V>([&]() -> kj::Promise<Result<V>> {
    return with_deadline<V>(
        io_, conn_->agent.listProcessesRequest().send().then([](auto r) -> Result<V> {
          V out;
          if (r.getProcesses().size() > kMaxListEntries)
            return make_error(
                ErrorCode::guest_error,
                "the guest listed more than " + std::to_string(kMaxListEntries) + " processes");
          for (auto p : r.getProcesses())
            out.push_back({p.getPid(), p.getCommand().cStr(), p.getRunning(), p.getExitCode(),
                           p.getStartedAtMs(), p.getPty()});
          return out;
        }),
        kCallTimeout, "listProcesses");
  });
}

const char* to_string(WatchEvent::Kind kind) {
  switch (kind) {
    case WatchEvent::Kind::create:
      return "create";
    case WatchEvent::Kind::write:
      return "write";
    case WatchEvent::Kind::remove:
      return "remove";
    case WatchEvent::Kind::rename:
      return "rename";
    case WatchEvent::Kind::chmod:
      return "chmod";
    case WatchEvent::Kind::overflow:
      return "overflow";
  }
  return "overflow";
}

Status AgentClient::resize_pty(uint32_t pid, uint16_t cols, uint16_t rows) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.resizePtyRequest();
    req.setPid(pid);
    req.setCols(cols);
    req.setRows(rows);
    return with_deadline<Ok>(io_, req.send().then([](auto r) -> Result<Ok> {
      if (r.getError().size() > 0)
        return make_error(ErrorCode::invalid_argument, r.getError().cStr());
      return Ok{};
    }),
                             kCallTimeout, "resizePty");
  });
}

Status AgentClient::watch(const std::string& path, bool recursive, std::function<void()> on_ready,
                          WatchCallback on_events, std::stop_token stop) {
  return call_cancellable<Ok>(stop, [&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.watchRequest();
    req.setPath(path);
    req.setRecursive(recursive);
    auto st =
        std::make_shared<WatchSinkState>(WatchSinkState{std::move(on_ready), std::move(on_events)});
    auto guard = kj::heap(kj::defer([st]() {
      st->on_ready = nullptr;
      st->on_events = nullptr;
    }));
    req.setSink(kj::heap<WatchSinkImpl>(st));
    return req.send()
        .then([](auto r) -> Result<Ok> {
          if (r.hasError()) return guest_file_error(r.getError());
          return Ok{};
        })
        .attach(kj::mv(guard));
  });
}

namespace {
constexpr uint32_t kChunk = 4u << 20;

kj::Promise<Result<std::string>> read_rest(w::Agent::Client agent, std::string path,
                                           kj::Own<std::string> acc, uint64_t max_bytes) {
  auto req = agent.readFileRequest();
  req.setPath(path);
  req.setOffset(acc->size());
  req.setLength(kChunk);
  return req.send().then([agent, path = kj::mv(path), acc = kj::mv(acc),
                          max_bytes](auto r) mutable -> kj::Promise<Result<std::string>> {
    if (r.hasError()) return Result<std::string>(guest_file_error(r.getError()));
    if (r.getSize() > max_bytes)
      return Result<std::string>(
          make_error(ErrorCode::invalid_argument, path + " is " + std::to_string(r.getSize()) +
                                                      " bytes, more than the limit of " +
                                                      std::to_string(max_bytes)));
    auto d = r.getData();
    // The guest's word is checked, not trusted: a chunk is at most what was asked, and the whole
    // is at most max_bytes however the guest reports the size.
    if (d.size() > kChunk)
      return Result<std::string>(make_error(
          ErrorCode::agent_error, "readFile answered " + std::to_string(d.size()) +
                                      " bytes for a read of at most " + std::to_string(kChunk)));
    if (acc->size() + d.size() > max_bytes)
      return Result<std::string>(
          make_error(ErrorCode::invalid_argument,
                     path + " is more than the limit of " + std::to_string(max_bytes) + " bytes"));
    acc->append(reinterpret_cast<const char*>(d.begin()), d.size());
    // A regular file ends at its size; a special file (size 0: /proc, devices) at end of file.
    if (d.size() == 0 || (r.getSize() > 0 && acc->size() >= r.getSize()))
      return Result<std::string>(kj::mv(*acc));
    return read_rest(kj::mv(agent), kj::mv(path), kj::mv(acc), max_bytes);
  });
}

// Reads up to `want` bytes of `path` from `start` (the bytes read so far are in `acc`).
kj::Promise<Result<FileRange>> range_rest(w::Agent::Client agent, std::string path, uint64_t start,
                                          uint64_t want, kj::Own<FileRange> acc) {
  auto req = agent.readFileRequest();
  req.setPath(path);
  req.setOffset(start + acc->data.size());
  req.setLength(uint32_t(std::min<uint64_t>(kChunk, want - acc->data.size())));
  return req.send().then([agent, path = kj::mv(path), start, want,
                          acc = kj::mv(acc)](auto r) mutable -> kj::Promise<Result<FileRange>> {
    if (r.hasError()) return Result<FileRange>(guest_file_error(r.getError()));
    auto d = r.getData();
    if (d.size() > kChunk || acc->data.size() + d.size() > want)
      return Result<FileRange>(
          make_error(ErrorCode::agent_error, "readFile answered more bytes than were asked"));
    acc->size = r.getSize();
    acc->data.append(reinterpret_cast<const char*>(d.begin()), d.size());
    if (d.size() == 0 || acc->data.size() >= want) return Result<FileRange>(kj::mv(*acc));
    return range_rest(kj::mv(agent), kj::mv(path), start, want, kj::mv(acc));
  });
}

kj::Promise<Result<Ok>> write_rest(w::Agent::Client agent, std::string path, std::string_view data,
                                   size_t offset, uint32_t mode, bool parents, bool append) {
  auto req = agent.writeFileRequest();
  req.setPath(path);
  size_t n = std::min<size_t>(kChunk, data.size() - offset);
  req.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(data.data() + offset), n));
  req.setMode(mode);
  req.setMakeParents(parents && offset == 0 && !append);
  req.setTruncate(offset == 0 && !append);
  req.setAppend(offset != 0 || append);
  return req.send().then([agent, path = kj::mv(path), data, offset, n, mode, parents,
                          append](auto r) mutable -> kj::Promise<Result<Ok>> {
    if (r.hasError()) return Result<Ok>(guest_file_error(r.getError()));
    if (offset + n >= data.size()) return Result<Ok>(Ok{});
    return write_rest(kj::mv(agent), kj::mv(path), data, offset + n, mode, parents, append);
  });
}
}  // namespace

Result<std::string> AgentClient::read_file(const std::string& path, uint64_t max_bytes) {
  return call<std::string>([&]() {
    return with_deadline<std::string>(
        io_, read_rest(conn_->agent, path, kj::heap<std::string>(), max_bytes), kCallTimeout * 4,
        "readFile");
  });
}

Result<FileRange> AgentClient::read_range(const std::string& path, uint64_t offset,
                                          uint64_t length) {
  return call<FileRange>([&]() {
    return with_deadline<FileRange>(
        io_, range_rest(conn_->agent, path, offset, length, kj::heap<FileRange>()),
        kCallTimeout * 4, "readFile");
  });
}

Status AgentClient::write_file(const std::string& path, std::string_view data, uint32_t mode,
                               bool make_parents, bool append) {
  return call<Ok>([&]() {
    return with_deadline<Ok>(io_,
                             write_rest(conn_->agent, path, data, 0, mode, make_parents, append),
                             kCallTimeout * 4, "writeFile");
  });
}

Result<std::vector<FileStat>> AgentClient::list_dir(const std::string& path) {
  using V = std::vector<FileStat>;
  return call<V>([&]() -> kj::Promise<Result<V>> {
    auto req = conn_->agent.listDirRequest();
    req.setPath(path);
    return with_deadline<V>(io_, req.send().then([](auto r) -> Result<V> {
      if (r.hasError()) return guest_file_error(r.getError());
      V out;
      if (r.getEntries().size() > kMaxListEntries)
        return make_error(ErrorCode::invalid_argument, "the folder has more than " +
                                                           std::to_string(kMaxListEntries) +
                                                           " entries: list a smaller one");
      for (auto e : r.getEntries()) out.push_back(read_stat(e));
      return out;
    }),
                            kCallTimeout, "listDir");
  });
}

Result<FileStat> AgentClient::stat(const std::string& path) {
  return call<FileStat>([&]() -> kj::Promise<Result<FileStat>> {
    auto req = conn_->agent.statRequest();
    req.setPath(path);
    return with_deadline<FileStat>(io_, req.send().then([](auto r) -> Result<FileStat> {
      if (r.hasError()) return guest_file_error(r.getError());
      return read_stat(r.getStat());
    }),
                                   kCallTimeout, "stat");
  });
}

namespace {
template <typename Resp>
Result<Ok> file_status(Resp& r) {
  if (r.hasError()) return guest_file_error(r.getError());
  return Ok{};
}
}  // namespace

Status AgentClient::remove(const std::string& path, bool recursive) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.removeRequest();
    req.setPath(path);
    req.setRecursive(recursive);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "remove");
  });
}

Status AgentClient::rename(const std::string& from, const std::string& to) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.renameRequest();
    req.setFrom(from);
    req.setTo(to);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "rename");
  });
}

Status AgentClient::mkdir(const std::string& path, bool parents, uint32_t mode) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.mkdirRequest();
    req.setPath(path);
    req.setParents(parents);
    req.setMode(mode);
    return with_deadline<Ok>(io_, req.send().then([](auto r) { return file_status(r); }),
                             kCallTimeout, "mkdir");
  });
}

Status AgentClient::set_clock(int64_t unix_nanos) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.setClockRequest();
    req.setUnixNanos(unix_nanos);
    return with_deadline<Ok>(io_, req.send().then([](auto) { return Result<Ok>(Ok{}); }),
                             kCallTimeout, "setClock");
  });
}

Status AgentClient::reseed_rng(std::string_view entropy) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.reseedRngRequest();
    req.setEntropy(kj::arrayPtr(reinterpret_cast<const kj::byte*>(entropy.data()), entropy.size()));
    return with_deadline<Ok>(io_, req.send().then([](auto) { return Result<Ok>(Ok{}); }),
                             kCallTimeout, "reseedRng");
  });
}

Status AgentClient::after_restore(int64_t unix_nanos, std::string_view entropy,
                                  const std::string& hostname, bool network,
                                  milliseconds timeout) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    kj::Vector<kj::Promise<void>> calls;
    auto clock = conn_->agent.setClockRequest();
    clock.setUnixNanos(unix_nanos);
    calls.add(clock.send().ignoreResult());
    auto seed = conn_->agent.reseedRngRequest();
    seed.setEntropy(
        kj::arrayPtr(reinterpret_cast<const kj::byte*>(entropy.data()), entropy.size()));
    calls.add(seed.send().ignoreResult());
    if (!hostname.empty()) {
      auto h = conn_->agent.setHostnameRequest();
      h.setHostname(hostname);
      calls.add(h.send().ignoreResult());
    }
    auto net = conn_->agent.setNetworkRequest();
    net.setEnabled(network);
    calls.add(net.send().ignoreResult().catch_([](kj::Exception&& e) {
      if (e.getType() != kj::Exception::Type::UNIMPLEMENTED) kj::throwFatalException(kj::mv(e));
    }));
    return with_deadline<Ok>(
        io_, kj::joinPromises(calls.releaseAsArray()).then([]() { return Result<Ok>(Ok{}); }),
        timeout, "afterRestore");
  });
}

Status AgentClient::mount_volume(uint32_t slot, const std::string& path, bool read_only,
                                 uint64_t size_bytes) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.mountVolumeRequest();
    req.setSlot(uint8_t(slot));
    req.setPath(path);
    req.setReadOnly(read_only);
    req.setSizeBytes(size_bytes);
    return with_deadline<Ok>(io_, req.send().then([](auto r) -> Result<Ok> {
      if (r.hasError()) return guest_file_error(r.getError());
      return Ok{};
    }),
                             kCallTimeout, "mountVolume");
  });
}

Status AgentClient::set_hostname(const std::string& hostname) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.setHostnameRequest();
    req.setHostname(hostname);
    return with_deadline<Ok>(io_, req.send().then([](auto) { return Result<Ok>(Ok{}); }),
                             kCallTimeout, "setHostname");
  });
}

}  // namespace pandastack::vmm
