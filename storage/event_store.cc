#include "storage/event_store.h"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace pandastack::storage {

namespace {

constexpr uint32_t kRecordFormat = 1;  // layout of the stored event record itself

void put_be64(std::string& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out += char((v >> (8 * i)) & 0xff);
}
void put_be32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out += char((v >> (8 * i)) & 0xff);
}
uint64_t get_be64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | uint8_t(p[i]);
  return v;
}
uint32_t get_be32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | uint8_t(p[i]);
  return v;
}

std::string event_key(const std::string& stream, uint64_t version) {
  std::string k = "e" + stream;
  k += '\0';
  put_be64(k, version);
  return k;
}
std::string global_key(uint64_t g) {
  std::string k = "g";
  put_be64(k, g);
  return k;
}
std::string time_key(int64_t t, uint64_t g) {
  std::string k = "t";
  put_be64(k, uint64_t(t));
  put_be64(k, g);
  return k;
}
std::string head_key(const std::string& stream) { return "h" + stream; }
std::string snapshot_key(const std::string& stream) { return "s" + stream; }
const std::string kGlobalKey = "m/global";

// record: format(4) global(8) time(8) event_format(4) type_len(2) type payload
std::string encode_record(uint64_t global, int64_t time, const NewEvent& e) {
  std::string r;
  put_be32(r, kRecordFormat);
  put_be64(r, global);
  put_be64(r, uint64_t(time));
  put_be32(r, e.format);
  r += char(e.type.size() >> 8);
  r += char(e.type.size() & 0xff);
  r += e.type;
  r += e.payload;
  return r;
}

Result<StoredEvent> decode_record(const std::string& stream, uint64_t version,
                                  const std::string& r) {
  if (r.size() < 26) return make_error(ErrorCode::corrupt, "short event record in " + stream);
  if (get_be32(r.data()) != kRecordFormat)
    return make_error(ErrorCode::corrupt,
                      "event record format " + std::to_string(get_be32(r.data())) + " in " +
                          stream + " (this build reads " + std::to_string(kRecordFormat) + ")");
  StoredEvent e;
  e.stream = stream;
  e.version = version;
  e.global_seq = get_be64(r.data() + 4);
  e.time_ms = int64_t(get_be64(r.data() + 12));
  e.format = get_be32(r.data() + 20);
  size_t tl = (size_t(uint8_t(r[24])) << 8) | uint8_t(r[25]);
  if (r.size() < 26 + tl)
    return make_error(ErrorCode::corrupt, "truncated event record in " + stream);
  e.type = r.substr(26, tl);
  e.payload = r.substr(26 + tl);
  return e;
}

Error from_status(const rocksdb::Status& s, const std::string& what) {
  auto code = s.IsCorruption() ? ErrorCode::corrupt
              : s.IsNoSpace()  ? ErrorCode::no_space
                               : ErrorCode::io_error;
  return make_error(code, what + ": " + s.ToString());
}

// RocksDB's own log goes to ours (spdlog), not to a LOG file in the store's folder: on a full disk
// that file is the first writer to fail, and RocksDB 7.8 asserts on the next line it logs there.
class SpdLogger : public rocksdb::Logger {
 public:
  SpdLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel()) return;
    char line[1024];
    vsnprintf(line, sizeof line, format, ap);
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL)
      spdlog::error("rocksdb: {}", line);
    else
      spdlog::warn("rocksdb: {}", line);
  }
};

rocksdb::Options rocksdb_options(bool read_only) {
  rocksdb::Options opts;
  opts.create_if_missing = !read_only;
  opts.paranoid_checks = true;
  opts.IncreaseParallelism(2);
  opts.info_log = std::make_shared<SpdLogger>();
  // Events are small: 16 MiB memtables flush often enough and fit in the free-space reserve.
  opts.write_buffer_size = 16 << 20;
  return opts;
}

// Free space a reopen after a failed write waits for (at least).
constexpr uint64_t kReopenSpace = 16ull << 20;

Error closed_db() {
  return make_error(ErrorCode::io_error,
                    "the event store could not be reopened after a disk error (see the daemon's "
                    "log); restart the daemon");
}

}  // namespace

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::conflict:
      return "conflict";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::corrupt:
      return "corrupt";
    case ErrorCode::io_error:
      return "io_error";
    case ErrorCode::no_space:
      return "no_space";
    case ErrorCode::closed:
      return "closed";
  }
  return "unknown";
}

Result<std::unique_ptr<EventStore>> EventStore::open(Options o) {
  if (!o.clock_ms)
    o.clock_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  std::error_code ec;
  if (!o.read_only) std::filesystem::create_directories(o.dir, ec);
  if (ec)
    return make_error(ErrorCode::io_error, "cannot create " + o.dir.string() + ": " + ec.message());
  auto opts = rocksdb_options(o.read_only);
  rocksdb::DB* raw = nullptr;
  auto s = o.read_only ? rocksdb::DB::OpenForReadOnly(opts, o.dir.string(), &raw)
                       : rocksdb::DB::Open(opts, o.dir.string(), &raw);
  if (!s.ok()) return from_status(s, "cannot open event store " + o.dir.string());
  std::unique_ptr<EventStore> store(new EventStore(std::move(o)));
  store->db_.reset(raw);
  std::string g;
  s = store->db_->Get(rocksdb::ReadOptions(), kGlobalKey, &g);
  if (s.ok() && g.size() == 8)
    store->global_ = get_be64(g.data());
  else if (!s.IsNotFound())
    return from_status(s, "cannot read the global sequence");
  if (store->options_.read_only) {
    std::lock_guard lock(store->mu_);
    store->stop_ = true;  // no writer: appends are refused as on a closing store
  } else {
    store->writer_ = std::thread([p = store.get()] { p->writer_loop(); });
  }
  return store;
}

EventStore::EventStore(Options o) : options_(std::move(o)) {}

EventStore::~EventStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::unique_lock lk(db_mu_);
  if (db_) {
    // A graceful stop writes the memtable out: the next open replays an empty log instead of up
    // to a memtable's worth of it (start-up time stays flat however much was written).
    if (!options_.read_only) {
      auto f = db_->Flush(rocksdb::FlushOptions());
      if (!f.ok()) spdlog::warn("event store flush at close: {}", f.ToString());
    }
    auto s = db_->Close();
    if (!s.ok()) spdlog::warn("event store close: {}", s.ToString());
  }
}

uint64_t EventStore::last_global_seq() const { return global_.load(); }

Result<AppendResult> EventStore::append(const std::string& stream, uint64_t expected,
                                        std::vector<NewEvent> events, Durability durability) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<Result<AppendResult>> out;
  append_async(
      stream, expected, std::move(events),
      [&](Result<AppendResult> r) {
        std::lock_guard lock(m);
        out.emplace(std::move(r));
        cv.notify_one();
      },
      durability);
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return out.has_value(); });
  return std::move(*out);
}

void EventStore::append_async(std::string stream, uint64_t expected, std::vector<NewEvent> events,
                              AppendCallback done, Durability durability) {
  if (stream.empty() || stream.find('\0') != std::string::npos) {
    done(make_error(ErrorCode::invalid_argument, "stream ids are non-empty and contain no NUL"));
    return;
  }
  if (events.empty()) {
    done(make_error(ErrorCode::invalid_argument, "append of no events"));
    return;
  }
  for (auto& e : events)
    if (e.type.empty() || e.type.size() > 255) {
      done(make_error(ErrorCode::invalid_argument, "event type must be 1..255 bytes"));
      return;
    }
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      done(make_error(ErrorCode::closed, "event store is closing"));
      return;
    }
    queue_.push_back({std::move(stream), expected, std::move(events), std::move(done), durability});
  }
  cv_.notify_one();
}

Result<uint64_t> EventStore::head(const std::string& stream) {
  auto it = heads_.find(stream);
  if (it != heads_.end()) return it->second;
  auto h = stream_version(stream);
  if (h) heads_[stream] = *h;
  return h;
}

void EventStore::sync_wal() {
  if (!sync_due_ || failed_) return;
  sync_due_.reset();
  std::shared_lock lk(db_mu_);
  if (!db_) return;
  auto s = db_->SyncWAL();
  if (!s.ok()) spdlog::error("event store: syncing the log failed: {}", s.ToString());
}

void EventStore::writer_loop() {
  for (;;) {
    std::vector<Pending> batch;
    {
      std::unique_lock lock(mu_);
      auto ready = [this] { return stop_ || !queue_.empty(); };
      if (sync_due_) {
        // Written appends wait for their fsync at most until sync_due_.
        if (!cv_.wait_until(lock, *sync_due_, ready)) {
          lock.unlock();
          sync_wal();
          continue;
        }
      } else {
        cv_.wait(lock, ready);
      }
      if (queue_.empty() && stop_) {
        lock.unlock();
        sync_wal();
        return;
      }
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    write_batch(batch);
  }
}

void EventStore::write_batch(std::vector<Pending>& batch) {
  rocksdb::WriteBatch wb;
  std::vector<std::optional<Result<AppendResult>>> results(batch.size());
  std::unordered_map<std::string, uint64_t> staged;  // heads as of this batch
  uint64_t global = global_.load();
  int64_t now = options_.clock_ms();
  bool any = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = batch[i];
    uint64_t current;
    auto st = staged.find(p.stream);
    if (st != staged.end()) {
      current = st->second;
    } else {
      auto h = head(p.stream);
      if (!h) {
        results[i] = h.error();
        continue;
      }
      current = *h;
    }
    if (current != p.expected) {
      results[i] = make_error(ErrorCode::conflict,
                              "stream " + p.stream + " is at version " + std::to_string(current) +
                                  ", the append expected " + std::to_string(p.expected));
      continue;
    }
    AppendResult r;
    r.first_version = current + 1;
    r.first_global = global + 1;
    for (auto& e : p.events) {
      ++current;
      ++global;
      wb.Put(event_key(p.stream, current), encode_record(global, now, e));
      wb.Put(
          global_key(global), p.stream + std::string(1, '\0') + [&] {
            std::string v;
            put_be64(v, current);
            return v;
          }());
      wb.Put(time_key(now, global), "");
    }
    r.last_version = current;
    r.last_global = global;
    std::string hv;
    put_be64(hv, current);
    wb.Put(head_key(p.stream), hv);
    staged[p.stream] = current;
    results[i] = r;
    any = true;
  }
  if (any) {
    std::string gv;
    put_be64(gv, global);
    wb.Put(kGlobalKey, gv);
    rocksdb::WriteOptions wo;
    bool need_sync = false;
    for (auto& p : batch) need_sync |= p.durability == Durability::synced;
    // One synced write also makes every earlier written one durable (the log is sequential).
    wo.sync = options_.sync &&
              (need_sync || (sync_due_ && std::chrono::steady_clock::now() >= *sync_due_));
    if (options_.sync && !wo.sync && !sync_due_)
      sync_due_ = std::chrono::steady_clock::now() + options_.lazy_sync_delay;
    if (failed_) reopen();
    rocksdb::Status s;
    std::optional<Error> refused = write_refusal();
    if (!refused) {
      std::shared_lock lk(db_mu_);
      if (db_)
        s = db_->Write(wo, &wb);
      else
        refused = closed_db();
    }
    if (!refused && !s.ok()) write_failed(s, "append failed");
    if (refused || !s.ok()) {
      // Nothing of this batch is durable: fail every append in it (conflicts stay conflicts).
      auto err = refused ? *refused : from_status(s, "append failed");
      for (auto& r : results)
        if (r && r->ok()) r = err;
      heads_.clear();  // reload from disk: the staged heads were not written
    } else {
      global_ = global;
      for (auto& [stream, v] : staged) heads_[stream] = v;
      if (wo.sync) sync_due_.reset();
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) batch[i].done(std::move(*results[i]));
}

std::optional<uint64_t> EventStore::free_bytes() const {
  struct statvfs v {};
  if (::statvfs(options_.dir.c_str(), &v) != 0) return std::nullopt;
  return uint64_t(v.f_bavail) * v.f_frsize;
}

Status EventStore::direct_write(const char* what, const std::string& failed,
                                const std::function<rocksdb::Status(rocksdb::DB&)>& op) {
  if (auto refused = write_refusal()) return *refused;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  auto s = op(*db_);
  if (s.ok()) return Ok{};
  write_failed(s, what);
  return from_status(s, failed);
}

std::optional<Error> EventStore::write_refusal() const {
  if (failed_) {
    std::lock_guard lock(failure_mu_);
    return failure_;
  }
  if (options_.reserve_bytes == 0) return std::nullopt;
  auto free = free_bytes();
  if (!free || *free >= options_.reserve_bytes) return std::nullopt;
  return make_error(ErrorCode::no_space,
                    "the event store's disk (" + options_.dir.string() + ") has " +
                        std::to_string(*free >> 20) + " MiB free, less than its reserve of " +
                        std::to_string(options_.reserve_bytes >> 20) + " MiB: free some space");
}

void EventStore::write_failed(const rocksdb::Status& s, const char* what) {
  auto err = from_status(s, std::string(what) + " failed");
  err.message += " (writes are refused until the store reopens, once space is back)";
  {
    std::lock_guard lock(failure_mu_);
    failure_ = err;
  }
  if (!failed_.exchange(true))
    spdlog::error("event store: a write failed; writes are refused until it reopens: {}",
                  s.ToString());
}

bool EventStore::reopen() {
  // Only with room to spare: a reopen writes a new log and manifest, and one that fails leaves
  // the store read-only until the next try.
  auto free = free_bytes();
  if (free && *free < std::max<uint64_t>(options_.reserve_bytes, kReopenSpace)) return false;
  std::unique_lock lk(db_mu_);
  if (db_) {
    auto s = db_->Close();
    if (!s.ok()) spdlog::warn("event store: closing after the failure: {}", s.ToString());
    db_.reset();
  }
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(rocksdb_options(false), options_.dir.string(), &raw);
  if (!s.ok()) {
    spdlog::error("event store: cannot reopen {}: {}; reads go on read-only", options_.dir.string(),
                  s.ToString());
    if (rocksdb::DB::OpenForReadOnly(rocksdb_options(true), options_.dir.string(), &raw).ok())
      db_.reset(raw);
    return false;
  }
  db_.reset(raw);
  heads_.clear();  // from the reopened store: a failed write may still have reached it
  std::string g;
  if (db_->Get(rocksdb::ReadOptions(), kGlobalKey, &g).ok() && g.size() == 8)
    global_ = get_be64(g.data());
  sync_due_.reset();
  failed_ = false;
  spdlog::info("event store: reopened {} after the failure; writes resume", options_.dir.string());
  return true;
}

Result<uint64_t> EventStore::stream_version(const std::string& stream) {
  std::string v;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  auto s = db_->Get(rocksdb::ReadOptions(), head_key(stream), &v);
  if (s.IsNotFound()) return uint64_t(0);
  if (!s.ok()) return from_status(s, "cannot read head of " + stream);
  if (v.size() != 8) return make_error(ErrorCode::corrupt, "bad head record of " + stream);
  return get_be64(v.data());
}

Result<std::vector<StoredEvent>> EventStore::read_stream(const std::string& stream, uint64_t from,
                                                         size_t max) {
  std::vector<StoredEvent> out;
  std::string prefix = "e" + stream;
  prefix += '\0';
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(event_key(stream, std::max<uint64_t>(from, 1))); it->Valid() && out.size() < max;
       it->Next()) {
    auto k = it->key();
    if (!k.starts_with(prefix) || k.size() != prefix.size() + 8) break;
    auto e = decode_record(stream, get_be64(k.data() + prefix.size()), it->value().ToString());
    if (!e) return e.error();
    out.push_back(std::move(*e));
  }
  if (!it->status().ok()) return from_status(it->status(), "cannot read stream " + stream);
  return out;
}

Result<std::vector<StoredEvent>> EventStore::read_all(uint64_t from, size_t max) {
  std::vector<StoredEvent> out;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(global_key(std::max<uint64_t>(from, 1))); it->Valid() && out.size() < max;
       it->Next()) {
    auto k = it->key();
    if (k.size() != 9 || k[0] != 'g') break;
    auto v = it->value().ToString();
    auto nul = v.find('\0');
    if (nul == std::string::npos || v.size() != nul + 9)
      return make_error(ErrorCode::corrupt, "bad audit index entry");
    std::string stream = v.substr(0, nul);
    uint64_t version = get_be64(v.data() + nul + 1);
    std::string rec;
    auto s = db_->Get(rocksdb::ReadOptions(), event_key(stream, version), &rec);
    if (!s.ok()) return from_status(s, "audit entry without its event");
    auto e = decode_record(stream, version, rec);
    if (!e) return e.error();
    out.push_back(std::move(*e));
  }
  if (!it->status().ok()) return from_status(it->status(), "cannot read the audit log");
  return out;
}

Result<std::vector<StoredEvent>> EventStore::read_time_range(int64_t from_ms, int64_t to_ms,
                                                             size_t max) {
  std::vector<uint64_t> globals;
  {
    std::shared_lock lk(db_mu_);
    if (!db_) return closed_db();
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(time_key(from_ms, 0)); it->Valid() && globals.size() < max; it->Next()) {
      auto k = it->key();
      if (k.size() != 17 || k[0] != 't') break;
      if (int64_t(get_be64(k.data() + 1)) >= to_ms) break;
      globals.push_back(get_be64(k.data() + 9));
    }
  }
  std::vector<StoredEvent> out;
  for (uint64_t g : globals) {
    auto one = read_all(g, 1);
    if (!one) return one.error();
    if (!one->empty()) out.push_back(std::move(one->front()));
  }
  return out;
}

Result<std::vector<std::string>> EventStore::streams(const std::string& prefix) {
  std::vector<std::string> out;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  std::string p = "h" + prefix;
  for (it->Seek(p); it->Valid(); it->Next()) {
    auto k = it->key();
    if (!k.starts_with(p)) break;
    out.push_back(k.ToString().substr(1));
  }
  if (!it->status().ok()) return from_status(it->status(), "cannot list streams");
  return out;
}

Status EventStore::save_snapshot(const std::string& stream, const StateSnapshot& snap) {
  std::string v;
  put_be32(v, kRecordFormat);
  put_be64(v, snap.version);
  put_be32(v, snap.format);
  v += snap.state;
  // Not synced: a state snapshot is derived from synced events; losing the newest one in a crash
  // only makes the next replay longer. (Also keeps fsync off the actors' threads.)
  rocksdb::WriteOptions wo;
  wo.sync = false;
  return direct_write("saving a snapshot", "cannot save snapshot of " + stream,
                      [&](rocksdb::DB& db) { return db.Put(wo, snapshot_key(stream), v); });
}

Result<std::optional<StateSnapshot>> EventStore::load_snapshot(const std::string& stream) {
  std::string v;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  auto s = db_->Get(rocksdb::ReadOptions(), snapshot_key(stream), &v);
  if (s.IsNotFound()) return std::optional<StateSnapshot>();
  if (!s.ok()) return from_status(s, "cannot load snapshot of " + stream);
  if (v.size() < 16 || get_be32(v.data()) != kRecordFormat)
    return make_error(ErrorCode::corrupt, "bad snapshot record of " + stream);
  StateSnapshot snap;
  snap.version = get_be64(v.data() + 4);
  snap.format = get_be32(v.data() + 12);
  snap.state = v.substr(16);
  return std::optional<StateSnapshot>(std::move(snap));
}

Status EventStore::put(const std::string& key, const std::string& value, bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync && options_.sync;
  return direct_write("put", "put failed", [&](rocksdb::DB& db) { return db.Put(wo, key, value); });
}

Result<std::optional<std::string>> EventStore::get(const std::string& key) {
  std::string v;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  auto s = db_->Get(rocksdb::ReadOptions(), key, &v);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return from_status(s, "get failed");
  return std::optional<std::string>(std::move(v));
}

Status EventStore::remove(const std::string& key, bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync && options_.sync;
  return direct_write("delete", "delete failed",
                      [&](rocksdb::DB& db) { return db.Delete(wo, key); });
}

Result<std::vector<std::pair<std::string, std::string>>> EventStore::scan(
    const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  std::shared_lock lk(db_mu_);
  if (!db_) return closed_db();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
    out.emplace_back(it->key().ToString(), it->value().ToString());
  if (!it->status().ok()) return from_status(it->status(), "scan failed");
  return out;
}

}  // namespace pandastack::storage
