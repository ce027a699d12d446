// Unit tests of the guest agent's parts that need no VM: the accounts it reads, the file helpers
// behind the file calls, and starting commands (spawn: argv or shell, environment, working
// folder, a terminal, another user through this binary's --run-as mode). They run on the host
// against real files and real processes (the agent's own main is not linked: this file's main
// serves --run-as as the agent's does).
#include <capnp/message.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "guest/agent/memory.h"
#include "guest/agent/spawn.h"
#include "guest/agent/users.h"
#include "guest/agent/util.h"

namespace pandastack::agent {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char d[] = "/tmp/agent-test-XXXXXX";
    if (::mkdtemp(d) == nullptr) throw std::runtime_error("mkdtemp");
    path_ = d;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name, const std::string& content) const {
    auto p = path_ / name;
    std::ofstream(p) << content;
    return p.string();
  }

 private:
  fs::path path_;
};

TEST(AgentAccounts, AnAccountWithItsGroupsFromTheGivenFiles) {
  TempDir t;
  auto passwd = t.file("passwd",
                       "# a comment\n"
                       "root:x:0:0:root:/root:/bin/bash\n"
                       "app:x:1000:1000:App:/home/app:/bin/sh\n"
                       "nohome:x:1001:1001:::\n"
                       "broken:x:abc:1:b:/b:/bin/sh\n"
                       "short:x:5\n");
  auto group = t.file("group",
                      "app:x:1000:\n"
                      "docker:x:998:app,other\n"
                      "audio:x:29:other\n"
                      "wheel:x:10:root,app\n"
                      "bad:x:zz:app\n");
  AccountFiles files{passwd.c_str(), group.c_str()};
  auto app = find_account("app", files);
  ASSERT_TRUE(app);
  EXPECT_EQ(app->uid, 1000u);
  EXPECT_EQ(app->gid, 1000u);
  EXPECT_EQ(app->home, "/home/app");
  EXPECT_EQ(app->shell, "/bin/sh");
  EXPECT_EQ(app->groups, (std::vector<gid_t>{1000, 998, 10}));  // its own first
  // An empty home is "/"; an empty trailing field is still a field.
  auto nohome = find_account("nohome", files);
  ASSERT_TRUE(nohome);
  EXPECT_EQ(nohome->home, "/");
  EXPECT_EQ(nohome->shell, "");
  // Malformed lines and unknown names are no account; neither is the empty name.
  EXPECT_FALSE(find_account("broken", files));
  EXPECT_FALSE(find_account("short", files));
  EXPECT_FALSE(find_account("nobody-here", files));
  EXPECT_FALSE(find_account("", files));
  EXPECT_FALSE(find_account("# a comment", files));
  // Missing files: nothing found, no failure.
  AccountFiles none{"/nonexistent/passwd", "/nonexistent/group"};
  EXPECT_FALSE(find_account("root", none));
}

TEST(AgentAccounts, NamesForAListingFallBackToNumbers) {
  TempDir t;
  auto passwd = t.file("passwd", "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:\n");
  auto group = t.file("group", "root:x:0:\nstaff:x:50:\n");
  Names n(AccountFiles{passwd.c_str(), group.c_str()});
  EXPECT_EQ(n.user(0), "root");
  EXPECT_EQ(n.user(1000), "app");
  EXPECT_EQ(n.user(4242), "4242");
  EXPECT_EQ(n.group(50), "staff");
  EXPECT_EQ(n.group(7), "7");
  // Read once: a change afterwards is not seen by the same listing.
  std::ofstream(passwd) << "other:x:0:0::/:/bin/sh\n";
  EXPECT_EQ(n.user(0), "root");
}

TEST(AgentFiles, StatusesCodesAndPaths) {
  EXPECT_EQ(decode_status(3 << 8), 3);          // exited with 3
  EXPECT_EQ(decode_status(SIGKILL), -SIGKILL);  // killed
  EXPECT_STREQ(errno_code(ENOENT), "not_found");
  EXPECT_STREQ(errno_code(ENOTDIR), "not_a_directory");
  EXPECT_STREQ(errno_code(EISDIR), "is_a_directory");
  EXPECT_STREQ(errno_code(EPERM), "permission_denied");
  EXPECT_STREQ(errno_code(EACCES), "permission_denied");
  EXPECT_STREQ(errno_code(ENAMETOOLONG), "invalid_argument");
  EXPECT_STREQ(errno_code(ENOSPC), "no_space");
  EXPECT_STREQ(errno_code(EIO), "io_error");
  EXPECT_EQ(resolve("notes.txt"), "/workspace/notes.txt");
  EXPECT_EQ(resolve("/etc/hosts"), "/etc/hosts");
  EXPECT_EQ(resolve(""), "/workspace/");
}

TEST(AgentFiles, MkdirPMakesEachFolderOnceAndStopsAtAFile) {
  TempDir t;
  auto deep = (t.path() / "a/b/c").string();
  EXPECT_EQ(mkdir_p(deep, 0750), 0);
  EXPECT_TRUE(fs::is_directory(deep));
  mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(deep.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750 & ~mask);
  EXPECT_EQ(mkdir_p(deep, 0750), 0);  // (there already)
  t.file("plain", "x");
  EXPECT_EQ(mkdir_p((t.path() / "plain").string(), 0755), ENOTDIR);
  EXPECT_EQ(mkdir_p((t.path() / "plain/below").string(), 0755), ENOTDIR);
  EXPECT_EQ(mkdir_p("/", 0755), 0);
  EXPECT_EQ(mkdir_p("", 0755), 0);
}

TEST(AgentFiles, RemoveTreeNeverFollowsALink) {
  TempDir t, outside;
  auto kept = outside.file("kept", "outside");
  fs::create_directories(t.path() / "tree/sub");
  t.file("tree/sub/f", "x");
  fs::create_symlink(outside.path(), t.path() / "tree/link-to-dir");
  fs::create_symlink(kept, t.path() / "tree/sub/link-to-file");
  EXPECT_EQ(remove_tree((t.path() / "tree").string()), 0);
  EXPECT_FALSE(fs::exists(t.path() / "tree"));
  EXPECT_TRUE(fs::exists(kept));  // the links went, not what they named
  // A link as the tree itself: the link goes.
  fs::create_symlink(outside.path(), t.path() / "top-link");
  EXPECT_EQ(remove_tree((t.path() / "top-link").string()), 0);
  EXPECT_TRUE(fs::exists(kept));
  EXPECT_EQ(remove_tree((t.path() / "missing").string()), ENOENT);
}

TEST(AgentFiles, ASmallFileIsRewrittenOnlyWhenItChanges) {
  TempDir t;
  auto p = t.file("hostname", "sbx-1");
  struct stat before {};
  ASSERT_EQ(::stat(p.c_str(), &before), 0);
  ::usleep(20000);
  write_small_file(p.c_str(), "sbx-1");
  struct stat same {};
  ASSERT_EQ(::stat(p.c_str(), &same), 0);
  EXPECT_EQ(same.st_mtim.tv_nsec, before.st_mtim.tv_nsec);  // not written again
  EXPECT_EQ(same.st_mtim.tv_sec, before.st_mtim.tv_sec);
  write_small_file(p.c_str(), "sbx-2");
  EXPECT_EQ(read_small(p.c_str()), "sbx-2");
  write_small_file(p.c_str(), "sbx-2-longer");  // (a prefix of the new content is a change)
  EXPECT_EQ(read_small(p.c_str()), "sbx-2-longer");
  write_small_file(p.c_str(), "sbx");
  EXPECT_EQ(read_small(p.c_str()), "sbx");
  EXPECT_EQ(read_small((t.path() / "missing").c_str()), "");
}

TEST(AgentFiles, MetadataIsExactlyWhatWasSetAndListed) {
  TempDir t;
  auto p = t.file("f", "x");
  int fd = ::open(p.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  capnp::MallocMessageBuilder mb;
  auto meta = mb.initRoot<w::FileStat>().initMetadata(2);
  meta[0].setName("owner");
  meta[0].setValue("agent-7");
  meta[1].setName("kind");
  meta[1].setValue("notes");
  int e = set_metadata(fd, meta.asReader());
  if (e == ENOTSUP) {
    ::close(fd);
    GTEST_SKIP() << "no user extended attributes on " << t.path();
  }
  ASSERT_EQ(e, 0) << strerror(e);
  // Set again with one: the other goes (exactly what was asked).
  capnp::MallocMessageBuilder mb2;
  auto one = mb2.initRoot<w::FileStat>().initMetadata(1);
  one[0].setName("owner");
  one[0].setValue("agent-8");
  ASSERT_EQ(set_metadata(fd, one.asReader()), 0);
  ::close(fd);
  struct stat st {};
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  capnp::MallocMessageBuilder out;
  auto b = out.initRoot<w::FileStat>();
  Names names;
  fill_stat(b, "f", p, st, names);
  EXPECT_EQ(std::string(b.getName().cStr()), "f");
  ASSERT_EQ(b.getMetadata().size(), 1u);
  EXPECT_EQ(std::string(b.getMetadata()[0].getName().cStr()), "owner");
  EXPECT_EQ(std::string(b.getMetadata()[0].getValue().cStr()), "agent-8");
}

// ---- spawn ----

struct Ran {
  std::string out, err;
  int status = -1;
};

// Everything `r`'s command writes until both streams end, then its exit (its descriptors closed).
Ran collect(SpawnResult& r) {
  Ran ran;
  if (r.in >= 0) ::close(r.in);
  std::vector<std::pair<int, std::string*>> open;
  if (r.out >= 0) open.push_back({r.out, &ran.out});
  if (r.err >= 0 && r.err != r.out) open.push_back({r.err, &ran.err});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!open.empty() && std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> p;
    for (auto& [fd, s] : open) p.push_back({fd, POLLIN, 0});
    ::poll(p.data(), p.size(), 200);
    for (size_t i = p.size(); i-- > 0;) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = ::read(open[i].first, buf, sizeof buf);
      if (n > 0) {
        open[i].second->append(buf, size_t(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {  // (EIO: a terminal's end)
        ::close(open[i].first);
        open.erase(open.begin() + long(i));
      }
    }
  }
  for (auto& [fd, s] : open) ::close(fd);
  ::waitpid(r.pid, &ran.status, 0);
  return ran;
}

struct Request {
  capnp::MallocMessageBuilder mb;
  w::ExecRequest::Builder req = mb.initRoot<w::ExecRequest>();
};

TEST(AgentSpawn, ArgvShellEnvironmentAndWorkingFolder) {
  TempDir t;
  Request a;
  auto argv = a.req.initArgv(3);
  argv.set(0, "printf");  // (found on the command's PATH)
  argv.set(1, "%s|%s");
  argv.set(2, "two words");
  a.req.setCwd(t.path().string());
  EXPECT_EQ(describe(a.req.asReader()), "printf %s|%s two words");
  auto r = spawn(a.req.asReader());
  ASSERT_EQ(r.error, "");
  auto ran = collect(r);
  EXPECT_EQ(ran.out, "two words|");
  EXPECT_EQ(decode_status(ran.status), 0);

  Request s;
  s.req.setShell("echo \"$GREETING\" in $(pwd); echo oops >&2; exit 7");
  auto env = s.req.initEnv(2);
  env[0].setName("GREETING");
  env[0].setValue("hello there");
  env[1].setName("PATH");
  env[1].setValue("/usr/bin:/bin");
  s.req.setCwd(t.path().string());
  EXPECT_EQ(describe(s.req.asReader()), "echo \"$GREETING\" in $(pwd); echo oops >&2; exit 7");
  auto r2 = spawn(s.req.asReader());
  ASSERT_EQ(r2.error, "");
  auto ran2 = collect(r2);
  EXPECT_EQ(ran2.out, "hello there in " + t.path().string() + "\n");
  EXPECT_EQ(ran2.err, "oops\n");
  EXPECT_EQ(decode_status(ran2.status), 7);
}

TEST(AgentSpawn, WhatCannotStartSaysWhy) {
  Request empty;
  EXPECT_NE(spawn(empty.req.asReader()).error, "");
  Request missing;
  missing.req.initArgv(1).set(0, "no-such-program-anywhere");
  auto r = spawn(missing.req.asReader());
  if (r.error.empty()) {  // (or it starts and exits 127, as a shell's would)
    auto ran = collect(r);
    EXPECT_EQ(decode_status(ran.status), 127);
  }
  Request nouser;
  nouser.req.setShell("true");
  nouser.req.setUser("no-such-user-in-passwd");
  EXPECT_NE(spawn(nouser.req.asReader()).error.find("no user"), std::string::npos);
}

TEST(AgentSpawn, ATerminalOfTheAskedSize) {
  Request p;
  p.req.setShell("stty size; tty");
  p.req.setPty(true);
  p.req.setCols(100);
  p.req.setRows(30);
  auto r = spawn(p.req.asReader());
  ASSERT_EQ(r.error, "");
  EXPECT_TRUE(r.pty);
  auto ran = collect(r);
  EXPECT_EQ(ran.out.substr(0, 6), "30 100") << ran.out;
  EXPECT_NE(ran.out.find("/dev/pts/"), std::string::npos) << ran.out;
  EXPECT_EQ(decode_status(ran.status), 0);
}

TEST(AgentSpawn, AnotherUserThroughRunAs) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (setgroups, setuid)";
  auto nobody = find_account("nobody");
  if (!nobody) GTEST_SKIP() << "no nobody account here";
  Request u;
  u.req.setShell("id -u; id -g; echo $HOME $USER $LOGNAME");
  u.req.setUser("nobody");
  u.req.setCwd("/");
  auto r = spawn(u.req.asReader());
  ASSERT_EQ(r.error, "");
  auto ran = collect(r);
  EXPECT_EQ(ran.out, std::to_string(nobody->uid) + "\n" + std::to_string(nobody->gid) + "\n" +
                         nobody->home + " nobody nobody\n")
      << ran.err;
  EXPECT_EQ(decode_status(ran.status), 0);
}

TEST(AgentMemory, AFieldOfMeminfoInKiB) {
  const char* meminfo =
      "MemTotal:         210888 kB\nMemFree:          157300 kB\nMemAvailable:     163404 kB\n"
      "SwapFree:              0 kB\n";
  EXPECT_EQ(meminfo_kib(meminfo, "MemFree"), 157300);
  EXPECT_EQ(meminfo_kib(meminfo, "MemTotal"), 210888);
  EXPECT_EQ(meminfo_kib(meminfo, "SwapFree"), 0);
  // A field is matched whole ("Mem" is no field), and a missing or empty one is -1.
  EXPECT_EQ(meminfo_kib(meminfo, "Mem"), -1);
  EXPECT_EQ(meminfo_kib(meminfo, "Cached"), -1);
  EXPECT_EQ(meminfo_kib("MemFree:\n", "MemFree"), -1);
  EXPECT_EQ(meminfo_kib("", "MemFree"), -1);
}

// A sysfs of two virtio devices, the balloon (type 5) bound; `bind`/`unbind` plain files here.
TEST(AgentMemory, FreePageReportingBindsOrUnbindsTheBalloonOnly) {
  TempDir sys;
  auto write = [](const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  };
  auto devices = sys.path() / "bus/virtio/devices";
  auto driver = sys.path() / "bus/virtio/drivers/virtio_balloon";
  write(devices / "virtio0/device", "0x0002\n");
  write(devices / "virtio3/device", "0x0005\n");
  write(driver / "bind", "");
  write(driver / "unbind", "");
  fs::create_directory_symlink(driver, devices / "virtio3/driver");
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(set_free_page_reporting(true, sys.path()), 0);
  EXPECT_EQ(read(driver / "bind"), "") << "already bound: nothing written";
  EXPECT_EQ(set_free_page_reporting(false, sys.path()), 0);
  EXPECT_EQ(read(driver / "unbind"), "virtio3");
  fs::remove(devices / "virtio3/driver");
  EXPECT_EQ(set_free_page_reporting(true, sys.path()), 0);
  EXPECT_EQ(read(driver / "bind"), "virtio3");
  // No balloon (a machine of revision 0), no virtio bus: nothing to do.
  fs::remove_all(devices / "virtio3");
  EXPECT_EQ(set_free_page_reporting(false, sys.path()), 0);
  EXPECT_EQ(set_free_page_reporting(true, (sys.path() / "none").string()), 0);
}

}  // namespace
}  // namespace pandastack::agent

// The agent's --run-as mode (spawn starts another user's command as /proc/self/exe --run-as).
int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--run-as") == 0) pandastack::agent::run_as(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
