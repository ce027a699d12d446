#include "actors/sandbox.h"

#include <gtest/gtest.h>

#include <array>

#include "actors/event_codec.h"

namespace pandastack::actors {
namespace {

constexpr int64_t kNow = 1'000'000;

Event e_(Event::Kind k) {
  Event e;
  e.kind = k;
  e.at_ms = kNow;
  return e;
}

Event created(bool persistent = false, bool auto_wake = false) {
  Event e = e_(Event::Kind::created);
  e.tenant = "acme";
  e.template_name = "base";
  e.vcpus = 1;
  e.memory_mib = 256;
  e.ttl_seconds = 900;
  e.expires_at_ms = kNow + 900'000;
  e.persistent = persistent;
  e.auto_wake = auto_wake;
  return e;
}

Event transition(Transition t, std::string snap = "snap-1") {
  Event e = e_(Event::Kind::transition_started);
  e.transition = t;
  e.snapshot_id = std::move(snap);
  return e;
}

// A sandbox in `status`, reached through events only.
SandboxState in(SandboxStatus status, bool persistent = false, bool auto_wake = false) {
  SandboxState s;
  s.id = "sbx_test";
  if (status == SandboxStatus::none) return s;
  s = apply(s, created(persistent, auto_wake));
  if (status == SandboxStatus::creating) return s;
  s = apply(s, e_(Event::Kind::started));
  switch (status) {
    case SandboxStatus::running:
      return s;
    case SandboxStatus::snapshotting:
      return apply(s, transition(Transition::snapshotting));
    case SandboxStatus::forking:
      return apply(s, transition(Transition::forking));
    case SandboxStatus::hibernating:
      return apply(s, transition(Transition::hibernating));
    case SandboxStatus::hibernated:
    case SandboxStatus::waking: {
      s = apply(s, transition(Transition::hibernating, "hib-1"));
      Event h = e_(Event::Kind::hibernated);
      h.snapshot_id = "hib-1";
      s = apply(s, h);
      if (status == SandboxStatus::hibernated) return s;
      return apply(s, transition(Transition::waking, "hib-1"));
    }
    case SandboxStatus::stopped:
      return apply(s, e_(Event::Kind::killed));
    case SandboxStatus::failed: {
      Event f = e_(Event::Kind::failed);
      f.reason = "boom";
      return apply(s, f);
    }
    default:
      return s;
  }
}

std::vector<std::pair<std::string, Command>> commands() {
  cmd::Create c;
  c.tenant = "acme";
  c.template_name = "base";
  cmd::SetMetadata m;
  m.metadata = {{"k", "v"}};
  return {{"Create", c},
          {"Started", cmd::Started{}},
          {"StartFailed", cmd::StartFailed{"no vm"}},
          {"Exec", cmd::Exec{"x1", "echo hi"}},
          {"ExecFinished", cmd::ExecFinished{"x-unknown", 0, 1, false}},
          {"Snapshot", cmd::Snapshot{"snap-2", ""}},
          {"Fork", cmd::Fork{"snap-3", 2}},
          {"Hibernate", cmd::Hibernate{"hib-2"}},
          {"Wake", cmd::Wake{}},
          {"TransitionDone", cmd::TransitionDone{{"sbx_c1", "sbx_c2"}, std::nullopt}},
          {"TransitionFailed", cmd::TransitionFailed{"disk full"}},
          {"SetTtl", cmd::SetTtl{600}},
          {"SetMetadata", m},
          {"Reap", cmd::Reap{}},
          {"Kill", cmd::Kill{}},
          {"Fail", cmd::Fail{"host_restart"}}};
}

std::string outcome(const Decision& d) {
  if (auto* r = std::get_if<Rejection>(&d)) return std::string("!") + to_string(r->code);
  auto& evs = std::get<std::vector<Event>>(d);
  if (evs.empty()) return "-";
  std::string s;
  for (auto& e : evs) s += (s.empty() ? "" : ",") + std::string(to_string(e.kind));
  return s;
}

// Every state x every command: the decision, and that its events apply cleanly.
TEST(SandboxDecide, EveryStateTimesEveryCommand) {
  const std::array<SandboxStatus, 10> states = {
      SandboxStatus::none,         SandboxStatus::creating, SandboxStatus::running,
      SandboxStatus::snapshotting, SandboxStatus::forking,  SandboxStatus::hibernating,
      SandboxStatus::hibernated,   SandboxStatus::waking,   SandboxStatus::stopped,
      SandboxStatus::failed};
  // Columns in the order of commands(): Create Started StartFailed Exec ExecFinished Snapshot Fork
  // Hibernate Wake TransitionDone TransitionFailed SetTtl SetMetadata Reap Kill Fail.
  const std::map<SandboxStatus, std::vector<std::string>> expected = {
      {SandboxStatus::none,
       {"created", "!invalid_state", "!invalid_state", "!sandbox_not_found", "!invalid_argument",
        "!sandbox_not_found", "!sandbox_not_found", "!sandbox_not_found", "!sandbox_not_found",
        "!invalid_state", "!invalid_state", "!sandbox_not_found", "!sandbox_not_found", "-",
        "!sandbox_not_found", "-"}},
      {SandboxStatus::creating,
       {"!already_exists", "started", "failed", "!sandbox_busy", "!invalid_argument",
        "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "!invalid_state",
        "!invalid_state", "ttl-changed", "metadata-changed", "!not_expired", "killed", "failed"}},
      {SandboxStatus::running,
       {"!already_exists", "!invalid_state", "!invalid_state", "exec-started", "!invalid_argument",
        "transition-started", "transition-started", "transition-started", "-", "!invalid_state",
        "!invalid_state", "ttl-changed", "metadata-changed", "!not_expired", "killed", "failed"}},
      {SandboxStatus::snapshotting,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_busy", "!invalid_argument",
        "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "snapshot-taken",
        "transition-failed", "ttl-changed", "metadata-changed", "!not_expired", "killed",
        "failed"}},
      {SandboxStatus::forking,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_busy", "!invalid_argument",
        "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "!sandbox_busy", "forked",
        "transition-failed", "ttl-changed", "metadata-changed", "!not_expired", "killed",
        "failed"}},
      {SandboxStatus::hibernating,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_busy", "!invalid_argument",
        "!sandbox_busy", "!sandbox_busy", "-", "!sandbox_busy", "hibernated", "transition-failed",
        "ttl-changed", "metadata-changed", "!not_expired", "killed", "failed"}},
      {SandboxStatus::hibernated,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_hibernated",
        "!invalid_argument", "!sandbox_hibernated", "!sandbox_hibernated", "-",
        "transition-started", "!invalid_state", "!invalid_state", "ttl-changed", "metadata-changed",
        "-", "killed", "failed"}},
      {SandboxStatus::waking,
       {"!already_exists", "woke", "failed", "!sandbox_busy", "!invalid_argument", "!sandbox_busy",
        "!sandbox_busy", "!sandbox_busy", "-", "woke", "transition-failed", "ttl-changed",
        "metadata-changed", "!not_expired", "killed", "failed"}},
      {SandboxStatus::stopped,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_stopped",
        "!invalid_argument", "!sandbox_stopped", "!sandbox_stopped", "!sandbox_stopped",
        "!sandbox_stopped", "!invalid_state", "!invalid_state", "!sandbox_stopped",
        "!sandbox_stopped", "-", "-", "-"}},
      {SandboxStatus::failed,
       {"!already_exists", "!invalid_state", "!invalid_state", "!sandbox_failed",
        "!invalid_argument", "!sandbox_failed", "!sandbox_failed", "!sandbox_failed",
        "!sandbox_failed", "!invalid_state", "!invalid_state", "!sandbox_failed", "!sandbox_failed",
        "-", "-", "-"}},
  };
  auto cmds = commands();
  for (SandboxStatus st : states) {
    SandboxState s = in(st);
    ASSERT_EQ(s.status, st);
    auto& row = expected.at(st);
    ASSERT_EQ(row.size(), cmds.size());
    for (size_t i = 0; i < cmds.size(); ++i) {
      auto d = decide(s, cmds[i].second, kNow + 1);
      EXPECT_EQ(outcome(d), row[i]) << to_string(st) << " x " << cmds[i].first;
      if (auto* evs = std::get_if<std::vector<Event>>(&d)) {
        SandboxState next = s;
        for (auto& e : *evs)
          EXPECT_NO_THROW(next = apply(next, e)) << to_string(st) << " x " << cmds[i].first;
        if (!evs->empty()) {
          EXPECT_EQ(next.version, s.version + evs->size());
        }
      }
    }
  }
}

// An egress summary is an audit record in every state of a sandbox that exists, its end
// included (the last period's); an empty one records nothing.
TEST(SandboxDecide, EgressSummariesAreRecordedInAnyStateButNone) {
  cmd::RecordEgress c;
  c.summary.dns = {3, 1};
  c.summary.destinations = {{"api.test", {3, 1}}};
  for (auto st : {SandboxStatus::creating, SandboxStatus::running, SandboxStatus::hibernated,
                  SandboxStatus::stopped, SandboxStatus::failed}) {
    SandboxState s = in(st);
    auto d = decide(s, c, kNow + 1);
    ASSERT_EQ(outcome(d), "egress-summary") << to_string(st);
    auto next = apply(s, std::get<std::vector<Event>>(d)[0]);
    EXPECT_EQ(next.status, st);  // nothing changes but the version
    EXPECT_EQ(next.version, s.version + 1);
  }
  EXPECT_EQ(outcome(decide(in(SandboxStatus::none), c, kNow)), "-");
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::RecordEgress{}, kNow)), "-");
}

// A migration ends a hibernated sandbox here (it runs on another host now); it may come back,
// its stream going on with a new life.
TEST(SandboxDecide, AMigrationEndsAHibernatedSandboxAndItMayComeBack) {
  for (SandboxStatus st :
       {SandboxStatus::none, SandboxStatus::creating, SandboxStatus::running,
        SandboxStatus::snapshotting, SandboxStatus::forking, SandboxStatus::hibernating,
        SandboxStatus::waking, SandboxStatus::stopped, SandboxStatus::failed})
    EXPECT_EQ(outcome(decide(in(st), cmd::MigratedAway{"h2"}, kNow + 1)), "!conflict")
        << to_string(st);
  SandboxState s = in(SandboxStatus::hibernated);
  auto d = decide(s, cmd::MigratedAway{"h2"}, kNow + 1);
  ASSERT_EQ(outcome(d), "migrated");
  for (auto& e : std::get<std::vector<Event>>(d)) s = apply(s, e);
  EXPECT_EQ(s.status, SandboxStatus::stopped);
  EXPECT_EQ(s.moved_to, "h2");
  EXPECT_FALSE(s.live());
  EXPECT_EQ(outcome(decide(s, cmd::Exec{"x1", "true"}, kNow + 2)), "!sandbox_stopped");
  // Back: a create goes on in the same stream.
  cmd::Create c;
  c.tenant = "acme";
  c.template_name = "base";
  d = decide(s, c, kNow + 3);
  ASSERT_EQ(outcome(d), "created");
  auto version = s.version;
  for (auto& e : std::get<std::vector<Event>>(d)) s = apply(s, e);
  EXPECT_EQ(s.status, SandboxStatus::creating);
  EXPECT_EQ(s.version, version + 1);
  EXPECT_EQ(s.moved_to, "");
  EXPECT_EQ(s.id, "sbx_test");
  // A sandbox that merely ended is never created again.
  EXPECT_EQ(outcome(decide(in(SandboxStatus::stopped), c, kNow)), "!already_exists");
}

// A named snapshot can be deleted whatever state its sandbox is in; only its own, and once.
TEST(SandboxDecide, DeletingASnapshotInAnyState) {
  for (SandboxStatus st : {SandboxStatus::running, SandboxStatus::hibernated,
                           SandboxStatus::stopped, SandboxStatus::failed}) {
    auto s = in(st);
    s.snapshots = {"snap-a", "snap-b"};
    auto d = decide(s, cmd::DeleteSnapshot{"snap-a"}, kNow + 1);
    ASSERT_EQ(outcome(d), "snapshot-deleted") << to_string(st);
    auto next = apply(s, std::get<std::vector<Event>>(d)[0]);
    EXPECT_EQ(next.snapshots, std::vector<std::string>{"snap-b"});
    EXPECT_EQ(next.status, st);
    EXPECT_EQ(outcome(decide(next, cmd::DeleteSnapshot{"snap-a"}, kNow + 2)),
              "!snapshot_not_found");
    EXPECT_EQ(outcome(decide(s, cmd::DeleteSnapshot{"hib-1"}, kNow + 1)), "!snapshot_not_found");
  }
  EXPECT_EQ(outcome(decide(in(SandboxStatus::none), cmd::DeleteSnapshot{"snap-a"}, kNow)),
            "!sandbox_not_found");
  // An event for a snapshot the sandbox does not have is impossible.
  Event bad = e_(Event::Kind::snapshot_deleted);
  bad.snapshot_id = "snap-z";
  EXPECT_ANY_THROW(apply(in(SandboxStatus::running), bad));
}

// The state after `c` is decided and its events applied (it must not be refused).
SandboxState step(SandboxState s, const Command& c) {
  auto d = decide(s, c, kNow);
  EXPECT_TRUE(std::holds_alternative<std::vector<Event>>(d));
  for (auto& e : std::get<std::vector<Event>>(d)) s = apply(s, e);
  return s;
}

TEST(SandboxDecide, ASnapshotKeepsTheNameItWasTakenWith) {
  auto s = step(in(SandboxStatus::running), cmd::Snapshot{"snap-a", "nightly"});
  EXPECT_EQ(s.pending_snapshot_name, "nightly");
  s = step(s, cmd::TransitionDone{});
  EXPECT_EQ(s.snapshot_names, (std::map<std::string, std::string>{{"snap-a", "nightly"}}));
  EXPECT_TRUE(s.pending_snapshot_name.empty());
  // An unnamed one has none; a failed one leaves nothing behind.
  s = step(step(s, cmd::Snapshot{"snap-b", ""}), cmd::TransitionDone{});
  EXPECT_EQ(s.snapshot_names.size(), 1u);
  s = step(step(s, cmd::Snapshot{"snap-c", "x"}), cmd::TransitionFailed{"disk full"});
  EXPECT_TRUE(s.pending_snapshot_name.empty());
  EXPECT_EQ(s.snapshot_names.size(), 1u);
  s = step(s, cmd::DeleteSnapshot{"snap-a"});
  EXPECT_TRUE(s.snapshot_names.empty());
}

TEST(SandboxDecide, ADiskOnlyHibernationIsRecordedUntilTheWake) {
  auto s = step(in(SandboxStatus::running), cmd::Hibernate{"", true});
  EXPECT_TRUE(s.pending_disk_only);
  s = step(s, cmd::TransitionDone{});
  EXPECT_EQ(s.status, SandboxStatus::hibernated);
  EXPECT_TRUE(s.hibernated_disk_only);
  EXPECT_FALSE(s.pending_disk_only);
  s = step(step(s, cmd::Wake{}), cmd::TransitionDone{});
  EXPECT_EQ(s.status, SandboxStatus::running);
  EXPECT_FALSE(s.hibernated_disk_only);
  // With memory (the default): not disk-only.
  EXPECT_FALSE(step(step(s, cmd::Hibernate{}), cmd::TransitionDone{}).hibernated_disk_only);
  // At its timeout: as the create said.
  auto t = in(SandboxStatus::running, /*persistent=*/true);
  t.timeout_disk_only = true;
  t.expires_at_ms = kNow - 1;
  t = step(t, cmd::Reap{});
  EXPECT_EQ(t.status, SandboxStatus::hibernating);
  EXPECT_TRUE(step(t, cmd::TransitionDone{}).hibernated_disk_only);
}

TEST(SandboxDecide, AHibernationIsDurableOnceItsCopyIsPersistedUntilTheWake) {
  auto s = step(step(in(SandboxStatus::running), cmd::Hibernate{"hib-1"}), cmd::TransitionDone{});
  ASSERT_EQ(s.status, SandboxStatus::hibernated);
  EXPECT_FALSE(s.hibernation_durable);
  const auto hib = s.hibernation_snapshot;
  ASSERT_FALSE(hib.empty());
  // A copy of another hibernation (an earlier one, woken since) changes nothing.
  EXPECT_EQ(outcome(decide(s, cmd::HibernationPersisted{"hib-old"}, kNow)), "-");
  s = step(s, cmd::HibernationPersisted{hib});
  EXPECT_TRUE(s.hibernation_durable);
  EXPECT_EQ(outcome(decide(s, cmd::HibernationPersisted{hib}, kNow)), "-");  // once
  s = step(step(s, cmd::Wake{}), cmd::TransitionDone{});
  EXPECT_FALSE(s.hibernation_durable);
  // While running, or on the way: nothing to persist.
  EXPECT_EQ(outcome(decide(s, cmd::HibernationPersisted{hib}, kNow)), "-");
  s = step(step(s, cmd::Hibernate{"hib-2"}), cmd::TransitionDone{});
  EXPECT_FALSE(s.hibernation_durable);  // a new hibernation: not yet
  s = step(step(s, cmd::HibernationPersisted{s.hibernation_snapshot}), cmd::Kill{});
  EXPECT_FALSE(s.hibernation_durable);
}

TEST(SandboxDecide, AHibernationIsRemoteOnceUploadedAfterItsLocalCopyUntilTheWake) {
  auto s = step(step(in(SandboxStatus::running), cmd::Hibernate{"hib-1"}), cmd::TransitionDone{});
  const auto hib = s.hibernation_snapshot;
  // Uploaded is what is on the data disk: not before that copy is recorded.
  EXPECT_EQ(outcome(decide(s, cmd::HibernationUploaded{hib, "manifests/a"}, kNow)), "-");
  s = step(s, cmd::HibernationPersisted{hib});
  const auto at = s.hibernation_persisted_at;
  // An upload of another copy (an earlier hibernation's) records nothing.
  EXPECT_EQ(outcome(decide(s, cmd::HibernationUploaded{hib, "manifests/a", at + 1}, kNow)), "-");
  EXPECT_EQ(outcome(decide(s, cmd::HibernationUploaded{"hib-old", "manifests/a", at}, kNow)), "-");
  EXPECT_EQ(outcome(decide(s, cmd::HibernationUploaded{hib, "", at}, kNow)), "-");
  s = step(s, cmd::HibernationUploaded{hib, "manifests/a", at});
  EXPECT_EQ(s.hibernation_manifest, "manifests/a");
  EXPECT_EQ(outcome(decide(s, cmd::HibernationUploaded{hib, "manifests/b", at}, kNow)),
            "-");  // once
  // It survives a replay: the manifest is in the event, and in a state snapshot.
  Event e;
  e.kind = Event::Kind::hibernation_uploaded;
  e.snapshot_id = hib;
  e.manifest = "manifests/a";
  auto back = decode_event(encode_event(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, Event::Kind::hibernation_uploaded);
  EXPECT_EQ(back->snapshot_id, hib);
  EXPECT_EQ(back->manifest, "manifests/a");
  auto state = decode_state(encode_state(s));
  ASSERT_TRUE(state);
  EXPECT_EQ(state->hibernation_manifest, "manifests/a");
  EXPECT_EQ(state->hibernation_persisted_at, at);
  s = step(step(s, cmd::Wake{}), cmd::TransitionDone{});
  EXPECT_TRUE(s.hibernation_manifest.empty());
  s = step(step(s, cmd::Hibernate{"hib-2"}), cmd::TransitionDone{});
  s = step(s, cmd::HibernationPersisted{s.hibernation_snapshot});
  EXPECT_NE(s.hibernation_persisted_at, at);  // another copy
  s = step(s, cmd::HibernationUploaded{s.hibernation_snapshot, "manifests/c",
                                       s.hibernation_persisted_at});
  EXPECT_EQ(s.hibernation_manifest, "manifests/c");
  EXPECT_TRUE(step(s, cmd::Kill{}).hibernation_manifest.empty());
}

TEST(SandboxDecide, ANamedSnapshotIsDurableOnceItsCopyIsPersistedWhateverTheSandboxDoes) {
  auto s = step(step(in(SandboxStatus::running), cmd::Snapshot{"snap-1", "nightly"}),
                cmd::TransitionDone{});
  ASSERT_EQ(s.snapshots, std::vector<std::string>{"snap-1"});
  EXPECT_TRUE(s.durable_snapshots.empty());
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotPersisted{"snap-other"}, kNow)), "-");
  // The sandbox ended meanwhile: its snapshot outlives it, and so does the copy.
  s = step(s, cmd::Kill{});
  s = step(s, cmd::SnapshotPersisted{"snap-1"});
  EXPECT_EQ(s.durable_snapshots, std::set<std::string>{"snap-1"});
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotPersisted{"snap-1"}, kNow)), "-");  // once
  // Lost (recovery found no copy): deleted with the reason.
  auto d = decide(s, cmd::DeleteSnapshot{"snap-1", "snapshot_lost"}, kNow);
  ASSERT_EQ(outcome(d), "snapshot-deleted");
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].reason, "snapshot_lost");
  s = step(s, cmd::DeleteSnapshot{"snap-1"});
  EXPECT_TRUE(s.durable_snapshots.empty());
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotPersisted{"snap-1"}, kNow)), "-");  // deleted: no
}

TEST(SandboxDecide, ANamedSnapshotIsRemoteOnceItsDurableCopyIsUploadedUntilItIsDeleted) {
  auto s = step(step(in(SandboxStatus::running), cmd::Snapshot{"snap-1", "nightly"}),
                cmd::TransitionDone{});
  // Uploaded is what is on the data disk: not before that copy is recorded.
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotUploaded{"snap-1", "manifests/a"}, kNow)), "-");
  s = step(s, cmd::SnapshotPersisted{"snap-1"});
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotUploaded{"snap-other", "manifests/a"}, kNow)), "-");
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotUploaded{"snap-1", ""}, kNow)), "-");
  // The sandbox ended meanwhile: the snapshot outlives it, and so does its copy in the store.
  s = step(s, cmd::Kill{});
  auto d = decide(s, cmd::SnapshotUploaded{"snap-1", "manifests/a"}, kNow);
  ASSERT_EQ(outcome(d), "snapshot-uploaded");
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].manifest, "manifests/a");
  s = step(s, cmd::SnapshotUploaded{"snap-1", "manifests/a"});
  EXPECT_EQ(s.snapshot_manifests, (std::map<std::string, std::string>{{"snap-1", "manifests/a"}}));
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotUploaded{"snap-1", "manifests/b"}, kNow)), "-");  // once
  s = step(s, cmd::DeleteSnapshot{"snap-1"});
  EXPECT_TRUE(s.snapshot_manifests.empty());
  EXPECT_EQ(outcome(decide(s, cmd::SnapshotUploaded{"snap-1", "manifests/a"}, kNow)), "-");
}

TEST(SandboxDecide, ExecOnAHibernatedSandboxWakesItWhenAskedTo) {
  auto s = in(SandboxStatus::hibernated, false, /*auto_wake=*/true);
  auto d = decide(s, cmd::Exec{"x1", "ls"}, kNow);
  ASSERT_EQ(outcome(d), "transition-started");
  auto next = apply(s, std::get<std::vector<Event>>(d)[0]);
  EXPECT_EQ(next.status, SandboxStatus::waking);
  EXPECT_EQ(next.pending_snapshot, "hib-1");
}

TEST(SandboxDecide, ConcurrentExecsAreLimited) {
  Limits limits;
  limits.max_concurrent_execs = 2;
  auto s = in(SandboxStatus::running);
  for (std::string id : {"x1", "x2"}) {
    auto d = decide(s, cmd::Exec{id, "sleep 1"}, kNow, limits);
    ASSERT_EQ(outcome(d), "exec-started");
    s = apply(s, std::get<std::vector<Event>>(d)[0]);
  }
  EXPECT_EQ(outcome(decide(s, cmd::Exec{"x3", "ls"}, kNow, limits)), "!too_many_execs");
  auto done = decide(s, cmd::ExecFinished{"x1", 0, 5, false}, kNow, limits);
  s = apply(s, std::get<std::vector<Event>>(done)[0]);
  EXPECT_EQ(outcome(decide(s, cmd::Exec{"x3", "ls"}, kNow, limits)), "exec-started");
}

TEST(SandboxDecide, TtlReaperKillsOrHibernatesPersistentSandboxes) {
  auto expiry = in(SandboxStatus::running).expires_at_ms;
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::Reap{}, expiry - 1)), "!not_expired");
  auto d = decide(in(SandboxStatus::running), cmd::Reap{}, expiry);
  ASSERT_EQ(outcome(d), "reaped");
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].reap_action, ReapAction::kill);
  EXPECT_EQ(apply(in(SandboxStatus::running), std::get<std::vector<Event>>(d)[0]).status,
            SandboxStatus::stopped);
  auto p = in(SandboxStatus::running, /*persistent=*/true);
  d = decide(p, cmd::Reap{}, expiry);
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].reap_action, ReapAction::hibernate);
  EXPECT_EQ(apply(p, std::get<std::vector<Event>>(d)[0]).status, SandboxStatus::hibernating);
  // Waking renews the TTL: the reaper does not take it straight back.
  auto woken = in(SandboxStatus::waking);
  Event w = e_(Event::Kind::woke);
  w.at_ms = expiry + 5000;
  woken = apply(woken, w);
  EXPECT_EQ(woken.expires_at_ms, expiry + 5000 + 900'000);
  EXPECT_EQ(outcome(decide(woken, cmd::Reap{}, expiry + 6000)), "!not_expired");
  // Extending the TTL postpones the reaper.
  auto ttl = decide(in(SandboxStatus::running), cmd::SetTtl{3600}, expiry - 1000);
  auto extended = apply(in(SandboxStatus::running), std::get<std::vector<Event>>(ttl)[0]);
  EXPECT_EQ(outcome(decide(extended, cmd::Reap{}, expiry)), "!not_expired");
}

TEST(SandboxDecide, IdleTimeoutEndsInTheOnTimeoutAction) {
  // No idle timeout: an idle reap is refused.
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::Reap{true}, kNow)),
            "!invalid_argument");
  Event c = created();
  c.idle_timeout_seconds = 60;
  c.on_timeout = ReapAction::hibernate;
  SandboxState s;
  s.id = "sbx_idle";
  s = apply(apply(s, c), e_(Event::Kind::started));
  EXPECT_EQ(s.idle_timeout_seconds, 60u);
  EXPECT_EQ(s.on_timeout, ReapAction::hibernate);
  // Idle is the actor's judgement (it knows the calls in flight): no expiry needed.
  auto d = decide(s, cmd::Reap{true}, kNow + 1);
  ASSERT_EQ(outcome(d), "reaped");
  auto reaped = std::get<std::vector<Event>>(d)[0];
  EXPECT_EQ(reaped.reap_action, ReapAction::hibernate);
  EXPECT_EQ(reaped.reason, "idle");
  EXPECT_EQ(apply(s, reaped).status, SandboxStatus::hibernating);
  // The TTL ends in the same action, with its own reason.
  d = decide(s, cmd::Reap{}, s.expires_at_ms);
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].reason, "ttl");
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].reap_action, ReapAction::hibernate);
  // on_timeout kill beats persistence; a default follows it.
  c.on_timeout = ReapAction::kill;
  c.persistent = true;
  EXPECT_EQ(apply(SandboxState{}, c).on_timeout, ReapAction::kill);
  c.on_timeout.reset();
  EXPECT_EQ(apply(SandboxState{}, c).on_timeout, ReapAction::hibernate);
  // Busy or hibernated sandboxes are not reaped for idleness.
  EXPECT_EQ(outcome(decide(apply(s, transition(Transition::snapshotting)), cmd::Reap{true}, kNow)),
            "!sandbox_busy");
  // Over the limit.
  cmd::Create big{"acme", "base", "", "", 1, 256, 60, {}, false, false, false, {}, 86401, {}, {}};
  EXPECT_EQ(outcome(decide(SandboxState{}, big, kNow)), "!invalid_argument");
}

TEST(SandboxDecide, CommandsRunningWhenASandboxEndsEndWithIt) {
  auto s = in(SandboxStatus::running);
  Event x = e_(Event::Kind::exec_started);
  x.exec_id = "x1";
  x.command = "sleep 100";
  s = apply(s, x);
  EXPECT_EQ(s.exec_started_ms.at("x1"), kNow);
  for (Command c : {Command{cmd::Kill{}}, Command{cmd::Fail{"vm_exited"}}}) {
    auto d = decide(s, c, kNow + 2500);
    auto evs = std::get<std::vector<Event>>(d);
    ASSERT_EQ(evs.size(), 2u) << outcome(d);
    EXPECT_EQ(evs[0].kind, Event::Kind::exec_finished);
    EXPECT_EQ(evs[0].exec_id, "x1");
    EXPECT_EQ(evs[0].exit_code, -9);
    EXPECT_EQ(evs[0].duration_ms, 2500u);
    auto ended = apply(apply(s, evs[0]), evs[1]);
    EXPECT_TRUE(ended.running_execs.empty());
  }
  // The caller's own report, arriving after the end, changes nothing (refused).
  auto killed = s;
  auto kill = decide(s, cmd::Kill{}, kNow + 1);
  for (auto& e : std::get<std::vector<Event>>(kill)) killed = apply(killed, e);
  EXPECT_EQ(outcome(decide(killed, cmd::ExecFinished{"x1", 0, 1, false}, kNow + 2)),
            "!invalid_argument");
}

TEST(SandboxDecide, ValidatesInput) {
  Limits l;
  l.max_ttl_seconds = 100;
  cmd::Create c;
  c.tenant = "t";
  c.template_name = "base";
  c.ttl_seconds = 101;
  EXPECT_EQ(outcome(decide(in(SandboxStatus::none), c, kNow, l)), "!invalid_argument");
  c.ttl_seconds = 0;
  auto d = decide(in(SandboxStatus::none), c, kNow, l);
  ASSERT_EQ(outcome(d), "created");
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].ttl_seconds, l.default_ttl_seconds);
  EXPECT_EQ(std::get<std::vector<Event>>(d)[0].expires_at_ms, kNow + 900'000);
  c.template_name = "";
  EXPECT_EQ(outcome(decide(in(SandboxStatus::none), c, kNow, l)), "!invalid_argument");
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::SetTtl{101}, kNow, l)),
            "!invalid_argument");
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::Fork{"s", 0}, kNow, l)),
            "!invalid_argument");
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), cmd::Fork{"s", 17}, kNow, l)),
            "!invalid_argument");
  cmd::SetMetadata m;
  m.metadata[""] = "x";
  EXPECT_EQ(outcome(decide(in(SandboxStatus::running), m, kNow, l)), "!invalid_argument");
}

TEST(SandboxApply, ImpossibleEventsFailLoudly) {
  EXPECT_THROW(apply(in(SandboxStatus::running), e_(Event::Kind::started)), std::logic_error);
  EXPECT_THROW(apply(in(SandboxStatus::stopped), e_(Event::Kind::killed)), std::logic_error);
  EXPECT_THROW(apply(in(SandboxStatus::none), e_(Event::Kind::woke)), std::logic_error);
  EXPECT_THROW(apply(in(SandboxStatus::running), created()), std::logic_error);
  Event fin = e_(Event::Kind::exec_finished);
  fin.exec_id = "never-started";
  EXPECT_THROW(apply(in(SandboxStatus::running), fin), std::logic_error);
  EXPECT_THROW(apply(in(SandboxStatus::hibernated), transition(Transition::snapshotting)),
               std::logic_error);
}

TEST(SandboxApply, ReplayOfALifeRebuildsTheState) {
  // create -> exec -> snapshot -> hibernate -> wake -> exec -> kill, applied one by one.
  SandboxState s;
  s.id = "sbx_life";
  std::vector<Command> life = {cmd::Create{"acme",
                                           "base",
                                           "",
                                           "",
                                           1,
                                           256,
                                           60,
                                           {{"a", "1"}},
                                           true,
                                           false,
                                           false,
                                           {},
                                           0,
                                           std::nullopt,
                                           {}},
                               cmd::Started{},
                               cmd::Exec{"x1", "make"},
                               cmd::ExecFinished{"x1", 0, 1200, false},
                               cmd::Snapshot{"snap-1", ""},
                               cmd::TransitionDone{},
                               cmd::Hibernate{"hib-1"},
                               cmd::TransitionDone{},
                               cmd::Wake{},
                               cmd::Started{},
                               cmd::Kill{}};
  std::vector<Event> log;
  for (auto& c : life) {
    auto d = decide(s, c, kNow);
    ASSERT_TRUE(std::holds_alternative<std::vector<Event>>(d)) << std::get<Rejection>(d).message;
    for (auto& e : std::get<std::vector<Event>>(d)) {
      s = apply(s, e);
      log.push_back(e);
    }
  }
  EXPECT_EQ(s.status, SandboxStatus::stopped);
  EXPECT_EQ(s.snapshots, std::vector<std::string>{"snap-1"});
  EXPECT_EQ(s.execs_finished, 1u);
  SandboxState replayed;
  replayed.id = "sbx_life";
  for (auto& e : log) replayed = apply(replayed, e);
  EXPECT_EQ(replayed.status, s.status);
  EXPECT_EQ(replayed.version, s.version);
  EXPECT_EQ(replayed.metadata, s.metadata);
  EXPECT_EQ(replayed.snapshots, s.snapshots);
  EXPECT_EQ(replayed.version, log.size());
}

}  // namespace
}  // namespace pandastack::actors

namespace pandastack::actors {
namespace {
TEST(SandboxNetwork, SubnetIsRecordedOnStartAndReleasedWhenTheVmGoes) {
  SandboxState s;
  s.id = "sbx_net";
  cmd::Create c;
  c.tenant = "acme";
  c.template_name = "base";
  c.network = true;
  c.egress = Egress{"allowlist", {"192.0.2.0/24"}, {}};
  auto run = [&](Command cmd) {
    auto d = decide(s, cmd, kNow);
    EXPECT_TRUE(std::holds_alternative<std::vector<Event>>(d))
        << (std::holds_alternative<Rejection>(d) ? to_string(std::get<Rejection>(d).code) : "");
    if (auto* ev = std::get_if<std::vector<Event>>(&d))
      for (auto& e : *ev) s = apply(s, e);
    return d;
  };
  run(c);
  EXPECT_TRUE(s.network);
  EXPECT_EQ(s.egress.cidrs, std::vector<std::string>{"192.0.2.0/24"});
  auto d = run(cmd::Started{7});
  ASSERT_EQ(std::get<std::vector<Event>>(d).size(), 2u);
  EXPECT_EQ(std::get<std::vector<Event>>(d)[1].kind, Event::Kind::network_attached);
  EXPECT_EQ(s.status, SandboxStatus::running);
  EXPECT_EQ(s.subnet, 7u);
  // Changing the policy: recorded; the same policy again is nothing to do.
  run(cmd::SetEgress{Egress{"allow_all", {}, {}}});
  EXPECT_EQ(s.egress.mode, "allow_all");
  EXPECT_TRUE(std::get<std::vector<Event>>(decide(s, cmd::SetEgress{s.egress}, kNow)).empty());
  // Ports: exposed once (again: nothing to do), limited, unexposed; bad ports refused.
  run(cmd::ExposePort{8080});
  EXPECT_EQ(s.ports, (std::set<uint32_t>{8080}));
  EXPECT_TRUE(std::get<std::vector<Event>>(decide(s, cmd::ExposePort{8080}, kNow)).empty());
  for (uint32_t bad : {0u, 65536u})
    EXPECT_EQ(std::get<Rejection>(decide(s, cmd::ExposePort{bad}, kNow)).code,
              Code::invalid_argument);
  Limits one;
  one.max_exposed_ports = 1;
  EXPECT_EQ(std::get<Rejection>(decide(s, cmd::ExposePort{81}, kNow, one)).code,
            Code::too_many_ports);
  EXPECT_EQ(std::get<Rejection>(decide(s, cmd::UnexposePort{81}, kNow)).code, Code::port_not_found);
  run(cmd::ExposePort{81});
  run(cmd::UnexposePort{81});
  EXPECT_EQ(s.ports, (std::set<uint32_t>{8080}));
  // Previews: opened with the default TTL, opened again (a new nonce replaces the old one),
  // bounded (count, TTL, port), closed; a missing one is preview_not_found.
  run(cmd::OpenPreview{3000, false, 0, "n1"});
  ASSERT_EQ(s.previews.count(3000), 1u);
  EXPECT_EQ(s.previews[3000].expires_at_ms - s.previews[3000].created_at_ms, 3600 * 1000);
  run(cmd::OpenPreview{3000, true, 60, "n2"});
  EXPECT_EQ(s.previews[3000], (Preview{3000, true, kNow, kNow + 60000, "n2"}));
  for (uint32_t bad : {0u, 65536u})
    EXPECT_EQ(std::get<Rejection>(decide(s, cmd::OpenPreview{bad, false, 0, "n"}, kNow)).code,
              Code::invalid_argument);
  EXPECT_EQ(
      std::get<Rejection>(decide(s, cmd::OpenPreview{1, false, 8 * 24 * 3600, "n"}, kNow)).code,
      Code::invalid_argument);
  Limits one_preview;
  one_preview.max_previews = 1;
  EXPECT_EQ(
      std::get<Rejection>(decide(s, cmd::OpenPreview{81, false, 0, "n"}, kNow, one_preview)).code,
      Code::too_many_previews);
  EXPECT_TRUE(std::holds_alternative<std::vector<Event>>(
      decide(s, cmd::OpenPreview{3000, false, 0, "n3"}, kNow, one_preview)));  // (replaces)
  EXPECT_EQ(std::get<Rejection>(decide(s, cmd::ClosePreview{81}, kNow)).code,
            Code::preview_not_found);
  run(cmd::OpenPreview{81, false, 0, "n4"});
  run(cmd::ClosePreview{81});
  EXPECT_EQ(s.previews.size(), 1u);
  // Hibernation releases the subnet; the wake records the new one.
  run(cmd::Hibernate{"hib"});
  run(cmd::TransitionDone{});
  EXPECT_EQ(s.status, SandboxStatus::hibernated);
  EXPECT_FALSE(s.subnet);
  run(cmd::SetEgress{Egress{"deny_all", {}, {}}});  // allowed while hibernated
  run(cmd::Wake{});
  run(cmd::TransitionDone{{}, 9u});
  EXPECT_EQ(s.status, SandboxStatus::running);
  EXPECT_EQ(s.subnet, 9u);
  run(cmd::Kill{});
  EXPECT_FALSE(s.subnet);
  // A sandbox without a network refuses a policy.
  SandboxState plain = in(SandboxStatus::running);
  auto r = decide(plain, cmd::SetEgress{Egress{"allow_all", {}, {}}}, kNow);
  ASSERT_TRUE(std::holds_alternative<Rejection>(r));
  EXPECT_EQ(std::get<Rejection>(r).code, Code::network_disabled);
  EXPECT_EQ(std::get<Rejection>(decide(plain, cmd::ExposePort{80}, kNow)).code,
            Code::network_disabled);
  EXPECT_EQ(std::get<Rejection>(decide(plain, cmd::OpenPreview{80, false, 0, "n"}, kNow)).code,
            Code::network_disabled);
  // ... and a started event carries no subnet for it.
  SandboxState creating = in(SandboxStatus::creating);
  EXPECT_EQ(std::get<std::vector<Event>>(decide(creating, cmd::Started{3}, kNow)).size(), 1u);
}

TEST(SandboxStatus, NamesRoundTrip) {
  for (int i = int(SandboxStatus::none); i <= int(SandboxStatus::failed); ++i)
    EXPECT_EQ(status_from_string(to_string(SandboxStatus(i))), SandboxStatus(i));
  EXPECT_FALSE(status_from_string("sleepy"));
}
}  // namespace
}  // namespace pandastack::actors
