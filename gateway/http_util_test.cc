#include "gateway/http_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include "gateway/api_types.h"
#include "gateway/rest.h"

namespace pandastack::gateway {
namespace {

TEST(HttpUtil, ErrorBodiesCarryTheCodeTheMessageAndAQuotasDetails) {
  EXPECT_EQ(error_body(Code::internal, "say \"hi\""),
            R"({"error":{"code":"internal","message":"say \"hi\""}})");
  EXPECT_EQ(
      error_body(Code::quota_exceeded, "over", QuotaDetail{"sandboxes", 2, 2, 1}),
      R"({"error":{"asked":1,"code":"quota_exceeded","limit":2,"message":"over","quota":"sandboxes","used":2}})");
}

// A refusal keeps its quota details on every way to an answer: unwrap throws it whole, and its
// reply has them as fields (the security suite's quota test, end to end).
TEST(HttpUtil, AQuotaRefusalKeepsItsDetailsUpToTheReply) {
  actors::Reply<int> refused =
      actors::Rejection{Code::quota_exceeded, "over", QuotaDetail{"memory_mib", 512, 256, 512}};
  try {
    (void)unwrap(std::move(refused));
    FAIL() << "unwrap did not throw";
  } catch (const ApiError& e) {
    auto r = error_reply(e);
    EXPECT_EQ(r.status, 429u);
    EXPECT_EQ(r.error_code, Code::quota_exceeded);
    auto j = wire::Json::parse(r.body);
    ASSERT_TRUE(j);
    EXPECT_EQ((*j)["error"]["quota"].as_string(), "memory_mib");
    EXPECT_EQ((*j)["error"]["limit"].as_int(), 512);
    EXPECT_EQ((*j)["error"]["used"].as_int(), 256);
    EXPECT_EQ((*j)["error"]["asked"].as_int(), 512);
  }
}

TEST(HttpUtil, RoutePatternsBindParameters) {
  RoutePattern p("/v1/sandboxes/{id}/files");
  std::map<std::string, std::string> params;
  EXPECT_TRUE(p.match({"v1", "sandboxes", "sbx_1", "files"}, params));
  EXPECT_EQ(params["id"], "sbx_1");
  EXPECT_FALSE(p.match({"v1", "sandboxes", "sbx_1"}, params));
  EXPECT_FALSE(p.match({"v1", "sandboxes", "sbx_1", "filez"}, params));
  EXPECT_FALSE(p.match({"v1", "sandboxes", "", "files"}, params));
  RoutePattern root("/healthz");
  EXPECT_TRUE(root.match({"healthz"}, params));
}

TEST(HttpUtil, GuestPathsAreChecked) {
  EXPECT_FALSE(check_guest_path("/tmp/a.txt", 4096));
  EXPECT_FALSE(check_guest_path("/", 4096));
  EXPECT_TRUE(check_guest_path("", 4096));
  EXPECT_TRUE(check_guest_path("tmp/a", 4096));
  EXPECT_TRUE(check_guest_path("/tmp/../etc/passwd", 4096));
  EXPECT_TRUE(check_guest_path("/tmp/./a", 4096));
  EXPECT_TRUE(check_guest_path("/..", 4096));
  EXPECT_TRUE(check_guest_path(std::string_view("/a\0b", 4), 4096));
  EXPECT_TRUE(check_guest_path("/" + std::string(5000, 'a'), 4096));
  EXPECT_FALSE(check_guest_path("/tmp/..a/b..", 4096));
}

TEST(HttpUtil, Base64) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode(std::string("\xff\x00\x80", 3)), "/wCA");
  for (std::string raw : {std::string(""), std::string("f"), std::string("fo"), std::string("foo"),
                          std::string("\xff\x00\x80\x01", 4)})
    EXPECT_EQ(base64_decode(base64_encode(raw)), std::optional<std::string>(raw));
  EXPECT_FALSE(base64_decode("Zg="));       // not a multiple of 4
  EXPECT_FALSE(base64_decode("Z!=="));      // not the alphabet
  EXPECT_FALSE(base64_decode("Zg==Zg=="));  // padding in the middle
}

TEST(HttpUtil, HistogramIsCumulative) {
  Histogram h({0.01, 0.1});
  h.observe(0.005);
  h.observe(0.05);
  h.observe(5);
  std::string out;
  h.render(out, "x_seconds", "help");
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.01\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_count 3\n"), std::string::npos);
}

TEST(ExecChecks, OneCommandWithinLimitsAndAValidCwd) {
  Limits l;
  l.max_command_bytes = 10;
  vmm::ExecRequest e;
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);  // neither argv nor shell
  e.shell = "true";
  e.argv = {"true"};
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);  // both
  e.argv.clear();
  e.stdin_data = "0123456789";
  EXPECT_EQ(check_exec(e, l)->code, Code::body_too_large);
  e.stdin_data.clear();
  e.cwd = "/tmp/../etc";
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_path);
  e.cwd = "/tmp";
  EXPECT_FALSE(check_exec(e, l));
  EXPECT_EQ(e.max_output_bytes, l.max_exec_output_bytes);
  // Nothing is cut short or split silently: NUL bytes and odd variable names are refused.
  e.shell = std::string("a\0b", 3);
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);
  e.shell = "true";
  e.env = {{"A=B", "z"}};
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);
  e.env = {{"", "z"}};
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);
  e.env = {{"A", std::string("a\0", 2)}};
  EXPECT_EQ(check_exec(e, l)->code, Code::invalid_argument);
}

std::string gzip_of(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(in.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(Gunzip, InflatesWithinItsLimitAndRefusesTheRest) {
  std::string text(200000, 'a');
  for (size_t i = 0; i < text.size(); i += 7) text[i] = char('a' + i % 26);
  auto gz = gzip_of(text);
  EXPECT_EQ(gunzip(gz, text.size()).value(), text);
  EXPECT_FALSE(gunzip(gz, text.size() - 1));  // one byte past the limit: refused
  EXPECT_EQ(gunzip(gz + gzip_of("tail"), text.size() + 4).value(), text + "tail");  // 2 members
  EXPECT_FALSE(gunzip(gz.substr(0, gz.size() / 2), text.size()));                   // cut short
  EXPECT_FALSE(gunzip("not gzip at all", 1000));
  EXPECT_EQ(gunzip(gzip_of(""), 0).value(), "");
  // A bomb: 64 MiB of zeros in a small body, never inflated past the limit.
  EXPECT_FALSE(gunzip(gzip_of(std::string(64 << 20, '\0')), 1 << 20));
}

}  // namespace
}  // namespace pandastack::gateway
