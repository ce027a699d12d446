#include "gateway/previews.h"

#include <gtest/gtest.h>

namespace pandastack::gateway {
namespace {

TEST(PreviewAddress, ByHost) {
  auto a = preview_by_host("3000-sbx_abc234.localhost:8080", "localhost:8080", "/app?x=1&token=T");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, "sbx_abc234");
  EXPECT_EQ(a->port, 3000u);
  EXPECT_TRUE(a->host_based);
  EXPECT_EQ(a->target, "/app?x=1");
  EXPECT_EQ(a->token, "T");
  EXPECT_EQ(a->cookie_path, "/");
  // Case-insensitive (browsers lower-case hosts), "sbx_" optional, an empty path is "/".
  auto b = preview_by_host("80-ABC234.Preview.Example.COM", "preview.example.com", "");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->id, "sbx_abc234");
  EXPECT_EQ(b->target, "/");
  // Not a preview: the API's own host, another domain, bad ports or ids.
  for (auto host :
       {"localhost:8080", "x.localhost:8080", "0-sbx_a.localhost:8080",
        "65536-sbx_a.localhost:8080", "80-sbx_a/b.localhost:8080", "80-sbx_a.localhost:8081",
        "80-sbx_a.evil-localhost:8080", "80-sbx_a.b.localhost:8080", "-sbx_a.localhost:8080"})
    EXPECT_FALSE(preview_by_host(host, "localhost:8080", "/")) << host;
  EXPECT_FALSE(preview_by_host("80-sbx_a.localhost", "", "/"));
}

TEST(PreviewAddress, ByPath) {
  auto a = preview_by_path("/v1/sandboxes/sbx_abc/previews/8000/static/app.js?v=2&token=T&w");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, "sbx_abc");
  EXPECT_EQ(a->port, 8000u);
  EXPECT_FALSE(a->host_based);
  EXPECT_EQ(a->target, "/static/app.js?v=2&w");
  EXPECT_EQ(a->token, "T");
  EXPECT_EQ(a->prefix, "/v1/sandboxes/sbx_abc/previews/8000");
  EXPECT_EQ(a->cookie_path, "/v1/sandboxes/sbx_abc/previews/8000/");
  auto root = preview_by_path("/v1/sandboxes/sbx_abc/previews/8000/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->target, "/");
  // The API's routes are not the proxy's: no slash after the port, or not a port.
  for (auto url : {"/v1/sandboxes/sbx_abc/previews", "/v1/sandboxes/sbx_abc/previews/8000",
                   "/v1/sandboxes/sbx_abc/previews/8000?token=x", "/v1/sandboxes/sbx_abc/ports/1/",
                   "/v1/sandboxes/sbx_abc/previews/abc/", "/v1/sandboxes/x/previews/80/",
                   "/v1/sandboxes/sbx_a%2F/previews/80/"})
    EXPECT_FALSE(preview_by_path(url)) << url;
}

TEST(PreviewTokens, BoundToSandboxPortExpiryAndNonce) {
  PreviewTokens t(std::string(32, 'k'));
  actors::Preview p{3000, false, 1, 1000, "nonce"};
  auto token = t.issue("sbx_a", p);
  EXPECT_TRUE(t.verify(token, "sbx_a", p));
  EXPECT_FALSE(t.verify(token, "sbx_b", p));
  EXPECT_FALSE(t.verify("", "sbx_a", p));
  EXPECT_FALSE(t.verify(token + "x", "sbx_a", p));
  for (auto other : {actors::Preview{3001, false, 1, 1000, "nonce"},
                     actors::Preview{3000, false, 1, 1001, "nonce"},
                     actors::Preview{3000, false, 1, 1000, "again"}})
    EXPECT_FALSE(t.verify(token, "sbx_a", other));
  EXPECT_FALSE(PreviewTokens(std::string(32, 'j')).verify(token, "sbx_a", p));
  EXPECT_LE(token.size(), kMaxPreviewTokenBytes);
}

TEST(PreviewCookies, FoundAndRemoved) {
  std::string h = "a=1; pds_preview=T1;pds_preview=T2; pds_previewx=3";
  EXPECT_EQ(cookie_values(h, "pds_preview"), (std::vector<std::string>{"T1", "T2"}));
  EXPECT_EQ(without_cookie(h, "pds_preview"), "a=1; pds_previewx=3");
  EXPECT_EQ(without_cookie("pds_preview=T", "pds_preview"), "");
  EXPECT_TRUE(cookie_values("", "pds_preview").empty());
}

TEST(PreviewUrls, Shapes) {
  PreviewSettings s;
  s.domain = "localhost:8080";
  EXPECT_EQ(preview_host_url(s, "sbx_a", 3000), "http://3000-sbx_a.localhost:8080/");
  EXPECT_EQ(preview_path_url(s, "127.0.0.1:8080", "sbx_a", 3000),
            "http://127.0.0.1:8080/v1/sandboxes/sbx_a/previews/3000/");
}

}  // namespace
}  // namespace pandastack::gateway
