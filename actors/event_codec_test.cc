#include "actors/event_codec.h"

#include <gtest/gtest.h>

namespace pandastack::actors {
namespace {

TEST(EventCodec, EveryKindRoundTrips) {
  for (int k = 0; k <= int(Event::Kind::failed); ++k) {
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
    e.children = {"c1", "c2"};
    e.reason = "why";
    e.reap_action = ReapAction::hibernate;
    auto bytes = encode_event(e);
    auto back = decode_event(bytes);
    ASSERT_TRUE(back) << to_string(e.kind);
    EXPECT_EQ(back->kind, e.kind);
    EXPECT_EQ(back->at_ms, e.at_ms);
    EXPECT_EQ(encode_event(*back), bytes) << to_string(e.kind);  // nothing lost or invented
  }
}

TEST(EventCodec, RejectsGarbage) {
  EXPECT_FALSE(decode_event(""));
  EXPECT_FALSE(decode_event("abc"));
  EXPECT_FALSE(decode_event(std::string(16, '\xff')));
  EXPECT_GE(event_format(), 1u);
}

}  // namespace
}  // namespace pandastack::actors
