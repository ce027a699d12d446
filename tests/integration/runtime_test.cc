// Integration tests of the actor runtime: real VMs, a real RocksDB event store, restarts.

#include "actors/runtime.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/custom_template.h"
#include "actors/event_codec.h"
#include "storage/event_store.h"
#include "tests/integration/test_env.h"
#include "wire/json.h"

namespace pandastack::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono;
using actors::Runtime;
using actors::SandboxStatus;

vmm::ExecRequest sh(std::string cmd) {
  vmm::ExecRequest r;
  r.shell = std::move(cmd);
  r.timeout_ms = 60000;
  return r;
}

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;
    base_ =
        fs::path("/dev/shm") / ("pst-rt-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    config_.data_dir = base_ / "data";
    config_.state_dir = base_ / "state";
    config_.images_dir = images_dir();
    config_.reaper_interval = milliseconds(200);
    // A failing test must not leave VMs behind: here they die with the test process. (The
    // adoption test's crashing host, runtime_host, keeps the default.)
    config_.vms_outlive_host = false;
    start();
  }
  void TearDown() override {
    rt_.reset();
    fs::remove_all(base_);
  }
  void start() {
    auto r = Runtime::start(config_);
    ASSERT_TRUE(r) << r.error().code << ": " << r.error().message;
    rt_ = std::move(*r);
  }
  void restart() {
    rt_.reset();  // the host process stops (gracefully)
    start();
  }
  actors::SandboxInfo create(actors::CreateRequest req = {}) {
    if (req.tenant.empty()) req.tenant = "acme";
    auto s = rt_->create(req);
    EXPECT_TRUE(s) << s.error().code << ": " << s.error().message;
    return s ? *s : actors::SandboxInfo{};
  }
  std::string run(const std::string& id, const std::string& cmd,
                  const std::string& tenant = "acme") {
    auto r = rt_->exec(tenant, id, sh(cmd));
    EXPECT_TRUE(r) << r.error().code << ": " << r.error().message;
    return r ? r->stdout_data : "";
  }
  std::vector<std::string> event_types(const std::string& id) {
    rt_.reset();
    auto store = storage::EventStore::open({config_.data_dir / "store", true, 1024, {}});
    std::vector<std::string> out;
    auto events = (*store)->read_stream(id);
    EXPECT_TRUE(events);
    if (events)
      for (auto& e : *events) out.push_back(e.type);
    return out;
  }

  fs::path base_;
  actors::RuntimeConfig config_;
  std::unique_ptr<Runtime> rt_;
};

// Security review 3, M1: a peer's start names a template, which becomes paths here (its folder,
// bound into the jail). Only a shipped template's name or the tenant's own template id that this
// host has is taken; the received snapshot goes whatever the answer.
TEST_F(RuntimeTest, AnImportNamesOnlyATemplateOfItsTenant) {
  auto folders = rt_->import_folders("acme");
  fs::create_directories(folders.dir);
  for (auto [name, code] : std::vector<std::pair<std::string, Code>>{
           {"../../../../etc", Code::invalid_argument},
           {"base/../../x", Code::invalid_argument},
           {"kernel", Code::invalid_argument},
           {"", Code::invalid_argument},
           {"jq." + actors::template_id("victim", "jq").substr(3), Code::template_not_found},
           {actors::template_id("victim", "jq"), Code::template_not_found},  // another tenant's
           {actors::template_id("acme", "jq"), Code::template_not_found},    // none here
           {"no-such-template", Code::template_not_found}}) {
    SCOPED_TRACE(name);
    actors::ImportRequest ir;
    ir.snapshot_id = folders.snapshot_id;
    ir.ids = {""};
    ir.parent = "sbx_aaaaaaaaaaaaaaaa";
    ir.create.tenant = "acme";
    ir.create.template_name = name;
    auto r = rt_->start_imported(ir, false);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, code) << r.error().message;
    EXPECT_FALSE(fs::exists(folders.dir));
    fs::create_directories(folders.dir);
  }
  fs::remove_all(folders.dir);
  EXPECT_TRUE(rt_->list("acme")->empty());
  // The layer cache is the tenant's own.
  EXPECT_NE(rt_->import_folders("acme").layer_cache, rt_->import_folders("victim").layer_cache);
}

TEST_F(RuntimeTest, CreateExecListAndTenantIsolation) {
  actors::CreateRequest req;
  req.metadata = {{"team", "red"}};
  auto s = create(req);
  ASSERT_EQ(s.status, SandboxStatus::running);
  EXPECT_EQ(s.id.rfind("sbx_", 0), 0u);
  EXPECT_EQ(s.id.size(), 20u);
  EXPECT_EQ(
      run(s.id, "echo hello; hostname"), "hello\n" + [&] {
        std::string h = s.id;
        for (auto& c : h)
          if (c == '_') c = '-';
        return h;
      }() + "\n");
  // Another tenant sees nothing.
  EXPECT_EQ(rt_->get("other", s.id).error().code, Code::sandbox_not_found);
  EXPECT_EQ(rt_->exec("other", s.id, sh("true")).error().code, Code::sandbox_not_found);
  EXPECT_EQ(rt_->kill("other", s.id).error().code, Code::sandbox_not_found);
  EXPECT_TRUE(rt_->list("other")->empty());
  EXPECT_EQ(rt_->list("acme")->size(), 1u);
  EXPECT_EQ(rt_->list("acme", std::nullopt, {{"team", "red"}})->size(), 1u);
  EXPECT_TRUE(rt_->list("acme", std::nullopt, {{"team", "blue"}})->empty());
  EXPECT_TRUE(rt_->list("acme", SandboxStatus::hibernated)->empty());
  auto m = rt_->set_metadata("acme", s.id, {{"team", "blue"}});
  ASSERT_TRUE(m);
  EXPECT_EQ(rt_->list("acme", std::nullopt, {{"team", "blue"}})->size(), 1u);
  auto k = rt_->kill("acme", s.id);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->status, SandboxStatus::stopped);
  EXPECT_EQ(rt_->exec("acme", s.id, sh("true")).error().code, Code::sandbox_stopped);
  EXPECT_EQ(event_types(s.id),
            (std::vector<std::string>{"created", "started", "exec-started", "exec-finished",
                                      "metadata-changed", "killed"}));
}

// Commands of one sandbox run concurrently with each other and with file operations; killing the
// sandbox ends a command in flight at once.
TEST_F(RuntimeTest, ConcurrentCommandsFilesAndKillEndsACommandInFlight) {
  auto s = create();
  ASSERT_EQ(s.status, SandboxStatus::running);
  auto long_start = steady_clock::now();
  std::optional<actors::Reply<vmm::ExecResult>> long_result;
  std::thread long_cmd([&] { long_result.emplace(rt_->exec("acme", s.id, sh("sleep 120"))); });
  std::this_thread::sleep_for(milliseconds(300));
  // While `sleep 120` runs: another command, files, a streamed command.
  EXPECT_EQ(run(s.id, "echo side"), "side\n");
  ASSERT_TRUE(rt_->write_file("acme", s.id, "/tmp/dir/a.txt", "alpha"));
  EXPECT_EQ(*rt_->read_file("acme", s.id, "/tmp/dir/a.txt", 1024), "alpha");
  EXPECT_EQ(rt_->read_file("acme", s.id, "/tmp/dir/a.txt", 2).error().code, Code::file_too_large);
  EXPECT_EQ(rt_->read_file("acme", s.id, "/tmp/nope", 1024).error().code, Code::file_not_found);
  EXPECT_EQ(rt_->read_file("other", s.id, "/tmp/dir/a.txt", 1024).error().code,
            Code::sandbox_not_found);
  ASSERT_TRUE(rt_->rename("acme", s.id, "/tmp/dir/a.txt", "/tmp/dir/b.txt"));
  auto ls = rt_->list_dir("acme", s.id, "/tmp/dir");
  ASSERT_TRUE(ls);
  ASSERT_EQ(ls->size(), 1u);
  EXPECT_EQ((*ls)[0].name, "b.txt");
  EXPECT_EQ(rt_->stat("acme", s.id, "/tmp/dir/b.txt")->size, 5u);
  std::string streamed;
  std::mutex mu;
  auto st = rt_->exec_stream("acme", s.id, sh("echo one; echo two >&2"),
                             [&](vmm::StreamKind, std::string_view d) {
                               std::lock_guard l(mu);
                               streamed += d;
                             });
  ASSERT_TRUE(st);
  EXPECT_EQ(st->exit_code, 0);
  EXPECT_NE(streamed.find("one"), std::string::npos);
  auto pid = rt_->start_process("acme", s.id, sh("sleep 100"));
  ASSERT_TRUE(pid);
  auto procs = rt_->list_processes("acme", s.id);
  ASSERT_TRUE(procs);
  EXPECT_FALSE(procs->empty());
  ASSERT_TRUE(rt_->kill_process("acme", s.id, *pid));
  ASSERT_TRUE(rt_->kill("acme", s.id));
  long_cmd.join();
  EXPECT_LT(steady_clock::now() - long_start, seconds(30));
  ASSERT_TRUE(long_result.has_value());
  ASSERT_FALSE(*long_result);
  EXPECT_EQ(long_result->error().code, Code::sandbox_stopped);
  EXPECT_EQ(rt_->read_file("acme", s.id, "/tmp/dir/b.txt", 1024).error().code,
            Code::sandbox_stopped);
}

// Recovery starts from the newest state snapshot and applies only the events after it.
TEST_F(RuntimeTest, RecoveryUsesStateSnapshotsAndTheTail) {
  rt_.reset();
  config_.snapshot_every = 4;
  start();
  actors::CreateRequest req;
  req.metadata = {{"k", "v"}};
  auto s = create(req);
  for (int i = 0; i < 3; ++i) run(s.id, "true");  // 2 + 6 events
  ASSERT_TRUE(rt_->set_ttl("acme", s.id, 1234));  // 9 events
  auto before = *rt_->get("acme", s.id);
  EXPECT_EQ(before.version, 9u);
  rt_.reset();
  {
    auto store = storage::EventStore::open({config_.data_dir / "store", true, 1024, {}});
    ASSERT_TRUE(store);
    auto snap = (*store)->load_snapshot(s.id);
    ASSERT_TRUE(snap && *snap);
    EXPECT_EQ((*snap)->version, 8u);  // the tail after it: ttl-changed, killed (at shutdown)
    auto state = actors::decode_state((*snap)->state);
    ASSERT_TRUE(state);
    EXPECT_EQ(state->execs_finished, 3u);
  }
  start();
  auto after = rt_->get("acme", s.id);
  ASSERT_TRUE(after);
  // The graceful shutdown killed it (one more event); everything else as before.
  EXPECT_EQ(after->status, SandboxStatus::stopped);
  EXPECT_EQ(after->version, before.version + 1);
  EXPECT_EQ(after->metadata, before.metadata);
  EXPECT_EQ(after->expires_at_ms, before.expires_at_ms);
  EXPECT_EQ(after->created_at_ms, before.created_at_ms);
}

// The first creates of a template wait for one bake by its template actor: a fresh images folder
// (hard links to the real images, no bake yet), four creates at once, one bake, and every sandbox
// restored from it (the same guest boot id).
TEST_F(RuntimeTest, ConcurrentFirstCreatesShareOneBake) {
  rt_.reset();
  auto images =
      fs::path(images_dir()).parent_path() / ("images-bake-test-" + std::to_string(::getpid()));
  fs::remove_all(images);
  for (auto sub : {"kernel", "initramfs", "base"}) fs::create_directories(images / sub);
  for (auto f : {"kernel/vmlinux", "kernel/key", "initramfs/initramfs.cpio", "initramfs/key",
                 "base/rootfs.qcow2", "base/key"})
    fs::create_hard_link(fs::path(images_dir()) / f, images / f);
  config_.images_dir = images;
  start();
  std::vector<std::thread> threads;
  std::vector<actors::Reply<actors::SandboxInfo>> made(
      4, actors::Rejection{Code::internal, "not made"});
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      actors::CreateRequest req;
      req.tenant = "acme";
      made[i] = rt_->create(req);
    });
  for (auto& t : threads) t.join();
  std::set<std::string> boot_ids;
  for (auto& m : made) {
    ASSERT_TRUE(m) << m.error().code << ": " << m.error().message;
    boot_ids.insert(run(m->id, "cat /proc/sys/kernel/random/boot_id"));
  }
  EXPECT_EQ(boot_ids.size(), 1u) << "sandboxes restored from different bakes";
  size_t bakes = 0;
  for (auto& d : fs::directory_iterator(images / "base" / "baked")) bakes += d.is_directory();
  EXPECT_EQ(bakes, 1u);
  rt_.reset();
  fs::remove_all(images);
}

TEST_F(RuntimeTest, HibernatedSandboxSurvivesAHostRestartAndWakesIntact) {
  auto s = create();
  ASSERT_EQ(s.status, SandboxStatus::running);
  auto sha = run(s.id, "head -c 16777216 /dev/urandom > /tmp/blob && sha256sum /tmp/blob");
  ASSERT_EQ(sha.size(), 64u + 12u);
  auto h = rt_->hibernate("acme", s.id);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->status, SandboxStatus::hibernated);
  EXPECT_EQ(rt_->exec("acme", s.id, sh("true")).error().code, Code::sandbox_hibernated);
  restart();
  auto after = rt_->get("acme", s.id);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, SandboxStatus::hibernated);
  auto w = rt_->wake("acme", s.id);
  ASSERT_TRUE(w) << w.error().message;
  EXPECT_EQ(w->status, SandboxStatus::running);
  EXPECT_EQ(run(s.id, "sha256sum /tmp/blob"), sha);
}

TEST_F(RuntimeTest, RunningSandboxesAreKilledOrHibernatedAtShutdownAndRecorded) {
  auto plain = create();
  actors::CreateRequest p;
  p.persistent = true;
  auto keep = create(p);
  run(keep.id, "echo kept > /tmp/kept");
  restart();
  EXPECT_EQ(rt_->get("acme", plain.id)->status, SandboxStatus::stopped);
  EXPECT_EQ(rt_->get("acme", keep.id)->status, SandboxStatus::hibernated);
  ASSERT_TRUE(rt_->wake("acme", keep.id));
  EXPECT_EQ(run(keep.id, "cat /tmp/kept"), "kept\n");
}

SandboxStatus wait_for(Runtime& rt, const std::string& id, SandboxStatus want, int tenths = 150) {
  SandboxStatus st = SandboxStatus::none;
  for (int i = 0; i < tenths && st != want; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    auto g = rt.get("acme", id);
    if (g) st = g->status;
  }
  return st;
}

TEST_F(RuntimeTest, TtlReaperKillsPlainAndHibernatesPersistentSandboxes) {
  actors::CreateRequest plain;
  plain.ttl_seconds = 2;
  auto p = create(plain);
  actors::CreateRequest keep;
  keep.ttl_seconds = 2;
  keep.persistent = true;
  auto k = create(keep);
  actors::CreateRequest extended;
  extended.ttl_seconds = 2;
  auto e = create(extended);
  ASSERT_TRUE(rt_->set_ttl("acme", e.id, 600));
  EXPECT_EQ(wait_for(*rt_, p.id, SandboxStatus::stopped), SandboxStatus::stopped);
  EXPECT_EQ(wait_for(*rt_, k.id, SandboxStatus::hibernated), SandboxStatus::hibernated);
  EXPECT_EQ(rt_->get("acme", e.id)->status, SandboxStatus::running);
  EXPECT_EQ(rt_->set_ttl("acme", e.id, 1000000).error().code, Code::invalid_argument);
}

// Each live sandbox has a VM worker thread; an ended one has none (its record answers for it).
// Before, every sandbox ever created kept its thread until the host stopped: 30,000 creates were
// 30,000 threads.
TEST_F(RuntimeTest, EndedSandboxesGiveTheirThreadsBack) {
  auto threads = [] {
    int n = 0;
    for ([[maybe_unused]] auto& t : fs::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  ASSERT_TRUE(rt_->kill("acme", create().id));  // warms the template and its pool
  auto settle = [&](int at_most) {
    int n = threads();
    for (int i = 0; i < 200 && n > at_most; ++i) {
      std::this_thread::sleep_for(milliseconds(20));
      n = threads();
    }
    return n;
  };
  std::this_thread::sleep_for(milliseconds(300));
  int base = threads();
  std::vector<std::string> ended;
  for (int i = 0; i < 6; ++i) {
    auto s = create();
    ASSERT_FALSE(s.id.empty());
    EXPECT_EQ(run(s.id, "echo hi"), "hi\n");
    ASSERT_TRUE(rt_->kill("acme", s.id));
    ended.push_back(s.id);
  }
  // Refused creates cost nothing either.
  actors::CreateRequest bad;
  bad.tenant = "acme";
  bad.ttl_seconds = 100000000;  // over the maximum: refused by the sandbox's decide
  for (int i = 0; i < 5; ++i) EXPECT_EQ(rt_->create(bad).error().code, Code::invalid_argument);
  EXPECT_LE(settle(base + 2), base + 2) << "threads grew with ended sandboxes";
  // Ended sandboxes still answer as before: their record, and the same refusals.
  for (auto& id : ended) {
    auto got = rt_->get("acme", id);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, SandboxStatus::stopped);
    auto again = rt_->exec("acme", id, sh("true"));
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().code, Code::sandbox_stopped);
    EXPECT_TRUE(rt_->kill("acme", id)) << "killing an ended sandbox changes nothing (and is fine)";
    EXPECT_FALSE(rt_->get("other", id)) << "still the tenant's alone";
  }
}

// Long uptimes stay flat (issue 32): an ended sandbox answers for its retention, then is
// forgotten by the registry (get is 404, lists and quota tallies pass it by) and by the next
// start's recovery; one that a named snapshot refers to stays until the snapshot goes. Its events
// stay in the store.
TEST_F(RuntimeTest, EndedSandboxesRetireAfterTheirRetention) {
  rt_.reset();
  config_.ended_retention = seconds(1);
  start();
  auto plain = create(), kept = create();
  auto snap = rt_->snapshot("acme", kept.id);
  ASSERT_TRUE(snap) << snap.error().message;
  ASSERT_TRUE(rt_->kill("acme", plain.id));
  ASSERT_TRUE(rt_->kill("acme", kept.id));
  auto got = rt_->get("acme", plain.id);
  ASSERT_TRUE(got) << "an ended sandbox answers within its retention";
  EXPECT_EQ(got->status, SandboxStatus::stopped);
  auto gone = [&](const std::string& id) {
    for (int i = 0; i < 100; ++i) {
      auto g = rt_->get("acme", id);
      if (!g) return std::string(to_string(g.error().code));
      std::this_thread::sleep_for(milliseconds(100));
    }
    return std::string("still answered after 10 s");
  };
  EXPECT_EQ(gone(plain.id), "sandbox_not_found");
  auto listed = rt_->list("acme");
  ASSERT_TRUE(listed);
  for (auto& i : *listed) EXPECT_NE(i.id, plain.id);
  EXPECT_TRUE(rt_->get("acme", kept.id)) << "its named snapshot keeps it";
  restart();
  EXPECT_EQ(rt_->get("acme", plain.id).error().code, Code::sandbox_not_found)
      << "recovery skips a retired sandbox";
  ASSERT_TRUE(rt_->get("acme", kept.id));
  ASSERT_TRUE(rt_->delete_snapshot("acme", *snap));
  EXPECT_EQ(gone(kept.id), "sandbox_not_found") << "once its snapshot is gone, it retires too";
  auto types = event_types(plain.id);
  ASSERT_FALSE(types.empty()) << "a retired sandbox's events stay";
  EXPECT_EQ(types.front(), "created");
}

TEST_F(RuntimeTest, ExecWakesAnAutoWakeSandbox) {
  actors::CreateRequest req;
  req.auto_wake = true;
  auto s = create(req);
  run(s.id, "echo state > /tmp/state");
  ASSERT_TRUE(rt_->hibernate("acme", s.id));
  EXPECT_EQ(run(s.id, "cat /tmp/state"), "state\n");
  EXPECT_EQ(rt_->get("acme", s.id)->status, SandboxStatus::running);
}

TEST_F(RuntimeTest, SnapshotCreateFromSnapshotAndFork) {
  auto s = create();
  run(s.id, "echo parent > /tmp/who");
  auto snap = rt_->snapshot("acme", s.id);
  ASSERT_TRUE(snap) << snap.error().message;
  EXPECT_EQ(snap->rfind("snap_", 0), 0u);
  actors::CreateRequest from;
  from.from_snapshot = *snap;
  auto c = create(from);
  ASSERT_EQ(c.status, SandboxStatus::running);
  EXPECT_EQ(run(c.id, "cat /tmp/who"), "parent\n");
  // Another tenant cannot use it.
  from.tenant = "other";
  EXPECT_EQ(rt_->create(from).error().code, Code::snapshot_not_found);
  auto kids = rt_->fork("acme", s.id, 2);
  ASSERT_TRUE(kids) << kids.error().message;
  ASSERT_EQ(kids->size(), 2u);
  for (auto& k : *kids) {
    EXPECT_EQ(k.parent, s.id);
    EXPECT_EQ(k.status, SandboxStatus::running);
    EXPECT_EQ(run(k.id, "cat /tmp/who"), "parent\n");
  }
  EXPECT_NE(run((*kids)[0].id, "cat /proc/sys/kernel/random/uuid"),
            run((*kids)[1].id, "cat /proc/sys/kernel/random/uuid"));
  EXPECT_EQ(rt_->get("acme", s.id)->status, SandboxStatus::running);
  EXPECT_EQ(rt_->list("acme")->size(), 4u);
  // The fork's own snapshot goes once its children run (it is not one of the sandbox's): only
  // the named snapshot stays. One a crash left behind goes at the next start.
  auto snapshots = [&] {
    std::vector<std::string> names;
    for (auto& d : fs::directory_iterator(config_.state_dir / "snapshots"))
      names.push_back(d.path().filename().string());
    return names;
  };
  for (int i = 0; i < 50 && snapshots().size() != 1; ++i)
    std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(snapshots(), std::vector<std::string>{*snap});
  fs::create_directories(config_.state_dir / "snapshots" / "snap_leftover");
  restart();
  EXPECT_EQ(snapshots(), std::vector<std::string>{*snap});
  actors::CreateRequest again;
  again.from_snapshot = *snap;
  EXPECT_EQ(run(create(again).id, "cat /tmp/who"), "parent\n");
}

// A host process that dies (SIGKILL) leaves its VMs running; the next start re-adopts the VM of a
// running sandbox (its tmpfs intact) and records a sandbox whose VM is gone failed(host_restart).
TEST_F(RuntimeTest, VmsOutliveACrashedHostAndAreAdopted) {
  rt_.reset();
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  pid_t host = ::fork();
  if (host == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execl(RUNTIME_HOST, RUNTIME_HOST, config_.data_dir.c_str(), config_.state_dir.c_str(),
            config_.images_dir.c_str(), "2", nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  // Its stdout carries the ids (logs go to stderr, but skip anything else to be safe).
  std::vector<std::string> ids;
  for (;;) {
    std::string line;
    char c;
    ssize_t n;
    while ((n = ::read(out[0], &c, 1)) == 1 && c != '\n') line += c;
    if (line.rfind("sbx_", 0) == 0) ids.push_back(line);
    if (n != 1 || ids.size() == 2) break;
  }
  ::close(out[0]);
  ASSERT_EQ(ids.size(), 2u);
  ::kill(host, SIGKILL);
  int status;
  ::waitpid(host, &status, 0);
  // Both QEMUs survived their host. Kill the second one: its sandbox cannot be adopted.
  auto qemu_pid = [&](const std::string& id) -> pid_t {
    for (auto& d : fs::directory_iterator(config_.state_dir / "run")) {
      if (!fs::exists(d.path() / "vm.json")) continue;
      std::ifstream in(d.path() / "vm.json");
      std::string text((std::istreambuf_iterator<char>(in)), {});
      auto j = wire::Json::parse(text);  // named after its sandbox (pooled VMs' folders are not)
      if (j && (*j)["name"].as_string().rfind(id + ".", 0) == 0) return pid_t((*j)["pid"].as_int());
    }
    return -1;
  };
  pid_t keep = qemu_pid(ids[0]), lose = qemu_pid(ids[1]);
  ASSERT_GT(keep, 0);
  ASSERT_GT(lose, 0);
  EXPECT_EQ(::kill(keep, 0), 0) << "the VM died with its host";
  ASSERT_EQ(::kill(lose, SIGKILL), 0);
  for (int i = 0; i < 300 && ::kill(lose, 0) == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));

  start();
  auto adopted = rt_->get("acme", ids[0]);
  ASSERT_TRUE(adopted) << adopted.error().message;
  EXPECT_EQ(adopted->status, SandboxStatus::running);
  EXPECT_EQ(run(ids[0], "cat /tmp/mark"), "adopted\n");  // same VM: its tmpfs is intact
  auto lost = rt_->get("acme", ids[1]);
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->status, SandboxStatus::failed);
  EXPECT_EQ(lost->failure_reason.rfind("host_restart", 0), 0u) << lost->failure_reason;
  // The crashed host's warm pool members and spares outlived it too: recovery killed them all,
  // only the adopted VM runs (the new runtime makes its pools on first use).
  EXPECT_EQ(count_processes((config_.state_dir / "run").string() + "/"), 1);
  // The adopted VM works like any other: snapshot + fork from it, then kill.
  auto kids = rt_->fork("acme", ids[0], 1);
  ASSERT_TRUE(kids) << kids.error().message;
  EXPECT_EQ(run((*kids)[0].id, "cat /tmp/mark"), "adopted\n");
  ASSERT_TRUE(rt_->kill("acme", ids[0]));
  for (int i = 0; i < 300 && ::kill(keep, 0) == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_NE(::kill(keep, 0), 0) << "the adopted QEMU outlived its kill";
  EXPECT_EQ(event_types(ids[1]), (std::vector<std::string>{"created", "started", "exec-started",
                                                           "exec-finished", "failed"}));
  start();
  rt_.reset();  // graceful: kills the fork child
  // A graceful stop removes its run folders (and the run folder itself when nothing is left).
  EXPECT_TRUE(!fs::exists(config_.state_dir / "run") || fs::is_empty(config_.state_dir / "run"))
      << "run folders were left behind";
}

}  // namespace
}  // namespace pandastack::testing
