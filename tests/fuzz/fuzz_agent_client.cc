// The host side of the agent protocol against a guest agent we do not trust (a guest's root owns
// its agent): the real client (vmm-driver/agent_client.cc) over a real socket talks to a fake
// agent whose every answer comes from the input. The first byte picks the mode: raw (the bytes
// after the session preamble are written as they are: malformed framing, truncated or huge
// messages) or structured (a real Cap'n Proto agent whose replies, output chunks, listings,
// processes, file data and watch events are drawn from the input: lengths past the host's limits,
// lying sizes, oversized batches and paths). Every call ends with a result or an error; never a
// crash, a hang, or memory the limits do not bound.
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "tests/fuzz/fake_peer.h"
#include "vmm-driver/agent_client.h"
#include "vmm-driver/io_thread.h"
#include "wire/agent.capnp.h"

namespace {

namespace w = pandastack::wire::agent;
using namespace std::chrono;

pandastack::vmm::IoThread& io() {
  static pandastack::vmm::IoThread* t = new pandastack::vmm::IoThread();  // lives for the process
  return *t;
}

// The input as a stream of choices; exhausted, it answers zeros.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint32_t count(uint32_t limit_past) {  // 0..254, or past the host's limit when 255
    uint8_t b = byte();
    return b == 255 ? limit_past : b;
  }
  kj::Array<kj::byte> bytes(size_t len) {
    auto a = kj::heapArray<kj::byte>(len);
    for (auto& x : a) x = byte();
    return a;
  }
  std::string text(size_t len) {
    std::string s;
    for (size_t i = 0; i < len; ++i) s += char(byte());
    return s;
  }
};

class FakeAgent final : public w::Agent::Server {
 public:
  explicit FakeAgent(Input& in) : in_(in) {}

  kj::Promise<void> health(HealthContext ctx) override {
    auto r = ctx.getResults();
    r.setVersion(in_.text(in_.byte()));
    r.setProtocolVersion(in_.byte());
    r.setBootId(in_.text(in_.byte()));
    return kj::READY_NOW;
  }
  kj::Promise<void> exec(ExecContext ctx) override {
    auto r = ctx.getResults().initResult();
    r.setExitCode(int8_t(in_.byte()));
    r.setTimedOut(in_.byte() & 1);
    r.setStdout(in_.bytes(size_t(in_.byte()) * in_.byte()));
    r.setError(in_.text(in_.byte() & 7));
    return kj::READY_NOW;
  }
  kj::Promise<void> execStream(ExecStreamContext ctx) override {
    auto sink = ctx.getParams().getSink();
    kj::Promise<void> p = kj::READY_NOW;
    for (uint32_t i = 0, n = in_.byte() & 15; i < n; ++i) {
      auto req = sink.writeRequest();
      req.setKind(in_.byte() & 1 ? w::StreamKind::STDERR : w::StreamKind::STDOUT);
      req.setData(in_.bytes(in_.byte()));
      p = p.then([req = kj::mv(req)]() mutable { return req.send(); });
    }
    return p.then([ctx, this]() mutable { ctx.getResults().initResult().setExitCode(in_.byte()); });
  }
  kj::Promise<void> listDir(ListDirContext ctx) override {
    auto list = ctx.getResults().initEntries(in_.count(pandastack::vmm::kMaxListEntries + 1));
    for (auto e : list) {
      e.setName(in_.text(in_.byte() & 31));
      e.setType(static_cast<w::FileType>(in_.byte() & 7));  // also values that are no type
      e.setSize(uint64_t(in_.byte()) << (in_.byte() & 63));
    }
    return kj::READY_NOW;
  }
  kj::Promise<void> readFile(ReadFileContext ctx) override {
    auto r = ctx.getResults();
    if (in_.byte() & 1) {
      auto e = r.initError();
      e.setCode(in_.text(in_.byte() & 15));
      e.setMessage(in_.text(in_.byte() & 15));
    }
    r.setSize(uint64_t(in_.byte()) << (in_.byte() & 63));  // a size that may lie
    r.setData(in_.bytes(size_t(in_.byte()) << (in_.byte() & 15)));
    return kj::READY_NOW;
  }
  kj::Promise<void> stat(StatContext ctx) override {
    auto s = ctx.getResults().initStat();
    s.setName(in_.text(in_.byte()));
    s.setType(static_cast<w::FileType>(in_.byte() & 7));
    s.setMode(uint32_t(in_.byte()) << 8 | in_.byte());
    return kj::READY_NOW;
  }
  kj::Promise<void> listProcesses(ListProcessesContext ctx) override {
    auto list = ctx.getResults().initProcesses(in_.count(pandastack::vmm::kMaxListEntries + 1));
    for (auto p : list) {
      p.setPid(in_.byte());
      p.setCommand(in_.text(in_.byte() & 31));
      p.setRunning(in_.byte() & 1);
      p.setPty(in_.byte() & 1);
    }
    return kj::READY_NOW;
  }
  kj::Promise<void> resizePty(ResizePtyContext ctx) override {
    ctx.getResults().setError(in_.text(in_.byte() & 15));
    return kj::READY_NOW;
  }
  kj::Promise<void> watch(WatchContext ctx) override {
    auto sink = ctx.getParams().getSink();
    kj::Promise<void> p = in_.byte() & 1 ? sink.readyRequest().send().ignoreResult()
                                         : kj::Promise<void>(kj::READY_NOW);
    for (uint32_t b = 0, batches = in_.byte() & 7; b < batches; ++b) {
      auto req = sink.eventsRequest();
      auto list = req.initEvents(in_.count(pandastack::vmm::kMaxWatchBatch + 1));
      for (auto e : list) {
        e.setKind(static_cast<w::WatchEventKind>(in_.byte() & 7));
        size_t len = in_.byte() == 255 ? pandastack::vmm::kMaxWatchPathBytes + 1 : in_.byte() & 31;
        e.setPath(std::string(len, 'p'));
        e.setIsDir(in_.byte() & 1);
      }
      p = p.then([req = kj::mv(req)]() mutable { return req.send(); });
    }
    return p.catch_([](kj::Exception&&) {});  // the host refused a batch: the watch ends
  }

 private:
  Input& in_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::socket_path("agent");
  int listener = fuzz::listen_at(path);
  Input in{data, size};
  bool raw = in.byte() & 1;
  std::thread guest([&] {
    int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) return;
    char preamble[16];
    size_t got = 0;
    while (got < sizeof preamble) {
      ssize_t n = ::recv(c, preamble + got, sizeof preamble - got, 0);
      if (n <= 0) break;
      got += size_t(n);
    }
    // The agent's answer to the preamble (wire/agent.capnp sessionAckMagic + its nonce); the
    // fuzzed bytes follow it.
    if (got == sizeof preamble) {
      char ack[16];
      memcpy(ack, w::SESSION_ACK_MAGIC.get().begin(), 8);
      memcpy(ack + 8, preamble + 8, 8);
      if (::send(c, ack, sizeof ack, MSG_NOSIGNAL) != ssize_t(sizeof ack)) return;
    }
    if (raw) return fuzz::answer_raw(c, in.p, in.n);
    auto kio = kj::setupAsyncIo();
    auto stream =
        kio.lowLevelProvider->wrapSocketFd(c, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
    capnp::TwoPartyVatNetwork net(*stream, capnp::rpc::twoparty::Side::SERVER);
    auto rpc = capnp::makeRpcServer(net, kj::heap<FakeAgent>(in));
    net.onDisconnect().wait(kio.waitScope);
  });
  namespace v = pandastack::vmm;
  auto agent = v::AgentClient::connect(io(), path, -1, milliseconds(2000));
  if (agent) {
    auto& a = **agent;
    (void)a.health(milliseconds(300));
    v::ExecRequest req;
    req.shell = "true";
    req.timeout_ms = 300;  // the host's deadline ends a call the guest never answers
    (void)a.exec(req);
    (void)a.exec_stream(req, [](v::StreamKind, std::string_view) {});
    (void)a.list_dir("/");
    (void)a.read_file("/f", 1 << 20);
    (void)a.stat("/f");
    (void)a.list_processes();
    (void)a.resize_pty(1, 80, 24);
    // A watch the fake never ends is stopped after 300 ms (as a client that leaves).
    std::stop_source stop;
    std::mutex mu;
    std::condition_variable cv;
    bool watched = false;
    std::thread stopper([&] {
      std::unique_lock l(mu);
      if (!cv.wait_for(l, milliseconds(300), [&] { return watched; })) stop.request_stop();
    });
    (void)a.watch(
        "/", true, [] {}, [](const std::vector<v::WatchEvent>&) {}, stop.get_token());
    {
      std::lock_guard l(mu);
      watched = true;
    }
    cv.notify_all();
    stopper.join();
    agent->reset();  // closes the host's end: the fake's session ends
  }
  ::shutdown(listener, SHUT_RDWR);
  guest.join();
  ::close(listener);
  return 0;
}
