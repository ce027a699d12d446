// The event store: per-entity event streams in RocksDB, a global audit sequence across all of
// them, append with an expected version, group commit, and per-entity state snapshots.
//
// Keys (one column family, byte-ordered):
//   e<stream>\0<version:BE64>   -> event record          (a stream's events, in order)
//   g<global:BE64>              -> <stream>\0<version>   (the audit log, in order)
//   t<time_ms:BE64><global:BE64> -> ""                   (events by time)
//   h<stream>                   -> <version:BE64>        (a stream's head)
//   s<stream>                   -> snapshot record       (newest state snapshot of a stream)
//   m/global                    -> <last global:BE64>
// A stream's events, its head, the audit and time index entries and the global counter are
// written in one WriteBatch: an append is all there or not at all.
//
// Appends are queued to one writer thread, which takes everything queued (up to `max_batch`
// appends), checks each expected version in order, writes them as one synced batch and then
// completes them: concurrent appends share one fsync (group commit). Appends that ask only to be
// written (Durability::written: per-command records, intermediate steps) complete once in the
// log, and are fsynced by the next synced batch or `lazy_sync_delay` later. Callers block in
// append() or get a callback from append_async() on the writer thread; never call either from a
// thread that must not block on disk (CAF workers use append_async).
//
// A full disk: writes (appends, snapshots, key records) are refused with `no_space` while the
// store's file system has less than `reserve_bytes` free, so RocksDB itself rarely meets ENOSPC.
// When a write fails anyway (ENOSPC, EIO), every later write is refused with that error until the
// writer reopens the database (once the reserve is free again, at the next append): RocksDB 7.8
// does not reliably move to a fresh log after a failed log write, and writing to the failed one
// aborts the process. Reads go on meanwhile; acknowledged appends are in the log the reopen
// replays.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "storage/error.h"

namespace rocksdb {
class DB;
class Status;
}  // namespace rocksdb

namespace pandastack::storage {

struct NewEvent {
  std::string type;     // event kind ("created", "started", ...)
  uint32_t format = 1;  // payload format version
  std::string payload;  // serialized event (wire/events.capnp)
};

struct StoredEvent {
  std::string stream;
  uint64_t version = 0;     // 1-based position in its stream
  uint64_t global_seq = 0;  // 1-based position in the audit log
  int64_t time_ms = 0;      // wall clock at append
  uint32_t format = 0;
  std::string type;
  std::string payload;
};

// When an append's callback may run. `synced`: the events are on disk (fsync) first: they survive
// a power loss. `written`: they are in the write-ahead log (written to the operating system, not
// yet fsynced): they survive a kill -9 of this process at once, and a power loss once the writer's
// next sync, at most `Options::lazy_sync_delay` later (or sooner: any synced batch after them
// syncs them too, the log being sequential).
enum class Durability { synced, written };

struct AppendResult {
  uint64_t first_version = 0, last_version = 0;
  uint64_t first_global = 0, last_global = 0;
};

struct StateSnapshot {
  uint64_t version = 0;  // the stream version the state includes
  uint32_t format = 0;
  std::string state;
};

class EventStore {
 public:
  struct Options {
    std::filesystem::path dir;
    bool sync = true;                   // fsync every batch (false only for benchmarks of the rest)
    size_t max_batch = 1024;            // appends per group commit
    std::function<int64_t()> clock_ms;  // default: system clock
    // Read-only: opens a store another process may be writing (RocksDB's read-only mode sees
    // what was written up to the open); appends fail with `closed`.
    bool read_only = false;
    // `written` appends are fsynced this long after the first of them at the latest.
    std::chrono::milliseconds lazy_sync_delay{100};
    // Free space kept on the store's file system: writes below it are refused (no_space). It
    // covers a memtable flush (16 MiB) and the log's preallocation.
    uint64_t reserve_bytes = 64ull << 20;
  };

  static Result<std::unique_ptr<EventStore>> open(Options options);
  ~EventStore();  // completes queued appends, then closes
  EventStore(const EventStore&) = delete;
  EventStore& operator=(const EventStore&) = delete;

  // Appends `events` to `stream` if its version is `expected_version` (0: the stream must not
  // exist). Returns once the events are durable. ErrorCode::conflict if the version differs; then
  // nothing was written.
  Result<AppendResult> append(const std::string& stream, uint64_t expected_version,
                              std::vector<NewEvent> events,
                              Durability durability = Durability::synced);
  using AppendCallback = std::function<void(Result<AppendResult>)>;
  // The same, completing on the writer thread (the callback must be quick).
  // With Durability::written the callback runs once the events are in the log (see Durability).
  void append_async(std::string stream, uint64_t expected_version, std::vector<NewEvent> events,
                    AppendCallback done, Durability durability = Durability::synced);

  // Current version of a stream (0 if it does not exist).
  Result<uint64_t> stream_version(const std::string& stream);
  // Events of a stream with version >= from_version, at most `max`.
  Result<std::vector<StoredEvent>> read_stream(const std::string& stream, uint64_t from_version = 1,
                                               size_t max = SIZE_MAX);
  // The audit log from global position `from` (1-based), at most `max`.
  Result<std::vector<StoredEvent>> read_all(uint64_t from = 1, size_t max = SIZE_MAX);
  // Events with from_ms <= time < to_ms, in global order within a millisecond.
  Result<std::vector<StoredEvent>> read_time_range(int64_t from_ms, int64_t to_ms,
                                                   size_t max = SIZE_MAX);
  // Every stream id with a prefix (e.g. "sbx_"), in byte order.
  Result<std::vector<std::string>> streams(const std::string& prefix = "");
  uint64_t last_global_seq() const;

  // Keeps a state snapshot of `stream` at `version` (replacing an older one). Not synced.
  Status save_snapshot(const std::string& stream, const StateSnapshot& snapshot);
  Result<std::optional<StateSnapshot>> load_snapshot(const std::string& stream);

  // Raw access for the key store (same database, its own key prefix).
  Status put(const std::string& key, const std::string& value, bool sync);
  Result<std::optional<std::string>> get(const std::string& key);
  Status remove(const std::string& key, bool sync);
  Result<std::vector<std::pair<std::string, std::string>>> scan(const std::string& prefix);

 private:
  struct Pending {
    std::string stream;
    uint64_t expected;
    std::vector<NewEvent> events;
    AppendCallback done;
    Durability durability = Durability::synced;
  };
  explicit EventStore(Options o);
  void writer_loop();
  void write_batch(std::vector<Pending>& batch);
  void sync_wal();  // fsyncs written-only appends (writer thread only)
  Result<uint64_t> head(const std::string& stream);  // writer thread only (cached)
  std::optional<uint64_t> free_bytes() const;        // on the store's file system
  // A write outside the writer thread (a state snapshot, a key record): refused as appends are,
  // then `op` under the shared lock; a failure refuses later writes (`what`; `failed` is the
  // message's prefix).
  Status direct_write(const char* what, const std::string& failed,
                      const std::function<rocksdb::Status(rocksdb::DB&)>& op);
  // Why a write may not go to RocksDB now: an earlier failure, or less free space than the reserve.
  std::optional<Error> write_refusal() const;
  void write_failed(const rocksdb::Status& s, const char* what);  // refuse writes from now on
  bool reopen();  // after a failure, once the reserve is free (writer thread only)

  Options options_;
  // Replaced only by reopen() (exclusive); every other use of db_ holds it shared. Null after a
  // reopen that failed: reads and writes answer io_error.
  mutable std::shared_mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  std::thread writer_;
  std::unordered_map<std::string, uint64_t> heads_;  // writer thread only
  // Written but not yet fsynced appends (writer thread only): synced by this time at the latest.
  std::optional<std::chrono::steady_clock::time_point> sync_due_;
  // A write failed (the disk full, an I/O error): writes are refused with `failure_` until a
  // reopen.
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mu_;
  Error failure_;
  std::atomic<uint64_t> global_{0};
};

}  // namespace pandastack::storage
