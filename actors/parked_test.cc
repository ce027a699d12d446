// A parked sandbox's settings (actors/parked.h): what the owner writes is what the waking host
// starts it with, and a record's bad fields fall back to a create's defaults.
#include "actors/parked.h"

#include <gtest/gtest.h>

namespace pandastack::actors {
namespace {

SandboxInfo hibernated_remote() {
  SandboxInfo s;
  s.id = "sbx_abc";
  s.tenant = "t1";
  s.template_name = "python";
  s.status = SandboxStatus::hibernated;
  s.hibernation_durable = s.hibernation_remote = true;
  s.hibernation_manifest = "manifests/" + std::string(64, 'a');
  s.metadata = {{"agent", "7"}};
  s.persistent = true;
  s.auto_wake = true;
  s.ttl_seconds = 3600;
  s.expires_at_ms = 1'000'000 + 3'600'000;
  s.idle_timeout_seconds = 60;
  s.on_timeout = ReapAction::hibernate;
  s.timeout_disk_only = true;
  s.network = true;
  s.egress.mode = "allowlist";
  s.egress.cidrs = {"10.1.0.0/16"};
  s.ports = {8080, 3000};
  return s;
}

TEST(Parked, SettingsComeBackAsTheCreateTheyWere) {
  auto s = hibernated_remote();
  EXPECT_FALSE(unparkable(s));
  std::vector<uint32_t> ports;
  // Woken 10 minutes later: 50 minutes of its TTL are left.
  auto c = parked_create("t1", parked_settings(s), 1'000'000 + 600'000, ports);
  EXPECT_EQ(c.tenant, "t1");
  EXPECT_EQ(c.template_name, "python");
  EXPECT_EQ(c.ttl_seconds, 3000u);
  EXPECT_EQ(c.metadata, s.metadata);
  EXPECT_TRUE(c.persistent);
  EXPECT_TRUE(c.auto_wake);
  EXPECT_EQ(c.idle_timeout_seconds, 60u);
  ASSERT_TRUE(c.on_timeout);
  EXPECT_EQ(*c.on_timeout, ReapAction::hibernate);
  EXPECT_TRUE(c.timeout_disk_only);
  EXPECT_EQ(c.network, std::optional<bool>(true));
  ASSERT_TRUE(c.egress);
  EXPECT_EQ(*c.egress, s.egress);
  EXPECT_EQ(ports, (std::vector<uint32_t>{3000, 8080}));
  // Expired meanwhile: a second, not a wrap-around.
  c = parked_create("t1", parked_settings(s), s.expires_at_ms + 10'000'000, ports);
  EXPECT_EQ(c.ttl_seconds, 1u);
}

TEST(Parked, OnlyAHibernationInTheStoreWithoutVolumesIsParked) {
  auto s = hibernated_remote();
  s.hibernation_remote = false;
  EXPECT_TRUE(unparkable(s));
  s = hibernated_remote();
  s.hibernated_disk_only = true;
  EXPECT_TRUE(unparkable(s));
  s = hibernated_remote();
  s.volumes.push_back({"vol_x", "/data", false, 0});
  EXPECT_TRUE(unparkable(s));
  s = hibernated_remote();
  s.status = SandboxStatus::running;
  EXPECT_TRUE(unparkable(s));
}

TEST(Parked, BadFieldsAreACreatesDefaults) {
  auto j = wire::Json::parse(
      R"({"template": 7, "expires_at_ms": "soon", "metadata": {"a": 1, "b": "x"},
          "persistent": "yes", "network": false, "egress": {"mode": "allow_all"},
          "idle_timeout_seconds": -5, "ports": [0, 70000, "80", 443]})");
  ASSERT_TRUE(j);
  std::vector<uint32_t> ports{1};
  auto c = parked_create("t2", *j, 0, ports);
  EXPECT_EQ(c.template_name, "base");
  EXPECT_EQ(c.ttl_seconds, 0u);
  EXPECT_EQ(c.metadata, (std::map<std::string, std::string>{{"b", "x"}}));
  EXPECT_FALSE(c.persistent);
  EXPECT_EQ(c.network, std::optional<bool>(false));
  EXPECT_FALSE(c.egress);  // (no network: no policy)
  EXPECT_EQ(c.idle_timeout_seconds, 0u);
  EXPECT_EQ(ports, (std::vector<uint32_t>{443}));
  // With a network, a policy that does not read is deny_all (not the host's default).
  j = wire::Json::parse(R"({"network": true, "egress": {"mode": 7}})");
  c = parked_create("t2", *j, 0, ports);
  ASSERT_TRUE(c.egress);
  EXPECT_EQ(c.egress->mode, "deny_all");
  EXPECT_TRUE(c.egress->cidrs.empty());
}

}  // namespace
}  // namespace pandastack::actors
