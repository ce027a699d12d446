// pandastack-agent: the in-VM agent. Serves wire/agent.capnp's `Agent` over the virtio-serial port
// named "agent". Single-threaded: one KJ event loop runs the RPC session, every command's pipes,
// timeouts and the SIGCHLD reaper. When the host end hangs up (QEMU replaced after a restore), the
// session is dropped and the agent waits for the next host connection; background processes live
// on.
//
// Run as PID 1 of the guest root filesystem (`--init`): it mounts the pseudo filesystems, reaps
// every orphan, and powers nothing off on its own. `--port PATH` serves a given device or fifo
// instead.

#include <arpa/inet.h>
#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <dirent.h>
#include <fcntl.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/debug.h>
#include <kj/main.h>
#include <linux/random.h>
#include <net/if.h>
#include <net/route.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "wire/agent.capnp.h"

namespace pandastack::agent {
namespace {

namespace w = pandastack::wire::agent;

constexpr const char* kVersion = "pandastack-agent/0.1.0";
constexpr size_t kDefaultMaxOutput = 16u << 20;  // per stream, buffered exec
constexpr size_t kBackgroundKeep = 1u << 20;     // tail kept per stream of a background process
constexpr size_t kMaxReadChunk = 4u << 20;       // readFile cap per call
constexpr size_t kPipeChunk = 64u << 10;
constexpr size_t kMaxExitedKept = 256;

void log_line(const std::string& s) {
  // The console is the guest's serial port: visible in the host's boot error tail.
  std::string line = std::string("pandastack-agent: ") + s + "\n";
  ssize_t r = ::write(STDERR_FILENO, line.data(), line.size());
  (void)r;
}

uint64_t now_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}
uint64_t mono_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Errors of file operations as stable codes.

const char* errno_code(int e) {
  switch (e) {
    case ENOENT:
      return "not_found";
    case ENOTDIR:
      return "not_a_directory";
    case EISDIR:
      return "is_a_directory";
    case EACCES:
    case EPERM:
      return "permission_denied";
    case EEXIST:
      return "exists";
    case ENOTEMPTY:
      return "not_empty";
    case EINVAL:
    case ENAMETOOLONG:
      return "invalid_argument";
    case ENOSPC:
      return "no_space";
    default:
      return "io_error";
  }
}

template <typename Builder>
void set_error(Builder&& b, int e, const std::string& what) {
  b.setCode(errno_code(e));
  b.setMessage(what + ": " + strerror(e));
}

void configure_network();
void take_network_down();
std::string read_small(const char* path);

std::string resolve(kj::StringPtr path) {
  std::string p(path.cStr());
  if (p.empty() || p[0] != '/') p = "/workspace/" + p;
  return p;
}

// Replaces a small file's content (best effort: a read-only root just keeps the old one).
void write_small_file(const char* path, const std::string& content) {
  int f = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f < 0) return;
  ssize_t w = ::write(f, content.data(), content.size());
  (void)w;
  ::close(f);
}

int mkdir_p(const std::string& path, mode_t mode) {
  if (path.empty() || path == "/") return 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    int r = mkdir_p(path.substr(0, slash), mode);
    if (r != 0) return r;
  }
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return errno;
  return 0;
}

int remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return errno;
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      int r = remove_tree(path + "/" + n);
      if (r != 0) {
        ::closedir(d);
        return r;
      }
    }
    ::closedir(d);
    if (::rmdir(path.c_str()) != 0) return errno;
    return 0;
  }
  if (::unlink(path.c_str()) != 0) return errno;
  return 0;
}

void fill_stat(w::FileStat::Builder b, const std::string& name, const struct stat& st) {
  b.setName(name);
  w::FileType t = w::FileType::OTHER;
  if (S_ISREG(st.st_mode))
    t = w::FileType::REGULAR;
  else if (S_ISDIR(st.st_mode))
    t = w::FileType::DIRECTORY;
  else if (S_ISLNK(st.st_mode))
    t = w::FileType::SYMLINK;
  b.setType(t);
  b.setSize(uint64_t(st.st_size));
  b.setMode(st.st_mode & 07777);
  b.setMtimeMs(int64_t(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000);
}

// ---------------------------------------------------------------------------------------------
// Processes.

struct SpawnResult {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
  std::string error;  // why it could not start
};

std::string describe(w::ExecRequest::Reader req) {
  if (req.getArgv().size() > 0) {
    std::string s;
    for (auto a : req.getArgv()) {
      if (!s.empty()) s += ' ';
      s += a.cStr();
    }
    return s;
  }
  return req.getShell().cStr();
}

SpawnResult spawn(w::ExecRequest::Reader req) {
  SpawnResult r;
  std::vector<std::string> argv;
  if (req.getArgv().size() > 0) {
    for (auto a : req.getArgv()) argv.emplace_back(a.cStr());
  } else if (req.getShell().size() > 0) {
    argv = {"/bin/sh", "-c", req.getShell().cStr()};
  } else {
    r.error = "empty command: give argv or shell";
    return r;
  }
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (auto v : req.getEnv()) env[v.getName().cStr()] = v.getValue().cStr();
  std::vector<std::string> envs;
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::string cwd = req.getCwd().size() > 0 ? std::string(req.getCwd().cStr()) : "/workspace";
  if (req.getCwd().size() == 0 && ::access(cwd.c_str(), X_OK) != 0) cwd = "/";

  // Resolve the program with the command's PATH (posix_spawnp would use the agent's).
  std::string program = argv[0];
  if (program.find('/') == std::string::npos) {
    std::string path = env.count("PATH") ? env["PATH"] : "/usr/local/bin:/usr/bin:/bin";
    std::string found;
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir =
          path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      std::string cand = (dir.empty() ? "." : dir) + "/" + program;
      if (::access(cand.c_str(), X_OK) == 0) {
        found = cand;
        break;
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    if (found.empty()) {
      r.error = "exec " + program + ": No such file or directory";
      return r;
    }
    program = found;
  }
  if (::access(cwd.c_str(), X_OK) != 0) {
    r.error = "cwd " + cwd + ": " + strerror(errno);
    return r;
  }

  int pin[2], pout[2], perr[2];
  if (::pipe2(pin, O_CLOEXEC) != 0) {
    r.error = strerror(errno);
    return r;
  }
  if (::pipe2(pout, O_CLOEXEC) != 0) {
    r.error = strerror(errno);
    ::close(pin[0]);
    ::close(pin[1]);
    return r;
  }
  if (::pipe2(perr, O_CLOEXEC) != 0) {
    r.error = strerror(errno);
    for (int fd : {pin[0], pin[1], pout[0], pout[1]}) ::close(fd);
    return r;
  }
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  // posix_spawn: glibc clones with CLONE_VM|CLONE_VFORK, so the agent's page tables are not copied
  // and no copy-on-write faults are taken (fork+exec is several times slower under TCG).
  // The child gets its own session and process group, so a timeout or cancel kills everything it
  // started; signals are unblocked and reset to their defaults.
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
  posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
  posix_spawn_file_actions_adddup2(&fa, perr[1], 2);
  posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int err = ::posix_spawn(&pid, program.c_str(), &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(pin[0]);
  ::close(pout[1]);
  ::close(perr[1]);
  if (err != 0) {
    r.error = "exec " + program + ": " + strerror(err);
    for (int fd : {pin[1], pout[0], perr[0]}) ::close(fd);
    return r;
  }
  r.pid = pid;
  r.in = pin[1];
  r.out = pout[0];
  r.err = perr[0];
  for (int fd : {r.in, r.out, r.err}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return r;
}

class Agent;

// One running child: its pipes and its exit. Destroying it before the child exited kills the whole
// process group (that is how a cancelled or disconnected exec is stopped).
class Command final : public kj::Refcounted {
 public:
  pid_t pid = -1;
  bool exited = false;
  int exit_code = 0;
  bool timed_out = false;
  uint64_t started_us = 0;
  kj::Own<kj::AsyncOutputStream> in;
  kj::Own<kj::AsyncInputStream> out, err;
  int out_fd = -1, err_fd = -1;  // owned by `out` / `err`; for the last drain after the exit
  kj::Promise<void> timeout_task = nullptr;

  ~Command() noexcept(false) {
    if (pid > 0 && !exited) ::kill(-pid, SIGKILL);
  }
};

using ChunkHandler = kj::Function<kj::Promise<void>(w::StreamKind, kj::ArrayPtr<const kj::byte>)>;

struct RunOutcome {
  int exit_code;
  bool timed_out;
  uint64_t duration_us;
};

class Agent {
 public:
  Agent(kj::AsyncIoContext& io) : io_(io), timer_(io.provider->getTimer()) {}

  kj::Timer& timer() { return timer_; }

  // Resolves with the exit status of `pid` (already-registered pids only).
  kj::Promise<int> wait_exit(pid_t pid) {
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

  kj::Promise<void> reap_loop() {
    return io_.unixEventPort.onSignal(SIGCHLD).then([this](siginfo_t) {
      reap_all();
      return reap_loop();
    });
  }

  void reap_all() {
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

  // Starts `req`; returns the Command or an error string.
  kj::OneOf<kj::Own<Command>, std::string> start(w::ExecRequest::Reader req) {
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

  // Feeds stdin, pumps both pipes into `handler`, waits for exit (and, briefly, for the pipes).
  kj::Promise<RunOutcome> run(kj::Own<Command> cmd, kj::Array<const kj::byte> stdin_data,
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

  static kj::Promise<void> drain(Command& c, ChunkHandler& handler) {
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

  kj::Promise<void> feed_stdin(kj::Own<kj::AsyncOutputStream> in, kj::Array<const kj::byte> data) {
    if (data.size() == 0) return kj::READY_NOW;  // `in` closes here: the command sees EOF
    auto p = in->write(data.begin(), data.size());
    return p.attach(kj::mv(in), kj::mv(data))
        .catch_([](kj::Exception&&) {})  // the command may exit without reading (EPIPE)
        .eagerlyEvaluate(nullptr);
  }

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
      tasks_.add(in_.tryRead(buf_.begin(), 1, buf_.size())
                     .then([this](size_t n) -> kj::Promise<void> {
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

  kj::Promise<void> pump(kj::AsyncInputStream& in, w::StreamKind kind, ChunkHandler& handler) {
    auto paf = kj::newPromiseAndFulfiller<void>();
    auto loop = kj::heap<PumpLoop>(in, kind, handler, kj::mv(paf.fulfiller));
    loop->step();
    return paf.promise.attach(kj::mv(loop));
  }

  // ---- background processes ----
  struct Background : public kj::Refcounted {
    uint32_t pid;
    std::string command;
    uint64_t started_ms;
    std::string out, err;
    bool running = true;
    RunOutcome outcome{};
    std::map<uint64_t, w::OutputSink::Client> sinks;  // live streams, by id
    uint64_t next_sink = 0;
    kj::Maybe<kj::ForkedPromise<void>> done;
    kj::Promise<void> task = nullptr;
    // keepStdinOpen: the open pipe and the chain of writes to it, in order.
    kj::Own<kj::AsyncOutputStream> in;
    kj::Promise<void> stdin_writes = kj::READY_NOW;
  };

  std::map<uint32_t, kj::Own<Background>>& background() { return background_; }

  kj::Maybe<std::string> start_background(w::ExecRequest::Reader req, uint32_t& pid_out) {
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
        if (req.getKeepStdinOpen()) {
          bg->in = kj::mv(cmd->in);  // run() feeds nothing; writeStdin does
          write_stdin(*bg, in_data, false);
          in_data = nullptr;
        }
        auto fork = run(kj::mv(cmd), kj::mv(in_data), kj::mv(handler))
                        .then([b](RunOutcome o) {
                          b->running = false;
                          b->outcome = o;
                          b->sinks.clear();
                        })
                        .catch_([b](kj::Exception&&) { b->running = false; })
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

  // Queues `data` (then a close, when asked) behind the earlier writes to `b`'s stdin.
  static void write_stdin(Background& b, kj::ArrayPtr<const kj::byte> data, bool close) {
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

  void prune_background() {
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

 private:
  kj::AsyncIoContext& io_;
  kj::Timer& timer_;
  std::map<pid_t, kj::Own<kj::PromiseFulfiller<int>>> exit_waiters_;
  std::map<pid_t, int> early_exits_;
  std::set<pid_t> tracked_;
  std::map<uint32_t, kj::Own<Background>> background_;
};

void fill_result(w::ExecResult::Builder r, const RunOutcome& o) {
  r.setExitCode(o.exit_code);
  r.setTimedOut(o.timed_out);
  r.setDurationUs(o.duration_us);
}

// ---------------------------------------------------------------------------------------------
// The RPC face. One instance per host session; process state lives in `Agent` and outlives it.

class AgentImpl final : public w::Agent::Server {
 public:
  // `end_session()` ends the session once the reply has gone out.
  AgentImpl(Agent& agent, std::string boot_id, std::function<void()> end_session)
      : agent_(agent), boot_id_(kj::mv(boot_id)), end_session_(kj::mv(end_session)) {}

  kj::Promise<void> endSession(EndSessionContext) override {
    end_session_();
    return kj::READY_NOW;
  }

  kj::Promise<void> health(HealthContext ctx) override {
    auto r = ctx.getResults();
    r.setVersion(kVersion);
    r.setProtocolVersion(w::PROTOCOL_VERSION);
    r.setUptimeMs(now_ms(CLOCK_BOOTTIME));
    r.setBootId(boot_id_);
    return kj::READY_NOW;
  }

  kj::Promise<void> exec(ExecContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto req = ctx.getParams().getRequest();
    size_t cap = req.getMaxOutputBytes() > 0 ? req.getMaxOutputBytes() : kDefaultMaxOutput;
    auto started = agent_.start(req);
    KJ_SWITCH_ONEOF(started) {
      KJ_CASE_ONEOF(err, std::string) {
        auto r = ctx.getResults().initResult();
        r.setError(err);
        r.setExitCode(127);
        return kj::READY_NOW;
      }
      KJ_CASE_ONEOF(cmd, kj::Own<Command>) {
        struct Buffers {
          std::string out, err;
          bool out_trunc = false, err_trunc = false;
        };
        auto bufs = kj::heap<Buffers>();
        Buffers* b = bufs.get();
        auto handler = kj::heap<ChunkHandler>(
            [b, cap](w::StreamKind kind, kj::ArrayPtr<const kj::byte> data) -> kj::Promise<void> {
              auto& s = kind == w::StreamKind::STDOUT ? b->out : b->err;
              auto& t = kind == w::StreamKind::STDOUT ? b->out_trunc : b->err_trunc;
              size_t room = cap > s.size() ? cap - s.size() : 0;
              size_t n = std::min(room, data.size());
              s.append(reinterpret_cast<const char*>(data.begin()), n);
              if (n < data.size()) t = true;
              return kj::READY_NOW;
            });
        auto in = kj::heapArray<const kj::byte>(req.getStdin().begin(), req.getStdin().size());
        return agent_.run(kj::mv(cmd), kj::mv(in), kj::mv(handler))
            .then([ctx, b](RunOutcome o) mutable {
              auto r = ctx.getResults().initResult();
              fill_result(r, o);
              r.setStdout(
                  kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->out.data()), b->out.size()));
              r.setStderr(
                  kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->err.data()), b->err.size()));
              r.setStdoutTruncated(b->out_trunc);
              r.setStderrTruncated(b->err_trunc);
            })
            .attach(kj::mv(bufs));
      }
    }
    KJ_UNREACHABLE;
  }

  kj::Promise<void> execStream(ExecStreamContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto params = ctx.getParams();
    auto req = params.getRequest();
    auto sink = kj::heap<w::OutputSink::Client>(params.getSink());
    auto started = agent_.start(req);
    KJ_SWITCH_ONEOF(started) {
      KJ_CASE_ONEOF(err, std::string) {
        auto r = ctx.getResults().initResult();
        r.setError(err);
        r.setExitCode(127);
        return kj::READY_NOW;
      }
      KJ_CASE_ONEOF(cmd, kj::Own<Command>) {
        w::OutputSink::Client* s = sink.get();
        auto handler = kj::heap<ChunkHandler>(
            [s](w::StreamKind kind, kj::ArrayPtr<const kj::byte> data) -> kj::Promise<void> {
              auto r = s->writeRequest();
              r.setKind(kind);
              r.setData(data);
              return r.send();
            });
        auto in = kj::heapArray<const kj::byte>(req.getStdin().begin(), req.getStdin().size());
        return agent_.run(kj::mv(cmd), kj::mv(in), kj::mv(handler))
            .then([ctx](RunOutcome o) mutable { fill_result(ctx.getResults().initResult(), o); })
            .attach(kj::mv(sink));
      }
    }
    KJ_UNREACHABLE;
  }

  kj::Promise<void> startProcess(StartProcessContext ctx) override {
    uint32_t pid = 0;
    KJ_IF_MAYBE (err, agent_.start_background(ctx.getParams().getRequest(), pid)) {
      ctx.getResults().setError(*err);
    } else {
      ctx.getResults().setPid(pid);
    }
    return kj::READY_NOW;
  }

  Agent::Background* find(uint32_t pid) {
    auto it = agent_.background().find(pid);
    return it == agent_.background().end() ? nullptr : it->second.get();
  }

  static void fill_bg_result(w::ExecResult::Builder r, Agent::Background& b) {
    fill_result(r, b.outcome);
    r.setStdout(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.out.data()), b.out.size()));
    r.setStderr(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.err.data()), b.err.size()));
  }

  kj::Promise<void> waitProcess(WaitProcessContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto* b = find(ctx.getParams().getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
      return kj::READY_NOW;
    }
    kj::Own<Agent::Background> ref = kj::addRef(*b);
    KJ_IF_MAYBE (d, b->done) {
      return d->addBranch().then([ctx, ref = kj::mv(ref)]() mutable {
        fill_bg_result(ctx.getResults().initResult(), *ref);
      });
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> killProcess(KillProcessContext ctx) override {
    auto p = ctx.getParams();
    auto* b = find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
    } else if (b->running) {
      ::kill(-pid_t(b->pid), p.getSignal() != 0 ? p.getSignal() : SIGKILL);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> writeStdin(WriteStdinContext ctx) override {
    auto p = ctx.getParams();
    auto* b = find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
    } else if (!b->in) {
      ctx.getResults().setError(
          "stdin is closed (or the process was not started with keepStdinOpen)");
    } else {
      Agent::write_stdin(*b, p.getData(), p.getClose());
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> streamProcess(StreamProcessContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto p = ctx.getParams();
    auto* b = find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
      return kj::READY_NOW;
    }
    auto sink = p.getSink();
    // Replay what is buffered, then attach for live output; E-order on `sink` keeps it in order.
    kj::Vector<kj::Promise<void>> sends;
    for (auto kind : {w::StreamKind::STDOUT, w::StreamKind::STDERR}) {
      auto& s = kind == w::StreamKind::STDOUT ? b->out : b->err;
      if (s.empty()) continue;
      auto r = sink.writeRequest();
      r.setKind(kind);
      r.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size()));
      sends.add(r.send());
    }
    kj::Own<Agent::Background> ref = kj::addRef(*b);
    auto replayed = kj::joinPromises(sends.releaseAsArray());
    if (!b->running) {
      return replayed.then([ctx, ref = kj::mv(ref)]() mutable {
        auto r = ctx.getResults().initResult();
        fill_result(r, ref->outcome);
      });
    }
    uint64_t sink_id = ++b->next_sink;
    b->sinks.emplace(sink_id, kj::mv(sink));
    // The stream ends with this call: a cancelled call (the host stopped reading) must not keep
    // its sink, or every later chunk would go to a host that no longer listens.
    auto detach = kj::defer([b = kj::addRef(*b), sink_id]() mutable { b->sinks.erase(sink_id); });
    KJ_IF_MAYBE (d, b->done) {
      return replayed.then([d]() { return d->addBranch(); })
          .then([ctx, ref = kj::mv(ref)]() mutable {
            fill_result(ctx.getResults().initResult(), ref->outcome);
          })
          .attach(kj::mv(detach));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> listProcesses(ListProcessesContext ctx) override {
    auto& all = agent_.background();
    auto list = ctx.getResults().initProcesses(all.size());
    size_t i = 0;
    for (auto& [pid, b] : all) {
      auto e = list[i++];
      e.setPid(pid);
      e.setCommand(b->command);
      e.setRunning(b->running);
      e.setExitCode(b->outcome.exit_code);
      e.setStartedAtMs(b->started_ms);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> readFile(ReadFileContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    auto r = ctx.getResults();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    KJ_DEFER(::close(fd));
    struct stat st {};
    ::fstat(fd, &st);
    if (S_ISDIR(st.st_mode)) {
      set_error(r.initError(), EISDIR, path);
      return kj::READY_NOW;
    }
    r.setSize(uint64_t(st.st_size));
    size_t want =
        std::min<size_t>(p.getLength() == 0 ? kMaxReadChunk : p.getLength(), kMaxReadChunk);
    auto buf = kj::heapArray<kj::byte>(want);
    size_t got = 0;
    while (got < want) {
      // At most 64 KiB per read: some special files refuse large ones (/proc/sys allocates a
      // kernel buffer of the request's size: ENOMEM for 4 MiB).
      size_t piece = std::min<size_t>(want - got, 64u << 10);
      ssize_t n = ::pread(fd, buf.begin() + got, piece, off_t(p.getOffset() + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        set_error(r.initError(), errno, path);
        return kj::READY_NOW;
      }
      if (n == 0) break;
      got += size_t(n);
    }
    r.setData(buf.slice(0, got));
    return kj::READY_NOW;
  }

  kj::Promise<void> writeFile(WriteFileContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    auto r = ctx.getResults();
    if (p.getMakeParents()) {
      auto slash = path.find_last_of('/');
      int e = mkdir_p(path.substr(0, slash), 0755);
      if (e != 0) {
        set_error(r.initError(), e, path);
        return kj::READY_NOW;
      }
    }
    mode_t mode = p.getMode() != 0 ? mode_t(p.getMode() & 07777) : 0644;
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    if (p.getTruncate()) flags |= O_TRUNC;
    if (p.getAppend()) flags |= O_APPEND;
    int fd = ::open(path.c_str(), flags, mode);
    if (fd < 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    KJ_DEFER(::close(fd));
    if (p.getTruncate() && p.getMode() != 0) ::fchmod(fd, mode);
    auto data = p.getData();
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd, data.begin() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        set_error(r.initError(), errno, path);
        return kj::READY_NOW;
      }
      done += size_t(n);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> listDir(ListDirContext ctx) override {
    auto path = resolve(ctx.getParams().getPath());
    auto r = ctx.getResults();
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    std::vector<std::pair<std::string, struct stat>> entries;
    // At most one entry more than the host takes (vmm-driver/agent_client.h, kMaxListEntries):
    // the host refuses the listing instead of the reply growing past its message limit.
    while (auto* e = ::readdir(d)) {
      if (entries.size() > 100000) break;
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st {};
      if (::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        entries.emplace_back(n, st);
    }
    ::closedir(d);
    std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.first < b.first; });
    auto list = r.initEntries(entries.size());
    for (size_t i = 0; i < entries.size(); ++i)
      fill_stat(list[i], entries[i].first, entries[i].second);
    return kj::READY_NOW;
  }

  kj::Promise<void> stat(StatContext ctx) override {
    auto path = resolve(ctx.getParams().getPath());
    auto r = ctx.getResults();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    auto slash = path.find_last_of('/');
    fill_stat(r.initStat(), path.substr(slash + 1), st);
    return kj::READY_NOW;
  }

  kj::Promise<void> remove(RemoveContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    int e = 0;
    if (p.getRecursive()) {
      e = remove_tree(path);
    } else {
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0)
        e = errno;
      else if (S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) != 0 : ::unlink(path.c_str()) != 0)
        e = errno;
    }
    if (e != 0) set_error(ctx.getResults().initError(), e, path);
    return kj::READY_NOW;
  }

  kj::Promise<void> rename(RenameContext ctx) override {
    auto p = ctx.getParams();
    auto from = resolve(p.getFrom()), to = resolve(p.getTo());
    if (::rename(from.c_str(), to.c_str()) != 0)
      set_error(ctx.getResults().initError(), errno, from);
    return kj::READY_NOW;
  }

  kj::Promise<void> mkdir(MkdirContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    mode_t mode = p.getMode() != 0 ? mode_t(p.getMode() & 07777) : 0755;
    int e = 0;
    if (p.getParents())
      e = mkdir_p(path, mode);
    else if (::mkdir(path.c_str(), mode) != 0)
      e = errno;
    if (e != 0) set_error(ctx.getResults().initError(), e, path);
    return kj::READY_NOW;
  }

  kj::Promise<void> setClock(SetClockContext ctx) override {
    int64_t ns = ctx.getParams().getUnixNanos();
    timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
      KJ_FAIL_REQUIRE("clock_settime failed", strerror(errno));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> reseedRng(ReseedRngContext ctx) override {
    auto entropy = ctx.getParams().getEntropy();
    KJ_REQUIRE(entropy.size() > 0 && entropy.size() <= 4096, "entropy size", entropy.size());
    int fd = ::open("/dev/urandom", O_RDWR | O_CLOEXEC);
    KJ_REQUIRE(fd >= 0, "open /dev/urandom", strerror(errno));
    KJ_DEFER(::close(fd));
    auto info = kj::heapArray<kj::byte>(sizeof(rand_pool_info) + entropy.size());
    auto* rpi = reinterpret_cast<rand_pool_info*>(info.begin());
    rpi->entropy_count = int(entropy.size() * 8);
    rpi->buf_size = int(entropy.size());
    memcpy(rpi->buf, entropy.begin(), entropy.size());
    KJ_REQUIRE(::ioctl(fd, RNDADDENTROPY, rpi) == 0, "RNDADDENTROPY", strerror(errno));
    // Force the CRNG to reseed now, so the very next random bytes already differ between forks.
    KJ_REQUIRE(::ioctl(fd, RNDRESEEDCRNG) == 0, "RNDRESEEDCRNG", strerror(errno));
    return kj::READY_NOW;
  }

  kj::Promise<void> setNetwork(SetNetworkContext ctx) override {
    if (ctx.getParams().getEnabled())
      configure_network();
    else
      take_network_down();
    return kj::READY_NOW;
  }

  kj::Promise<void> mountVolume(MountVolumeContext ctx) override {
    auto p = ctx.getParams();
    auto fail = [&](int e, const std::string& what) {
      set_error(ctx.getResults().initError(), e, what);
      return kj::READY_NOW;
    };
    std::string path(p.getPath().cStr());
    if (path.empty() || path[0] != '/' || path == "/") return fail(EINVAL, "mount path " + path);
    // The disk whose serial names the slot (the guest has no udev: /sys is the map).
    std::string serial = "pds-vol" + std::to_string(p.getSlot()), dev;
    if (DIR* d = ::opendir("/sys/block")) {
      while (auto* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name.rfind("vd", 0) == 0 && read_small(("/sys/block/" + name + "/serial").c_str()) == serial)
          dev = name;
      }
      ::closedir(d);
    }
    if (dev.empty()) return fail(ENODEV, "no disk " + serial);
    // The host grew the slot when it bound the volume; the kernel applies that asynchronously.
    auto size_file = "/sys/block/" + dev + "/size";
    uint64_t want = p.getSizeBytes() / 512;
    for (int i = 0; i < 4000 && std::strtoull(read_small(size_file.c_str()).c_str(), nullptr, 10) != want; ++i)
      ::usleep(500);
    if (std::strtoull(read_small(size_file.c_str()).c_str(), nullptr, 10) != want)
      return fail(EIO, "disk " + dev + " did not reach " + std::to_string(p.getSizeBytes()) + " bytes");
    if (int e = mkdir_p(path, 0755); e != 0) return fail(e, path);
    unsigned long flags = MS_NOATIME | MS_NODEV | MS_NOSUID;
    if (p.getReadOnly()) flags |= MS_RDONLY;
    auto node = "/dev/" + dev;
    if (::mount(node.c_str(), path.c_str(), "ext4", flags, p.getReadOnly() ? "noload" : "") != 0)
      return fail(errno, "mount " + node + " on " + path);
    return kj::READY_NOW;
  }

  kj::Promise<void> setHostname(SetHostnameContext ctx) override {
    auto h = ctx.getParams().getHostname();
    KJ_REQUIRE(h.size() > 0 && h.size() < 64, "hostname length", h.size());
    KJ_REQUIRE(::sethostname(h.cStr(), h.size()) == 0, "sethostname", strerror(errno));
    // The files that name it too, so `hostname`, /etc/hostname and name lookups agree.
    write_small_file("/etc/hostname", std::string(h.cStr()) + "\n");
    write_small_file("/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 " + std::string(h.cStr()) +
                                       "\n::1 localhost ip6-localhost ip6-loopback\n");
    return kj::READY_NOW;
  }

 private:
  Agent& agent_;
  std::string boot_id_;
  std::function<void()> end_session_;
};

// ---------------------------------------------------------------------------------------------

std::string read_small(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The /dev node of the virtio-serial port called `name` (no udev in the guest to make the
// /dev/virtio-ports/NAME symlink).
std::string find_port(const std::string& name) {
  DIR* d = ::opendir("/sys/class/virtio-ports");
  if (d == nullptr) return "";
  std::string found;
  while (auto* e = ::readdir(d)) {
    std::string dev = e->d_name;
    if (dev[0] == '.') continue;
    if (read_small(("/sys/class/virtio-ports/" + dev + "/name").c_str()) == name) {
      found = "/dev/" + dev;
      break;
    }
  }
  ::closedir(d);
  return found;
}

void init_system() {
  ::mkdir("/tmp", 01777);
  ::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  ::mkdir("/dev/pts", 0755);
  ::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=666");
  ::mkdir("/dev/shm", 01777);
  ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  ::symlink("/proc/self/fd", "/dev/fd");
  ::sethostname("sandbox", 7);
  // Loopback up, so servers inside the sandbox are reachable on localhost.
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s >= 0) {
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
      ifr.ifr_flags |= IFF_UP;
      ::ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    ::close(s);
  }
  ::setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
  ::setenv("HOME", "/root", 1);
  ::setenv("LANG", "C.UTF-8", 1);
  ::setenv("TERM", "xterm", 1);
  ::chdir("/");
}

// The guest side of the sandbox network, the same in every sandbox (the host NATs at the
// namespace boundary, so restored and forked guests need no re-addressing): eth0 172.31.255.2/30,
// default route via 172.31.255.1 (vmm-driver/network.h). Without a sandbox network the NIC is
// attached to nothing and these packets go nowhere.
void configure_network() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  auto sin = [](const char* ip) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
  };
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  auto addr = sin("172.31.255.2");
  memcpy(&ifr.ifr_addr, &addr, sizeof addr);
  if (::ioctl(s, SIOCSIFADDR, &ifr) != 0) {
    log_line(std::string("eth0: no address: ") + strerror(errno));
    ::close(s);
    return;
  }
  auto mask = sin("255.255.255.252");
  memcpy(&ifr.ifr_netmask, &mask, sizeof mask);
  ::ioctl(s, SIOCSIFNETMASK, &ifr);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  rtentry rt{};
  auto any = sin("0.0.0.0"), gw = sin("172.31.255.1");
  memcpy(&rt.rt_dst, &any, sizeof any);
  memcpy(&rt.rt_genmask, &any, sizeof any);
  memcpy(&rt.rt_gateway, &gw, sizeof gw);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (::ioctl(s, SIOCADDRT, &rt) != 0 && errno != EEXIST)
    log_line(std::string("eth0: no default route: ") + strerror(errno));
  ::close(s);
  // Names are resolved by the platform's resolver for this sandbox, on the gateway: it answers
  // what the egress policy allows and refuses the rest at once.
  int f = ::open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f >= 0) {
    const char conf[] = "nameserver 172.31.255.1\noptions timeout:1 attempts:2\n";
    ssize_t w = ::write(f, conf, sizeof conf - 1);
    (void)w;
    ::close(f);
  }
}

// A sandbox without a network: eth0 down (the kernel drops its routes with it), so connects and
// name lookups fail at once instead of waiting on a NIC attached to nothing.
void take_network_down() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP)) {
    ifr.ifr_flags &= ~IFF_UP;
    if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
      log_line(std::string("eth0: cannot take it down: ") + strerror(errno));
  }
  ::close(s);
}

// True while the host end of the port is connected (virtio-serial reports POLLHUP otherwise).
bool host_connected(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & POLLHUP) == 0;
}

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
    Agent agent(io);
    auto reaper = agent.reap_loop().eagerlyEvaluate([](kj::Exception&& e) {
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
      serve_session(io, agent, fd, boot_id);
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
  // byte of the RPC that follows is consumed. Anything before it is discarded. False on EOF.
  static kj::Promise<bool> read_preamble(kj::AsyncIoStream& stream,
                                         kj::Own<kj::Array<kj::byte>> window, size_t have) {
    auto* buf = window->begin();
    return stream.tryRead(buf + have, 16 - have, 16 - have)
        .then([&stream, window = kj::mv(window), have](size_t n) mutable -> kj::Promise<bool> {
          if (n == 0) return false;
          have += n;
          if (have < 16) return read_preamble(stream, kj::mv(window), have);
          auto magic = w::SESSION_MAGIC.get();
          if (memcmp(window->begin(), magic.begin(), 8) == 0) return true;
          // Not aligned on a preamble: slide by one byte.
          memmove(window->begin(), window->begin() + 1, 15);
          return read_preamble(stream, kj::mv(window), 15);
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
  void serve_session(kj::AsyncIoContext& io, Agent& agent, int fd, const std::string& boot_id) {
    // The stream must not own (or shut down) the port: it stays open across sessions.
    auto stream =
        io.lowLevelProvider->wrapSocketFd(fd, kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                                  kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK);
    bool started = read_preamble(*stream, kj::heap(kj::heapArray<kj::byte>(16)), 0)
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
    auto rpc = capnp::makeRpcServer(network, kj::heap<AgentImpl>(agent, boot_id, [this, id]() {
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
