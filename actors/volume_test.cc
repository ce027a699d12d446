#include "actors/volume.h"

#include <gtest/gtest.h>

#include "actors/event_codec.h"
#include "actors/volume_codec.h"

namespace pandastack::actors {
namespace {

constexpr int64_t kNow = 1'000'000;

// Applies what `c` decides to `s`; fails the test on a refusal.
VolumeState run(VolumeState s, const VolumeCommand& c) {
  auto d = decide(s, c, kNow);
  if (auto* r = std::get_if<Rejection>(&d)) {
    ADD_FAILURE() << r->code << ": " << r->message;
    return s;
  }
  for (auto& e : std::get<std::vector<VolumeEvent>>(d)) s = apply(s, e);
  return s;
}

std::string refusal(const VolumeState& s, const VolumeCommand& c) {
  auto d = decide(s, c, kNow);
  auto* r = std::get_if<Rejection>(&d);
  return r ? to_string(r->code) : "";
}

// Whether `c` changes nothing in `s` (no events, no refusal).
bool nothing(const VolumeState& s, const VolumeCommand& c) {
  auto d = decide(s, c, kNow);
  auto* events = std::get_if<std::vector<VolumeEvent>>(&d);
  return events && events->empty();
}

VolumeState made() {
  VolumeState s;
  s.id = "vol_a";
  return run(s, vcmd::Create{"acme", "data", 64, {{"k", "v"}}, ""});
}

VolumeCommand attach(std::string sbx, bool ro, std::string mount = "/data") {
  return vcmd::Attach{{std::move(sbx), std::move(mount), ro}};
}

TEST(Volume, CreateChecksNameSizeAndMetadata) {
  VolumeState s;
  s.id = "vol_a";
  EXPECT_EQ(refusal(s, vcmd::Create{"acme", "data", 8, {}, ""}), "invalid_argument");  // too small
  EXPECT_EQ(refusal(s, vcmd::Create{"acme", "data", 1 << 20, {}, ""}), "invalid_argument");
  EXPECT_EQ(refusal(s, vcmd::Create{"acme", "no/slash", 64, {}, ""}), "invalid_argument");
  auto v = made();
  EXPECT_EQ(v.status, VolumeStatus::available);
  EXPECT_EQ(v.size_mib, 64u);
  EXPECT_EQ(v.version, 1u);
  EXPECT_EQ(refusal(v, vcmd::Create{"acme", "data", 64, {}, ""}), "invalid_state");
}

TEST(Volume, ReadWriteIsExclusiveReadOnlyIsShared) {
  auto v = run(made(), attach("sbx_1", false));
  EXPECT_EQ(refusal(v, attach("sbx_2", false)), "volume_in_use");
  EXPECT_EQ(refusal(v, attach("sbx_2", true)), "volume_in_use");
  // The same attachment again changes nothing; another mount for the same sandbox is refused.
  auto again = decide(v, attach("sbx_1", false), kNow);
  EXPECT_TRUE(std::get<std::vector<VolumeEvent>>(again).empty());
  EXPECT_EQ(refusal(v, attach("sbx_1", false, "/other")), "invalid_argument");
  v = run(v, vcmd::Detach{"sbx_1", "sandbox_ended"});
  EXPECT_TRUE(v.attachments.empty());
  v = run(run(v, attach("sbx_2", true)), attach("sbx_3", true));
  EXPECT_EQ(v.attachments.size(), 2u);
  EXPECT_EQ(refusal(v, attach("sbx_4", false)), "volume_in_use");
  // Detaching a sandbox that does not hold it is nothing.
  EXPECT_TRUE(
      std::get<std::vector<VolumeEvent>>(decide(v, vcmd::Detach{"sbx_9", ""}, kNow)).empty());
}

TEST(Volume, DeleteAndResizeWaitForEveryDetach) {
  auto v = run(made(), attach("sbx_1", true));
  EXPECT_EQ(refusal(v, vcmd::Delete{}), "volume_attached");
  EXPECT_EQ(refusal(v, vcmd::Resize{128}), "volume_attached");
  v = run(v, vcmd::Detach{"sbx_1", "sandbox_ended"});
  EXPECT_EQ(refusal(v, vcmd::Resize{32}), "invalid_argument");  // only grows
  v = run(v, vcmd::Resize{128});
  EXPECT_EQ(v.size_mib, 128u);
  v = run(v, vcmd::Delete{});
  EXPECT_EQ(v.status, VolumeStatus::deleted);
  EXPECT_EQ(refusal(v, attach("sbx_2", false)), "volume_not_found");
  EXPECT_EQ(refusal(v, vcmd::Delete{}), "volume_not_found");
}

TEST(Volume, MountPathsAreCheckedBeforeAnythingIsRecorded) {
  for (const char* bad :
       {"data", "/", "/data/", "/a/../etc", "/a//b", "/proc", "/etc/x", "/dev", "/usr/local"})
    EXPECT_TRUE(check_mount_path(bad)) << bad;
  for (const char* good : {"/data", "/workspace/cache", "/mnt/models", "/home/user/repo"})
    EXPECT_FALSE(check_mount_path(good)) << good;
  EXPECT_EQ(refusal(made(), attach("sbx_1", false, "/sys/x")), "invalid_argument");
}

TEST(Volume, ApplyRefusesWhatCannotHappen) {
  auto v = made();
  VolumeEvent created;
  created.kind = VolumeEvent::Kind::created;
  EXPECT_THROW(apply(v, created), std::logic_error);
  VolumeEvent del;
  del.kind = VolumeEvent::Kind::deleted;
  auto attached = run(v, attach("sbx_1", false));
  EXPECT_THROW(apply(attached, del), std::logic_error);
}

TEST(Volume, SnapshotsNeedAStillFileAndAreBounded) {
  auto v = made();
  auto s1 = run(v, vcmd::Snapshot{"vsnap_1", ""});
  ASSERT_EQ(s1.snapshots.size(), 1u);
  EXPECT_EQ(s1.snapshots[0], (VolumeSnapshot{"vsnap_1", 64, kNow}));
  // Held read-write: only when that sandbox quiesced it (froze its file system, or hibernated).
  auto held = run(v, attach("sbx_1", false));
  EXPECT_EQ(refusal(held, vcmd::Snapshot{"vsnap_2", ""}), "volume_attached");
  EXPECT_EQ(refusal(held, vcmd::Snapshot{"vsnap_2", "sbx_9"}), "volume_attached");
  EXPECT_EQ(run(held, vcmd::Snapshot{"vsnap_2", "sbx_1"}).snapshots.size(), 1u);
  // Read-only holders write nothing.
  EXPECT_EQ(run(run(v, attach("sbx_1", true)), vcmd::Snapshot{"vsnap_2", ""}).snapshots.size(), 1u);
  EXPECT_EQ(refusal(v, vcmd::Snapshot{"", ""}), "invalid_argument");
  VolumeLimits two;
  two.max_snapshots = 2;
  auto full = run(s1, vcmd::Snapshot{"vsnap_2", ""});
  auto d = decide(full, vcmd::Snapshot{"vsnap_3", ""}, kNow, two);
  ASSERT_TRUE(std::holds_alternative<Rejection>(d));
  EXPECT_EQ(std::get<Rejection>(d).code, Code::quota_exceeded);
  EXPECT_EQ(refusal(full, vcmd::DeleteSnapshot{"vsnap_9"}), "snapshot_not_found");
  auto one = run(full, vcmd::DeleteSnapshot{"vsnap_1"});
  ASSERT_EQ(one.snapshots.size(), 1u);
  EXPECT_EQ(one.snapshots[0].id, "vsnap_2");
}

TEST(Volume, EventsSurviveTheirPersistedForm) {
  VolumeState s;
  s.id = "vol_a";
  std::vector<VolumeCommand> cmds = {
      vcmd::Create{"acme", "data", 64, {{"k", "v"}}, "fork:sbx_0:vol_b"},
      attach("sbx_1", true, "/mnt/x"),
      vcmd::Detach{"sbx_1", "sandbox_ended"},
      vcmd::Resize{100},
      vcmd::Uploaded{"manifests/m", 3},  // (the file as the resize left it: version 3)
      vcmd::SetMetadata{{{"a", "b"}}},
      vcmd::Snapshot{"vsnap_1", ""},
      vcmd::Snapshot{"vsnap_2", ""},
      vcmd::DeleteSnapshot{"vsnap_1"},
      vcmd::Leave{"h2", ""},
      vcmd::Arrive{
          "acme", "data", "fork:sbx_0:vol_b", "h2", 100, {{"a", "b"}}, 5, {{"vsnap_2", 100, kNow}}},
      vcmd::Delete{}};
  VolumeState replayed = s;
  for (auto& c : cmds) {
    auto d = decide(s, c, kNow);
    ASSERT_TRUE(std::holds_alternative<std::vector<VolumeEvent>>(d));
    for (auto& e : std::get<std::vector<VolumeEvent>>(d)) {
      s = apply(s, e);
      auto back = decode_volume_event(encode_volume_event(e));
      ASSERT_TRUE(back) << to_string(e.kind);
      replayed = apply(replayed, *back);
      EXPECT_NE(volume_event_to_json(*back).find(to_string(e.kind)), std::string::npos);
    }
  }
  EXPECT_EQ(replayed.status, VolumeStatus::deleted);
  EXPECT_EQ(replayed.origin, "fork:sbx_0:vol_b");
  EXPECT_EQ(replayed.snapshots, (std::vector<VolumeSnapshot>{{"vsnap_2", 100, kNow}}));
  EXPECT_EQ(replayed.size_mib, 100u);
  EXPECT_EQ(replayed.metadata, (std::map<std::string, std::string>{{"a", "b"}}));
  EXPECT_EQ(replayed.version, s.version);
  EXPECT_EQ(replayed.version, 12u);  // (every command above recorded one event)
  EXPECT_FALSE(decode_volume_event("garbage!"));
}

TEST(Volume, ACopyInTheStoreIsRecordedOnlyOfTheFileAsItIs) {
  auto v = made();
  EXPECT_FALSE(v.stored);
  const auto made_at = v.file_version;
  // A copy of the file as it is (detached since it was made): recorded once.
  auto up = run(v, vcmd::Uploaded{"manifests/a", made_at});
  EXPECT_TRUE(up.stored);
  EXPECT_EQ(up.manifest, "manifests/a");
  EXPECT_TRUE(nothing(up, vcmd::Uploaded{"manifests/a", made_at}));
  // Metadata and snapshots do not change the file: still the copy.
  up = run(run(up, vcmd::SetMetadata{{{"a", "b"}}}), vcmd::Snapshot{"vsnap_1", ""});
  EXPECT_TRUE(up.stored);
  // Attached, the guest may write it: no longer the copy, and a copy read before the attach, or
  // while attached, records nothing.
  auto att = run(up, attach("sbx_1", false));
  EXPECT_FALSE(att.stored);
  EXPECT_EQ(att.manifest, "manifests/a");  // (the last copy, until a newer one replaces it)
  EXPECT_TRUE(nothing(att, vcmd::Uploaded{"manifests/b", att.file_version}));
  auto det = run(att, vcmd::Detach{"sbx_1", "sandbox_ended"});
  EXPECT_TRUE(nothing(det, vcmd::Uploaded{"manifests/b", made_at}));
  det = run(det, vcmd::Uploaded{"manifests/b", det.file_version});
  EXPECT_TRUE(det.stored);
  EXPECT_EQ(det.manifest, "manifests/b");
  // Grown: the file changed. Deleted or moved: no copy.
  EXPECT_FALSE(run(det, vcmd::Resize{128}).stored);
  EXPECT_TRUE(run(det, vcmd::Delete{}).manifest.empty());
  EXPECT_TRUE(run(run(det, attach("sbx_2", false)), vcmd::Leave{"h2", "sbx_2"}).manifest.empty());
}

TEST(Volume, AVolumeMovesWithItsSandboxAndMayComeBack) {
  auto v = run(made(), vcmd::Snapshot{"vsnap_1", ""});
  v = run(v, attach("sbx_1", false));
  // Only with the one sandbox it is attached to.
  EXPECT_EQ(refusal(v, vcmd::Leave{"h2", "sbx_2"}), "volume_in_use");
  auto shared = run(run(made(), attach("sbx_1", true)), attach("sbx_2", true));
  EXPECT_EQ(refusal(shared, vcmd::Leave{"h2", "sbx_1"}), "volume_in_use");
  auto left = run(v, vcmd::Leave{"h2", "sbx_1"});
  EXPECT_EQ(left.status, VolumeStatus::moved);
  EXPECT_TRUE(left.attachments.empty());
  EXPECT_TRUE(left.snapshots.empty());
  EXPECT_EQ(refusal(left, attach("sbx_3", false)), "volume_not_found");
  EXPECT_EQ(refusal(left, vcmd::Leave{"h3", "sbx_1"}), "volume_not_found");
  // On the other host it arrives as it was (unattached: its sandbox attaches it there), and it
  // may come back here, its stream going on.
  vcmd::Arrive back{"acme", "data", "", "h2", 80, {{"k", "w"}}, 777, {{"vsnap_1", 64, 555}}};
  EXPECT_EQ(refusal(v, back), "conflict");
  auto returned = run(left, back);
  EXPECT_EQ(returned.status, VolumeStatus::available);
  EXPECT_EQ(returned.size_mib, 80u);
  EXPECT_EQ(returned.created_at_ms, 777);
  EXPECT_EQ(returned.snapshots, (std::vector<VolumeSnapshot>{{"vsnap_1", 64, 555}}));
  EXPECT_EQ(returned.version, left.version + 1);
  VolumeState fresh;
  fresh.id = "vol_a";
  EXPECT_EQ(run(fresh, back).metadata, (std::map<std::string, std::string>{{"k", "w"}}));
  back.from_host.clear();
  EXPECT_EQ(refusal(fresh, back), "invalid_argument");
}

TEST(Volume, ASandboxRemembersItsVolumesThroughEventsAndStateSnapshots) {
  SandboxState s;
  s.id = "sbx_1";
  cmd::Create c;
  c.tenant = "acme";
  c.template_name = "base";
  c.volumes = {{"vol_a", "/data", false, 0}, {"vol_b", "/ro", true, 1}};
  auto d = decide(s, c, kNow);
  ASSERT_TRUE(std::holds_alternative<std::vector<Event>>(d));
  auto e = std::get<std::vector<Event>>(d).front();
  auto back = decode_event(encode_event(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->volumes, c.volumes);
  s = apply(s, *back);
  EXPECT_EQ(s.volumes, c.volumes);
  auto state = decode_state(encode_state(s));
  ASSERT_TRUE(state);
  EXPECT_EQ(state->volumes, c.volumes);
  // Snapshots and forks of it are decided like any (the registry copies its volumes).
  s = apply(s, [] {
    Event st;
    st.kind = Event::Kind::started;
    return st;
  }());
  auto f = decide(s, cmd::Fork{"snap", 1}, kNow);
  ASSERT_TRUE(std::holds_alternative<std::vector<Event>>(f));
}

}  // namespace
}  // namespace pandastack::actors
