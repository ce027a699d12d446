#include "storage/event_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;

class EventStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("es-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    reopen();
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }
  void reopen() {
    store_.reset();
    EventStore::Options o;
    o.dir = dir_;
    o.clock_ms = [this] { return now_.load(); };
    auto s = EventStore::open(o);
    ASSERT_TRUE(s) << s.error().message;
    store_ = std::move(*s);
  }
  static std::vector<NewEvent> evs(std::initializer_list<std::string> types) {
    std::vector<NewEvent> v;
    for (auto& t : types) v.push_back({t, 1, "payload-" + t});
    return v;
  }
  fs::path dir_;
  std::atomic<int64_t> now_{1000};
  std::unique_ptr<EventStore> store_;
};

TEST_F(EventStoreTest, AppendsAndReadsAStreamInOrder) {
  auto r = store_->append("sbx_a", 0, evs({"created", "started"}));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->first_version, 1u);
  EXPECT_EQ(r->last_version, 2u);
  EXPECT_EQ(r->first_global, 1u);
  auto r2 = store_->append("sbx_a", 2, evs({"hibernated"}));
  ASSERT_TRUE(r2);
  EXPECT_EQ(r2->last_version, 3u);
  auto events = store_->read_stream("sbx_a");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[0].type, "created");
  EXPECT_EQ((*events)[2].type, "hibernated");
  EXPECT_EQ((*events)[2].payload, "payload-hibernated");
  EXPECT_EQ((*events)[2].version, 3u);
  EXPECT_EQ((*events)[2].global_seq, 3u);
  EXPECT_EQ(*store_->stream_version("sbx_a"), 3u);
  EXPECT_EQ(*store_->stream_version("sbx_none"), 0u);
  auto tail = store_->read_stream("sbx_a", 2);
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].version, 2u);
}

TEST_F(EventStoreTest, ConflictingAppendFailsAndWritesNothing) {
  ASSERT_TRUE(store_->append("sbx_a", 0, evs({"created"})));
  auto stale = store_->append("sbx_a", 0, evs({"created"}));
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, ErrorCode::conflict);
  auto ahead = store_->append("sbx_a", 5, evs({"started"}));
  ASSERT_FALSE(ahead);
  EXPECT_EQ(ahead.error().code, ErrorCode::conflict);
  EXPECT_EQ(store_->read_stream("sbx_a")->size(), 1u);
  EXPECT_EQ(store_->last_global_seq(), 1u);
}

TEST_F(EventStoreTest, ConcurrentWritersToOneStreamNeverOverwrite) {
  // 8 threads race to append version N+1 of one stream; exactly one wins each version.
  ASSERT_TRUE(store_->append("sbx_race", 0, evs({"created"})));
  std::atomic<int> wins{0}, conflicts{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto v = store_->stream_version("sbx_race");
        auto r = store_->append("sbx_race", *v, evs({"exec-finished"}));
        (r ? wins : conflicts)++;
      }
    });
  for (auto& t : ts) t.join();
  auto events = store_->read_stream("sbx_race");
  ASSERT_EQ(events->size(), size_t(1 + wins.load()));
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].version, i + 1);
  EXPECT_EQ(wins + conflicts, 400);
}

TEST_F(EventStoreTest, GlobalAuditSequenceAndTimeIndexSpanAllStreams) {
  now_ = 5000;
  ASSERT_TRUE(store_->append("sbx_a", 0, evs({"created"})));
  now_ = 6000;
  ASSERT_TRUE(store_->append("sbx_b", 0, evs({"created", "started"})));
  now_ = 7000;
  ASSERT_TRUE(store_->append("sbx_a", 1, evs({"killed"})));
  auto all = store_->read_all();
  ASSERT_EQ(all->size(), 4u);
  std::vector<std::string> order;
  for (auto& e : *all) order.push_back(e.stream + ":" + e.type);
  EXPECT_EQ(order, (std::vector<std::string>{"sbx_a:created", "sbx_b:created", "sbx_b:started",
                                             "sbx_a:killed"}));
  for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*all)[i].global_seq, i + 1);
  auto from3 = store_->read_all(3, 10);
  ASSERT_EQ(from3->size(), 2u);
  EXPECT_EQ((*from3)[0].type, "started");
  auto range = store_->read_time_range(6000, 7000);
  ASSERT_EQ(range->size(), 2u);
  EXPECT_EQ((*range)[0].stream, "sbx_b");
  EXPECT_EQ((*range)[0].time_ms, 6000);
  auto streams = store_->streams("sbx_");
  EXPECT_EQ(*streams, (std::vector<std::string>{"sbx_a", "sbx_b"}));
}

TEST_F(EventStoreTest, EverythingSurvivesAReopen) {
  ASSERT_TRUE(store_->append("sbx_a", 0, evs({"created", "started"})));
  ASSERT_TRUE(store_->save_snapshot("sbx_a", {2, 1, "state-at-2"}));
  ASSERT_TRUE(store_->append("sbx_a", 2, evs({"hibernated"})));
  reopen();
  EXPECT_EQ(*store_->stream_version("sbx_a"), 3u);
  EXPECT_EQ(store_->last_global_seq(), 3u);
  auto snap = store_->load_snapshot("sbx_a");
  ASSERT_TRUE(snap);
  ASSERT_TRUE(snap->has_value());
  EXPECT_EQ((*snap)->version, 2u);
  EXPECT_EQ((*snap)->state, "state-at-2");
  // Snapshot + tail = the whole state.
  auto tail = store_->read_stream("sbx_a", (*snap)->version + 1);
  ASSERT_EQ(tail->size(), 1u);
  EXPECT_EQ((*tail)[0].type, "hibernated");
  ASSERT_TRUE(store_->append("sbx_a", 3, evs({"woke"})));
  EXPECT_EQ(store_->last_global_seq(), 4u);
  EXPECT_FALSE(store_->load_snapshot("sbx_b")->has_value());
}

TEST_F(EventStoreTest, RejectsBadInput) {
  EXPECT_EQ(store_->append("", 0, evs({"x"})).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(store_->append(std::string("a\0b", 3), 0, evs({"x"})).error().code,
            ErrorCode::invalid_argument);
  EXPECT_EQ(store_->append("s", 0, {}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(store_->append("s", 0, {{"", 1, ""}}).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(store_->append("s", 0, {{std::string(256, 't'), 1, ""}}).error().code,
            ErrorCode::invalid_argument);
}

TEST_F(EventStoreTest, GroupCommitBatchesConcurrentAppends) {
  // 16 writers on 16 streams: all succeed, and the global sequence has no gaps or duplicates.
  std::vector<std::thread> ts;
  for (int t = 0; t < 16; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i)
        ASSERT_TRUE(store_->append("s" + std::to_string(t), uint64_t(i), evs({"e"})));
    });
  for (auto& t : ts) t.join();
  auto all = store_->read_all();
  ASSERT_EQ(all->size(), 320u);
  for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*all)[i].global_seq, i + 1);
}

}  // namespace
}  // namespace pandastack::storage

namespace pandastack::storage {
namespace {

// A read-only store opens next to the writer (as `pandastack audit` does next to the daemon),
// sees what was written before it opened, and refuses appends.
TEST_F(EventStoreTest, WrittenAppendsAreReadableAtOnceAndDurableAfterAReopen) {
  for (uint64_t v = 0; v < 20; ++v) {
    auto r = store_->append("w", v, {{"tick", 1, "p" + std::to_string(v)}}, Durability::written);
    ASSERT_TRUE(r) << r.error().message;
  }
  auto evs = store_->read_stream("w");
  ASSERT_TRUE(evs);
  EXPECT_EQ(evs->size(), 20u);
  // A synced append after written ones: all of them, in order.
  ASSERT_TRUE(store_->append("w", 20, {{"tick", 1, "synced"}}));
  reopen();
  evs = store_->read_stream("w");
  ASSERT_TRUE(evs);
  ASSERT_EQ(evs->size(), 21u);
  EXPECT_EQ((*evs)[19].payload, "p19");
  EXPECT_EQ((*evs)[20].payload, "synced");
}

TEST(EventStoreReadOnly, OpensBesideAWriterAndRefusesAppends) {
  auto dir = fs::temp_directory_path() / ("es-ro-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto w = EventStore::open({dir, true, 1024, {}});
  ASSERT_TRUE(w);
  ASSERT_TRUE((*w)->append("sbx_a", 0, {{"created", 1, "x"}}));
  EventStore::Options ro;
  ro.dir = dir;
  ro.read_only = true;
  auto r = EventStore::open(ro);
  ASSERT_TRUE(r) << r.error().message;
  auto events = (*r)->read_stream("sbx_a");
  ASSERT_TRUE(events);
  EXPECT_EQ(events->size(), 1u);
  auto refused = (*r)->append("sbx_a", 1, {{"started", 1, "y"}});
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::closed);
  EventStore::Options missing;
  missing.dir = dir / "nope";
  missing.read_only = true;
  EXPECT_FALSE(EventStore::open(missing));
  r->reset();
  w->reset();
  fs::remove_all(dir);
}

// A tmpfs of `mib` MiB mounted for one test (root only), unmounted and removed after it.
class SmallDisk {
 public:
  explicit SmallDisk(int mib)
      : dir_(fs::temp_directory_path() / ("es-full-" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
    mounted_ =
        std::system(("mount -t tmpfs -o size=" + std::to_string(mib) + "m tmpfs " + dir_.string())
                        .c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) [[maybe_unused]]
      int r = std::system(("umount " + dir_.string()).c_str());
    fs::remove_all(dir_);
  }
  bool mounted() const { return mounted_; }
  bool grow(int mib) {
    return std::system(
               ("mount -o remount,size=" + std::to_string(mib) + "m " + dir_.string()).c_str()) ==
           0;
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  bool mounted_ = false;
};

// Appends of 64 KiB until `failures` of them failed; returns the last acknowledged version.
uint64_t fill(EventStore& store, int failures, ErrorCode expected, int* failed) {
  std::string big(64 * 1024, 'x');
  uint64_t v = *store.stream_version("s");
  *failed = 0;
  for (int i = 0; i < 2000 && *failed < failures; ++i) {
    auto r =
        store.append("s", v, {{"e", 1, big}}, i % 2 ? Durability::written : Durability::synced);
    if (r) {
      v = r->last_version;
    } else {
      ++*failed;
      EXPECT_EQ(r.error().code, expected) << r.error().message;
    }
  }
  return v;
}

// Past the reserve, writes are refused (no_space) before RocksDB meets the full disk; with room
// again they go on.
TEST(EventStoreFullDisk, WritesStopAtTheReserve) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  SmallDisk disk(48);
  ASSERT_TRUE(disk.mounted());
  EventStore::Options o;
  o.dir = disk.dir() / "store";
  o.reserve_bytes = 24 << 20;
  auto s = EventStore::open(o);
  ASSERT_TRUE(s) << s.error().message;
  int failed = 0;
  uint64_t v = fill(**s, 3, ErrorCode::no_space, &failed);
  ASSERT_EQ(failed, 3) << "the reserve was never reached";
  auto snap = (*s)->save_snapshot("s", StateSnapshot{v, 1, "state"});
  ASSERT_FALSE(snap);
  EXPECT_EQ(snap.error().code, ErrorCode::no_space);
  EXPECT_FALSE((*s)->put("k/x", "v", true));
  ASSERT_TRUE(disk.grow(128));
  auto r = (*s)->append("s", v, {{"e", 1, "small"}});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(*(*s)->stream_version("s"), v + 1);
}

// With no reserve, RocksDB meets the full disk: that append fails (no_space), the store refuses
// writes (not aborts: RocksDB 7.8 aborts on a write to a failed log), reads go on; once space is
// back the next append reopens it, and nothing acknowledged is lost.
TEST(EventStoreFullDisk, AFailedWriteReopensTheStoreOnceSpaceIsBack) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  SmallDisk disk(4);
  ASSERT_TRUE(disk.mounted());
  EventStore::Options o;
  o.dir = disk.dir() / "store";
  o.reserve_bytes = 0;
  uint64_t acked = 0;
  {
    auto s = EventStore::open(o);
    ASSERT_TRUE(s) << s.error().message;
    auto& store = **s;
    int failed = 0;
    acked = fill(store, 5, ErrorCode::no_space, &failed);
    ASSERT_EQ(failed, 5) << "the disk never filled";
    EXPECT_FALSE(store.save_snapshot("s", StateSnapshot{acked, 1, "state"}));
    EXPECT_FALSE(store.put("k/x", "v", true));
    EXPECT_EQ(*store.stream_version("s"), acked);  // reads go on
    auto events = store.read_stream("s");
    ASSERT_TRUE(events);
    EXPECT_EQ(events->size(), acked);
    ASSERT_TRUE(disk.grow(64));
    auto r = store.append("s", acked, {{"e", 1, "small"}});
    ASSERT_TRUE(r) << r.error().message;
    acked = r->last_version;
    EXPECT_TRUE(store.put("k/x", "v", true));
  }
  auto s = EventStore::open(o);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(*(*s)->stream_version("s"), acked);
  auto all = (*s)->read_all();
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size(), acked);
}

}  // namespace
}  // namespace pandastack::storage
