#include "vmm-driver/vm_watcher.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace pandastack::vmm {
namespace {

pid_t sleeper() {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execlp("sleep", "sleep", "30", nullptr);
    ::_exit(127);
  }
  return pid;
}

bool wait_for(const std::atomic<int>& v, int want) {
  for (int i = 0; i < 500 && v.load() != want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return v.load() == want;
}

TEST(VmWatcher, ReportsAProcessThatDiesAndNothingAfterUnwatch) {
  VmWatcher w;
  std::atomic<int> died{0};
  pid_t a = sleeper(), b = sleeper();
  auto ta = w.watch(a, [&] { ++died; });
  auto tb = w.watch(b, [&] { died += 100; });
  ASSERT_TRUE(ta && tb);
  EXPECT_EQ(w.watched(), 2u);
  ::kill(a, SIGKILL);
  EXPECT_TRUE(wait_for(died, 1));
  // A process stopped on purpose: unwatched first, its end is not reported.
  w.unwatch(*tb);
  ::kill(b, SIGKILL);
  int st;
  ::waitpid(a, &st, 0);  // the watcher never reaps: the owner still gets the exit status
  EXPECT_TRUE(WIFSIGNALED(st));
  ::waitpid(b, &st, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(died.load(), 1);
  EXPECT_EQ(w.watched(), 0u);
}

TEST(VmWatcher, AProcessAlreadyGoneIsReportedOrRefused) {
  VmWatcher w;
  pid_t a = sleeper();
  ::kill(a, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a zombie now
  std::atomic<int> died{0};
  auto t = w.watch(a, [&] { ++died; });
  ASSERT_TRUE(t);
  EXPECT_TRUE(wait_for(died, 1));
  int st;
  ::waitpid(a, &st, 0);
  EXPECT_FALSE(w.watch(a, [] {}));  // reaped: no such process
}

}  // namespace
}  // namespace pandastack::vmm
