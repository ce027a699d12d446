// The E2B surface's pure parts: access tokens, Connect envelopes, multipart bodies, error codes.
#include "gateway/e2b.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <vector>

namespace pandastack::gateway::e2b {
namespace {

// Security review 3, M4: a token is scoped to one sandbox of one tenant, names the key it was
// issued under (target() refuses it once that key is revoked), and expires.
TEST(E2bTokens, AreScopedToOneSandboxOfOneTenantAndExpire) {
  Tokens t(std::string(32, 'k'));
  const int64_t now = int64_t(std::time(nullptr));
  auto tok = t.issue("acme", "keyaaaaaaaaa", "sbx_aaaaaaaaaaaaaaaa", now);
  EXPECT_EQ(tok.rfind("e2b2.", 0), 0u);
  auto claims = t.verify(tok, "sbx_aaaaaaaaaaaaaaaa", now);
  ASSERT_TRUE(claims);
  EXPECT_EQ(claims->tenant, "acme");
  EXPECT_EQ(claims->key_id, "keyaaaaaaaaa");
  // Valid for kLifetime after the end of the hour it was issued in.
  EXPECT_EQ(claims->expires % Tokens::kGranularity, 0);
  EXPECT_GT(claims->expires, now + Tokens::kLifetime);
  EXPECT_LE(claims->expires, now + Tokens::kLifetime + Tokens::kGranularity);
  EXPECT_EQ(t.verify(tok, "sbx_bbbbbbbbbbbbbbbb", now), std::nullopt);  // another sandbox
  // Expired: a day and an hour later it is no token.
  EXPECT_EQ(t.verify(tok, "sbx_aaaaaaaaaaaaaaaa", now + Tokens::kLifetime + Tokens::kGranularity),
            std::nullopt);
  // Any part changed (tenant, key, expiry) does not verify with this MAC.
  auto parts = [](const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t dot; (dot = s.find('.', at)) != std::string::npos; at = dot + 1)
      out.push_back(s.substr(at, dot - at));
    out.push_back(s.substr(at));
    return out;
  };
  auto p = parts(tok);
  ASSERT_EQ(p.size(), 5u);
  auto other = parts(t.issue("evil", "keybbbbbbbbb", "sbx_aaaaaaaaaaaaaaaa"));
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (auto& x : v) out += (out.empty() ? "" : ".") + x;
    return out;
  };
  for (int i : {1, 2}) {
    auto forged = p;
    forged[i] = other[i];
    EXPECT_EQ(t.verify(join(forged), "sbx_aaaaaaaaaaaaaaaa", now), std::nullopt) << i;
  }
  auto later = p;
  later[3] = std::to_string(now + 10 * Tokens::kLifetime);
  EXPECT_EQ(t.verify(join(later), "sbx_aaaaaaaaaaaaaaaa", now), std::nullopt);
  // Another secret (another daemon) does not verify it either.
  EXPECT_EQ(Tokens(std::string(32, 'j')).verify(tok, "sbx_aaaaaaaaaaaaaaaa", now), std::nullopt);
  // The old never-expiring form is no token any more.
  for (const char* bad : {"", "e2b1.YWNtZQ.abc", "e2b2.", "e2b2....", "e2b2.YWNtZQ.k.1.", "pds_x",
                          "e2b2.!!.k.1.!!", "e2b2.YWNtZQ.k.-1.YWJj", "e2b2.YWNtZQ.k.1.a.b"})
    EXPECT_EQ(t.verify(bad, "sbx_aaaaaaaaaaaaaaaa", now), std::nullopt) << bad;
  EXPECT_EQ(t.verify(std::string(10000, 'a'), "sbx_aaaaaaaaaaaaaaaa", now), std::nullopt);
}

TEST(E2bEnvelopes, RoundTripAndRefuseWhatIsNotOne) {
  Json m = Json::object();
  m.set("a", 1);
  auto e = envelope(m, 2);
  ASSERT_EQ(e.size(), 5 + m.dump().size());
  EXPECT_EQ(uint8_t(e[0]), 2);
  EXPECT_EQ(read_envelope(e)["a"].as_int(), 1);
  auto code = [](const std::string& body) {
    try {
      read_envelope(body);
    } catch (const ApiError& err) {
      return std::string(to_string(err.code));
    }
    return std::string("ok");
  };
  EXPECT_EQ(code(""), "invalid_argument");
  EXPECT_EQ(code(std::string("\0\0\0\0\5{}", 7)), "invalid_argument");  // length says 5, has 2
  EXPECT_EQ(code(std::string("\1\0\0\0\2{}", 7)), "invalid_argument");  // compressed
  EXPECT_EQ(code(std::string("\0\0\0\0\2[]", 7)), "invalid_argument");  // not an object
  EXPECT_EQ(code(std::string("\0\0\0\0\2{}", 7)), "ok");
}

TEST(E2bMultipart, PartsInOrderAndClearErrors) {
  std::string ct = "multipart/form-data; boundary=XyZ";
  std::string body =
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/a.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n\r\nA\r\n--XyZ\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"/tmp/b\"\r\n\r\n"
      "line1\r\nline2\r\n--XyZ--\r\n";
  auto parts = multipart(ct, body);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], (std::pair<std::string, std::string>{"/tmp/a.txt", "A"}));
  EXPECT_EQ(parts[1], (std::pair<std::string, std::string>{"/tmp/b", "line1\r\nline2"}));
  EXPECT_EQ(multipart("multipart/form-data; boundary=\"XyZ\"", body).size(), 2u);
  auto code = [](const std::string& c, const std::string& b) {
    try {
      multipart(c, b);
    } catch (const ApiError& err) {
      return std::string(to_string(err.code));
    }
    return std::string("ok");
  };
  EXPECT_EQ(code("application/json", body), "invalid_argument");
  EXPECT_EQ(code("multipart/form-data", body), "invalid_argument");  // no boundary
  EXPECT_EQ(code(ct, ""), "invalid_argument");
  EXPECT_EQ(
      code(ct, "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/x\"\r\n\r\nA"),
      "invalid_argument");  // unterminated
  EXPECT_EQ(code(ct, "--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nA\r\n--XyZ--"),
            "invalid_argument");                     // no file part
  EXPECT_EQ(code(ct, "--XyZ"), "invalid_argument");  // neither a part nor the closing delimiter
}

TEST(E2bErrors, OurCodesMapToConnectCodesAndShapes) {
  EXPECT_EQ(connect_code(Code::file_not_found), "not_found");
  EXPECT_EQ(connect_code(Code::process_not_found), "not_found");
  EXPECT_EQ(connect_code(Code::unauthorized), "unauthenticated");
  EXPECT_EQ(connect_code(Code::file_exists), "already_exists");
  EXPECT_EQ(connect_code(Code::invalid_path), "invalid_argument");
  EXPECT_EQ(connect_code(Code::not_implemented), "unimplemented");
  EXPECT_EQ(connect_code(Code::too_many_requests), "resource_exhausted");
  EXPECT_EQ(connect_code(Code::storage_error), "internal");
  auto gone = envd_error(error_reply(Code::sandbox_stopped, "sandbox x is stopped"));
  EXPECT_EQ(gone.status, 502u);
  auto nf = envd_error(error_reply(Code::file_not_found, "no /x"));
  EXPECT_EQ(nf.status, 404u);
  EXPECT_EQ((*Json::parse(nf.body))["code"].as_string(), "not_found");
  auto api = api_error(error_reply(Code::sandbox_not_found, "no sbx"));
  EXPECT_EQ(api.status, 404u);
  EXPECT_EQ((*Json::parse(api.body))["code"].as_int(), 404);
  EXPECT_EQ((*Json::parse(api.body))["message"].as_string(), "no sbx");
}

TEST(E2bTemplates, MapByName) {
  EXPECT_EQ(template_for(""), "base");
  EXPECT_EQ(template_for("base"), "base");
  EXPECT_EQ(template_for("code-interpreter-v1"), "code-interpreter");
  EXPECT_EQ(template_for("agent:latest"), "agent");
}

TEST(E2bTimes, Rfc3339ParsesWhatToIsoStringWrites) {
  EXPECT_EQ(parse_rfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_rfc3339("2026-12-04T15:22:33.123Z"), 1796397753123);
  EXPECT_EQ(parse_rfc3339("2026-12-04T16:22:33.123+01:00"), 1796397753123);
  EXPECT_EQ(parse_rfc3339(rfc3339(1796397753000)), 1796397753000);
  for (auto bad : {"", "2026-12-04", "2026-12-04T15:22:33", "2026-13-04T15:22:33Z",
                   "2026-12-04T15:22:33Zjunk", "2026-12-04T15:22:33+0100", "yesterday"})
    EXPECT_FALSE(parse_rfc3339(bad)) << bad;
}

}  // namespace
// Current E2B SDKs refuse an X-API-KEY that is not ^e2b_[0-9a-f]+$: our keys have an e2b_ form.
TEST(E2bKeys, TheE2bFormIsTheSameKeyAndNothingElseDecodes) {
  std::string pds = "pds_abcdefghijkl_" + std::string(40, 'a');
  auto form = api_key_form(pds);
  EXPECT_EQ(form.rfind("e2b_", 0), 0u);
  EXPECT_EQ(form.size(), 4u + 114u);
  for (char c : form.substr(4)) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  EXPECT_EQ(from_api_key_form(form), pds);
  EXPECT_EQ(from_api_key_form(pds), std::nullopt);
  EXPECT_EQ(from_api_key_form("e2b_" + std::string(114, '0')), std::nullopt) << "not a pds_ key";
  auto upper = form;
  upper[10] = 'A';
  EXPECT_EQ(from_api_key_form(upper), std::nullopt);
  EXPECT_EQ(from_api_key_form(form.substr(0, form.size() - 2)), std::nullopt);
  EXPECT_EQ(from_api_key_form(api_key_form("pds_x")), std::nullopt);
}

// A signed file URL carries a hash over the token, not the token: the tokens still valid must be
// recomputable. Those issued in one hour are one token; live() gives each valid one.
TEST(E2bTokens, LiveTokensAreEveryValidOneIssuedInTheLastDay) {
  Tokens t(std::string(32, 'k'));
  const int64_t t0 = 1'800'000'000;  // (a whole hour)
  const std::string s = "sbx_aaaaaaaaaaaaaaaa";
  EXPECT_EQ(t.issue("acme", "k1", s, t0 + 1), t.issue("acme", "k1", s, t0 + 3599));
  EXPECT_NE(t.issue("acme", "k1", s, t0 + 1), t.issue("acme", "k1", s, t0 + 3601));
  auto live = t.live("acme", "k1", s, t0 + 100);
  EXPECT_EQ(live.size(), 25u);
  // Every token issued in the last day (and this hour) is among them, and verifies.
  for (int64_t at = t0 + 100 - Tokens::kLifetime; at <= t0 + 100; at += 600) {
    auto tok = t.issue("acme", "k1", s, at);
    EXPECT_NE(std::find(live.begin(), live.end(), tok), live.end()) << at;
    EXPECT_TRUE(t.verify(tok, s, t0 + 100)) << at;
  }
  // None that expired, none of another key.
  for (auto& tok : live) EXPECT_TRUE(t.verify(tok, s, t0 + 100));
  auto old = t.issue("acme", "k1", s, t0 - Tokens::kLifetime - 3600);
  EXPECT_EQ(std::find(live.begin(), live.end(), old), live.end());
  for (auto& tok : t.live("acme", "k2", s, t0 + 100))
    EXPECT_EQ(std::find(live.begin(), live.end(), tok), live.end());
}

// What E2B's SDKs compute (values from its signature.ts, run under Node).
TEST(E2bSignedUrls, SignatureIsTheSdks) {
  EXPECT_EQ(file_signature("/home/user/a.txt", "read", "", "tok", std::nullopt),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY");
  EXPECT_EQ(file_signature("/home/user/a.txt", "write", "user", "tok", 1700000000),
            "v1_x09R0+VxB2mRzkxWcRyFCpiJmFv0okUrtgQ6q12G0jM");
  EXPECT_TRUE(sandbox_plane_port(49983));
  EXPECT_TRUE(sandbox_plane_port(49999));
  EXPECT_FALSE(sandbox_plane_port(8080));
}

// Security review 3, M5: envVars are checked as a request's and as the guest's file alike.
TEST(E2bEnv, EnvVarsAreCheckedAndRoundTrip) {
  auto env = env_vars(*Json::parse(R"({"OPENAI_API_KEY":"sk-x","EMPTY":"","U":"\u00e9\n"})"));
  EXPECT_EQ(env.size(), 3u);
  EXPECT_EQ(decode_env(encode_env(env)), env);
  EXPECT_TRUE(env_vars(Json()).empty());
  auto refused = [](const char* text) {
    try {
      env_vars(*Json::parse(text));
    } catch (const ApiError& e) {
      return e.code == Code::invalid_argument;
    }
    return false;
  };
  EXPECT_TRUE(refused(R"([])"));
  EXPECT_TRUE(refused(R"({"A":1})"));
  EXPECT_TRUE(refused(R"({"":"x"})"));
  EXPECT_TRUE(refused(R"({"A=B":"x"})"));
  EXPECT_TRUE(refused(R"({"A":"x\u0000y"})"));
  Json big = Json::object();
  big.set("A", std::string(kMaxEnvValue + 1, 'v'));
  EXPECT_TRUE(refused(big.dump().c_str()));
  Json many = Json::object();
  for (size_t i = 0; i <= kMaxEnvVars; ++i) many.set("V" + std::to_string(i), "x");
  EXPECT_TRUE(refused(many.dump().c_str()));
  // What a guest may have put in the file instead: not an envVars file.
  EXPECT_EQ(decode_env("not json"), std::nullopt);
  EXPECT_EQ(decode_env(R"({"A":["x"]})"), std::nullopt);
  EXPECT_EQ(decode_env(many.dump()), std::nullopt);
  EXPECT_EQ(decode_env("{}"), EnvVars{});
}

// The audit log shows that a credential-named metadata entry was set, never its value; E2B
// envVars that older sandboxes kept as metadata are redacted too.
TEST(E2bEnv, AuditLogRedactsCredentialMetadata) {
  actors::AuditEvent e;
  e.type = "created";
  e.json = R"({"kind":"created","metadata":{"who":"me","OPENAI_API_KEY":"sk-1","GhToken":"t",)"
           R"("db_password":"p","e2b.env.FOO":"bar","my-secret-thing":"s"}})";
  auto j = audit_json(e);
  const Json& md = j["event"]["metadata"];
  EXPECT_EQ(md["who"].as_string(), "me");
  for (const char* k :
       {"OPENAI_API_KEY", "GhToken", "db_password", "e2b.env.FOO", "my-secret-thing"})
    EXPECT_EQ(md[k].as_string(), "[redacted]") << k;
  EXPECT_EQ(j["event"]["kind"].as_string(), "created");
  // An event without metadata is answered as it is.
  e.json = R"({"kind":"killed"})";
  EXPECT_EQ(audit_json(e)["event"].dump(), R"({"kind":"killed"})");
}

}  // namespace pandastack::gateway::e2b
