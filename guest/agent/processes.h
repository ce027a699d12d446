// The guest's commands: running them (pipes or a terminal, timeouts, output pumps), reaping every
// child (the agent is PID 1), and the table of background processes that outlives host sessions.
#pragma once

#include <kj/async-io.h>
#include <kj/function.h>
#include <kj/one-of.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "wire/agent.capnp.h"

namespace pandastack::agent {

namespace w = pandastack::wire::agent;

inline constexpr size_t kDefaultMaxOutput = 16u << 20;  // per stream, buffered exec
inline constexpr size_t kBackgroundKeep = 1u << 20;  // tail kept per stream of a background process
inline constexpr size_t kPipeChunk = 64u << 10;
inline constexpr size_t kMaxExitedKept = 256;

// One running child: its pipes (or terminal) and its exit. Destroying it before the child exited
// kills the whole process group (that is how a cancelled or disconnected exec is stopped).
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
  bool pty = false;              // out_fd is the terminal's master
  kj::Promise<void> timeout_task = nullptr;

  ~Command() noexcept(false);
};

using ChunkHandler = kj::Function<kj::Promise<void>(w::StreamKind, kj::ArrayPtr<const kj::byte>)>;

struct RunOutcome {
  int exit_code;
  bool timed_out;
  uint64_t duration_us;
};

void fill_result(w::ExecResult::Builder r, const RunOutcome& o);

class Processes {
 public:
  explicit Processes(kj::AsyncIoContext& io) : io_(io), timer_(io.provider->getTimer()) {}

  kj::AsyncIoContext& io() { return io_; }
  kj::Timer& timer() { return timer_; }

  // Reaps children on SIGCHLD, for ever.
  kj::Promise<void> reap_loop();

  // Starts `req`; returns the Command or an error string.
  kj::OneOf<kj::Own<Command>, std::string> start(w::ExecRequest::Reader req);

  // Feeds stdin, pumps both streams into `handler`, waits for exit (and, briefly, for the pipes).
  kj::Promise<RunOutcome> run(kj::Own<Command> cmd, kj::Array<const kj::byte> stdin_data,
                              kj::Own<ChunkHandler> handler);

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
    // keepStdinOpen (or a terminal): the open input and the chain of writes to it, in order.
    kj::Own<kj::AsyncOutputStream> in;
    kj::Promise<void> stdin_writes = kj::READY_NOW;
    bool pty = false;
    int pty_fd = -1;  // the terminal's master while the process runs on one (owned by its Command)
  };

  std::map<uint32_t, kj::Own<Background>>& background() { return background_; }
  Background* find(uint32_t pid);

  // Starts a background process; its pid in `pid_out`, or why it could not start.
  kj::Maybe<std::string> start_background(w::ExecRequest::Reader req, uint32_t& pid_out);

  // Queues `data` (then a close, when asked) behind the earlier writes to `b`'s stdin.
  static void write_stdin(Background& b, kj::ArrayPtr<const kj::byte> data, bool close);

  // Sets the terminal size of a process running on a terminal (its group gets SIGWINCH).
  kj::Maybe<std::string> resize(uint32_t pid, uint16_t cols, uint16_t rows);

 private:
  kj::Promise<int> wait_exit(pid_t pid);
  void reap_all();
  static kj::Promise<void> drain(Command& c, ChunkHandler& handler);
  kj::Promise<void> feed_stdin(kj::Own<kj::AsyncOutputStream> in, kj::Array<const kj::byte> data);
  kj::Promise<void> pump(kj::AsyncInputStream& in, w::StreamKind kind, ChunkHandler& handler);
  void prune_background();

  kj::AsyncIoContext& io_;
  kj::Timer& timer_;
  std::map<pid_t, kj::Own<kj::PromiseFulfiller<int>>> exit_waiters_;
  std::map<pid_t, int> early_exits_;
  std::set<pid_t> tracked_;
  std::map<uint32_t, kj::Own<Background>> background_;
};

}  // namespace pandastack::agent
