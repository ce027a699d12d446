// Integration tests of the VMM driver and the guest agent: real QEMU microVMs (TCG here) booted
// from the project's own guest image.

#include <gtest/gtest.h>
#include <openssl/sha.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "tests/integration/test_env.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/vm.h"

namespace pandastack::testing {
namespace {

using namespace std::chrono;
using vmm::ErrorCode;
using vmm::ExecRequest;

ExecRequest sh(std::string cmd, uint32_t timeout_ms = 60000) {
  ExecRequest r;
  r.shell = std::move(cmd);
  r.timeout_ms = timeout_ms;
  return r;
}

class DriverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { vm_ = boot_base("drv").release(); }
  static void TearDownTestSuite() {
    delete vm_;
    vm_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(vm_, nullptr) << "shared VM did not boot"; }
  vmm::AgentClient& agent() { return vm_->agent(); }
  std::string run(const std::string& cmd) {
    auto r = agent().exec(sh(cmd));
    EXPECT_TRUE(r) << (r ? "" : r.error().message);
    return r ? r->stdout_data : "";
  }
  static vmm::Vm* vm_;
};
vmm::Vm* DriverTest::vm_ = nullptr;

TEST_F(DriverTest, ExecReturnsStdoutStderrAndExitCode) {
  auto r = agent().exec(sh("echo out; echo err >&2; exit 3"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->stdout_data, "out\n");
  EXPECT_EQ(r->stderr_data, "err\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_FALSE(r->timed_out);
  EXPECT_TRUE(r->error.empty());
}

TEST_F(DriverTest, ExecWithArgvEnvCwdAndStdin) {
  ExecRequest req;
  req.argv = {"/bin/sh", "-c", "echo \"$FOO\"; pwd; cat"};
  req.env = {{"FOO", "bar baz"}};
  req.cwd = "/tmp";
  req.stdin_data = "from stdin";
  auto r = agent().exec(req);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->stdout_data, "bar baz\n/tmp\nfrom stdin");
  EXPECT_EQ(r->exit_code, 0);
}

TEST_F(DriverTest, PythonRunsInTheGuest) {
  auto r = agent().exec(sh("python3 -c 'import sys; print(sys.version_info[0] * 7)'"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->stdout_data, "21\n") << r->stderr_data;
}

TEST_F(DriverTest, TimeoutKillsTheWholeProcessGroupInsideTheGuest) {
  auto r = agent().exec(sh("sleep 300 & echo $! > /tmp/bg.pid; sleep 300", 700));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->exit_code, -SIGKILL);
  // The background child was in the same process group: it is gone too.
  auto check =
      agent().exec(sh("kill -0 $(cat /tmp/bg.pid) 2>/dev/null && echo alive || echo gone"));
  ASSERT_TRUE(check);
  EXPECT_EQ(check->stdout_data, "gone\n");
}

TEST_F(DriverTest, TenMebibyteBinaryFileRoundTripsByteIdentical) {
  std::string data(10u << 20, '\0');
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < data.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  auto w = agent().write_file("/tmp/big/blob.bin", data, 0600, true);
  ASSERT_TRUE(w) << w.error().message;
  // The guest sees the same bytes: compare its sha256sum with ours.
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string hex;
  for (unsigned char b : digest) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", b);
    hex += two;
  }
  auto r = agent().exec(sh("sha256sum /tmp/big/blob.bin"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data, hex + "  /tmp/big/blob.bin\n") << r->stderr_data;
  auto back = agent().read_file("/tmp/big/blob.bin");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->size(), data.size());
  EXPECT_TRUE(*back == data);
  auto st = agent().stat("/tmp/big/blob.bin");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->mode, 0600u);
  EXPECT_EQ(st->size, data.size());
}

TEST_F(DriverTest, NonUtf8OutputSurvives) {
  auto r = agent().exec(sh("printf '\\377\\376\\000abc\\200'"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data, std::string("\xff\xfe\0abc\x80", 7));
}

TEST_F(DriverTest, MissingFileIsNotFound) {
  auto r = agent().read_file("/no/such/file");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::not_found);
  EXPECT_EQ(r.error().guest_code, "not_found");
  EXPECT_EQ(agent().stat("/no/such").error().code, ErrorCode::not_found);
  EXPECT_EQ(agent().list_dir("/no/such").error().code, ErrorCode::not_found);
  EXPECT_EQ(agent().remove("/no/such", false).error().code, ErrorCode::not_found);
}

TEST_F(DriverTest, FileOperations) {
  ASSERT_TRUE(agent().mkdir("/tmp/ops/a/b", true));
  EXPECT_EQ(agent().mkdir("/tmp/ops/a", false).error().guest_code, "exists");
  ASSERT_TRUE(agent().write_file("/tmp/ops/a/b/f.txt", "hello", 0755));
  auto list = agent().list_dir("/tmp/ops/a/b");
  ASSERT_TRUE(list);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "f.txt");
  EXPECT_EQ((*list)[0].size, 5u);
  EXPECT_EQ((*list)[0].mode, 0755u);
  EXPECT_EQ((*list)[0].type, vmm::FileStat::Type::regular);
  ASSERT_TRUE(agent().rename("/tmp/ops/a/b/f.txt", "/tmp/ops/g.txt"));
  EXPECT_EQ(*agent().read_file("/tmp/ops/g.txt"), "hello");
  EXPECT_EQ(agent().stat("/tmp/ops/a/b").value().type, vmm::FileStat::Type::directory);
  EXPECT_EQ(agent().remove("/tmp/ops/a", false).error().guest_code, "not_empty");
  ASSERT_TRUE(agent().remove("/tmp/ops", true));
  EXPECT_EQ(agent().stat("/tmp/ops").error().code, ErrorCode::not_found);
  EXPECT_EQ(agent().read_file("/tmp").error().guest_code, "is_a_directory");
}

TEST_F(DriverTest, OutputCapTruncatesWithAFlag) {
  ExecRequest req = sh("head -c 5000 /dev/zero; echo tail >&2");
  req.max_output_bytes = 1000;
  auto r = agent().exec(req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->stdout_data.size(), 1000u);
  EXPECT_TRUE(r->stdout_truncated);
  EXPECT_FALSE(r->stderr_truncated);
  EXPECT_EQ(r->stderr_data, "tail\n");
  EXPECT_EQ(r->exit_code, 0);
}

TEST_F(DriverTest, MissingBinaryIsAClearError) {
  ExecRequest req;
  req.argv = {"/usr/bin/definitely-not-here"};
  auto r = agent().exec(req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->exit_code, 127);
  EXPECT_NE(r->error.find("No such file"), std::string::npos) << r->error;
  req.argv = {"ls"};
  req.cwd = "/no/such/dir";
  r = agent().exec(req);
  ASSERT_TRUE(r);
  EXPECT_NE(r->error.find("cwd /no/such/dir"), std::string::npos) << r->error;
}

TEST_F(DriverTest, EightConcurrentExecsRunAtTheSameTime) {
  // Each command waits until all eight have started: this only finishes if they run concurrently.
  run("rm -rf /tmp/barrier; mkdir -p /tmp/barrier");
  std::vector<std::thread> threads;
  std::vector<std::string> outs(8);
  std::vector<bool> timed_out(8, true);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto r = agent().exec(
          sh("touch /tmp/barrier/" + std::to_string(i) +
                 "; while [ $(ls /tmp/barrier | wc -l) -lt 8 ]; do sleep 0.05; done; echo " +
                 std::to_string(i),
             60000));
      if (r) {
        outs[i] = r->stdout_data;
        if (r->exit_code != 0 || !r->stderr_data.empty() || !r->error.empty())
          outs[i] += "(exit " + std::to_string(r->exit_code) + ", stderr: " + r->stderr_data +
                     ", error: " + r->error + ")";
        timed_out[i] = r->timed_out;
      } else {
        outs[i] = "error: " + r.error().message;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(outs[i], std::to_string(i) + "\n");
    EXPECT_FALSE(timed_out[i]);
  }
}

TEST_F(DriverTest, StreamingExecDeliversOutputBeforeTheCommandEnds) {
  // The command waits for a file the test creates only after it saw the first line: without
  // streaming this deadlocks until the timeout.
  run("rm -f /tmp/go");
  std::atomic<bool> saw_ready{false};
  std::string collected;
  std::mutex mu;
  std::thread releaser([&] {
    for (int i = 0; i < 2000 && !saw_ready; ++i) std::this_thread::sleep_for(milliseconds(10));
    if (saw_ready) (void)agent().write_file("/tmp/go", "");
  });
  auto r = agent().exec_stream(
      sh("echo ready; while [ ! -f /tmp/go ]; do sleep 0.05; done; echo done >&2", 30000),
      [&](vmm::StreamKind k, std::string_view d) {
        std::lock_guard lock(mu);
        collected += (k == vmm::StreamKind::out ? "O:" : "E:") + std::string(d);
        if (collected.find("ready") != std::string::npos) saw_ready = true;
      });
  releaser.join();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_EQ(collected, "O:ready\nE:done\n");
  EXPECT_TRUE(r->stdout_data.empty());
}

TEST_F(DriverTest, CancellingAStreamingExecKillsTheGuestProcess) {
  run("rm -f /tmp/cancel.pid");
  std::stop_source stop;
  std::atomic<bool> started{false};
  std::thread canceller([&] {
    for (int i = 0; i < 2000 && !started; ++i) std::this_thread::sleep_for(milliseconds(10));
    stop.request_stop();
  });
  auto r = agent().exec_stream(
      sh("echo $$ > /tmp/cancel.pid; echo started; sleep 300"),
      [&](vmm::StreamKind, std::string_view d) {
        if (d.find("started") != std::string_view::npos) started = true;
      },
      stop.get_token());
  canceller.join();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "cancelled");
  // The guest killed the process group once the call was dropped.
  std::string state;
  for (int i = 0; i < 100; ++i) {
    state = run("kill -0 $(cat /tmp/cancel.pid) 2>/dev/null && echo alive || echo gone");
    if (state == "gone\n") break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(state, "gone\n");
}

TEST_F(DriverTest, BackgroundProcesses) {
  ExecRequest counter = sh("for i in 1 2 3; do echo $i; sleep 0.1; done; echo fin >&2");
  counter.timeout_ms = 0;
  auto pid = agent().start_process(counter);
  ASSERT_TRUE(pid) << pid.error().message;
  auto done = agent().wait_process(*pid);
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(done->stdout_data, "1\n2\n3\n");
  EXPECT_EQ(done->stderr_data, "fin\n");
  EXPECT_EQ(done->exit_code, 0);

  ExecRequest sleeper = sh("echo up; sleep 300");
  sleeper.timeout_ms = 0;
  auto spid = agent().start_process(sleeper);
  ASSERT_TRUE(spid);
  auto list = agent().list_processes();
  ASSERT_TRUE(list);
  bool found_running = false;
  for (auto& p : *list)
    if (p.pid == *spid) found_running = p.running && p.command == "echo up; sleep 300";
  EXPECT_TRUE(found_running);
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(300));
    (void)agent().kill_process(*spid);
  });
  std::string streamed;
  auto s =
      agent().stream_process(*spid, [&](vmm::StreamKind, std::string_view d) { streamed += d; });
  killer.join();
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(streamed, "up\n");
  EXPECT_EQ(s->exit_code, -SIGKILL);
  EXPECT_EQ(agent().wait_process(999999).error().code, ErrorCode::not_found);
}

TEST_F(DriverTest, ClockRngAndHostname) {
  auto now = duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(agent().set_clock(now - int64_t(3600) * 1000000000));
  auto t = std::stoll(run("date +%s"));
  EXPECT_NEAR(double(t), double(now / 1000000000 - 3600), 3.0);
  ASSERT_TRUE(agent().set_clock(now));
  ASSERT_TRUE(agent().reseed_rng(std::string(64, 'x')));
  ASSERT_TRUE(agent().set_hostname("sbx-test"));
  EXPECT_EQ(run("hostname"), "sbx-test\n");
  // The files that name it agree, and live on tmpfs (linked from /etc at boot): naming a restored
  // guest never writes its root disk (on ext4 that started writeback: ~40 ms of each fork).
  EXPECT_EQ(run("cat /etc/hostname"), "sbx-test\n");
  EXPECT_EQ(run("grep -c '^127.0.1.1 sbx-test$' /etc/hosts"), "1\n");
  EXPECT_EQ(run("stat -f -L -c %T /etc/hostname /etc/hosts"), "tmpfs\ntmpfs\n");
  // A file a user put in place of the link stays theirs, and is written in place.
  run("rm /etc/hostname && echo mine > /etc/hostname");
  ASSERT_TRUE(agent().set_hostname("sbx-two"));
  EXPECT_EQ(run("cat /etc/hostname; stat -f -c %T /etc/hostname"), "sbx-two\next2/ext3\n");
}

// A host that dies mid-session (no endSession) leaves the guest's session open; the next host's
// preamble ends it and starts its own at once (guest/agent/main.cc SessionStream), without the
// fresh connection a lost preamble costs. The session does not end on the port's state either:
// that is what made a live session end under load (the agent-session flake).
TEST_F(DriverTest, ANewHostAfterOneThatDiedMidSessionIsAnsweredAtOnce) {
  ExecRequest sleeper = sh("sleep 300");
  sleeper.timeout_ms = 0;
  auto pid = agent().start_process(sleeper);
  ASSERT_TRUE(pid);
  for (int i = 0; i < 3; ++i) {
    vm_->drop_agent();
    auto rc = vm_->reconnect_agent();
    ASSERT_TRUE(rc) << rc.error().message << "\n" << vm_->console_tail(2000);
    EXPECT_EQ(vm_->reconnect_retries(), 0) << vm_->console_tail(2000);
    EXPECT_EQ(run("echo again"), "again\n");
  }
  EXPECT_NE(vm_->console_tail(4000).find("session ended by a new host's preamble"),
            std::string::npos);
  ASSERT_TRUE(agent().kill_process(*pid));
}

TEST_F(DriverTest, AgentSurvivesHostReconnect) {
  ExecRequest sleeper = sh("sleep 300");
  sleeper.timeout_ms = 0;
  auto pid = agent().start_process(sleeper);
  ASSERT_TRUE(pid);
  ASSERT_TRUE(agent().reset_session());
  EXPECT_EQ(run("echo same channel"), "same channel\n");
  for (int i = 0; i < 3; ++i) {
    auto rc = vm_->reconnect_agent();
    ASSERT_TRUE(rc) << rc.error().message << "\n" << vm_->console_tail(2000);
    EXPECT_EQ(run("echo again"), "again\n");
  }
  // Background processes outlive host sessions.
  auto list = agent().list_processes();
  ASSERT_TRUE(list);
  bool running = false;
  for (auto& p : *list)
    if (p.pid == *pid) running = p.running;
  EXPECT_TRUE(running);
  ASSERT_TRUE(agent().kill_process(*pid));
}

TEST(DriverLifecycle, DestroyingAVmLeavesNoProcessSocketOrFile) {
  auto vm = boot_base("life");
  ASSERT_NE(vm, nullptr);
  pid_t pid = vm->pid();
  auto dir = vm->config().run_dir;
  EXPECT_TRUE(std::filesystem::exists(dir / "q" / "agent.sock"));
  EXPECT_TRUE(std::filesystem::exists(dir / "mem"));
  EXPECT_EQ(count_processes(dir.string()), 1);
  // Its own cgroups (v2: one; v1: memory and pids), as the kernel reports them.
  std::vector<std::filesystem::path> groups;
  {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      auto path = line.substr(line.find(':', line.find(':') + 1) + 1);
      auto controllers =
          line.substr(line.find(':') + 1, line.find(':', line.find(':') + 1) - line.find(':') - 1);
      if (path.find("/pandastack/") == std::string::npos) continue;
      groups.push_back(std::filesystem::path("/sys/fs/cgroup") / controllers / path.substr(1));
    }
  }
  bool has_cgroups = std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers") ||
                     std::filesystem::exists("/sys/fs/cgroup/memory/cgroup.procs");
  if (has_cgroups) {
    EXPECT_FALSE(groups.empty()) << "QEMU is in no pandastack cgroup";
  }
  for (auto& g : groups) EXPECT_TRUE(std::filesystem::exists(g)) << g;
  vm.reset();
  EXPECT_FALSE(std::filesystem::exists(dir));
  EXPECT_FALSE(std::filesystem::exists(dir.string() + ".jail"));
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_EQ(count_processes(dir.string()), 0);
  // Its cgroups are gone too.
  for (auto& g : groups) EXPECT_FALSE(std::filesystem::exists(g)) << g;
}

TEST(DriverLifecycle, FailedBootReportsTheConsoleTailAndLeavesNothing) {
  // A guest that cannot find its root disk: the initramfs powers off with a message.
  auto c = base_config("badroot");
  auto empty_disk = fresh_run_dir("emptydisk").string() + ".qcow2";
  ASSERT_EQ(std::system(("qemu-img create -q -f qcow2 " + empty_disk + " 64M").c_str()), 0);
  c.rootfs = empty_disk;
  c.boot_timeout = seconds(60);
  auto vm = vmm::Vm::boot(io(), c);
  std::filesystem::remove(empty_disk);
  std::filesystem::remove(empty_disk + ".overlay");  // (the driver's cached overlay of it)
  ASSERT_FALSE(vm);
  EXPECT_EQ(vm.error().code, ErrorCode::boot_failed);
  EXPECT_NE(vm.error().message.find("cannot mount /dev/vda"), std::string::npos)
      << vm.error().message;
  EXPECT_FALSE(std::filesystem::exists(c.run_dir));
  EXPECT_EQ(count_processes(c.run_dir.string()), 0);
}

TEST(DriverLifecycle, BootTimeoutKillsQemu) {
  auto c = base_config("timeout");
  c.boot_timeout = milliseconds(300);  // far too short for a TCG boot
  auto vm = vmm::Vm::boot(io(), c);
  ASSERT_FALSE(vm);
  EXPECT_EQ(vm.error().code, ErrorCode::boot_failed);
  EXPECT_NE(vm.error().message.find("within 300 ms"), std::string::npos) << vm.error().message;
  EXPECT_FALSE(std::filesystem::exists(c.run_dir));
  EXPECT_EQ(count_processes(c.run_dir.string()), 0);
}

}  // namespace
}  // namespace pandastack::testing
