#include "guest/agent/processes.h"

#include <kj/async-unix.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "guest/agent/spawn.h"
#include "guest/agent/util.h"

namespace pandastack::agent {

Command::~Command() noexcept(false) {
  if (pid > 0 && !exited) ::kill(-pid, SIGKILL);
}

void fill_result(w::ExecResult::Builder r, const RunOutcome& o) {
  r.setExitCode(o.exit_code);
  r.setTimedOut(o.timed_out);
  r.setDurationUs(o.duration_us);
}

namespace {

// Reads `in` to its end into `handler`. A loop of independent tasks, not a chain of promises:
// each read's continuation starts the next read as a new task and ends, so nothing nests.
// (A chain, `read().then(... return pump())`, nests one promise per chunk; a command writing
// 40 MB in 4 KiB pieces made ten thousand, and resolving them at the end overflowed PID 1's
// stack: the guest kernel panicked.)
class PumpLoop final : public kj::TaskSet::ErrorHandler {
 public:
  PumpLoop(kj::AsyncInputStream& in, w::StreamKind kind, ChunkHandler& handler,
           kj::Own<kj::PromiseFulfiller<void>> done)
      : in_(in), kind_(kind), handler_(handler), done_(kj::mv(done)) {}
  void step() {
    tasks_.add(
        in_.tryRead(buf_.begin(), 1, buf_.size()).then([this](size_t n) -> kj::Promise<void> {
          if (n == 0) {
            finish();
            return kj::READY_NOW;
          }
          return handler_(kind_, buf_.slice(0, n)).then([this]() { step(); });
        }));
  }
  void taskFailed(kj::Exception&&) override { finish(); }  // a broken pipe ends the stream

 private:
  void finish() {
    if (done_->isWaiting()) done_->fulfill();
  }
  kj::AsyncInputStream& in_;
  w::StreamKind kind_;
  ChunkHandler& handler_;
  kj::Own<kj::PromiseFulfiller<void>> done_;
  kj::Array<kj::byte> buf_ = kj::heapArray<kj::byte>(kPipeChunk);
  kj::TaskSet tasks_{*this};  // last: destroyed first, cancelling the read in flight
};

}  // namespace

// Resolves with the exit status of `pid` (already-registered pids only).
kj::Promise<int> Processes::wait_exit(pid_t pid) {
  auto it = early_exits_.find(pid);
  if (it != early_exits_.end()) {
    int s = it->second;
    early_exits_.erase(it);
    return s;
  }
  auto paf = kj::newPromiseAndFulfiller<int>();
  exit_waiters_[pid] = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

kj::Promise<void> Processes::reap_loop() {
  return io_.unixEventPort.onSignal(SIGCHLD).then([this](siginfo_t) {
    reap_all();
    return reap_loop();
  });
}

void Processes::reap_all() {
  int status = 0;
  pid_t p;
  while ((p = ::waitpid(-1, &status, WNOHANG)) > 0) {
    auto it = exit_waiters_.find(p);
    if (it != exit_waiters_.end()) {
      it->second->fulfill(decode_status(status));
      exit_waiters_.erase(it);
    } else if (tracked_.count(p) != 0) {
      early_exits_[p] = decode_status(status);
    }
    // else: an orphan re-parented to us (PID 1): reaped and forgotten.
  }
}

kj::OneOf<kj::Own<Command>, std::string> Processes::start(w::ExecRequest::Reader req) {
  auto s = spawn(req);
  if (s.pid < 0) return s.error;
  tracked_.insert(s.pid);
  auto cmd = kj::refcounted<Command>();
  cmd->pid = s.pid;
  cmd->started_us = mono_us();
  auto& ll = *io_.lowLevelProvider;
  constexpr uint flags = kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                         kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                         kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK;
  cmd->in = ll.wrapOutputFd(s.in, flags);
  cmd->out = ll.wrapInputFd(s.out, flags);
  cmd->err = ll.wrapInputFd(s.err, flags);
  cmd->out_fd = s.out;
  cmd->err_fd = s.err;
  cmd->pty = s.pty;
  if (req.getTimeoutMs() > 0) {
    Command* c = cmd.get();
    cmd->timeout_task = timer_.afterDelay(req.getTimeoutMs() * kj::MILLISECONDS)
                            .then([c]() {
                              if (!c->exited) {
                                c->timed_out = true;
                                ::kill(-c->pid, SIGKILL);
                              }
                            })
                            .eagerlyEvaluate(nullptr);
  }
  return kj::mv(cmd);
}

kj::Promise<RunOutcome> Processes::run(kj::Own<Command> cmd, kj::Array<const kj::byte> stdin_data,
                                       kj::Own<ChunkHandler> handler) {
  Command* c = cmd.get();
  auto feed = feed_stdin(kj::mv(c->in), kj::mv(stdin_data));
  auto pumps = kj::joinPromises(kj::arr(pump(*c->out, w::StreamKind::STDOUT, *handler),
                                        pump(*c->err, w::StreamKind::STDERR, *handler)))
                   .fork();
  auto pipes_done = pumps.addBranch();
  ChunkHandler* h = handler.get();
  return wait_exit(c->pid)
      .then([this, c, h, pipes_done = kj::mv(pipes_done)](int code) mutable {
        c->exited = true;
        c->exit_code = code;
        tracked_.erase(c->pid);
        // Give the pipes a moment to reach EOF; a daemon that kept them open must not hang the
        // exec. Then take what is in them now: a busy guest may not have run the pumps yet, and
        // everything the command wrote before it exited is there.
        return pipes_done.exclusiveJoin(
            timer_.afterDelay(100 * kj::MILLISECONDS).then([c, h]() { return drain(*c, *h); }));
      })
      .then([c]() {
        return RunOutcome{c->exit_code, c->timed_out, mono_us() - c->started_us};
      })
      .attach(kj::mv(cmd), kj::mv(feed), kj::mv(pumps), kj::mv(handler));
}

kj::Promise<void> Processes::drain(Command& c, ChunkHandler& handler) {
  kj::Promise<void> done = kj::READY_NOW;
  for (auto [fd, kind] :
       {std::pair{c.out_fd, w::StreamKind::STDOUT}, std::pair{c.err_fd, w::StreamKind::STDERR}}) {
    std::string data;
    char buf[65536];
    ssize_t n;
    while (fd >= 0 && (n = ::read(fd, buf, sizeof buf)) > 0) data.append(buf, size_t(n));
    if (data.empty()) continue;
    auto bytes = kj::heapArray<kj::byte>(data.size());
    memcpy(bytes.begin(), data.data(), data.size());
    done = done.then([&handler, kind = kind, bytes = kj::mv(bytes)]() mutable {
      auto view = kj::ArrayPtr<const kj::byte>(bytes.begin(), bytes.size());
      return handler(kind, view).attach(kj::mv(bytes));
    });
  }
  return done;
}

kj::Promise<void> Processes::feed_stdin(kj::Own<kj::AsyncOutputStream> in,
                                        kj::Array<const kj::byte> data) {
  if (data.size() == 0) return kj::READY_NOW;  // `in` closes here: the command sees EOF
  auto p = in->write(data.begin(), data.size());
  return p.attach(kj::mv(in), kj::mv(data))
      .catch_([](kj::Exception&&) {})  // the command may exit without reading (EPIPE)
      .eagerlyEvaluate(nullptr);
}

kj::Promise<void> Processes::pump(kj::AsyncInputStream& in, w::StreamKind kind,
                                  ChunkHandler& handler) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto loop = kj::heap<PumpLoop>(in, kind, handler, kj::mv(paf.fulfiller));
  loop->step();
  return paf.promise.attach(kj::mv(loop));
}

kj::Maybe<std::string> Processes::start_background(w::ExecRequest::Reader req, uint32_t& pid_out) {
  auto started = start(req);
  KJ_SWITCH_ONEOF(started) {
    KJ_CASE_ONEOF(err, std::string) { return err; }
    KJ_CASE_ONEOF(cmd, kj::Own<Command>) {
      auto bg = kj::refcounted<Background>();
      bg->pid = uint32_t(cmd->pid);
      bg->command = describe(req);
      bg->started_ms = now_ms(CLOCK_REALTIME);
      Background* b = bg.get();
      auto handler = kj::heap<ChunkHandler>(
          [b](w::StreamKind kind, kj::ArrayPtr<const kj::byte> data) -> kj::Promise<void> {
            std::string& keep = kind == w::StreamKind::STDOUT ? b->out : b->err;
            keep.append(reinterpret_cast<const char*>(data.begin()), data.size());
            if (keep.size() > kBackgroundKeep) keep.erase(0, keep.size() - kBackgroundKeep);
            if (b->sinks.size() == 0) return kj::READY_NOW;
            kj::Vector<kj::Promise<void>> sends;
            for (auto& [id, s] : b->sinks) {
              auto r = s.writeRequest();
              r.setKind(kind);
              r.setData(data);
              sends.add(r.send().catch_([](kj::Exception&&) {}));
            }
            return kj::joinPromises(sends.releaseAsArray());
          });
      auto in_data = kj::heapArray<const kj::byte>(req.getStdin().begin(), req.getStdin().size());
      bg->pty = cmd->pty;
      if (cmd->pty) bg->pty_fd = cmd->out_fd;
      if (req.getKeepStdinOpen() || cmd->pty) {  // a terminal's input stays open
        bg->in = kj::mv(cmd->in);                // run() feeds nothing; writeStdin does
        write_stdin(*bg, in_data, false);
        in_data = nullptr;
      }
      // At the exit the input closes (after the writes queued before it): the descriptor is not
      // kept for as long as the exited process is listed, and a terminal's master closes with it.
      auto exited = [b]() {
        b->running = false;
        b->pty_fd = -1;
        b->sinks.clear();
        write_stdin(*b, nullptr, true);
      };
      auto fork = run(kj::mv(cmd), kj::mv(in_data), kj::mv(handler))
                      .then([b, exited](RunOutcome o) {
                        b->outcome = o;
                        exited();
                      })
                      .catch_([exited](kj::Exception&&) { exited(); })
                      .fork();
      bg->task = fork.addBranch().eagerlyEvaluate(nullptr);
      bg->done = kj::mv(fork);
      pid_out = bg->pid;
      prune_background();
      background_[pid_out] = kj::mv(bg);
      return nullptr;
    }
  }
  KJ_UNREACHABLE;
}

void Processes::write_stdin(Background& b, kj::ArrayPtr<const kj::byte> data, bool close) {
  Background* bp = &b;
  if (data.size() > 0) {
    auto copy = kj::heapArray<kj::byte>(data);
    b.stdin_writes = b.stdin_writes
                         .then([bp, copy = kj::mv(copy)]() mutable -> kj::Promise<void> {
                           if (!bp->in) return kj::READY_NOW;
                           auto p = bp->in->write(copy.begin(), copy.size());
                           return p.attach(kj::mv(copy));
                         })
                         .catch_([](kj::Exception&&) {})  // the command stopped reading
                         .eagerlyEvaluate(nullptr);
  }
  if (close)
    b.stdin_writes = b.stdin_writes.then([bp]() { bp->in = nullptr; }).eagerlyEvaluate(nullptr);
}

void Processes::prune_background() {
  size_t exited = 0;
  for (auto& [pid, bg] : background_) exited += bg->running ? 0 : 1;
  for (auto it = background_.begin(); it != background_.end() && exited > kMaxExitedKept;) {
    if (!it->second->running) {
      it = background_.erase(it);
      --exited;
    } else {
      ++it;
    }
  }
}

Processes::Background* Processes::find(uint32_t pid) {
  auto it = background_.find(pid);
  return it == background_.end() ? nullptr : it->second.get();
}

kj::Maybe<std::string> Processes::resize(uint32_t pid, uint16_t cols, uint16_t rows) {
  auto* b = find(pid);
  if (b == nullptr) return std::string("no such process");
  if (!b->running) return std::string("the process has exited");
  if (b->pty_fd < 0) return std::string("the process does not run on a terminal");
  if (cols == 0 || rows == 0) return std::string("a terminal needs at least one column and row");
  winsize ws{};
  ws.ws_col = cols;
  ws.ws_row = rows;
  if (::ioctl(b->pty_fd, TIOCSWINSZ, &ws) != 0)
    return std::string("TIOCSWINSZ: ") + strerror(errno);
  return nullptr;
}

}  // namespace pandastack::agent
