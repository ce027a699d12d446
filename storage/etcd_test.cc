// The etcd client against a real etcd (Debian's etcd-server) started by the test on free loopback
// ports, in a folder of its own. Skipped when etcd is not installed.
#include "storage/etcd.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists("/usr/bin/etcd")) GTEST_SKIP() << "etcd is not installed (make deps)";
    dir_ = fs::temp_directory_path() / ("etcd-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    int client = free_port(), peer = free_port();
    url_ = "http://127.0.0.1:" + std::to_string(client);
    std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = (dir_.string() + ".log");
      FILE* f = ::freopen(log.c_str(), "w", stderr);
      (void)f;
      ::execl("/usr/bin/etcd", "etcd", "--data-dir", dir_.c_str(), "--listen-client-urls",
              url_.c_str(), "--advertise-client-urls", url_.c_str(), "--listen-peer-urls",
              peer_url.c_str(), "--initial-advertise-peer-urls", peer_url.c_str(),
              "--initial-cluster", ("default=" + peer_url).c_str(), nullptr);
      ::_exit(127);
    }
    etcd_ = std::make_unique<Etcd>(url_);
    for (int i = 0; i < 200; ++i) {
      if (etcd_->get("probe")) return;
      std::this_thread::sleep_for(milliseconds(50));
    }
    FAIL() << "etcd did not start";
  }
  void TearDown() override {
    etcd_.reset();
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
    fs::remove(dir_.string() + ".log");
  }
  fs::path dir_;
  std::string url_;
  pid_t pid_ = -1;
  std::unique_ptr<Etcd> etcd_;
};

TEST_F(EtcdTest, PutGetListErase) {
  std::string binary("v\0\xff\x01", 4);
  ASSERT_TRUE(etcd_->put("/t/a", binary));
  ASSERT_TRUE(etcd_->put("/t/b", "2"));
  ASSERT_TRUE(etcd_->put("/u/c", "3"));
  auto a = etcd_->get("/t/a");
  ASSERT_TRUE(a && a->has_value());
  EXPECT_EQ((*a)->value, binary);
  EXPECT_GT((*a)->mod_revision, 0);
  auto none = etcd_->get("/t/none");
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  auto l = etcd_->list("/t/");
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].key, "/t/a");
  EXPECT_EQ((*l)[1].key, "/t/b");
  ASSERT_TRUE(etcd_->erase("/t/a"));
  EXPECT_EQ(etcd_->list("/t/")->size(), 1u);
}

TEST_F(EtcdTest, CreateIsOnceAndReplaceComparesRevisions) {
  auto first = etcd_->create("/owner/x", "h1");
  ASSERT_TRUE(first);
  EXPECT_TRUE(*first);
  std::optional<EtcdKv> current;
  auto second = etcd_->create("/owner/x", "h2", 0, &current);
  ASSERT_TRUE(second);
  EXPECT_FALSE(*second);
  ASSERT_TRUE(current.has_value());
  EXPECT_EQ(current->value, "h1");
  auto stale = etcd_->replace("/owner/x", "h3", current->mod_revision + 1);
  ASSERT_TRUE(stale);
  EXPECT_FALSE(*stale);
  auto moved = etcd_->replace("/owner/x", "h3", current->mod_revision);
  ASSERT_TRUE(moved);
  EXPECT_TRUE(*moved);
  EXPECT_EQ((*etcd_->get("/owner/x"))->value, "h3");
}

TEST_F(EtcdTest, ReplacingSeveralKeysIsAllOrNothing) {
  ASSERT_TRUE(etcd_->create("/owner/a", "h1"));
  ASSERT_TRUE(etcd_->create("/owner/b", "h1"));
  auto a = *etcd_->get("/owner/a");
  auto b = *etcd_->get("/owner/b");
  // One revision is stale: neither key moves.
  auto stale = etcd_->replace(
      {{"/owner/a", "h2", a->mod_revision}, {"/owner/b", "h2", b->mod_revision + 1}});
  ASSERT_TRUE(stale);
  EXPECT_FALSE(*stale);
  EXPECT_EQ((*etcd_->get("/owner/a"))->value, "h1");
  EXPECT_EQ((*etcd_->get("/owner/b"))->value, "h1");
  auto moved =
      etcd_->replace({{"/owner/a", "h2", a->mod_revision}, {"/owner/b", "h2", b->mod_revision}});
  ASSERT_TRUE(moved);
  EXPECT_TRUE(*moved);
  EXPECT_EQ((*etcd_->get("/owner/a"))->value, "h2");
  EXPECT_EQ((*etcd_->get("/owner/b"))->value, "h2");
}

TEST_F(EtcdTest, ATransactionChecksAbsentKeysAndErases) {
  // An adoption's shape (actors/cluster.h): the owner moves, the parked record goes, only while
  // the old owner's host record is absent.
  ASSERT_TRUE(etcd_->create("/owner/s", "h2"));
  ASSERT_TRUE(etcd_->create("/parked/s", "record"));
  ASSERT_TRUE(etcd_->create("/hosts/h2", "up"));
  auto owner = *etcd_->get("/owner/s");
  auto parked = *etcd_->get("/parked/s");
  using Op = Etcd::Replacement::Op;
  std::vector<Etcd::Replacement> adopt{{"/owner/s", "h1", owner->mod_revision},
                                       {"/parked/s", "", parked->mod_revision, Op::erase},
                                       {"/hosts/h2", "", 0, Op::check}};
  auto refused = etcd_->replace(adopt);  // h2 is up
  ASSERT_TRUE(refused);
  EXPECT_FALSE(*refused);
  EXPECT_TRUE(etcd_->get("/parked/s")->has_value());
  ASSERT_TRUE(etcd_->erase("/hosts/h2"));
  auto adopted = etcd_->replace(adopt);
  ASSERT_TRUE(adopted);
  EXPECT_TRUE(*adopted);
  EXPECT_EQ((*etcd_->get("/owner/s"))->value, "h1");
  EXPECT_FALSE(etcd_->get("/parked/s")->has_value());
  EXPECT_FALSE(etcd_->get("/hosts/h2")->has_value());  // (checked, not written)
  auto again = etcd_->replace(adopt);  // the same adoption a second time: revisions moved
  ASSERT_TRUE(again);
  EXPECT_FALSE(*again);
}

TEST_F(EtcdTest, ConcurrentCreatesHaveOneWinner) {
  std::atomic<int> wins{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] {
      Etcd mine(url_);
      auto r = mine.create("/owner/race", "h" + std::to_string(i));
      if (r && *r) ++wins;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wins, 1);
}

TEST_F(EtcdTest, KeysUnderALeaseGoWithIt) {
  auto lease = etcd_->grant(seconds(2));
  ASSERT_TRUE(lease);
  ASSERT_TRUE(etcd_->put("/hosts/h1", "up", *lease));
  auto ttl = etcd_->keepalive(*lease);
  ASSERT_TRUE(ttl);
  EXPECT_GT(*ttl, 0);
  EXPECT_TRUE((*etcd_->get("/hosts/h1")).has_value());
  ASSERT_TRUE(etcd_->revoke(*lease));
  EXPECT_FALSE((*etcd_->get("/hosts/h1")).has_value());
  auto gone = etcd_->keepalive(*lease);
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, 0);  // an expired lease keeps nothing alive
}

TEST_F(EtcdTest, AnUnreachableEtcdIsAnError) {
  Etcd nobody("http://127.0.0.1:1", std::nullopt, milliseconds(300));
  auto r = nobody.get("/x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::io_error);
}

TEST(EtcdPrefix, EndIsTheNextKey) {
  EXPECT_EQ(etcd_prefix_end("/a/"), "/a0");
  EXPECT_EQ(etcd_prefix_end(std::string("a\xff", 2)), "b");
}

}  // namespace
}  // namespace pandastack::storage
