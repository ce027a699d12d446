// The Cap'n Proto RPC API against the real daemon binary: pipelining (create and exec in one
// round trip, shown with an artificial 1 s server->client latency), streaming output to a sink,
// files, fork, error codes, tenant isolation. Traffic stays on loopback and a unix socket.
#include <capnp/rpc-twoparty.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>

#include "tools/http_client.h"
#include "wire/json.h"
#include "wire/pandastack.capnp.h"

namespace api = pandastack::wire::api;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// pandastackd on free loopback ports with its own folders; stopped with SIGTERM.
class Daemon {
 public:
  // `network`: sandbox networks (databases need them) with a prefix and subnets of this test's own,
  // no resolver upstream; the data folder then on disk (volumes), not tmpfs.
  explicit Daemon(bool network = false) {
    std::string tag = std::to_string(::getpid());
    base_ = network ? fs::path("/var/tmp") / ("pst-rpcdb-" + tag)
                    : fs::path("/dev/shm") / ("pst-rpc-" + tag);
    state_ = network ? fs::path("/dev/shm") / ("pst-rpcdb-state-" + tag) : base_ / "state";
    std::vector<std::string> args = {"--accel", "tcg", "--network", "off"};
    if (network) {
      unsigned n = unsigned(::getpid());
      std::string prefix = "pr";
      prefix += char('a' + n % 26);
      prefix += char('a' + (n / 26) % 26);
      args = {"--accel",          "tcg",
              "--network-prefix", prefix,
              "--subnet-pool",    "10.252." + std::to_string(4 * (n % 64)) + ".0/22",
              "--dns-upstream",   "off"};
    }
    fs::create_directories(base_ / "data");
    int out[2];
    if (::pipe(out) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      // A test that crashes takes its daemon (and so its VMs) with it.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      ::dup2(out[1], 1);
      int log =
          ::open((base_ / "data" / "daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      ::dup2(log, 2);
      std::string images = std::getenv("PANDASTACK_IMAGES") ? std::getenv("PANDASTACK_IMAGES")
                                                            : PANDASTACK_SOURCE_DIR "/var/images";
      std::string data = (base_ / "data").string();
      std::string state = state_.string();
      std::vector<std::string> all = {PANDASTACKD,   "--data",       data,         "--state-dir",
                                      state,         "--images",     images,       "--listen",
                                      "127.0.0.1:0", "--rpc-listen", "127.0.0.1:0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(PANDASTACKD, argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    FILE* f = ::fdopen(out[0], "r");
    char line[1024];
    while (std::fgets(line, sizeof line, f)) {
      std::string l = line;
      auto value = [&](const char* label) {
        auto p = l.find(label);
        if (p == std::string::npos) return std::string();
        auto v = l.substr(p + std::strlen(label));
        while (!v.empty() && v.front() == ' ') v.erase(0, 1);
        return v.substr(0, v.find_first_of(" \n"));
      };
      if (l.find("URL:") != std::string::npos) url = value("URL:");
      if (l.find("RPC:") != std::string::npos) rpc = value("RPC:");
      if (l.find("API key:") != std::string::npos) key = value("API key:");
      if (l.find("(key file") != std::string::npos) break;
    }
    std::fclose(f);
    sock = (base_ / "data" / "rpc.sock").string();
  }
  ~Daemon() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "daemon status " << status;
    fs::remove_all(base_);
    fs::remove_all(state_);
  }
  std::string url, rpc, key, sock;

 private:
  fs::path base_, state_;
  pid_t pid_ = -1;
};

// Delays every byte from the server by `delay` after it arrived: one-way network latency, so a
// round trip costs `delay`.
class DelayedStream final : public kj::AsyncIoStream {
 public:
  DelayedStream(kj::Own<kj::AsyncIoStream> inner, kj::Timer& timer, kj::Duration delay)
      : inner_(kj::mv(inner)),
        timer_(timer),
        delay_(delay),
        pump_(pump().eagerlyEvaluate(nullptr)) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t min, size_t max) override {
    return read(reinterpret_cast<kj::byte*>(buffer), min, max, 0);
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }

 private:
  struct Chunk {
    kj::TimePoint ready;
    std::string data;
  };
  kj::Promise<void> pump() {
    return inner_->tryRead(buf_, 1, sizeof buf_).then([this](size_t n) -> kj::Promise<void> {
      if (n == 0) {
        eof_ = true;
      } else {
        chunks_.push_back({timer_.now() + delay_, std::string(buf_, n)});
      }
      KJ_IF_MAYBE (w, waiter_) {
        (*w)->fulfill();
        waiter_ = nullptr;
      }
      if (n == 0) return kj::READY_NOW;
      return pump();
    });
  }
  kj::Promise<size_t> read(kj::byte* out, size_t min, size_t max, size_t got) {
    if (got >= min) return got;
    if (chunks_.empty()) {
      if (eof_) return got;
      auto paf = kj::newPromiseAndFulfiller<void>();
      waiter_ = kj::mv(paf.fulfiller);
      return paf.promise.then([=, this] { return read(out, min, max, got); });
    }
    return timer_.atTime(chunks_.front().ready).then([=, this] {
      auto& c = chunks_.front();
      size_t n = std::min(max - got, c.data.size());
      std::memcpy(out + got, c.data.data(), n);
      c.data.erase(0, n);
      if (c.data.empty()) chunks_.pop_front();
      return read(out, min, max, got + n);
    });
  }

  kj::Own<kj::AsyncIoStream> inner_;
  kj::Timer& timer_;
  kj::Duration delay_;
  char buf_[65536];
  std::deque<Chunk> chunks_;
  bool eof_ = false;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiter_;
  kj::Promise<void> pump_;
};

std::string error_of(kj::Function<void()> f) {
  try {
    f();
  } catch (const kj::Exception& e) {
    std::string d = e.getDescription().cStr();
    // Remote exceptions are prefixed "remote exception: ".
    auto p = d.find("remote exception: ");
    if (p != std::string::npos) d = d.substr(p + 18);
    // A cut connection reads "::writev(...): Broken pipe": the whole text, never "".
    auto code = d.substr(0, d.find(':'));
    return code.empty() ? d : code;
  }
  return "";
}

class RpcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = new Daemon(); }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override { ASSERT_FALSE(daemon_->rpc.empty()) << "daemon did not start"; }

  api::Platform::Client login(capnp::TwoPartyClient& client, const std::string& key) {
    auto r = client.bootstrap().castAs<api::Login>().loginRequest();
    r.setApiKey(key);
    return r.send().getPlatform();
  }

  static Daemon* daemon_;
  // (Held by pointer: kj::AsyncIoContext's destructor may throw, gtest's must not.)
  std::unique_ptr<kj::AsyncIoContext> io_ptr_ =
      std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo());
  kj::AsyncIoContext& io_ = *io_ptr_;
};

Daemon* RpcTest::daemon_ = nullptr;

TEST_F(RpcTest, PipelinedCreateAndExecTakeOneRoundTrip) {
  auto& ws = io_.waitScope;
  auto& timer = io_.provider->getTimer();
  constexpr auto kDelay = 1000 * kj::MILLISECONDS;
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  DelayedStream slow(kj::mv(conn), timer, kDelay);
  capnp::TwoPartyClient client(slow);
  auto platform = login(client, daemon_->key);
  // Login answered once (one delayed round trip), outside the measurement.
  platform.listRequest().send().wait(ws);

  auto exec_on = [](api::Sandbox::Client sandbox) {
    auto e = sandbox.execRequest();
    e.initRequest().setCmd("echo pipelined");
    return e;
  };
  // Sequential: wait for create, then exec: two round trips.
  auto t0 = Clock::now();
  auto created = platform.createRequest().send().wait(ws);
  auto r1 = exec_on(created.getSandbox()).send().wait(ws);
  double sequential = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(
      std::string(r1.getResult().getStdout().asChars().begin(), r1.getResult().getStdout().size()),
      "pipelined\n");
  // Pipelined: exec is sent to the promised sandbox right after create, in the same flight.
  t0 = Clock::now();
  auto promised = platform.createRequest().send();
  auto r2 = exec_on(promised.getSandbox()).send().wait(ws);
  double pipelined = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(
      std::string(r2.getResult().getStdout().asChars().begin(), r2.getResult().getStdout().size()),
      "pipelined\n");
  // One round trip (1 s) fewer; the VM work is the same in both.
  EXPECT_GT(sequential - pipelined, 0.6)
      << "sequential " << sequential << " s, pipelined " << pipelined << " s";
  EXPECT_LT(pipelined, sequential);
  promised.getSandbox().killRequest().send().wait(ws);
  created.getSandbox().killRequest().send().wait(ws);
}

TEST_F(RpcTest, SandboxOperationsStreamingAndErrors) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork()
                  .parseAddress(kj::str("unix:", daemon_->sock.c_str()))
                  .wait(ws)
                  ->connect()
                  .wait(ws);
  capnp::TwoPartyClient client(*conn);

  EXPECT_EQ(error_of([&] { login(client, "pds_wrong").listRequest().send().wait(ws); }),
            "unauthorized");
  auto platform = login(client, daemon_->key);
  EXPECT_EQ(error_of([&] {
              auto g = platform.getRequest();
              g.setId("sbx_nope");
              g.send().wait(ws);
            }),
            "sandbox_not_found");
  auto c = platform.createRequest();
  c.initRequest().setTemplate("nope");
  EXPECT_EQ(error_of([&] { c.send().wait(ws); }), "template_not_found");

  auto created = platform.createRequest().send().wait(ws);
  auto sandbox = created.getSandbox();
  std::string id = created.getInfo().getId();
  EXPECT_EQ(std::string(created.getInfo().getState()), "running");

  // Output reaches the sink while the command runs.
  struct Sink final : public api::OutputSink::Server {
    std::string out, err;
    Clock::time_point first;
    kj::Promise<void> write(WriteContext ctx) override {
      auto d = ctx.getParams().getData();
      if (out.empty() && err.empty()) first = Clock::now();
      (ctx.getParams().getKind() == api::StreamKind::STDOUT ? out : err)
          .append(d.asChars().begin(), d.size());
      return kj::READY_NOW;
    }
  };
  auto sink_own = kj::heap<Sink>();
  Sink& sink = *sink_own;
  api::OutputSink::Client sink_cap = kj::mv(sink_own);
  auto s = sandbox.execStreamRequest();
  s.initRequest().setCmd("echo one; sleep 2; echo two >&2; exit 7");
  s.setSink(sink_cap);
  auto t0 = Clock::now();
  auto sr = s.send().wait(ws);
  auto end = Clock::now();
  EXPECT_EQ(sr.getResult().getExitCode(), 7);
  EXPECT_EQ(sink.out, "one\n");
  EXPECT_EQ(sink.err, "two\n");
  EXPECT_LT(sink.first - t0, end - t0 - std::chrono::milliseconds(1500));

  auto w = sandbox.writeFileRequest();
  w.setPath("/tmp/rpc/file.txt");
  w.setData(kj::StringPtr("over rpc").asBytes());
  w.send().wait(ws);
  auto rf = sandbox.readFileRequest();
  rf.setPath("/tmp/rpc/file.txt");
  auto read = rf.send().wait(ws);  // the response owns the data
  auto data = read.getData();
  EXPECT_EQ(std::string(data.asChars().begin(), data.size()), "over rpc");
  auto ld = sandbox.listDirRequest();
  ld.setPath("/tmp/rpc");
  auto entries_r = ld.send().wait(ws);  // the response owns what it holds
  auto entries = entries_r.getEntries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(std::string(entries[0].getName()), "file.txt");
  auto bad = sandbox.readFileRequest();
  bad.setPath("/tmp/../etc/passwd");
  EXPECT_EQ(error_of([&] { bad.send().wait(ws); }), "invalid_path");

  // A snapshot, deleted: creates from it are refused; a second delete finds nothing.
  auto snap_id = std::string(sandbox.snapshotRequest().send().wait(ws).getSnapshotId());
  auto delete_snapshot = [&] {
    auto del = platform.deleteSnapshotRequest();
    del.setSnapshotId(snap_id);
    del.send().wait(ws);
  };
  delete_snapshot();
  EXPECT_EQ(error_of(delete_snapshot), "snapshot_not_found");
  EXPECT_EQ(error_of([&] {
              auto from = platform.createRequest();
              from.initRequest().setFromSnapshot(snap_id);
              from.send().wait(ws);
            }),
            "snapshot_not_found");

  auto f = sandbox.forkRequest();
  f.setCount(1);
  auto forked = f.send().wait(ws);
  ASSERT_EQ(forked.getChildren().size(), 1u);
  auto child = forked.getChildren()[0];
  auto cr = child.readFileRequest();
  cr.setPath("/tmp/rpc/file.txt");
  auto cd_r = cr.send().wait(ws);  // the response owns what it holds
  auto cd = cd_r.getData();
  EXPECT_EQ(std::string(cd.asChars().begin(), cd.size()), "over rpc");
  child.killRequest().send().wait(ws);

  // forkOne: one child as a capability, pipelined: fork and read in one flight.
  auto one = sandbox.forkOneRequest().send();
  auto one_read = one.getSandbox().readFileRequest();
  one_read.setPath("/tmp/rpc/file.txt");
  auto od_r = one_read.send().wait(ws);  // the response owns what it holds
  auto od = od_r.getData();
  EXPECT_EQ(std::string(od.asChars().begin(), od.size()), "over rpc");
  auto one_info_r = one.wait(ws);  // the response owns what it holds
  auto one_info = one_info_r.getInfo();
  EXPECT_EQ(std::string(one_info.getParent()), id);
  one.getSandbox().killRequest().send().wait(ws);

  // Another tenant (a key made over REST) cannot see the sandbox.
  pandastack::tools::HttpClient http(daemon_->url, daemon_->key);
  auto k = http.request("POST", "/v1/keys", R"({"tenant":"rpc-other"})");
  ASSERT_EQ(k.status, 201) << k.body;
  auto other_key = (*pandastack::wire::Json::parse(k.body))["key"].as_string();
  auto other = login(client, other_key);
  EXPECT_EQ(error_of([&] {
              auto g = other.getRequest();
              g.setId(id);
              g.send().wait(ws);
            }),
            "sandbox_not_found");
  EXPECT_EQ(other.listRequest().send().wait(ws).getSandboxes().size(), 0u);

  auto killed = sandbox.killRequest().send().wait(ws);
  EXPECT_EQ(std::string(killed.getInfo().getState()), "stopped");
  auto after = sandbox.execRequest();
  after.initRequest().setCmd("true");
  EXPECT_EQ(error_of([&] { after.send().wait(ws); }), "sandbox_stopped");
}

TEST_F(RpcTest, DroppingAStreamingCallKillsTheCommand) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork()
                  .parseAddress(kj::str("unix:", daemon_->sock.c_str()))
                  .wait(ws)
                  ->connect()
                  .wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, daemon_->key);
  auto sandbox = platform.createRequest().send().wait(ws).getSandbox();
  struct Sink final : public api::OutputSink::Server {
    kj::Own<kj::PromiseFulfiller<void>> started;
    kj::Promise<void> write(WriteContext) override {
      started->fulfill();
      return kj::READY_NOW;
    }
  };
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto sink = kj::heap<Sink>();
  sink->started = kj::mv(paf.fulfiller);
  auto s = sandbox.execStreamRequest();
  s.initRequest().setCmd("echo up; exec sleep 303");
  s.setSink(kj::mv(sink));
  {
    auto call = s.send();
    paf.promise.wait(ws);  // the command runs
  }                        // dropped: the call is cancelled
  auto count = [&] {
    auto e = sandbox.execRequest();
    e.initRequest().setCmd(
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[s]leep 303'");
    auto out_r = e.send().wait(ws);  // the response owns what it holds
    auto out = out_r.getResult().getStdout();
    return std::atoi(std::string(out.asChars().begin(), out.size()).c_str());
  };
  auto deadline = Clock::now() + std::chrono::seconds(15);
  while (count() > 0 && Clock::now() < deadline)
    io_.provider->getTimer().afterDelay(300 * kj::MILLISECONDS).wait(ws);
  EXPECT_EQ(count(), 0);
  sandbox.killRequest().send().wait(ws);
}

// Volumes over RPC: create, attach at a sandbox's create (read back after a kill), the REST
// error codes, delete.
TEST_F(RpcTest, VolumesAttachAtCreateAndOutliveTheSandbox) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, daemon_->key);
  auto cv = platform.createVolumeRequest();
  cv.setName("rpc");
  cv.setSizeMib(32);
  auto made = cv.send().wait(ws);
  std::string vol = made.getInfo().getId();
  EXPECT_EQ(made.getInfo().getSizeMib(), 32u);
  auto with = [&](bool ro) {
    auto c = platform.createRequest();
    auto v = c.initRequest().initVolumes(1);
    v[0].setVolume(vol);
    v[0].setMount("/data");
    v[0].setReadOnly(ro);
    return c;
  };
  auto a = with(false).send().wait(ws).getSandbox();
  auto e = a.execRequest();
  e.initRequest().setCmd("echo rpc > /data/f && sync");
  EXPECT_EQ(e.send().wait(ws).getResult().getExitCode(), 0);
  EXPECT_EQ(error_of([&] { with(true).send().wait(ws); }), "volume_in_use");
  auto del = [&] {  // a request is sent once
    auto d = platform.deleteVolumeRequest();
    d.setId(vol);
    d.send().wait(ws);
  };
  EXPECT_EQ(error_of(del), "volume_attached");
  a.killRequest().send().wait(ws);
  auto b = with(true).send().wait(ws).getSandbox();
  auto r = b.readFileRequest();
  r.setPath("/data/f");
  auto read = r.send().wait(ws);
  auto data = read.getData();
  EXPECT_EQ(std::string(data.asChars().begin(), data.size()), "rpc\n");
  auto listed = platform.listVolumesRequest().send().wait(ws);
  ASSERT_EQ(listed.getVolumes().size(), 1u);
  EXPECT_EQ(listed.getVolumes()[0].getAttachedTo().size(), 1u);
  b.killRequest().send().wait(ws);
  del();
  EXPECT_EQ(error_of(del), "volume_not_found");
}

// A sandbox without a network has no egress log: network_disabled, as over REST.
TEST_F(RpcTest, EgressLogOfASandboxWithoutANetworkIsRefused) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, daemon_->key);
  auto sbx = platform.createRequest().send().wait(ws).getSandbox();
  EXPECT_EQ(error_of([&] { sbx.egressLogRequest().send().wait(ws); }), "network_disabled");
  EXPECT_EQ(platform.listSecretsRequest().send().wait(ws).getSecrets().size(), 0u);
  sbx.killRequest().send().wait(ws);
  // Secrets are named at create: an unknown one (looked up first), and then a sandbox without a
  // network (this daemon has none), are refused as over REST; more than 16 before anything is
  // looked up.
  auto named = platform.createRequest();
  named.initRequest().initSecrets(1).set(0, "NOPE");
  EXPECT_EQ(error_of([&] { named.send().wait(ws); }), "secret_not_found");
  auto many = platform.createRequest();
  auto list = many.initRequest().initSecrets(17);
  for (unsigned i = 0; i < 17; ++i) list.set(i, "S" + std::to_string(i));
  EXPECT_EQ(error_of([&] { many.send().wait(ws); }), "invalid_argument");
}

// A key revoked over REST ends what its open RPC sessions may do: their next call fails, on the
// Platform and on every Sandbox capability it handed out (H8/M1 of the security review).
TEST_F(RpcTest, ARevokedKeysOpenSessionFailsItsNextCall) {
  auto& ws = io_.waitScope;
  pandastack::tools::HttpClient http(daemon_->url, daemon_->key);
  auto k = http.request("POST", "/v1/keys", R"({"tenant":"rpc-revoked"})");
  ASSERT_EQ(k.status, 201) << k.body;
  auto made = *pandastack::wire::Json::parse(k.body);
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, made["key"].as_string());
  auto created = platform.createRequest().send().wait(ws);
  auto sandbox = created.getSandbox();
  EXPECT_EQ(platform.listRequest().send().wait(ws).getSandboxes().size(), 1u);
  auto revoked = http.request("DELETE", "/v1/keys/" + made["id"].as_string(), "");
  ASSERT_EQ(revoked.status, 204) << revoked.body;
  EXPECT_EQ(error_of([&] { platform.listRequest().send().wait(ws); }), "unauthorized");
  EXPECT_EQ(error_of([&] { sandbox.infoRequest().send().wait(ws); }), "unauthorized");
  auto e = sandbox.execRequest();
  e.initRequest().setCmd("true");
  EXPECT_EQ(error_of([&] { e.send().wait(ws); }), "unauthorized");
  // The admin cleans up what the revoked tenant left.
  auto gone = http.request("DELETE", "/v1/sandboxes/" + std::string(created.getInfo().getId()), "");
  EXPECT_TRUE(gone.status == 200 || gone.status == 404) << gone.body;
}

// Before a login a connection may send a login's worth of bytes (64 KiB): a client without a key
// that sends a 60 MiB message, or a 1 MiB "key", is cut off without the daemon reading it.
TEST_F(RpcTest, NobodyWithoutAKeyMakesTheDaemonHoldMegabytes) {
  auto& ws = io_.waitScope;
  auto connect = [&] {
    return io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  };
  {
    auto raw = connect();
    // A frame announcing one segment of 7.5M words (60 MiB), then its first MiB.
    uint32_t header[2] = {0, 7864320};
    raw->write(header, sizeof header).wait(ws);
    std::string chunk(1 << 16, 'x');
    size_t sent = 0;
    bool cut = false;
    for (int i = 0; i < 16 && !cut; ++i) {
      try {
        raw->write(chunk.data(), chunk.size()).wait(ws);
        sent += chunk.size();
      } catch (const kj::Exception&) {
        cut = true;
      }
    }
    // The daemon closed its side (after an abort message, perhaps): EOF instead of waiting for
    // the rest.
    char b[4096];
    size_t n = 1, total = 0;
    auto deadline = io_.provider->getTimer().now() + 5 * kj::SECONDS;
    while (n != 0 && n != 99) {
      n = raw->tryRead(b, 1, sizeof b)
              .exclusiveJoin(
                  io_.provider->getTimer().atTime(deadline).then([] { return size_t(99); }))
              .wait(ws);
      if (n != 99) total += n;
    }
    EXPECT_EQ(n, 0u) << "the connection stayed open after " << sent << " bytes";
    EXPECT_LT(total, 4096u);
  }
  {
    auto conn = connect();
    capnp::TwoPartyClient client(*conn);
    std::string huge(1 << 20, 'k');
    EXPECT_NE(error_of([&] { login(client, huge).listRequest().send().wait(ws); }), "");
  }
  {
    auto conn = connect();
    capnp::TwoPartyClient client(*conn);
    std::string malformed = "pds_" + std::string(200, 'a');
    EXPECT_EQ(error_of([&] { login(client, malformed).listRequest().send().wait(ws); }),
              "unauthorized");
  }
  // The daemon is fine, and a real login works.
  auto conn = connect();
  capnp::TwoPartyClient client(*conn);
  EXPECT_NO_THROW(login(client, daemon_->key).listRequest().send().wait(ws));
}

// Managed databases over RPC against a daemon with sandbox networks: create (the password once),
// the real psql client through the URI, get/list without the password, backup, rotate the
// password (the old one is refused), hibernate/wake, logs, another tenant sees nothing, delete.
class RpcDatabaseTest : public RpcTest {
 protected:
  static void SetUpTestSuite() { daemon_ = new Daemon(/*network=*/true); }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
};

// psql through a URI: its output (trimmed), or "error: ..." with what it printed.
std::string psql(const std::string& uri, const std::string& sql) {
  std::string cmd = "psql '" + uri + "' -qAtc '" + sql + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "error: popen";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return status == 0 ? out : "error: " + out;
}

TEST_F(RpcDatabaseTest, CreateQueryBackupRotateHibernateWakeAndDelete) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, daemon_->key);

  auto bad = [&] {
    auto c = platform.createDatabaseRequest();
    c.initRequest().setName("Not A Name");
    c.send().wait(ws);
  };
  EXPECT_EQ(error_of(bad), "invalid_argument");

  auto c = platform.createDatabaseRequest();
  c.initRequest().setName("rpcdb");
  auto made = c.send().wait(ws);
  auto info = made.getInfo();
  std::string id = info.getId(), uri = info.getConnectionUri(), password = info.getPassword();
  EXPECT_EQ(id.rfind("db_", 0), 0u);
  EXPECT_EQ(std::string(info.getStatus().cStr()), "running");
  EXPECT_FALSE(password.empty());
  EXPECT_NE(uri.find(":" + password + "@"), std::string::npos) << uri;
  EXPECT_EQ(psql(uri, "select 40 + 2"), "42");
  auto db = made.getDatabase();

  // The password is shown once: get and list answer the URI without it.
  auto got = [&] {
    auto g = platform.getDatabaseRequest();
    g.setId(id);
    return g.send().wait(ws);
  };
  auto g = got();
  EXPECT_EQ(std::string(g.getInfo().getPassword().cStr()), "");
  EXPECT_EQ(std::string(g.getInfo().getConnectionUri().cStr()).find(password), std::string::npos);
  auto listed = platform.listDatabasesRequest().send().wait(ws);
  ASSERT_EQ(listed.getDatabases().size(), 1u);
  EXPECT_EQ(std::string(listed.getDatabases()[0].getId().cStr()), id);

  EXPECT_EQ(psql(uri, "create table t (n int); insert into t select generate_series(1, 100)"), "");
  auto backed = db.backupRequest().send().wait(ws);  // (a Reader lives as long as its response)
  auto bk = backed.getBackup();
  std::string backup = bk.getId();
  EXPECT_EQ(backup.rfind("bk_", 0), 0u);
  EXPECT_GT(bk.getBytes(), 0u);
  EXPECT_EQ(db.infoRequest().send().wait(ws).getInfo().getBackups().size(), 1u);

  // A restore into a new database has the rows; then it goes.
  auto r = platform.createDatabaseRequest();
  r.initRequest().setName("restored");
  r.getRequest().setFromBackup(backup);
  auto restored = r.send().wait(ws);
  EXPECT_EQ(psql(restored.getInfo().getConnectionUri(), "select count(*) from t"), "100");
  EXPECT_EQ(std::string(restored.getInfo().getRestoredFrom().cStr()), backup);
  restored.getDatabase().deleteRequest().send().wait(ws);

  auto rotation = db.rotatePasswordRequest().send().wait(ws);
  auto rotated = rotation.getInfo();
  std::string fresh = rotated.getConnectionUri();
  EXPECT_NE(std::string(rotated.getPassword().cStr()), password);
  EXPECT_EQ(psql(fresh, "select count(*) from t"), "100");
  EXPECT_EQ(psql(uri, "select 1").rfind("error: ", 0), 0u) << "the old password still works";

  auto hibernation = db.hibernateRequest().send().wait(ws);
  auto h = hibernation.getInfo();
  EXPECT_EQ(std::string(h.getStatus().cStr()), "hibernated");
  EXPECT_EQ(std::string(h.getHost().cStr()), "");
  auto waking = db.wakeRequest().send().wait(ws);
  auto w = waking.getInfo();
  EXPECT_EQ(std::string(w.getStatus().cStr()), "running");
  // The same role and password, maybe on another port: the URI of get, with the password added.
  std::string woke = w.getConnectionUri();
  auto at = woke.find('@');
  ASSERT_NE(at, std::string::npos);
  woke = fresh.substr(0, fresh.find('@')) + woke.substr(at);
  EXPECT_EQ(psql(woke, "select count(*) from t"), "100");

  auto logs = db.logsRequest();
  logs.setLines(50);
  EXPECT_NE(std::string(logs.send().wait(ws).getLog().cStr()), "");
  auto too_many = [&] {
    auto l = db.logsRequest();
    l.setLines(20000);
    l.send().wait(ws);
  };
  EXPECT_EQ(error_of(too_many), "invalid_argument");

  // Another tenant sees nothing of it.
  pandastack::tools::HttpClient http(daemon_->url, daemon_->key);
  auto k = http.request("POST", "/v1/keys", R"({"tenant":"rpc-db-other"})");
  ASSERT_EQ(k.status, 201) << k.body;
  auto other_conn =
      io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient other_client(*other_conn);
  auto other =
      login(other_client, pandastack::wire::Json::parse(k.body)->operator[]("key").as_string());
  auto theirs = [&] {
    auto g2 = other.getDatabaseRequest();
    g2.setId(id);
    g2.send().wait(ws);
  };
  EXPECT_EQ(error_of(theirs), "database_not_found");
  EXPECT_EQ(other.listDatabasesRequest().send().wait(ws).getDatabases().size(), 0u);

  auto dropped = [&] {
    auto d = db.deleteBackupRequest();
    d.setBackupId(backup);
    return d.send().wait(ws).getInfo().getBackups().size();
  };
  EXPECT_EQ(dropped(), 0u);
  EXPECT_EQ(error_of([&] { dropped(); }), "backup_not_found");
  db.deleteRequest().send().wait(ws);
  EXPECT_EQ(error_of([&] { got(); }), "database_not_found");
}

// What a sandbox reached and was refused, and the tenant's secrets (never a value), over RPC as
// over REST (issue 35); a hibernated sandbox says whether its hibernation is durable yet.
TEST_F(RpcDatabaseTest, EgressLogSecretsAndDurability) {
  auto& ws = io_.waitScope;
  auto conn = io_.provider->getNetwork().parseAddress(daemon_->rpc).wait(ws)->connect().wait(ws);
  capnp::TwoPartyClient client(*conn);
  auto platform = login(client, daemon_->key);
  auto made = platform.createRequest().send().wait(ws);
  auto sbx = made.getSandbox();
  EXPECT_EQ(std::string(made.getInfo().getDurable()), "");  // (running)
  // A connection its rules refuse (the metadata address: refused in its own namespace).
  auto e = sbx.execRequest();
  e.initRequest().setCmd(
      "python3 -c \"import socket\ntry:\n socket.create_connection(('169.254.169.254', 80), 2)\n"
      "except OSError as e:\n print(e)\"");
  EXPECT_EQ(e.send().wait(ws).getResult().getExitCode(), 0);
  std::string found;
  for (int i = 0; i < 50 && found.empty(); ++i) {
    auto q = sbx.egressLogRequest();
    q.setVerdict("denied");
    auto log = q.send().wait(ws);
    for (auto entry : log.getEntries())
      if (std::string(entry.getDestination()) == "169.254.169.254")
        found = std::string(entry.getKind()) + " " + std::string(entry.getVerdict()) + " " +
                std::string(entry.getReason()) + " " + std::to_string(entry.getPort());
    if (found.empty()) io_.provider->getTimer().afterDelay(100 * kj::MILLISECONDS).wait(ws);
  }
  EXPECT_EQ(found, "connection denied internal 80");
  EXPECT_EQ(error_of([&] {
              auto q = sbx.egressLogRequest();
              q.setLimit(5000);
              q.send().wait(ws);
            }),
            "invalid_argument");
  EXPECT_EQ(error_of([&] {
              auto q = sbx.egressLogRequest();
              q.setKind("http");
              q.send().wait(ws);
            }),
            "invalid_argument");
  // Secrets: names and hosts, never a value.
  pandastack::tools::HttpClient http(daemon_->url, daemon_->key);
  auto r = http.request("POST", "/v1/secrets",
                        R"({"name":"RPC_TOKEN","value":"rpc-value-x","hosts":["api.example.test"],)"
                        R"("inject_into":["headers","body"]})");
  ASSERT_EQ(r.status, 201) << r.body;
  auto listed = platform.listSecretsRequest().send().wait(ws);
  ASSERT_EQ(listed.getSecrets().size(), 1u);
  auto s0 = listed.getSecrets()[0];
  EXPECT_EQ(std::string(s0.getName()), "RPC_TOKEN");
  ASSERT_EQ(s0.getHosts().size(), 1u);
  EXPECT_EQ(std::string(s0.getHosts()[0]), "api.example.test");
  EXPECT_EQ(s0.getVersion(), 1u);
  EXPECT_GT(s0.getCreatedAtMs(), 0);
  ASSERT_EQ(s0.getInjectInto().size(), 2u);
  EXPECT_EQ(std::string(s0.getInjectInto()[1]), "body");
  EXPECT_FALSE(s0.getAllowPlainHttp());
  EXPECT_EQ(http.request("DELETE", "/v1/secrets/RPC_TOKEN", "").status, 204);
  // Hibernated: "local" once its copy is on the data disk, "none" before.
  auto h = sbx.hibernateRequest().send().wait(ws);
  std::string durable = h.getInfo().getDurable();
  EXPECT_TRUE(durable == "local" || durable == "none") << durable;
  sbx.killRequest().send().wait(ws);
}

}  // namespace
