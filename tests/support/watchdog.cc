#include "tests/support/watchdog.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace pandastack::testing {

namespace {

// See watchdog.h.
// (Declared before thread_: the thread reads the others.)
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  Watchdog() : thread_([this] { loop(); }) {}
  ~Watchdog() override {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void OnTestStart(const ::testing::TestInfo& t) override {
    std::lock_guard lock(mu_);
    name_ = std::string(t.test_suite_name()) + "." + t.name();
    started_ = std::chrono::steady_clock::now();
    reports_ = 0;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard lock(mu_);
    name_.clear();
  }

 private:
  // PANDASTACK_WATCHDOG_SECONDS overrides the 3 minutes (to see it work).
  const std::chrono::seconds kAfter{std::getenv("PANDASTACK_WATCHDOG_SECONDS")
                                        ? std::atoi(std::getenv("PANDASTACK_WATCHDOG_SECONDS"))
                                        : 180};
  void loop() {
    std::unique_lock lock(mu_);
    while (!done_) {
      cv_.wait_for(lock, std::chrono::seconds(5));
      if (name_.empty() || std::chrono::steady_clock::now() - started_ < kAfter * (reports_ + 1))
        continue;
      ++reports_;
      std::fprintf(stderr, "WATCHDOG: %s still running after %lld s; its threads:\n", name_.c_str(),
                   static_cast<long long>(kAfter.count()) * reports_);
      lock.unlock();
      dump_threads();
      lock.lock();
    }
  }
  static void dump_threads() {
    std::string pid = std::to_string(::getpid());
    pid_t p = ::fork();
    if (p == 0) {
      ::dup2(2, 1);
      ::execlp("gdb", "gdb", "-p", pid.c_str(), "-batch", "-nx", "-ex", "thread apply all bt 25",
               nullptr);
      ::_exit(127);
    }
    if (p > 0) ::waitpid(p, nullptr, 0);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string name_;
  std::chrono::steady_clock::time_point started_;
  int reports_ = 0;
  std::thread thread_;
};

}  // namespace

void install_watchdog() {
  ::testing::UnitTest::GetInstance()->listeners().Append(new Watchdog());
}

}  // namespace pandastack::testing
