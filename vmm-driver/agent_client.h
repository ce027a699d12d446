// Host side of the guest agent protocol (wire/agent.capnp). Every method is synchronous and
// thread-safe: it runs its call on the driver's IoThread and blocks the caller until it is done.
// Output callbacks run on the IoThread: they must be quick and must not call back into the driver.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// What the host takes from a guest: one message at most 40 MiB, a listing at most 100,000
// entries (a hostile guest answers anything; the daemon's memory stays bounded).
inline constexpr uint64_t kMaxGuestMessageBytes = 40ull << 20;
inline constexpr size_t kMaxListEntries = 100000;

class IoThread;

struct ExecRequest {
  std::vector<std::string> argv;  // used when non-empty
  std::string shell;              // else run with /bin/sh -c
  std::map<std::string, std::string> env;
  std::string cwd;
  std::string stdin_data;
  uint32_t timeout_ms = 0;        // 0 = none; enforced in the guest by killing the process group
  uint32_t max_output_bytes = 0;  // per stream; 0 = the agent's default (16 MiB)
  bool keep_stdin_open = false;   // start_process only: stdin stays open for write_stdin
  // On a new pseudo-terminal of cols x rows (0 = 80x24): output is the terminal's (all as `out`);
  // a background process's input stays open (write_stdin) and resize_pty applies.
  bool pty = false;
  uint16_t cols = 0, rows = 0;
  // As this account of the guest's ("" = root): its identity, HOME, USER, LOGNAME; cwd defaults
  // to its home. An agent older than protocol 2 cannot: refused (invalid_argument).
  std::string user;
};

struct ExecResult {
  int exit_code = 0;  // -N when killed by signal N
  bool timed_out = false;
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  uint64_t duration_us = 0;
  std::string error;  // non-empty when the command could not start (exit_code is then 127)
};

enum class StreamKind { out, err };
using OutputCallback = std::function<void(StreamKind, std::string_view)>;

struct FileStat {
  enum class Type { regular, directory, symlink, other };
  std::string name;
  Type type = Type::other;
  uint64_t size = 0;
  uint32_t mode = 0;
  int64_t mtime_ms = 0;
  std::string owner, group;  // names in the guest (or numbers); "" from an agent before protocol 2
  std::string symlink_target;  // a symbolic link's target as written in it
  // The file's metadata: its `user.e2b.*` extended attributes, prefix stripped (protocol 3; a
  // guest's answer is checked against the limits below, larger ones dropped).
  std::map<std::string, std::string> metadata;
};

// File metadata a write sets (AgentClient::write_file): names of at most 246 bytes, names and
// values printable ASCII, at most 4096 bytes in all with the `user.e2b.` prefix counted per name
// (what one inode's extended attributes hold on ext4). check_file_metadata says why one is not.
inline constexpr size_t kMaxMetadataNameBytes = 246;
inline constexpr size_t kMaxMetadataBytes = 4096;
inline constexpr const char* kMetadataXattrPrefix = "user.e2b.";
std::optional<std::string> check_file_metadata(const std::map<std::string, std::string>& metadata);

// A part of a file (AgentClient::read_range) and the whole file's size.
struct FileRange {
  std::string data;
  uint64_t size = 0;
};

struct ProcessInfo {
  uint32_t pid = 0;
  std::string command;
  bool running = false;
  int exit_code = 0;
  uint64_t started_at_ms = 0;
  bool pty = false;
};

// A change in a watched directory (wire/agent.capnp WatchEvent). `path` is relative to it.
struct WatchEvent {
  enum class Kind { create, write, remove, rename, chmod, overflow };
  Kind kind = Kind::create;
  std::string path;
  bool is_dir = false;
  std::optional<FileStat> entry;  // watch(include_entry): the entry, when it still was there
};
// "create", "write", "remove", "rename", "chmod", "overflow".
const char* to_string(WatchEvent::Kind kind);
// What the host takes from a guest per batch of watch events, and per path in them.
inline constexpr size_t kMaxWatchBatch = 256;
inline constexpr size_t kMaxWatchPathBytes = 4096;
using WatchCallback = std::function<void(const std::vector<WatchEvent>&)>;

struct Health {
  std::string version;
  uint32_t protocol_version = 0;
  uint64_t uptime_ms = 0;
  std::string boot_id;
};

class AgentClient {
 public:
  // Connects to the agent's channel: the unix socket QEMU serves for the virtio-serial port.
  // Returns once the socket is connected; the agent may not be answering yet (see health()).
  // `peer_uid` >= 0: the socket must be served by that uid (see QmpClient::connect).
  static Result<std::unique_ptr<AgentClient>> connect(IoThread& io, const std::string& socket_path,
                                                      int64_t peer_uid,
                                                      std::chrono::milliseconds deadline);
  ~AgentClient();
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  // Waits up to `timeout` for the agent to answer. The first call after connect waits for the
  // guest to open its port (boot); later calls reuse that pending answer.
  Result<Health> health(std::chrono::milliseconds timeout);

  // Runs a command to completion. A stop request kills the command's process group in the guest.
  Result<ExecResult> exec(const ExecRequest& request, std::stop_token stop = {});
  // Like exec, but output goes to `on_output` as it is produced (result has no output).
  Result<ExecResult> exec_stream(const ExecRequest& request, OutputCallback on_output,
                                 std::stop_token stop = {});

  Result<uint32_t> start_process(const ExecRequest& request);
  Result<ExecResult> wait_process(uint32_t pid);
  Status kill_process(uint32_t pid, int signal = 0);
  // Writes to a background process started with keep_stdin_open (then closes it when `close`).
  Status write_stdin(uint32_t pid, std::string_view data, bool close = false);
  Result<ExecResult> stream_process(uint32_t pid, OutputCallback on_output,
                                    std::stop_token stop = {});
  Result<std::vector<ProcessInfo>> list_processes();
  // The terminal size of a background process started with `pty` (SIGWINCH to its group).
  Status resize_pty(uint32_t pid, uint16_t cols, uint16_t rows);

  // Watches the guest directory `path` (with `recursive`, its subdirectories too): `on_ready`
  // once the watch is in place, then batches of events to `on_events` (both on the IoThread),
  // until `stop` is requested (code cancelled) or the directory goes (Ok).
  // Errors: not_found, guest_error (not a directory, too many directories).
  // `include_entry`: each event carries its entry (protocol 3: refused by an older agent).
  Status watch(const std::string& path, bool recursive, std::function<void()> on_ready,
               WatchCallback on_events, std::stop_token stop, bool include_entry = false);

  // Reads a whole file (in chunks of 4 MiB). Fails with not_found, or invalid_argument when the
  // file is larger than `max_bytes`.
  Result<std::string> read_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 30);
  // Up to `length` bytes of a file from `offset` (in chunks of 4 MiB; fewer at its end), and
  // the file's size. Fails with not_found.
  Result<FileRange> read_range(const std::string& path, uint64_t offset, uint64_t length);
  // Replaces a file's contents (mode 0 = 0644); creates parent folders when `make_parents`.
  // `append`: the data goes at the file's end instead (its other bytes stay).
  // `owner` (an account of the guest's, "" = root): what the call creates belongs to it.
  // `metadata`: afterwards the file's metadata is exactly this (checked: check_file_metadata;
  // protocol 3: refused by an older agent); none: it keeps what it had.
  Status write_file(const std::string& path, std::string_view data, uint32_t mode = 0,
                    bool make_parents = true, bool append = false, const std::string& owner = "",
                    const std::optional<std::map<std::string, std::string>>& metadata = {});
  Result<std::vector<FileStat>> list_dir(const std::string& path);
  Result<FileStat> stat(const std::string& path);
  Status remove(const std::string& path, bool recursive);
  Status rename(const std::string& from, const std::string& to);
  Status mkdir(const std::string& path, bool parents, uint32_t mode = 0,
               const std::string& owner = "");

  Status set_clock(int64_t unix_nanos);
  Status reseed_rng(std::string_view entropy);
  Status set_hostname(const std::string& hostname);
  // set_clock + reseed_rng + set_hostname (when not empty), sent together: one round trip.
  // `network`: whether the sandbox has one (the guest takes eth0 down without). An agent that
  // predates setNetwork (a hibernated guest from an older release) leaves eth0 as it was.
  // `free_page_reporting`: whether the guest gives its free memory back through the balloon
  // (setFreePageReporting: the agent (un)binds the balloon in the background).
  Status after_restore(int64_t unix_nanos, std::string_view entropy, const std::string& hostname,
                       bool network, bool free_page_reporting,
                       std::chrono::milliseconds timeout = kCallTimeout);
  // Whether the guest reports its free memory through the balloon (wire/agent.capnp
  // setFreePageReporting); an agent that predates it: Ok, nothing done.
  Status set_free_page_reporting(bool on);
  // Mounts the volume bound to block slot `slot` at `path` (wire/agent.capnp mountVolume).
  Status mount_volume(uint32_t slot, const std::string& path, bool read_only, uint64_t size_bytes);
  // Ends the agent's RPC session (wire/agent.capnp endSession): calls in flight are cancelled and
  // the agent waits for the next session preamble, holding no state of this host. Afterwards this
  // client only accepts destruction: the VM can be snapshotted, or the channel reconnected.
  Status end_session(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // end_session(), then a fresh session on the same channel.
  Status reset_session(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Starts a fresh session after end_session().
  Status start_session();

  // Whether the agent answered this session's preamble (wire/agent.capnp sessionAckMagic). An
  // agent still in a session it has not seen end reads a new preamble as that session's bytes,
  // ends it, and waits for the next preamble: no answer comes, connect again.
  bool answered() const;
  // How long to wait for that answer from a running guest before connecting again.
  static constexpr std::chrono::milliseconds kAnswerWait{3000};

  // Calls in progress (from any thread). With none, end_session() cancels nothing.
  int in_flight() const { return in_flight_.load(); }
  // True once a call failed because the connection is gone (the RPC connection broke: the peer
  // aborted it, e.g. a stale session of a restored agent that read our bytes as its own). Every
  // later call fails the same way: the owner reconnects (Vm::reconnect_agent).
  bool disconnected() const { return disconnected_.load(); }

  // Deadline for calls that are not commands (files, health after boot, control).
  static constexpr std::chrono::milliseconds kCallTimeout{30000};

  struct Conn;  // lives on the IoThread

 private:
  AgentClient(IoThread& io, std::unique_ptr<Conn> conn);

  // Ok when the agent speaks protocol `version` or later (asking its health if not known yet);
  // invalid_argument naming `feature` otherwise.
  Status require_protocol(uint32_t version, const char* feature);
  template <typename T, typename F>
  Result<T> call(F&& f);
  template <typename T, typename F>
  Result<T> call_cancellable(std::stop_token stop, F&& f);

  IoThread& io_;
  std::unique_ptr<Conn> conn_;
  std::atomic<int> in_flight_{0};
  std::atomic<bool> disconnected_{false};
};

}  // namespace pandastack::vmm
