// Header rules' checks, precedence and markers (actors/header_rules.h).
#include "actors/header_rules.h"

#include <gtest/gtest.h>

namespace pandastack::actors::header_rules {
namespace {

using storage::HeaderRule;

TEST(HeaderRules, HostsAreNamesWildcardsOrAddresses) {
  for (auto ok : {"api.example.com", "*.example.com", "*.a.b.example.com", "localhost", "10.0.0.1",
                  "under_score.example"})
    EXPECT_FALSE(check_host(ok)) << ok;
  for (auto bad : {"*", "", "a.*.example.com", "*example.com", "10.0.0.0/8", "a..b", ".a", "a.",
                   "api.example.com:443", "*.", "300.1.1.1", "1.2.3", "a b"})
    EXPECT_TRUE(check_host(bad)) << bad;
}

TEST(HeaderRules, HeadersAndValuesAreChecked) {
  EXPECT_FALSE(check({{"a.example", "Authorization", "Bearer ${e2b.secrets.k}"},
                      {"a.example", "X-Two", "${e2b.secrets.k}-${e2b.secrets.other.name}"}}));
  auto code = [](HeaderRule r) {
    auto no = check({r});
    return no ? std::optional<Code>(no->code) : std::nullopt;
  };
  EXPECT_EQ(code({"A.example", "X", "v"}), Code::invalid_argument);  // (lower-cased first)
  EXPECT_EQ(code({"a.example", "", "v"}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X Y", "v"}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X:Y", "v"}), Code::invalid_argument);
  for (auto reserved : {"Host", "content-length", "Transfer-Encoding", "Connection", "Upgrade"})
    EXPECT_EQ(code({"a.example", reserved, "v"}), Code::invalid_argument) << reserved;
  EXPECT_EQ(code({"a.example", "X", "a\r\nB: c"}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X", std::string(kMaxValueBytes + 1, 'v')}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X", std::string(kMaxValueBytes, 'v')}), std::nullopt);
  EXPECT_EQ(code({"a.example", "X", "${e2b.secrets.}"}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X", "${e2b.secrets.unclosed"}), Code::invalid_argument);
  EXPECT_EQ(code({"a.example", "X", "${e2b.identity.tokens.aws}"}), Code::not_implemented);
  // Counts: hosts, headers per host (a header named twice counts once).
  std::vector<HeaderRule> many;
  for (size_t i = 0; i <= kMaxHosts; ++i) many.push_back({"h" + std::to_string(i) + ".x", "X", ""});
  EXPECT_EQ(check(many)->code, Code::invalid_argument);
  many.pop_back();
  EXPECT_FALSE(check(many));
  std::vector<HeaderRule> headers;
  for (size_t i = 0; i < kMaxHeadersPerHost; ++i)
    headers.push_back({"a.x", "X-" + std::to_string(i), "v"});
  headers.push_back({"a.x", "x-0", "again"});
  EXPECT_FALSE(check(headers));
  headers.push_back({"a.x", "X-Extra", "v"});
  EXPECT_EQ(check(headers)->code, Code::invalid_argument);
}

TEST(HeaderRules, MarkersNameSecrets) {
  using Parts = std::vector<std::pair<std::string, bool>>;
  EXPECT_EQ(parts("Bearer ${e2b.secrets.k}"), (Parts{{"Bearer ", false}, {"k", true}}));
  EXPECT_EQ(parts("${e2b.secrets.a}:${e2b.secrets.b}!"),
            (Parts{{"a", true}, {":", false}, {"b", true}, {"!", false}}));
  EXPECT_EQ(parts("${other} text"), (Parts{{"${other} text", false}}));
  EXPECT_TRUE(parts("").empty());
  EXPECT_EQ(secret_names({{"a.x", "A", "${e2b.secrets.k}"},
                          {"b.x", "B", "${e2b.secrets.k} ${e2b.secrets.j}"}}),
            (std::set<std::string>{"j", "k"}));
}

TEST(HeaderRules, TheExactNameWinsElseTheLongestWildcardNeverMerged) {
  std::vector<HeaderRule> rules = {{"*.example.com", "A", "1"},
                                   {"api.example.com", "B", "2"},
                                   {"*.eu.example.com", "C", "3"},
                                   {"api.example.com", "D", "4"},
                                   {"10.0.0.1", "E", "5"}};
  auto headers = [&](const std::string& host) {
    std::string out;
    for (auto* r : for_host(rules, host)) out += r->header;
    return out;
  };
  EXPECT_EQ(headers("api.example.com"), "BD");
  EXPECT_EQ(headers("x.example.com"), "A");
  EXPECT_EQ(headers("a.b.example.com"), "A");
  EXPECT_EQ(headers("x.eu.example.com"), "C");
  EXPECT_EQ(headers("eu.example.com"), "A");
  EXPECT_EQ(headers("example.com"), "");
  EXPECT_EQ(headers("badexample.com"), "");
  EXPECT_EQ(headers("10.0.0.1"), "E");
}

}  // namespace
}  // namespace pandastack::actors::header_rules
