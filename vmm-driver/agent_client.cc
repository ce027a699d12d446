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

#include "vmm-driver/agent_internal.h"
#include "vmm-driver/io_thread.h"
#include "wire/agent.capnp.h"

namespace pandastack::vmm {

using namespace agent_detail;

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

namespace {

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
  b.setUser(r.user);
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
                          .then([&conn](auto r) {
                            conn.protocol = r.getProtocolVersion();
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
      conn_->protocol = h.protocol_version;
      return Result<Health>(h);
    }),
                                 timeout, "health");
  });
}

Status AgentClient::require_protocol(uint32_t version, const char* feature) {
  uint32_t known = conn_->protocol;
  if (known == 0) {
    auto h = health(kCallTimeout);
    if (!h) return h.error();
    known = h->protocol_version;
  }
  if (known >= version) return Ok{};
  return make_error(ErrorCode::invalid_argument,
                    std::string("this sandbox's guest agent is older than ") + feature +
                        " (its protocol " + std::to_string(known) + ", needed " +
                        std::to_string(version) + "): create it again from its template");
}

Result<ExecResult> AgentClient::exec(const ExecRequest& request, std::stop_token stop) {
  if (!request.user.empty())
    if (auto ok = require_protocol(2, "running commands as a user"); !ok) return ok.error();
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
  if (!request.user.empty())
    if (auto ok = require_protocol(2, "running commands as a user"); !ok) return ok.error();
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
  if (!request.user.empty())
    if (auto ok = require_protocol(2, "running commands as a user"); !ok) return ok.error();
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
                                  bool free_page_reporting, milliseconds timeout) {
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
    // Best effort (an agent that cannot costs memory, not correctness).
    auto reporting = conn_->agent.setFreePageReportingRequest();
    reporting.setEnabled(free_page_reporting);
    calls.add(reporting.send().ignoreResult().catch_([](kj::Exception&& e) {
      if (e.getType() != kj::Exception::Type::UNIMPLEMENTED) kj::throwFatalException(kj::mv(e));
    }));
    return with_deadline<Ok>(
        io_, kj::joinPromises(calls.releaseAsArray()).then([]() { return Result<Ok>(Ok{}); }),
        timeout, "afterRestore");
  });
}

Status AgentClient::set_free_page_reporting(bool on) {
  return call<Ok>([&]() -> kj::Promise<Result<Ok>> {
    auto req = conn_->agent.setFreePageReportingRequest();
    req.setEnabled(on);
    return with_deadline<Ok>(io_,
                             req.send()
                                 .then([](auto) { return Result<Ok>(Ok{}); })
                                 .catch_([](kj::Exception&& e) -> Result<Ok> {
                                   if (e.getType() != kj::Exception::Type::UNIMPLEMENTED)
                                     kj::throwFatalException(kj::mv(e));
                                   return Ok{};
                                 }),
                             kCallTimeout, "setFreePageReporting");
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
