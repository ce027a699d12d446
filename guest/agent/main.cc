// pandastack-agent: the in-VM agent. Serves wire/agent.capnp's `Agent` over the virtio-serial port
// named "agent". Single-threaded: one KJ event loop runs the RPC session, every command's pipes
// and terminals, timeouts, directory watches and the SIGCHLD reaper. When the host end hangs up
// (QEMU replaced after a restore), the session is dropped and the agent waits for the next host
// connection; background processes live on.
//
// Run as PID 1 of the guest root filesystem (`--init`): it mounts the pseudo filesystems, reaps
// every orphan, and powers nothing off on its own. `--port PATH` serves a given device or fifo
// instead.
//
// The parts: system.cc (the guest system), spawn.cc (starting a command), processes.cc (running
// and tracking commands), watcher.cc (inotify), service.cc (the RPC methods), memory.cc
// (`--zero-free-memory`), util.cc.

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <fcntl.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/debug.h>
#include <kj/main.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "guest/agent/memory.h"
#include "guest/agent/processes.h"
#include "guest/agent/service.h"
#include "guest/agent/system.h"
#include "guest/agent/users.h"
#include "guest/agent/util.h"

namespace pandastack::agent {
namespace {

// One session's view of the port. A session ends on the host's word only: endSession, a protocol
// error, or the next host's preamble. Never on the port's connection state: the guest learns of
// the host's close and open from control messages that the kernel handles apart from the data (a
// reconnecting host's new session can be read, and answered, before the old connection's close
// is seen), so a port that reads as closed says nothing about the session that runs. While it
// reads as closed, reads wait; a new preamble where the next message would start (capnp reads a
// message's first word alone; "PSTK" is no segment count) ends the session and is handed over to
// the next one (`handed_over`), so that host is answered at once.
class SessionStream final : public kj::AsyncIoStream {
 public:
  SessionStream(kj::AsyncIoStream& port, kj::Timer& timer, kj::Vector<kj::byte>& handed_over)
      : port_(port), timer_(timer), handed_over_(handed_over) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override {
    bool first_word = min_bytes == 8 && max_bytes == 8;
    return fill(static_cast<kj::byte*>(buffer), min_bytes, max_bytes, 0, first_word);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return port_.write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return port_.write(pieces);
  }
  // The port's state does not end a session (above).
  kj::Promise<void> whenWriteDisconnected() override { return kj::NEVER_DONE; }
  void shutdownWrite() override {}

 private:
  // `closed`: the port read as closed since this read began. Bytes after that which open with a
  // preamble come from a host that replaced one which died inside a message: they end the
  // session too (the partial message is dropped).
  kj::Promise<size_t> fill(kj::byte* buf, size_t min, size_t max, size_t have, bool first_word,
                           bool closed = false) {
    return port_.tryRead(buf + have, min - have, max - have)
        .then([this, buf, min, max, have, first_word,
               closed](size_t n) mutable -> kj::Promise<size_t> {
          auto magic = w::SESSION_MAGIC.get();
          if (closed && n > 0 && memcmp(buf + have, magic.begin(), std::min(n, size_t(8))) == 0) {
            handed_over_.addAll(buf + have, buf + have + n);
            return size_t(0);  // a premature end: the session ends as by a protocol error
          }
          have += n;
          if (have < min) {  // the port reads as closed: wait for the host's next bytes
            closed = closed || n == 0;
            return timer_.afterDelay(50 * kj::MILLISECONDS)
                .then([this, buf, min, max, have, first_word, closed]() {
                  return fill(buf, min, max, have, first_word, closed);
                });
          }
          if (first_word && memcmp(buf, magic.begin(), 8) == 0) {
            handed_over_.addAll(buf, buf + have);
            return size_t(0);  // the end of this session's messages
          }
          return have;
        });
  }

  kj::AsyncIoStream& port_;
  kj::Timer& timer_;
  kj::Vector<kj::byte>& handed_over_;
};

class Main {
 public:
  explicit Main(kj::ProcessContext& context) : context_(context) {}

  kj::MainBuilder::Validity set_init() {
    init_ = true;
    return true;
  }
  kj::MainBuilder::Validity set_port(kj::StringPtr p) {
    port_ = p.cStr();
    return true;
  }

  kj::MainBuilder::Validity run() {
    if (init_) {
      init_system();
      configure_network();
    }
    kj::UnixEventPort::captureSignal(SIGCHLD);
    kj::UnixEventPort::captureSignal(SIGIO);
    ::signal(SIGPIPE, SIG_IGN);
    auto io = kj::setupAsyncIo();
    Processes procs(io);
    auto reaper = procs.reap_loop().eagerlyEvaluate([](kj::Exception&& e) {
      log_line(std::string("reaper failed: ") + e.getDescription().cStr());
    });

    std::string path = port_;
    for (int i = 0; path.empty(); ++i) {
      path = find_port("agent");
      if (path.empty()) {
        if (i == 0) log_line("waiting for virtio port 'agent'");
        io.provider->getTimer().afterDelay(10 * kj::MILLISECONDS).wait(io.waitScope);
      }
    }
    int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      log_line("cannot open " + path + ": " + strerror(errno));
      return false;
    }
    // SIGIO tells us when the host end connects or disconnects.
    ::fcntl(fd, F_SETOWN, ::getpid());
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_ASYNC);
    std::string boot_id = read_small("/proc/sys/kernel/random/boot_id");
    log_line(std::string(kVersion) + " serving on " + path);
    for (;;) {
      // Wait for a host: woken by SIGIO, re-checked every 50 ms in case a signal is missed.
      while (!host_connected(fd)) {
        io.unixEventPort.onSignal(SIGIO)
            .ignoreResult()
            .exclusiveJoin(io.provider->getTimer().afterDelay(50 * kj::MILLISECONDS))
            .wait(io.waitScope);
      }
      serve_session(io, procs, fd, boot_id);
    }
  }

  kj::MainFunc getMain() {
    return kj::MainBuilder(context_, kVersion,
                           "PandaStack guest agent: serves the host over virtio-serial.")
        .addOption({"init"}, KJ_BIND_METHOD(*this, set_init),
                   "Run as PID 1: mount /tmp, /dev/pts, set hostname.")
        .addOptionWithArg({"port"}, KJ_BIND_METHOD(*this, set_port), "<path>",
                          "Serve this device instead of the virtio port named 'agent'.")
        .callAfterParsing(KJ_BIND_METHOD(*this, run))
        .build();
  }

 private:
  // Reads the session preamble (sessionMagic + 8-byte nonce) with exact-size reads, so not one
  // byte of the RPC that follows is consumed. Anything before it is discarded; the first `have`
  // bytes of `window` were read already. The nonce goes to `nonce` (8 bytes). False on EOF.
  kj::Promise<bool> read_preamble(kj::AsyncIoStream& stream, kj::Own<kj::Array<kj::byte>> window,
                                  size_t have, kj::byte* nonce) {
    auto* buf = window->begin();
    return stream.tryRead(buf + have, 16 - have, 16 - have)
        .then([this, &stream, window = kj::mv(window), have,
               nonce](size_t n) mutable -> kj::Promise<bool> {
          if (n == 0) {  // the port reads as closed: what came of a preamble is kept
            handed_over_.addAll(window->begin(), window->begin() + have);
            return false;
          }
          have += n;
          if (have < 16) return read_preamble(stream, kj::mv(window), have, nonce);
          auto magic = w::SESSION_MAGIC.get();
          if (memcmp(window->begin(), magic.begin(), 8) == 0) {
            memcpy(nonce, window->begin() + 8, 8);
            return true;
          }
          // Not aligned on a preamble: slide by one byte.
          memmove(window->begin(), window->begin() + 1, 15);
          return read_preamble(stream, kj::mv(window), 15, nonce);
        });
  }

  // Serves one session: preamble, then RPC until the host ends it (endSession, a protocol error,
  // the next host's preamble: SessionStream).
  void serve_session(kj::AsyncIoContext& io, Processes& procs, int fd, const std::string& boot_id) {
    // The stream must not own (or shut down) the port: it stays open across sessions.
    auto port =
        io.lowLevelProvider->wrapSocketFd(fd, kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                                  kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK);
    kj::byte ack[16];
    // A preamble's first bytes that the last session read where its next message would start
    // (SessionStream): the rest of it follows on the port.
    auto window = kj::heap(kj::heapArray<kj::byte>(16));
    size_t have = std::min(handed_over_.size(), size_t(15));
    memcpy(window->begin(), handed_over_.begin(), have);
    handed_over_.clear();
    auto preamble = read_preamble(*port, kj::mv(window), have, ack + 8);
    bool started = preamble
                       .then([&](bool ok) -> kj::Promise<bool> {
                         if (!ok) return false;
                         // The answer: the host reads RPC only after it (wire/agent.capnp).
                         memcpy(ack, w::SESSION_ACK_MAGIC.get().begin(), 8);
                         return port->write(ack, sizeof ack).then([]() { return true; });
                       })
                       .catch_([](kj::Exception&&) { return false; })
                       .wait(io.waitScope);
    if (!started) return;  // host went away before starting a session
    SessionStream stream(*port, io.provider->getTimer(), handed_over_);
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 64u
                                 << 20;  // 512 MiB of traversal per message; chunks are <= 4 MiB
    capnp::TwoPartyVatNetwork network(stream, capnp::rpc::twoparty::Side::SERVER, opts);
    auto ended = kj::newPromiseAndFulfiller<void>();
    end_session_ = kj::mv(ended.fulfiller);
    uint64_t id = ++session_id_;
    auto rpc = capnp::makeRpcServer(network, make_service(procs, boot_id, [this, id]() {
                                      if (id == session_id_ && end_session_->isWaiting())
                                        end_session_->fulfill();
                                    }));
    bool by_host = network.onDisconnect()
                       .then([]() { return false; })
                       .exclusiveJoin(ended.promise.then([]() {
                         // Let the endSession reply (queued this turn) be written first.
                         return kj::evalLast([]() {}).then(
                             []() { return kj::evalLast([]() { return true; }); });
                       }))
                       .wait(io.waitScope);
    if (by_host)
      log_line("session ended by the host");
    else if (!handed_over_.empty())
      log_line("session ended by a new host's preamble");
    else
      log_line("session ended by a protocol error");
  }

  kj::ProcessContext& context_;
  kj::Own<kj::PromiseFulfiller<void>> end_session_;
  kj::Vector<kj::byte> handed_over_;  // see SessionStream
  uint64_t session_id_ = 0;
  bool init_ = false;
  std::string port_;
};

}  // namespace
}  // namespace pandastack::agent

int main(int argc, char* argv[]) {
  // A command of another user: this binary drops to that identity and executes it (users.h).
  if (argc > 1 && std::strcmp(argv[1], "--run-as") == 0) pandastack::agent::run_as(argc, argv);
  // Run by the host before it bakes a template (vmm::Vm::bake): free memory zeroed (memory.h).
  if (argc > 1 && std::strcmp(argv[1], "--zero-free-memory") == 0)
    return pandastack::agent::zero_free_memory(uint64_t(8) << 20);
  kj::TopLevelProcessContext context(argv[0]);
  pandastack::agent::Main main_object(context);
  return kj::runMainAndExit(context, main_object.getMain(), argc, argv);
}
