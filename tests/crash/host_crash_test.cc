// The host process dies (SIGKILL) while it owns running VMs: no QEMU may survive it unaccounted.
// Uses the real `pandastack-vm` tool as the host process.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace {

using namespace std::chrono;

int count_processes(const std::string& needle) {
  int n = 0;
  DIR* d = ::opendir("/proc");
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find("qemu-system") != std::string::npos && cmd.find(needle) != std::string::npos) ++n;
  }
  ::closedir(d);
  return n;
}

TEST(HostCrash, KilledHostTakesItsQemuWithIt) {
  std::string images = std::string(PANDASTACK_SOURCE_DIR) + "/var/images";
  if (const char* e = std::getenv("PANDASTACK_IMAGES")) images = e;
  pid_t host = ::fork();
  if (host == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(PANDASTACK_VM, PANDASTACK_VM, "--images", images.c_str(), "--", "sleep", "600", nullptr);
    ::_exit(127);
  }
  std::string tag = "pandastack-vm-" + std::to_string(host);
  // Wait for its VM to be up (a cold boot under TCG).
  int found = 0;
  for (int i = 0; i < 600 && found == 0; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    found = count_processes(tag);
  }
  ASSERT_EQ(found, 1) << "the host never started its VM";
  std::this_thread::sleep_for(seconds(5));  // inside the guest command now
  ASSERT_EQ(::kill(host, SIGKILL), 0);
  int status;
  ::waitpid(host, &status, 0);
  int left = 1;
  for (int i = 0; i < 50 && left > 0; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    left = count_processes(tag);
  }
  EXPECT_EQ(left, 0) << "QEMU outlived its host process";
  std::error_code ec;
  std::filesystem::remove_all("/tmp/" + tag, ec);
  std::filesystem::remove_all("/tmp/" + tag + ".jail", ec);
}

}  // namespace
