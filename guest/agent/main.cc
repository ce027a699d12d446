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
// and tracking commands), watcher.cc (inotify), service.cc (the RPC methods), util.cc.

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <fcntl.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/debug.h>
#include <kj/main.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "guest/agent/processes.h"
#include "guest/agent/service.h"
#include "guest/agent/system.h"
#include "guest/agent/util.h"

namespace pandastack::agent {
namespace {

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
  // byte of the RPC that follows is consumed. Anything before it is discarded. The nonce goes to
  // `nonce` (8 bytes). False on EOF.
  static kj::Promise<bool> read_preamble(kj::AsyncIoStream& stream,
                                         kj::Own<kj::Array<kj::byte>> window, size_t have,
                                         kj::byte* nonce) {
    auto* buf = window->begin();
    return stream.tryRead(buf + have, 16 - have, 16 - have)
        .then(
            [&stream, window = kj::mv(window), have, nonce](size_t n) mutable -> kj::Promise<bool> {
              if (n == 0) return false;
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

  // Resolves when the host end of the port has stayed disconnected for 300 ms (checked every
  // 100 ms). A reconnecting host closes and reopens the port in quick succession, and the guest
  // may see that close late: only a lasting hang-up (the host is gone) ends the session.
  static kj::Promise<void> watch_hangup(kj::AsyncIoContext& io, int fd, int down = 0) {
    return io.provider->getTimer()
        .afterDelay(100 * kj::MILLISECONDS)
        .then([&io, fd, down]() -> kj::Promise<void> {
          int now_down = host_connected(fd) ? 0 : down + 1;
          if (now_down >= 3) return kj::READY_NOW;
          return watch_hangup(io, fd, now_down);
        });
  }

  // Serves one session: preamble, then RPC until the host disconnects or ends the session.
  void serve_session(kj::AsyncIoContext& io, Processes& procs, int fd, const std::string& boot_id) {
    // The stream must not own (or shut down) the port: it stays open across sessions.
    auto stream =
        io.lowLevelProvider->wrapSocketFd(fd, kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                                  kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK);
    kj::byte ack[16];
    bool started = read_preamble(*stream, kj::heap(kj::heapArray<kj::byte>(16)), 0, ack + 8)
                       .then([&](bool ok) -> kj::Promise<bool> {
                         if (!ok) return false;
                         // The answer: the host reads RPC only after it (wire/agent.capnp).
                         memcpy(ack, w::SESSION_ACK_MAGIC.get().begin(), 8);
                         return stream->write(ack, sizeof ack).then([]() { return true; });
                       })
                       .catch_([](kj::Exception&&) { return false; })
                       .wait(io.waitScope);
    if (!started) return;  // host went away before starting a session
    capnp::ReaderOptions opts;
    opts.traversalLimitInWords = 64u
                                 << 20;  // 512 MiB of traversal per message; chunks are <= 4 MiB
    capnp::TwoPartyVatNetwork network(*stream, capnp::rpc::twoparty::Side::SERVER, opts);
    auto ended = kj::newPromiseAndFulfiller<void>();
    end_session_ = kj::mv(ended.fulfiller);
    uint64_t id = ++session_id_;
    auto rpc = capnp::makeRpcServer(network, make_service(procs, boot_id, [this, id]() {
                                      if (id == session_id_ && end_session_->isWaiting())
                                        end_session_->fulfill();
                                    }));
    // A host can vanish without a byte (its process died): QEMU closes the chardev and the port
    // reports POLLHUP, which a pending read does not notice. Watch for it, so that the next host
    // finds the agent waiting for its preamble instead of reading it as part of a dead session.
    bool by_host = network.onDisconnect()
                       .exclusiveJoin(watch_hangup(io, fd))
                       .then([]() { return false; })
                       .exclusiveJoin(ended.promise.then([]() {
                         // Let the endSession reply (queued this turn) be written first.
                         return kj::evalLast([]() {}).then(
                             []() { return kj::evalLast([]() { return true; }); });
                       }))
                       .wait(io.waitScope);
    log_line(by_host ? "session ended by the host" : "host disconnected");
  }

  kj::ProcessContext& context_;
  kj::Own<kj::PromiseFulfiller<void>> end_session_;
  uint64_t session_id_ = 0;
  bool init_ = false;
  std::string port_;
};

}  // namespace
}  // namespace pandastack::agent

KJ_MAIN(pandastack::agent::Main)
