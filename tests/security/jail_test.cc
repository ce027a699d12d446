// Security tests of the QEMU jail (vmm-driver/jail.policy) against real VMs.

#include "vmm-driver/jail.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "tests/integration/test_env.h"
#include "vmm-driver/vm.h"

namespace pandastack::testing {
namespace {

namespace fs = std::filesystem;

std::string status_field(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) {
      auto v = line.substr(field.size() + 1);
      return v.substr(v.find_first_not_of(" \t"));
    }
  return "";
}

// A launch runs `before_exec` (where the driver writes a VM's live record) while the child exists
// but has not set up the jail or exec'd: a host killed at any moment never leaves a process that
// no record names. The child execs only afterwards.
TEST(Jail, TheLaunchRecordsTheChildBeforeItExecs) {
  // Without QEMU's -sandbox arguments: sleep would refuse them and exit at once (then, on a loaded
  // host, be gone before the test reads its /proc entry).
  auto policy = vmm::JailPolicy::builtin();
  policy.seccomp.clear();
  fs::path run = fs::path("/dev/shm") / ("pst-jail-rec-" + std::to_string(::getpid()));
  fs::create_directories(run);
  ASSERT_EQ(::chown(run.c_str(), policy.uid_base, policy.uid_base), 0);
  auto launch = vmm::JailLaunch::prepare(policy, {}, run, {}, policy.uid_base,
                                         {"/usr/bin/sleep", "5"}, -1, true);
  ASSERT_TRUE(launch) << launch.error().message;
  std::string exe_before;
  pid_t seen = -1;
  auto pid = (*launch)->start(nullptr, 0, [&](pid_t p) {
    seen = p;
    std::error_code ec;
    exe_before = fs::read_symlink("/proc/" + std::to_string(p) + "/exe", ec).string();
  });
  ASSERT_TRUE(pid) << pid.error().message;
  EXPECT_EQ(seen, *pid);
  EXPECT_EQ(exe_before, fs::read_symlink("/proc/self/exe").string()) << "it had exec'd already";
  EXPECT_EQ(fs::read_symlink("/proc/" + std::to_string(*pid) + "/exe").filename(), "sleep");
  ::kill(*pid, SIGKILL);
  ::waitpid(*pid, nullptr, 0);
  fs::remove_all(run);
  fs::remove_all(run.string() + ".jail");
}

TEST(Jail, QemuRunsUnprivilegedInItsOwnNamespacesAndRoot) {
  auto vm = boot_base("jail");
  ASSERT_NE(vm, nullptr);
  pid_t pid = vm->pid();
  // Not root, no capabilities at all, no way to gain any, a seccomp filter installed.
  auto uid = status_field(pid, "Uid");
  EXPECT_NE(uid.substr(0, uid.find_first_of(" \t")), "0") << uid;
  EXPECT_EQ(status_field(pid, "CapEff"), "0000000000000000");
  EXPECT_EQ(status_field(pid, "CapPrm"), "0000000000000000");
  EXPECT_EQ(status_field(pid, "CapBnd"), "0000000000000000");
  EXPECT_EQ(status_field(pid, "NoNewPrivs"), "1");
  EXPECT_EQ(status_field(pid, "Seccomp"), "2");
  // Its own mount, pid, ipc, uts and net namespaces.
  for (auto ns : {"mnt", "pid", "ipc", "uts", "net"}) {
    auto theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/ns/" + ns);
    auto ours = fs::read_symlink(std::string("/proc/self/ns/") + ns);
    EXPECT_NE(theirs, ours) << ns;
  }
  // Its root is the jail's tmpfs: the host's files are not there, the binds are, read-only.
  fs::path root = "/proc/" + std::to_string(pid) + "/root";
  EXPECT_NE(fs::read_symlink(root), fs::path("/"));
  EXPECT_FALSE(fs::exists(root / "etc/passwd"));
  EXPECT_FALSE(fs::exists(root / "root"));
  EXPECT_FALSE(fs::exists(root / "home"));
  EXPECT_TRUE(fs::exists(root / "usr/bin/qemu-system-x86_64"));
  int fd = ::open((root / "usr/pwned").c_str(), O_WRONLY | O_CREAT, 0644);
  EXPECT_LT(fd, 0) << "/usr in the jail is writable";
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(errno, EROFS);
  auto kernel_in_jail = root / fs::absolute(vm->config().kernel).relative_path();
  EXPECT_TRUE(fs::exists(kernel_in_jail));
  fd = ::open(kernel_in_jail.c_str(), O_WRONLY);
  EXPECT_LT(fd, 0) << "the guest image is writable from the jail";
  if (fd >= 0) ::close(fd);
  // The VM's run folder is there; QEMU makes its sockets in q/.
  EXPECT_TRUE(fs::exists(root / vm->config().run_dir.relative_path() / "q" / "agent.sock"));
  // In the jail's pid namespace QEMU is alone.
  size_t procs = 0;
  for (auto& e : fs::directory_iterator(root / "proc"))
    if (std::isdigit(e.path().filename().string()[0])) ++procs;
  EXPECT_EQ(procs, 1u);
  // The guest still works.
  auto r = vm->agent().exec([] {
    vmm::ExecRequest q;
    q.shell = "echo inside";
    q.timeout_ms = 30000;
    return q;
  }());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data, "inside\n");
  // Resource limits, where the host has cgroups.
  std::ifstream cg("/proc/" + std::to_string(pid) + "/cgroup");
  std::stringstream ss;
  ss << cg.rdbuf();
  if (fs::exists("/sys/fs/cgroup/cgroup.controllers") ||
      fs::exists("/sys/fs/cgroup/memory/cgroup.procs")) {
    EXPECT_NE(ss.str().find("pandastack/"), std::string::npos) << ss.str();
  }
  auto jail_root = vm->config().run_dir.string() + ".jail";
  vm.reset();
  EXPECT_FALSE(fs::exists(jail_root));
}

// Runs `f` in a child process as `uid` (what a QEMU compromised by its guest could do) and returns
// its exit code.
int as_uid(uid_t uid, const std::function<int()>& f) {
  pid_t p = ::fork();
  if (p == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
        ::setresuid(uid, uid, uid) != 0)
      ::_exit(99);
    ::_exit(f());
  }
  int status = 0;
  ::waitpid(p, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 98;
}

// H1 of the security review: QEMU (its uid) can neither plant a symlink where the daemon writes
// as root (run folder, disk folder) nor rewrite the VM's record; a socket it replaces with a link
// to another server is refused by the peer check; it holds no descriptor the daemon did not give
// it (M3).
TEST(Jail, QemuCannotPlantLinksRewriteItsRecordOrSwapItsSockets) {
  // A descriptor the daemon holds without close-on-exec while the VM starts.
  fs::path marker = fs::path("/dev/shm") / ("pst-leak-" + std::to_string(::getpid()));
  int leaked = ::open(marker.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(leaked, 0);
  auto vm = boot_base("plant");
  ::close(leaked);
  ASSERT_NE(vm, nullptr);
  pid_t pid = vm->pid();
  uid_t uid = 0;
  {
    struct stat st {};
    ASSERT_EQ(::stat(("/proc/" + std::to_string(pid)).c_str(), &st), 0);
    uid = st.st_uid;
  }
  ASSERT_NE(uid, 0u);
  auto run = vm->config().run_dir;
  auto disks = vm->config().disk_dir.empty() ? run : vm->config().disk_dir;
  // Nothing of the daemon's (the planted descriptor) is open in QEMU.
  for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    EXPECT_NE(fs::read_symlink(e.path(), ec), marker) << "QEMU inherited " << e.path();
  }
  fs::remove(marker);
  // The folders and the record are root's; QEMU's uid can create nothing there.
  auto owner = [](const fs::path& p) {
    struct stat st {};
    ::lstat(p.c_str(), &st);
    return st.st_uid;
  };
  EXPECT_EQ(owner(run), 0u);
  EXPECT_EQ(owner(disks), 0u);
  EXPECT_EQ(owner(run / "vm.json"), 0u);
  for (auto target : {run / "vm.json.tmp", run / "evil", disks / "disk-2.qcow2"})
    EXPECT_EQ(as_uid(uid, [&] { return ::symlink("/etc/shadow", target.c_str()) == 0 ? 0 : 1; }), 1)
        << "QEMU's uid planted " << target;
  EXPECT_EQ(as_uid(uid,
                   [&] {
                     int fd = ::open((run / "vm.json").c_str(), O_WRONLY);
                     return fd >= 0 ? 0 : 1;
                   }),
            1)
      << "QEMU's uid can rewrite the VM's record";
  EXPECT_EQ(
      as_uid(uid,
             [&] { return ::rename((run / "mem").c_str(), (run / "m2").c_str()) == 0 ? 0 : 1; }),
      1);
  // q/ is QEMU's: replacing its QMP socket with a link to a server of another uid (here: a
  // root-owned socket, like the daemon's RPC socket) makes the daemon refuse the connection.
  fs::path other = fs::path("/dev/shm") / ("pst-other-" + std::to_string(::getpid()) + ".sock");
  int srv = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, other.c_str());
  ::unlink(other.c_str());
  ASSERT_EQ(::bind(srv, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(srv, 4), 0);
  ::chmod(other.c_str(), 0777);
  auto qmp = run / "q" / "qmp.sock";
  EXPECT_EQ(as_uid(uid,
                   [&] {
                     return ::unlink(qmp.c_str()) == 0 && ::symlink(other.c_str(), qmp.c_str()) == 0
                                ? 0
                                : 1;
                   }),
            0)
      << "q/ should be QEMU's to write";
  auto c = vmm::QmpClient::connect(qmp.string(), std::chrono::milliseconds(2000), nullptr, uid);
  ASSERT_FALSE(c) << "the daemon talked to a socket that is not its QEMU's";
  EXPECT_NE(c.error().message.find("refusing"), std::string::npos) << c.error().message;
  ::close(srv);
  ::unlink(other.c_str());
}

}  // namespace
}  // namespace pandastack::testing
