// Build context archives kept per tenant (actors/build_context.h): keys, limits, eviction, the
// build's own links, and the bundle the unpacker's guest reads.
#include "actors/build_context.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "wire/json.h"

namespace pandastack::actors {
namespace {

namespace fs = std::filesystem;

struct Folder {
  fs::path dir =
      fs::temp_directory_path() / ("build-context-test-" + std::to_string(::getpid()) + "-" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  Folder() {
    fs::remove_all(dir);
    fs::create_directories(dir / "uploads");
  }
  ~Folder() { fs::remove_all(dir); }
  fs::path upload(const std::string& name, const std::string& bytes) const {
    auto p = dir / "uploads" / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
};

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(BuildContexts, KeptByDigestOrByTheKeyGivenPerTenant) {
  Folder f;
  BuildContexts store(f.dir / "store", 1 << 20, 8);
  auto a = store.put("alice", f.upload("a", "abc"));
  ASSERT_TRUE(a) << a.error().message;
  // sha256("abc")
  EXPECT_EQ(a->key, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(a->bytes, 3u);
  EXPECT_FALSE(fs::exists(f.dir / "uploads" / "a"));  // taken over
  EXPECT_TRUE(store.get("alice", a->key));
  EXPECT_EQ(store.get("bob", a->key).error().code, Code::context_not_found);  // not bob's
  std::string e2b(64, 'e');
  ASSERT_TRUE(store.put("bob", f.upload("b", "e2b's"), e2b));
  EXPECT_TRUE(store.get("bob", e2b));
  EXPECT_EQ(store.put("bob", f.upload("c", "x"), "not-hex").error().code, Code::invalid_argument);
  EXPECT_FALSE(fs::exists(f.dir / "uploads" / "c"));  // a refusal removes the upload
  EXPECT_EQ(store.put("bob", f.upload("d", "")).error().code, Code::invalid_argument);
  EXPECT_EQ(store.put("bob", f.upload("e", std::string((1 << 20) + 1, 'x'))).error().code,
            Code::file_too_large);
  EXPECT_FALSE(store.remove("bob", e2b));
  EXPECT_EQ(store.remove("bob", e2b)->code, Code::context_not_found);
  EXPECT_EQ(context_key("sha256:" + a->key), a->key);
  EXPECT_EQ(context_key(a->key), a->key);
  EXPECT_FALSE(context_key("sha256:" + a->key.substr(1)));
  EXPECT_FALSE(context_key("../../etc/passwd"));
}

TEST(BuildContexts, TheLeastRecentlyUsedGoFirstAndABuildKeepsItsOwnLinks) {
  Folder f;
  BuildContexts store(f.dir / "store", 1 << 20, 2);
  auto one = store.put("t", f.upload("1", "one"));
  auto two = store.put("t", f.upload("2", "two"));
  ASSERT_TRUE(one && two);
  // (one used long ago)
  auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (auto& e : fs::recursive_directory_iterator(f.dir / "store"))
    if (e.path().stem() == one->key) fs::last_write_time(e.path(), old);
  auto links = store.take("t", {two->key, one->key}, f.dir / "build");
  ASSERT_TRUE(links) << links.error().message;
  ASSERT_EQ(links->size(), 2u);
  EXPECT_EQ(read((*links)[0]), "two");
  EXPECT_EQ(read((*links)[1]), "one");
  // take() marked both used; `two` is now the older of the two (set it so), and goes.
  for (auto& e : fs::recursive_directory_iterator(f.dir / "store"))
    if (e.path().stem() == two->key) fs::last_write_time(e.path(), old);
  auto three = store.put("t", f.upload("3", "three"));
  ASSERT_TRUE(three);
  EXPECT_FALSE(store.get("t", two->key));
  EXPECT_TRUE(store.get("t", one->key));
  EXPECT_TRUE(store.get("t", three->key));
  EXPECT_EQ(read((*links)[0]), "two");  // the build's link outlives the eviction
  auto missing = store.take("t", {two->key}, f.dir / "build2");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, Code::context_not_found);
}

TEST(BuildContexts, TheBundleHasAHeaderThenEachArchiveOnASectorBoundary) {
  Folder f;
  auto a = f.upload("a", std::string(700, 'a'));
  auto b = f.upload("b", "bb");
  auto out = f.dir / "bundle";
  auto size = write_context_bundle({a, b}, out);
  ASSERT_TRUE(size) << size.error().message;
  auto bytes = read(out);
  EXPECT_EQ(bytes.size(), *size);
  EXPECT_EQ(*size, 4096u + 1024 + 512);
  auto header = wire::Json::parse(std::string(bytes.c_str()));
  ASSERT_TRUE(header);
  auto& list = (*header)["archives"].as_array();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list.at(0)["offset"].as_int(), 4096);
  EXPECT_EQ(list.at(0)["bytes"].as_int(), 700);
  EXPECT_EQ(list.at(1)["offset"].as_int(), 4096 + 1024);
  EXPECT_EQ(list.at(1)["bytes"].as_int(), 2);
  EXPECT_EQ(bytes.substr(4096, 700), std::string(700, 'a'));
  EXPECT_EQ(bytes.substr(4096 + 700, 324), std::string(324, '\0'));
  EXPECT_EQ(bytes.substr(4096 + 1024, 2), "bb");
}

}  // namespace
}  // namespace pandastack::actors
