#include "actors/custom_template.h"

#include <gtest/gtest.h>

#include "actors/custom_template_codec.h"

namespace pandastack::actors {
namespace {

constexpr int64_t kNow = 5'000;

TemplateState run(TemplateState s, const TemplateCommand& c) {
  auto d = decide(s, c, kNow);
  if (auto* r = std::get_if<Rejection>(&d)) {
    ADD_FAILURE() << r->code << ": " << r->message;
    return s;
  }
  for (auto& e : std::get<std::vector<TemplateEvent>>(d)) s = apply(s, e);
  return s;
}

std::string refusal(const TemplateState& s, const TemplateCommand& c) {
  auto d = decide(s, c, kNow);
  auto* r = std::get_if<Rejection>(&d);
  return r ? to_string(r->code) : "";
}

TemplateSpec spec() {
  TemplateSpec s;
  s.packages = {"jq", "python3-numpy", "libc6:amd64"};
  s.files = {{"/etc/motd", "hello"}};
  s.run = {"echo hi > /workspace/hi"};
  s.env = {{"MODE", "test"}};
  s.memory_mib = 512;
  s.vcpus = 2;
  return s;
}

TEST(CustomTemplate, ABuildIsOneAtATimeAndAReadyTemplateIsDeletedFirst) {
  TemplateState s;
  s.id = template_id("acme", "ml");
  auto building = run(s, tcmd::Build{"acme", "ml", spec()});
  EXPECT_EQ(building.status, TemplateStatus::building);
  EXPECT_EQ(refusal(building, tcmd::Build{"acme", "ml", spec()}), "conflict");
  EXPECT_EQ(refusal(building, tcmd::Delete{0}), "conflict");
  auto ready = run(building, tcmd::Finish{1234, 99, {}});
  EXPECT_EQ(ready.status, TemplateStatus::ready);
  EXPECT_EQ(ready.build_ms, 1234u);
  EXPECT_EQ(refusal(ready, tcmd::Build{"acme", "ml", spec()}), "conflict");
  EXPECT_EQ(refusal(ready, tcmd::Delete{2}), "template_in_use");
  auto gone = run(ready, tcmd::Delete{0});
  EXPECT_EQ(gone.status, TemplateStatus::deleted);
  EXPECT_EQ(refusal(gone, tcmd::Delete{0}), "template_not_found");
  // Built again after a delete, and after a failure.
  auto again = run(gone, tcmd::Build{"acme", "ml", spec()});
  auto failed = run(again, tcmd::Fail{"boom", "tail"});
  EXPECT_EQ(failed.status, TemplateStatus::failed);
  EXPECT_EQ(failed.error, "boom");
  EXPECT_EQ(refusal(failed, tcmd::Finish{1, 1, {}}), "invalid_state");
  EXPECT_EQ(run(failed, tcmd::Build{"acme", "ml", spec()}).status, TemplateStatus::building);
}

TEST(CustomTemplate, ASandboxPublishedIsReadyAtOnce) {
  TemplateState s;
  s.id = template_id("acme", "mine");
  auto ready = run(s, tcmd::Publish{"acme", "mine", "sbx_1", "base", 77, false, 384, 2});
  EXPECT_EQ(ready.status, TemplateStatus::ready);
  EXPECT_EQ(ready.spec.memory_mib, 384u);  // the sandbox's shape
  EXPECT_EQ(ready.spec.vcpus, 2u);
  EXPECT_EQ(ready.sandbox, "sbx_1");
  EXPECT_EQ(ready.spec.from, "base");
  EXPECT_FALSE(ready.spec.network);
  EXPECT_EQ(refusal(ready, tcmd::Publish{"acme", "mine", "sbx_2", "base", 1, true}), "conflict");
  EXPECT_EQ(refusal(s, tcmd::Publish{"acme", "Mine", "sbx_2", "base", 1, true}),
            "invalid_argument");
  auto back = decode_template_event(encode_template_event([&] {
    TemplateEvent e;
    e.kind = TemplateEvent::Kind::published;
    e.tenant = "acme";
    e.name = "mine";
    e.sandbox = "sbx_1";
    e.spec.from = "base";
    e.size_bytes = 77;
    e.spec.memory_mib = 384;
    e.spec.vcpus = 2;
    return e;
  }()));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->sandbox, "sbx_1");
  // A build's start command and readiness port round-trip.
  auto started = decode_template_event(encode_template_event([&] {
    TemplateEvent e;
    e.kind = TemplateEvent::Kind::build_started;
    e.tenant = "acme";
    e.name = "web";
    e.spec = spec();
    e.spec.start = "cd '/srv' && exec python3 -m http.server 8080";
    e.spec.ready_port = 8080;
    e.spec.ready_cmd = "true";
    return e;
  }()));
  ASSERT_TRUE(started);
  EXPECT_EQ(started->spec, [] {
    auto s = spec();
    s.start = "cd '/srv' && exec python3 -m http.server 8080";
    s.ready_port = 8080;
    s.ready_cmd = "true";
    return s;
  }());
  EXPECT_EQ(back->spec.memory_mib, 384u);
  EXPECT_EQ(back->spec.vcpus, 2u);
  EXPECT_EQ(back->size_bytes, 77u);
}

// The bake script that starts a template's program: detached (setsid, output to its log), then
// ready on its port or still running 2 s later; nothing when there is none.
TEST(CustomTemplate, TheStartScriptStartsDetachedAndWaitsForReadiness) {
  TemplateSpec s;
  EXPECT_EQ(start_script(s), "");
  s.start = "cd '/srv' && exec python3 -m http.server 8080";
  s.ready_port = 8080;
  auto script = start_script(s);
  EXPECT_NE(script.find("setsid sh -c 'cd '\\''/srv'\\'' && exec python3 -m http.server 8080' "
                        "</dev/null >>\"$log\" 2>&1 &"),
            std::string::npos)
      << script;
  EXPECT_NE(script.find("hex=$(printf '%04X' 8080)"), std::string::npos) << script;
  EXPECT_NE(script.find("/proc/net/tcp /proc/net/tcp6"), std::string::npos) << script;
  s.ready_port = 0;
  EXPECT_NE(start_script(s).find("sleep 2"), std::string::npos);
  s.ready_cmd = "test -f /tmp/up";
  script = start_script(s);
  EXPECT_NE(script.find("until sh -c 'test -f /tmp/up' >/dev/null 2>&1; do"), std::string::npos)
      << script;
  EXPECT_EQ(script.find("sleep 2\n"), std::string::npos) << script;
}

TEST(CustomTemplate, ASpecIsCheckedBeforeAnythingIsBuilt) {
  TemplateState s;
  s.id = "x";
  auto with = [](auto change) {
    auto sp = spec();
    change(sp);
    return tcmd::Build{"acme", "ok", sp};
  };
  EXPECT_EQ(refusal(s, tcmd::Build{"acme", "Bad_Name", spec()}), "invalid_argument");
  EXPECT_EQ(refusal(s, tcmd::Build{"acme", "-x", spec()}), "invalid_argument");
  EXPECT_EQ(refusal(s, tcmd::Build{"acme", std::string(41, 'a'), spec()}), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.packages = {"jq; rm -rf /"}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.packages = {"-f"}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.files = {{"relative", ""}}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.files = {{"/a/../etc/x", ""}}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.files = {{"/proc/x", ""}}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) {
                      p.files = {{"/x", std::string(2 << 20, 'a')}};
                    })),
            "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) {
                      p.files = {{"/x", std::string("a\0b", 3)}};
                    })),
            "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.run = {""}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.run = std::vector<std::string>(33, "true"); })),
            "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.env = {{"1X", "v"}}; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.start = std::string(4097, 'x'); })),
            "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.ready_port = 80; })), "invalid_argument");  // no start
  EXPECT_EQ(refusal(s, with([](auto& p) { p.env = {{"X", "a\nb"}}; })), "invalid_argument");
  // Its shape: memory within the limits, vCPUs at most max_vcpus (0: the host's default).
  EXPECT_EQ(refusal(s, with([](auto& p) { p.memory_mib = 64; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.memory_mib = 70000; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.vcpus = 33; })), "invalid_argument");
  EXPECT_EQ(refusal(s, with([](auto& p) { p.memory_mib = p.vcpus = 0; })), "");
  EXPECT_EQ(refusal(s, with([](auto&) {})), "");
}

TEST(CustomTemplate, IdsKeepTenantsApartAndEventsSurviveTheirPersistedForm) {
  EXPECT_NE(template_id("acme", "ml"), template_id("other", "ml"));
  EXPECT_EQ(template_display_name(template_id("acme", "ml")), "ml");
  EXPECT_EQ(template_display_name("base"), "base");
  TemplateState s, replayed;
  s.id = replayed.id = template_id("acme", "ml");
  for (TemplateCommand c : std::vector<TemplateCommand>{
           tcmd::Build{"acme", "ml", spec()}, tcmd::Finish{10, 20, {}}, tcmd::Delete{0}}) {
    auto d = decide(s, c, kNow);
    for (auto& e : std::get<std::vector<TemplateEvent>>(d)) {
      s = apply(s, e);
      auto back = decode_template_event(encode_template_event(e));
      ASSERT_TRUE(back);
      replayed = apply(replayed, *back);
      EXPECT_NE(template_event_to_json(*back).find(to_string(e.kind)), std::string::npos);
    }
  }
  EXPECT_EQ(replayed.spec, spec());
  EXPECT_EQ(replayed.status, TemplateStatus::deleted);
  EXPECT_EQ(replayed.size_bytes, 20u);
  EXPECT_EQ(replayed.version, 3u);
  EXPECT_FALSE(decode_template_event("nope"));
}

}  // namespace
}  // namespace pandastack::actors
