// Crash test of the event store (the idea of RocksDB's crash test): a child process appends under
// load and is killed with SIGKILL at a random point, 50 times over one database. After each kill
// the store must hold every acknowledged event, in order, with no partial event visible.

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include "storage/event_store.h"

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono;

std::string payload_for(const std::string& stream, uint64_t version) {
  std::string p = stream + ":" + std::to_string(version) + ":";
  while (p.size() < 300) p += char('a' + (p.size() * 7 + version) % 26);
  return p;
}

TEST(EventStoreCrash, AcknowledgedEventsSurviveSigkill50Times) {
  fs::path dir = fs::temp_directory_path() / ("es-crash-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::mt19937 rng(std::random_device{}());
  // Highest acknowledged version per stream: every stream the writer appends to (c0..c3), also
  // before its first acknowledgement (an append can be durable and the writer killed before it
  // says so: its events are in the audit log and must be in their stream too).
  std::map<std::string, uint64_t> acked;
  for (int t = 0; t < 4; ++t) acked["c" + std::to_string(t)] = 0;
  uint64_t total_acks = 0;
  for (int round = 0; round < 50; ++round) {
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::execl(CRASH_WRITER, CRASH_WRITER, dir.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    // Let it write for a random while, reading acknowledgements as they come.
    auto kill_at =
        steady_clock::now() + milliseconds(std::uniform_int_distribution<int>(30, 250)(rng));
    std::string buf;
    char chunk[4096];
    while (steady_clock::now() < kill_at) {
      pollfd p{out[0], POLLIN, 0};
      int left = int(duration_cast<milliseconds>(kill_at - steady_clock::now()).count());
      if (::poll(&p, 1, std::max(left, 1)) > 0) {
        ssize_t n = ::read(out[0], chunk, sizeof chunk);
        if (n <= 0) break;
        buf.append(chunk, size_t(n));
      }
    }
    ::kill(pid, SIGKILL);
    ssize_t n;
    while ((n = ::read(out[0], chunk, sizeof chunk)) > 0) buf.append(chunk, size_t(n));
    ::close(out[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself (status " << status << ")";
    std::istringstream lines(buf);
    std::string stream;
    uint64_t version;
    while (lines >> stream >> version) {
      acked[stream] = std::max(acked[stream], version);
      ++total_acks;
    }
    // Recover and check.
    auto store = EventStore::open({dir, true, 1024, {}});
    ASSERT_TRUE(store) << store.error().message;
    uint64_t events = 0;
    for (auto& [s, max_acked] : acked) {
      auto evs = (*store)->read_stream(s);
      ASSERT_TRUE(evs) << evs.error().message;
      ASSERT_GE(evs->size(), max_acked)
          << "round " << round << ": acknowledged events of " << s << " lost";
      for (size_t i = 0; i < evs->size(); ++i) {
        ASSERT_EQ((*evs)[i].version, i + 1) << s;
        ASSERT_EQ((*evs)[i].payload, payload_for(s, i + 1))
            << "round " << round << ": partial or wrong event";
      }
      ASSERT_EQ(*(*store)->stream_version(s), evs->size());
      events += evs->size();
    }
    auto all = (*store)->read_all();
    ASSERT_TRUE(all);
    ASSERT_EQ(all->size(), events) << "audit log and streams disagree";
    for (size_t i = 0; i < all->size(); ++i) ASSERT_EQ((*all)[i].global_seq, i + 1);
    ASSERT_EQ((*store)->last_global_seq(), events);
  }
  EXPECT_GT(total_acks, 100u) << "the writer hardly wrote: the test proved little";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pandastack::storage
