#include "actors/event_codec.h"

#include <gtest/gtest.h>

#include "wire/json.h"

namespace pandastack::actors {
namespace {

TEST(EventCodec, EveryKindRoundTrips) {
  for (int k = 0; k <= int(Event::Kind::snapshot_uploaded); ++k) {
    Event e;
    e.kind = Event::Kind(k);
    e.at_ms = 1234567890123;
    e.tenant = "acme";
    e.template_name = "base";
    e.vcpus = 2;
    e.memory_mib = 512;
    e.ttl_seconds = 60;
    e.expires_at_ms = 99;
    e.metadata = {{"a", "1"}, {"b", "2"}};
    e.persistent = true;
    e.auto_wake = true;
    e.parent = "sbx_p";
    e.from_snapshot = "snap_x";
    e.exec_id = "x1";
    e.command = "echo hi";
    e.exit_code = -9;
    e.duration_ms = 42;
    e.timed_out = true;
    e.transition = Transition::hibernating;
    e.snapshot_id = "snap-1";
    e.snapshot_name = "nightly";
    e.disk_only = true;
    e.timeout_disk_only = true;
    e.children = {"c1", "c2"};
    e.reason = "why";
    e.reap_action = ReapAction::hibernate;
    e.network = true;
    e.egress = Egress{"allowlist", {"192.0.2.0/24"}, {"example.com"}};
    e.subnet = 77;
    e.port = 8080;
    e.idle_timeout_seconds = 30;
    e.on_timeout = ReapAction::kill;
    e.pid = 4242;
    e.path = "/tmp/f";
    e.bytes = 5000000000ull;
    e.host = "h2";
    e.preview = Preview{3000, true, 11, 22, "nonce1"};
    e.manifest = "manifests/m1";
    e.egress_summary = {10, 20, {1, 2}, {3, 4}, {5, 6}, 7000000000ull, 8, {{"api.test", {9, 10}}},
                        11};
    auto bytes = encode_event(e);
    auto back = decode_event(bytes);
    ASSERT_TRUE(back) << to_string(e.kind);
    EXPECT_EQ(back->kind, e.kind);
    EXPECT_EQ(back->at_ms, e.at_ms);
    EXPECT_EQ(encode_event(*back), bytes) << to_string(e.kind);  // nothing lost or invented
    if (e.kind == Event::Kind::created || e.kind == Event::Kind::egress_changed) {
      EXPECT_EQ(back->egress, e.egress);
    }
    if (e.kind == Event::Kind::created) {
      EXPECT_EQ(back->idle_timeout_seconds, 30u);
      EXPECT_EQ(back->on_timeout, std::optional<ReapAction>(ReapAction::kill));
    }
    if (e.kind == Event::Kind::reaped) {
      EXPECT_EQ(back->reason, "why");
    }
    if (e.kind == Event::Kind::network_attached) {
      EXPECT_EQ(back->subnet, 77u);
    }
    if (e.kind == Event::Kind::snapshot_deleted || e.kind == Event::Kind::hibernation_persisted ||
        e.kind == Event::Kind::snapshot_persisted || e.kind == Event::Kind::hibernation_uploaded ||
        e.kind == Event::Kind::snapshot_uploaded) {
      EXPECT_EQ(back->snapshot_id, "snap-1");
    }
    if (e.kind == Event::Kind::hibernation_uploaded || e.kind == Event::Kind::snapshot_uploaded) {
      EXPECT_EQ(back->manifest, "manifests/m1");
    }
    if (e.kind == Event::Kind::snapshot_deleted) {
      EXPECT_EQ(back->reason, "why");
    }
    if (e.kind == Event::Kind::hibernated) {
      EXPECT_TRUE(back->disk_only);
    }
    if (e.kind == Event::Kind::created) {
      EXPECT_TRUE(back->timeout_disk_only);
    }
    if (e.kind == Event::Kind::snapshot_taken) {
      EXPECT_EQ(back->snapshot_id, "snap-1");
      EXPECT_EQ(back->snapshot_name, "nightly");
    }
    if (e.kind == Event::Kind::process_started) {
      EXPECT_EQ(back->pid, 4242u);
      EXPECT_EQ(back->command, "echo hi");
    }
    if (e.kind == Event::Kind::file_written) {
      EXPECT_EQ(back->path, "/tmp/f");
      EXPECT_EQ(back->bytes, 5000000000ull);
    }
    if (e.kind == Event::Kind::file_removed) {
      EXPECT_EQ(back->path, "/tmp/f");
    }
    if (e.kind == Event::Kind::migrated) {
      EXPECT_EQ(back->host, "h2");
    }
    if (e.kind == Event::Kind::preview_opened) {
      EXPECT_EQ(back->preview, e.preview);
    }
    if (e.kind == Event::Kind::preview_closed) {
      EXPECT_EQ(back->port, 8080u);
    }
    if (e.kind == Event::Kind::egress_summary) {
      EXPECT_EQ(back->egress_summary, e.egress_summary);
      auto j = *wire::Json::parse(event_to_json(*back));
      EXPECT_EQ(j["kind"].as_string(), "egress-summary");
      EXPECT_EQ(j["secret_requests"]["denied"].as_int(), 6);
      EXPECT_EQ(j["destinations"].as_array().at(0)["name"].as_string(), "api.test");
    }
  }
}

TEST(EventCodec, RejectsGarbage) {
  EXPECT_FALSE(decode_event(""));
  EXPECT_FALSE(decode_event("abc"));
  EXPECT_FALSE(decode_event(std::string(16, '\xff')));
  EXPECT_GE(event_format(), 1u);
}

TEST(StateCodec, RoundTripsEveryField) {
  SandboxState s;
  s.id = "sbx_abc";
  s.status = SandboxStatus::hibernated;
  s.version = 42;
  s.tenant = "acme";
  s.template_name = "agent";
  s.parent = "sbx_parent";
  s.from_snapshot = "snap_1";
  s.vcpus = 2;
  s.memory_mib = 512;
  s.ttl_seconds = 600;
  s.metadata = {{"a", "1"}, {"b", "\"quoted\""}};
  s.created_at_ms = 1000;
  s.expires_at_ms = 601000;
  s.persistent = true;
  s.auto_wake = true;
  s.pending_snapshot = "snap_p";
  s.hibernation_snapshot = "hib";
  s.snapshots = {"snap_1", "snap_2"};
  s.snapshot_names = {{"snap_2", "nightly"}};
  s.pending_snapshot_name = "next";
  s.timeout_disk_only = true;
  s.hibernated_disk_only = true;
  s.hibernation_durable = true;
  s.durable_snapshots = {"snap_2"};
  s.snapshot_manifests = {{"snap_2", "manifests/m2"}};
  s.running_execs = {{"x1", "sleep 1"}};
  s.execs_finished = 7;
  s.failure_reason = "none";
  s.network = true;
  s.egress = Egress{"allowlist", {"192.0.2.0/24"}, {}};
  s.subnet = 12;
  s.ports = {80, 8080};
  s.previews[3000] = Preview{3000, false, 5, 6, "n1"};
  auto d = decode_state(encode_state(s));
  ASSERT_TRUE(d);
  EXPECT_EQ(encode_state(*d), encode_state(s));
  EXPECT_EQ(d->status, SandboxStatus::hibernated);
  EXPECT_EQ(d->metadata.at("b"), "\"quoted\"");
  EXPECT_EQ(d->egress, s.egress);
  EXPECT_EQ(d->subnet, 12u);
  EXPECT_EQ(d->ports, (std::set<uint32_t>{80, 8080}));
  EXPECT_EQ(d->previews, s.previews);
  EXPECT_EQ(d->snapshot_names, s.snapshot_names);
  EXPECT_EQ(d->pending_snapshot_name, "next");
  EXPECT_TRUE(d->timeout_disk_only && d->hibernated_disk_only && !d->pending_disk_only);
  EXPECT_TRUE(d->hibernation_durable);
  EXPECT_EQ(d->durable_snapshots, s.durable_snapshots);
  EXPECT_EQ(d->snapshot_manifests, s.snapshot_manifests);
  EXPECT_FALSE(decode_state("{}"));
  EXPECT_FALSE(decode_state("not json"));
  auto bad = encode_state(s);
  bad.replace(bad.find("\"status\":6"), 10, "\"status\":99");
  EXPECT_FALSE(decode_state(bad));
}

}  // namespace
}  // namespace pandastack::actors
