// Unit tests of the pure parts of sandbox networking: policy validation, the subnet pool's
// arithmetic and the nftables rulesets. (Namespaces and real traffic: tests/integration.)
#include "vmm-driver/network.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

namespace pandastack::vmm {
namespace {

TEST(Network, CidrsAreNormalizedAndBadOnesRefused) {
  EXPECT_EQ(*normalize_cidr("10.1.2.3"), "10.1.2.3/32");
  EXPECT_EQ(*normalize_cidr("10.1.0.0/16"), "10.1.0.0/16");
  EXPECT_EQ(*normalize_cidr("0.0.0.0/0"), "0.0.0.0/0");
  auto host_bits = normalize_cidr("10.1.2.3/16");
  ASSERT_FALSE(host_bits);
  EXPECT_NE(host_bits.error().message.find("10.1.0.0/16"), std::string::npos);
  for (auto bad : {"10.1.2", "10.1.2.3/33", "10.1.2.3/", "::1", "example.com", "10.1.2.3/a", ""})
    EXPECT_FALSE(normalize_cidr(bad)) << bad;
}

TEST(Network, PoliciesAreValidated) {
  EgressPolicy p;
  p.mode = EgressPolicy::Mode::allowlist;
  p.cidrs = {"192.0.2.7", "192.0.2.0/24", "192.0.2.7/32"};
  p.domains = {"Example.COM.", "api.example.com", "*.example.org"};
  auto v = validate(p);
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->cidrs, (std::vector<std::string>{"192.0.2.0/24", "192.0.2.7/32"}));
  EXPECT_EQ(v->domains,
            (std::vector<std::string>{"*.example.org", "api.example.com", "example.com"}));
  for (std::string bad : std::vector<std::string>{"-a.com", "a..com", "a b.com", "", "x*.com",
                                                  std::string(64, 'a') + ".com"}) {
    EgressPolicy q;
    q.mode = EgressPolicy::Mode::allowlist;
    q.domains = {bad};
    EXPECT_FALSE(validate(q)) << bad;
  }
  EgressPolicy deny;
  deny.cidrs = {"192.0.2.0/24"};
  EXPECT_FALSE(validate(deny)) << "CIDRs need mode allowlist";
  EgressPolicy many;
  many.mode = EgressPolicy::Mode::allowlist;
  for (int i = 0; i < 3; ++i) many.cidrs.push_back("192.0.2." + std::to_string(i));
  EXPECT_FALSE(validate(many, 2));
  EXPECT_EQ(egress_mode_from_string("allow_all"), EgressPolicy::Mode::allow_all);
  EXPECT_FALSE(egress_mode_from_string("open"));
}

TEST(Network, SubnetPoolCarvesSlash30s) {
  auto pool = SubnetPool::parse("10.200.0.0/16");
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->capacity(), 16384u);
  EXPECT_EQ(pool->host_address(0), "10.200.0.1");
  EXPECT_EQ(pool->ns_address(0), "10.200.0.2");
  EXPECT_EQ(pool->host_address(16383), "10.200.255.253");
  EXPECT_EQ(pool->ns_address(65), "10.200.1.6");
  EXPECT_FALSE(SubnetPool::parse("10.200.0.0/31"));
  EXPECT_FALSE(SubnetPool::parse("10.200.0.1/16"));
}

TEST(Network, SandboxRulesetFollowsThePolicy) {
  NetworkSettings s;
  EgressPolicy deny;
  auto r = sandbox_ruleset(s, deny);
  EXPECT_NE(r.find("policy drop"), std::string::npos);
  EXPECT_EQ(r.find("oifname \"eth0\" accept"), std::string::npos);
  EXPECT_NE(r.find("10.200.0.0/16, 127.0.0.0/8, 169.254.0.0/16"), std::string::npos)
      << "other sandboxes, loopback and metadata are always refused";
  EXPECT_NE(r.find("masquerade"), std::string::npos);
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  EXPECT_NE(sandbox_ruleset(s, all).find("iifname \"tap0\" oifname \"eth0\" accept"),
            std::string::npos);
  EgressPolicy list;
  list.mode = EgressPolicy::Mode::allowlist;
  list.cidrs = {"192.0.2.0/24", "198.51.100.7/32"};
  auto l = sandbox_ruleset(s, list);
  EXPECT_NE(l.find("elements = { 192.0.2.0/24, 198.51.100.7/32 }"), std::string::npos);
  EXPECT_NE(l.find("ip daddr @allow accept"), std::string::npos);
  // The refusal of pool addresses comes before any accept.
  EXPECT_LT(l.find("10.200.0.0/16"), l.find("@allow accept"));
  // So does the refusal of private and reserved ranges (merged into disjoint intervals) ...
  auto priv = l.find(
      "ip daddr { 0.0.0.0-0.255.255.255, 10.0.0.0-10.255.255.255, "
      "100.64.0.0-100.127.255.255, 172.16.0.0-172.31.255.255, "
      "192.0.0.0-192.0.0.255, 192.168.0.0-192.168.255.255, "
      "198.18.0.0-198.19.255.255, 240.0.0.0-255.255.255.255 } jump deny_reserved");
  EXPECT_NE(priv, std::string::npos) << l;
  EXPECT_LT(priv, l.find("@allow accept"));
  EXPECT_LT(priv, l.find("@dns_allow accept"));
  // ... but for the operator's exceptions.
  s.reserved_allowed = {"192.168.7.0/24"};
  EXPECT_NE(
      sandbox_ruleset(s, all).find(" ip daddr != { 192.168.7.0-192.168.7.255 } jump deny_reserved"),
      std::string::npos);
  // Each refusal is logged for the egress log (rate-limited), then rejected.
  EXPECT_NE(l.find("chain deny_policy {\n    limit rate 20/second burst 40 packets log prefix "
                   "\"policy\" group 1\n    reject with icmpx type admin-prohibited\n  }"),
            std::string::npos)
      << l;
  EXPECT_NE(l.find("iifname \"tap0\" jump deny_policy\n  }\n  chain output"), std::string::npos);
}

// The namespace's own connections (the egress proxy's) obey the guest's rules; with the proxy on,
// the guest's 443 and 80 go to its listeners, and only those ports of the gateway are open.
TEST(Network, SandboxRulesetAppliesThePolicyToTheProxy) {
  NetworkSettings s;
  EgressPolicy list;
  list.mode = EgressPolicy::Mode::allowlist;
  list.cidrs = {"192.0.2.0/24"};
  auto off = sandbox_ruleset(s, list, false);
  auto out = off.substr(off.find("chain output"));
  EXPECT_NE(out.find("oifname \"eth0\" ip daddr { 10.200.0.0/16, 127.0.0.0/8, 169.254.0.0/16"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("oifname \"eth0\" ip daddr { 0.0.0.0-0.255.255.255"), std::string::npos);
  EXPECT_NE(out.find("oifname \"eth0\" oifname \"eth0\" ip daddr @allow accept"),
            std::string::npos);
  EXPECT_NE(out.find("oifname \"eth0\" jump deny_policy\n  }"), std::string::npos);
  EXPECT_EQ(off.find("redirect"), std::string::npos);
  EXPECT_EQ(off.find("15443"), std::string::npos);
  auto on = sandbox_ruleset(s, list, true);
  EXPECT_NE(on.find("iifname \"tap0\" tcp dport 443 redirect to :15443"), std::string::npos) << on;
  EXPECT_NE(on.find("iifname \"tap0\" tcp dport 80 redirect to :15080"), std::string::npos);
  EXPECT_NE(on.find("iifname \"tap0\" ip daddr 172.31.255.1 tcp dport { 15443, 15080 } accept"),
            std::string::npos);
  EXPECT_LT(on.find("15443, 15080 } accept"), on.find("iifname \"tap0\" jump deny_internal\n  }"));
}

TEST(Network, ReservedRangesMergeAndMatch) {
  EXPECT_EQ(merged_intervals({"10.0.0.0/8", "10.200.0.0/16", "10.1.2.3/32", "11.0.0.0/8"}),
            (std::vector<std::string>{"10.0.0.0-11.255.255.255"}));
  EXPECT_EQ(merged_intervals({"192.0.2.7/32"}), (std::vector<std::string>{"192.0.2.7"}));
  auto r = NetworkSettings::default_reserved_ranges();
  auto ip = [](const char* a) {
    in_addr x{};
    ::inet_pton(AF_INET, a, &x);
    return ntohl(x.s_addr);
  };
  EXPECT_TRUE(is_reserved(ip("100.100.100.200"), r, {}));  // a cloud's metadata service
  EXPECT_TRUE(is_reserved(ip("172.31.0.1"), r, {}));
  EXPECT_FALSE(is_reserved(ip("172.32.0.1"), r, {}));
  EXPECT_FALSE(is_reserved(ip("8.8.8.8"), r, {}));
  EXPECT_FALSE(is_reserved(ip("192.168.1.1"), r, {"192.168.0.0/16"}));
  EXPECT_TRUE(is_reserved(ip("10.0.0.1"), r, {"192.168.0.0/16"}));
}

TEST(Network, HostRulesetDropsSandboxTrafficToTheHostAndBetweenSandboxes) {
  NetworkSettings s;
  s.prefix = "pt";
  s.pool_cidr = "10.201.0.0/20";
  auto r = host_ruleset(s);
  EXPECT_NE(r.find("table inet pandastack_pt {"), std::string::npos);
  EXPECT_NE(r.find("hook input"), std::string::npos);
  EXPECT_NE(r.find("iifname \"pt*\" drop"), std::string::npos);
  EXPECT_NE(r.find("iifname \"pt*\" oifname \"pt*\" drop"), std::string::npos);
  EXPECT_NE(r.find("ip saddr 10.201.0.0/20"), std::string::npos);
}

}  // namespace
}  // namespace pandastack::vmm
