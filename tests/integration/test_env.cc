#include "tests/integration/test_env.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "vmm-driver/images.h"

namespace pandastack::testing {

std::filesystem::path images_dir() {
  if (const char* e = std::getenv("PANDASTACK_IMAGES")) return e;
  return std::filesystem::path(PANDASTACK_SOURCE_DIR) / "var" / "images";
}

vmm::IoThread& io() {
  static vmm::IoThread* t = new vmm::IoThread();  // lives until exit (VMs may outlive tests)
  return *t;
}

std::filesystem::path fresh_run_dir(const std::string& tag) {
  static std::atomic<int> n{0};
  return std::filesystem::path("/tmp") /
         ("pst-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++));
}

vmm::VmConfig base_config(const std::string& tag) {
  return vmm::config_for_template(images_dir(), "base", fresh_run_dir(tag));
}

std::unique_ptr<vmm::Vm> boot_base(const std::string& tag) {
  auto vm = vmm::Vm::boot(io(), base_config(tag));
  if (!vm) {
    ADD_FAILURE() << "boot failed: " << vm.error().message;
    return nullptr;
  }
  return std::move(*vm);
}

int count_processes(const std::string& needle) {
  int n = 0;
  DIR* d = ::opendir("/proc");
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find(needle) != std::string::npos) ++n;
  }
  ::closedir(d);
  return n;
}

namespace {

// A test case that runs for minutes is a hang until shown otherwise: after 3 minutes (and every 3
// after) this prints its name and every thread's stack (gdb), so a CI log says where it waits.
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

}  // namespace pandastack::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  spdlog::set_level(std::getenv("PANDASTACK_DEBUG") ? spdlog::level::debug : spdlog::level::info);
  if (!std::filesystem::exists(pandastack::testing::images_dir() / "base" / "rootfs.qcow2")) {
    std::fprintf(stderr, "guest image missing under %s: run `make guest-base` first\n",
                 pandastack::testing::images_dir().c_str());
    return 1;
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new pandastack::testing::Watchdog());
  return RUN_ALL_TESTS();
}
