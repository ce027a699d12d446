// Unit tests of the sandbox resolver's DNS handling (no sockets).
#include "vmm-driver/dns.h"

#include <gtest/gtest.h>

#include "vmm-driver/network.h"

namespace pandastack::vmm {
namespace {

std::string query(const std::string& name, uint16_t qtype = 1) {
  std::string q("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 12);
  size_t start = 0;
  while (start <= name.size()) {
    auto dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q += char(dot - start);
    q += name.substr(start, dot - start);
    start = dot + 1;
  }
  q += '\0';
  q += char(qtype >> 8);
  q += char(qtype & 0xff);
  q += std::string("\x00\x01", 2);
  return q;
}

TEST(Dns, QuestionNameIsReadAndLowercased) {
  EXPECT_EQ(dns::question_name(query("Api.Example.COM")), "api.example.com");
  EXPECT_FALSE(dns::question_name("short"));
  auto cut = query("example.com");
  EXPECT_FALSE(dns::question_name(cut.substr(0, cut.size() - 6)));
}

TEST(Dns, ARecordsFollowCompressedNamesAndSkipOtherTypes) {
  std::string r = query("example.com");
  r[2] = char(0x81);
  r[3] = char(0x80);
  r[7] = 3;  // three answers: CNAME, A, A
  // CNAME example.com -> www.example.com (compressed)
  r += std::string("\xc0\x0c\x00\x05\x00\x01\x00\x00\x00\x10\x00\x06\x03www\xc0\x0c", 18);
  r += std::string("\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x2c\x00\x04\xc6\x33\x64\x07", 16);
  r += std::string("\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04\xc6\x33\x64\x08", 16);
  auto a = dns::a_records(r);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0], (std::pair<std::string, uint32_t>{"198.51.100.7", 300}));
  EXPECT_EQ(a[1].first, "198.51.100.8");
  EXPECT_TRUE(dns::a_records(r.substr(0, r.size() - 3)).size() == 1) << "a cut record is ignored";
}

TEST(Dns, RefusedKeepsTheIdAndQuestion) {
  auto q = query("blocked.test");
  auto r = dns::refused(q);
  EXPECT_EQ(r.size(), q.size());
  EXPECT_EQ(r.substr(0, 2), q.substr(0, 2));
  EXPECT_EQ(uint8_t(r[2]) & 0x80, 0x80);
  EXPECT_EQ(uint8_t(r[3]) & 0x0f, 5);
  EXPECT_EQ(r.substr(12), q.substr(12));
  EXPECT_EQ(dns::question_name(r), "blocked.test");
}

TEST(Dns, PatternsMatchExactNamesAndSubdomains) {
  std::vector<std::string> p = {"example.com", "*.pypi.org"};
  EXPECT_TRUE(dns::allowed("example.com", p));
  EXPECT_FALSE(dns::allowed("www.example.com", p));
  EXPECT_TRUE(dns::allowed("files.pypi.org", p));
  EXPECT_TRUE(dns::allowed("a.b.pypi.org", p));
  EXPECT_FALSE(dns::allowed("pypi.org", p));
  EXPECT_FALSE(dns::allowed("evilpypi.org", p));
}

TEST(Dns, ResolverIsNeededForAllowAllAndDomainsAndTheUpstreamComesFromResolvConf) {
  EgressPolicy p;
  EXPECT_FALSE(needs_resolver(p));
  p.mode = EgressPolicy::Mode::allow_all;
  EXPECT_TRUE(needs_resolver(p));
  p.mode = EgressPolicy::Mode::allowlist;
  p.cidrs = {"192.0.2.0/24"};
  EXPECT_FALSE(needs_resolver(p));
  p.domains = {"example.com"};
  EXPECT_TRUE(needs_resolver(p));
  EXPECT_EQ(first_nameserver("# c\nsearch x\nnameserver ::1\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n"),
            "192.0.2.53");
  EXPECT_EQ(first_nameserver(""), "");
}

TEST(Dns, OnlyPlainQueriesAreForwarded) {
  // id, flags (RD), QD=1, AN=0, NS=0, AR=0, then "a.test" A IN.
  std::string q("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01" "a\x04test\x00\x00\x01\x00\x01", 24);
  EXPECT_TRUE(dns::plain_query(q));
  auto with = [&](size_t at, char v) {
    auto c = q;
    c[at] = v;
    return c;
  };
  EXPECT_FALSE(dns::plain_query(with(2, char(0x28))));  // opcode UPDATE (5)
  EXPECT_FALSE(dns::plain_query(with(2, char(0x81))));  // a response
  EXPECT_FALSE(dns::plain_query(with(5, 2)));           // two questions
  EXPECT_FALSE(dns::plain_query(with(7, 1)));           // an answer record in a query
  EXPECT_TRUE(dns::plain_query(with(11, 1)));           // EDNS OPT
  EXPECT_FALSE(dns::plain_query("short"));
}

}  // namespace
}  // namespace pandastack::vmm
