// An image pull's pure parts: references as Docker reads them, and registries' sign-in
// challenges. (The pull itself: templates_test.py against a registry on loopback.)
#include "actors/image_pull.h"

#include <gtest/gtest.h>

namespace pandastack::actors {
namespace {

TEST(ImagePull, ReferencesReadAsDockerReadsThem) {
  struct Case {
    const char* text;
    const char* registry;
    const char* repository;
    const char* reference;
  } cases[] = {
      {"busybox", "registry-1.docker.io", "library/busybox", "latest"},
      {"python:3.12-slim", "registry-1.docker.io", "library/python", "3.12-slim"},
      {"docker.io/bitnami/redis:7", "registry-1.docker.io", "bitnami/redis", "7"},
      {"ghcr.io/org/app:1.0", "ghcr.io", "org/app", "1.0"},
      {"localhost/team/app", "localhost", "team/app", "latest"},
      {"127.0.0.1:5000/test/busybox:1", "127.0.0.1:5000", "test/busybox", "1"},
      {"quay.io/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
       "quay.io", "a/b", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
      {"team/app:2", "registry-1.docker.io", "team/app", "2"},
  };
  for (auto& c : cases) {
    auto r = parse_image_ref(c.text);
    ASSERT_TRUE(r) << c.text << ": " << r.error().message;
    EXPECT_EQ(r->registry, c.registry) << c.text;
    EXPECT_EQ(r->repository, c.repository) << c.text;
    EXPECT_EQ(r->reference, c.reference) << c.text;
  }
  EXPECT_EQ(parse_image_ref("python:3.12")->text(), "registry-1.docker.io/library/python:3.12");
  for (auto bad : {"", "UPPER/case", "a b", "x@sha256:12", "x@md5:ab", "a//b", "/a", "a/",
                   "x:", "x:bad/tag", "a/../b"}) {
    auto r = parse_image_ref(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_EQ(r.error().code, Code::invalid_argument);
    }
  }
  EXPECT_FALSE(parse_image_ref(std::string(513, 'a')));
}

TEST(ImagePull, SignInChallengesParse) {
  auto c = parse_auth_challenge(
      R"(Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull")");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->scheme, "bearer");
  EXPECT_EQ(c->params["realm"], "https://auth.docker.io/token");
  EXPECT_EQ(c->params["service"], "registry.docker.io");
  EXPECT_EQ(c->params["scope"], "repository:library/busybox:pull");
  auto b = parse_auth_challenge(R"(Basic realm="Registry Realm")");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->scheme, "basic");
  EXPECT_EQ(b->params["realm"], "Registry Realm");
  EXPECT_FALSE(parse_auth_challenge(""));
}

}  // namespace
}  // namespace pandastack::actors
