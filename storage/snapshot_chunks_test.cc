// The chunked folder upload over a store in memory (the ObjectStore interface): the real S3
// protocol is exercised against a real server in tests/api/object_store_test.py.
#include "storage/snapshot_chunks.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <random>

#include "wire/sha256.h"

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;

class MemoryStore : public ObjectStore {
 public:
  std::map<std::string, std::string> objects;
  int puts = 0;
  Status put(const std::string& key, const std::string& bytes) override {
    ++puts;
    objects[key] = bytes;
    return Ok{};
  }
  Result<std::string> get(const std::string& key, uint64_t max_bytes) override {
    auto it = objects.find(key);
    if (it == objects.end()) return make_error(ErrorCode::not_found, "no object " + key);
    if (it->second.size() > max_bytes) return make_error(ErrorCode::invalid_argument, "too large");
    return it->second;
  }
  Result<bool> exists(const std::string& key) override { return objects.count(key) > 0; }
  Status remove(const std::string& key) override {
    objects.erase(key);
    return Ok{};
  }
  Result<std::vector<std::string>> list(const std::string& prefix) override {
    std::vector<std::string> keys;
    for (auto& [k, v] : objects)
      if (k.rfind(prefix, 0) == 0) keys.push_back(k);
    return keys;
  }
  std::string describe() const override { return "memory"; }
  size_t count(const std::string& prefix) { return list(prefix)->size(); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(g());
  return s;
}

class SnapshotChunks : public ::testing::Test {
 protected:
  fs::path root;
  void SetUp() override {
    root = fs::temp_directory_path() /
           ("pst-chunks-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root);
    fs::create_directories(root / "snap");
    // A RAM file: 5 chunks, two of them data (one repeated), the rest holes.
    std::string mem(5 * kChunkBytes, '\0');
    auto data = random_bytes(kChunkBytes, 1);
    mem.replace(kChunkBytes, kChunkBytes, data);
    mem.replace(3 * kChunkBytes, kChunkBytes, data);
    mem.replace(4 * kChunkBytes + 10, 5, "tail!");
    write(root / "snap" / "mem", mem);
    write(root / "snap" / "state", "device state");
    write(root / "snap" / "layer-1.qcow2", random_bytes(kChunkBytes + 7, 2));
    fs::permissions(root / "snap" / "layer-1.qcow2", fs::perms(0644));
    fs::create_hard_link(root / "snap" / "layer-1.qcow2", root / "snap" / "disk.qcow2");
    write(root / "snap" / "meta.json", "{}");
  }
  void TearDown() override { fs::remove_all(root); }
};

TEST_F(SnapshotChunks, AFolderComesBackAsItWasWithHolesAndLinks) {
  MemoryStore store;
  ChunkStats up;
  auto key = upload_folder(store, root / "snap", &up);
  ASSERT_TRUE(key) << key.error().message;
  EXPECT_TRUE(manifest_key(*key));
  EXPECT_EQ(up.files, 4u);  // disk.qcow2 is a link of layer-1.qcow2
  EXPECT_EQ(up.zero_chunks, 2u);
  // mem: 1 data chunk (twice) and the tail's; state; meta; layer: 2
  EXPECT_EQ(store.count("chunks/"), 6u);
  EXPECT_EQ(up.sent_chunks, 6u);
  ChunkStats down;
  ASSERT_TRUE(download_folder(store, *key, root / "back", &down));
  for (auto name : {"mem", "state", "layer-1.qcow2", "disk.qcow2", "meta.json"})
    EXPECT_EQ(slurp(root / "back" / name), slurp(root / "snap" / name)) << name;
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat((root / "back" / "layer-1.qcow2").c_str(), &a), 0);
  ASSERT_EQ(::stat((root / "back" / "disk.qcow2").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_mode & 0777, 0644u);  // read permissions kept (a jailed QEMU reads layers)
  ASSERT_EQ(::stat((root / "back" / "mem").c_str(), &a), 0);
  EXPECT_LT(uint64_t(a.st_blocks) * 512, 4 * kChunkBytes);  // the holes stay holes
  EXPECT_FALSE(fs::exists(root / "back.download"));
}

TEST_F(SnapshotChunks, WhatTheStoreHasIsNotSentAgain) {
  MemoryStore store;
  ASSERT_TRUE(upload_folder(store, root / "snap"));
  // A fork's hibernation: the same disk, one RAM chunk changed.
  fs::create_directories(root / "fork");
  for (auto name : {"state", "layer-1.qcow2", "meta.json"})
    fs::copy_file(root / "snap" / name, root / "fork" / name);
  auto mem = slurp(root / "snap" / "mem");
  mem[3] = 'x';
  write(root / "fork" / "mem", mem);
  ChunkStats st;
  auto key = upload_folder(store, root / "fork", &st);
  ASSERT_TRUE(key);
  EXPECT_EQ(st.sent_chunks, 1u);
  EXPECT_EQ(st.sent_bytes, kChunkBytes);
  EXPECT_TRUE(download_folder(store, *key, root / "fork-back"));
  EXPECT_EQ(slurp(root / "fork-back" / "mem"), mem);
}

TEST_F(SnapshotChunks, KnownChunksAreNotAskedForAgainUntilCollected) {
  struct Counting : MemoryStore {
    int asked = 0;
    Result<bool> exists(const std::string& key) override {
      ++asked;
      return MemoryStore::exists(key);
    }
  } store;
  KnownChunks known;
  auto first = upload_folder(store, root / "snap", nullptr, &known);
  ASSERT_TRUE(first);
  EXPECT_EQ(store.asked, 6);
  EXPECT_EQ(known.size(), 6u);
  ASSERT_TRUE(upload_folder(store, root / "snap", nullptr, &known));
  EXPECT_EQ(store.asked, 6);  // none asked again
  // Collected chunks are forgotten: an upload after a collection sends them again.
  ASSERT_TRUE(store.remove(*first));
  auto manifests = store.list("manifests/");
  ASSERT_TRUE(manifests);
  for (auto& key : *manifests) ASSERT_TRUE(store.remove(key));
  auto gc = collect_garbage(store, &known);
  ASSERT_TRUE(gc);
  EXPECT_EQ(gc->deleted, 6u);
  EXPECT_TRUE(known.empty());
  ChunkStats st;
  auto again = upload_folder(store, root / "snap", &st, &known);
  ASSERT_TRUE(again);
  EXPECT_EQ(st.sent_chunks, 6u);
  EXPECT_TRUE(download_folder(store, *again, root / "back"));
}

TEST_F(SnapshotChunks, ACorruptedOrMissingChunkIsRefusedAndNothingIsLeft) {
  MemoryStore store;
  auto key = upload_folder(store, root / "snap");
  ASSERT_TRUE(key);
  auto chunk = store.list("chunks/")->front();
  store.objects[chunk][0] ^= 1;
  auto r = download_folder(store, *key, root / "back");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_NE(r.error().message.find("does not match its hash"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "back"));
  EXPECT_FALSE(fs::exists(root / "back.download"));
  store.objects.erase(chunk);
  r = download_folder(store, *key, root / "back");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::not_found);
  EXPECT_FALSE(fs::exists(root / "back"));
}

TEST_F(SnapshotChunks, AFetchTakesAtMostItsBound) {
  MemoryStore store;
  auto key = upload_folder(store, root / "snap");
  ASSERT_TRUE(key);
  ChunkStats st;
  ASSERT_TRUE(download_folder(store, *key, root / "back", &st));
  fs::remove_all(root / "back");
  auto r = download_folder(store, *key, root / "back", nullptr, st.bytes - 1);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("more than"), std::string::npos);
  EXPECT_FALSE(fs::exists(root / "back"));
  EXPECT_FALSE(fs::exists(root / "back.download"));
  EXPECT_TRUE(download_folder(store, *key, root / "back", nullptr, st.bytes));
}

TEST_F(SnapshotChunks, AManifestIsCheckedBeforeItIsBelieved) {
  MemoryStore store;
  auto key = upload_folder(store, root / "snap");
  ASSERT_TRUE(key);
  // Its bytes must hash to its name.
  auto text = store.objects[*key];
  store.objects[*key] = text + " ";
  EXPECT_EQ(download_folder(store, *key, root / "back").error().code, ErrorCode::corrupt);
  // A manifest naming a path out of the folder (its name matching its hash: an attacker with
  // write access to the bucket) is refused.
  std::string evil =
      R"({"format":1,"chunk_bytes":4194304,"files":[{"name":"../escape","size":0,"mode":384,"chunks":[]}]})";
  std::string evil_key = "manifests/" + wire::sha256_hex(evil);
  store.objects[evil_key] = evil;
  auto r = download_folder(store, evil_key, root / "back");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::corrupt);
  EXPECT_FALSE(fs::exists(root / "escape"));
  EXPECT_FALSE(download_folder(store, "manifests/../x", root / "back"));
  // The target must not exist.
  fs::create_directories(root / "there");
  EXPECT_EQ(download_folder(store, *key, root / "there").error().code, ErrorCode::invalid_argument);
}

TEST_F(SnapshotChunks, GarbageCollectionTakesWhatNoManifestNames) {
  MemoryStore store;
  auto first = upload_folder(store, root / "snap");
  ASSERT_TRUE(first);
  write(root / "snap" / "state", "another device state");
  auto second = upload_folder(store, root / "snap");
  ASSERT_TRUE(second);
  const size_t all = store.count("chunks/");  // both states' chunks
  store.objects["chunks/" + std::string(64, 'a')] = "left by an upload cut short";
  auto gc = collect_garbage(store);
  ASSERT_TRUE(gc) << gc.error().message;
  EXPECT_EQ(gc->manifests, 2u);
  EXPECT_EQ(gc->deleted, 1u);
  EXPECT_EQ(store.count("chunks/"), all);
  // The first manifest goes: only its own chunk (the old state) with it.
  ASSERT_TRUE(store.remove(*first));
  gc = collect_garbage(store);
  ASSERT_TRUE(gc);
  EXPECT_EQ(gc->deleted, 1u);
  EXPECT_TRUE(download_folder(store, *second, root / "back"));
  // An unreadable manifest stops it: nothing is deleted on a guess.
  ASSERT_TRUE(store.remove(*second));
  store.objects["manifests/" + std::string(64, 'b')] = "not json";
  EXPECT_FALSE(collect_garbage(store));
  EXPECT_EQ(store.count("chunks/"), all - 1);
  store.objects.erase("manifests/" + std::string(64, 'b'));
  gc = collect_garbage(store);
  ASSERT_TRUE(gc);
  EXPECT_EQ(store.count("chunks/"), 0u);
}

TEST(ObjectStoreConfig, UrlsAndCredentials) {
  auto dir = fs::temp_directory_path() / ("pst-s3cfg-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write(dir / "creds", "# test\n[default]\naws_access_key_id = AK\nsecret_access_key=SK \n");
  auto c = parse_object_store("http://127.0.0.1:4568/my-bucket/pfx/a?region=eu-west-1",
                              (dir / "creds").string());
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:4568");
  EXPECT_EQ(c->bucket, "my-bucket");
  EXPECT_EQ(c->prefix, "pfx/a/");
  EXPECT_EQ(c->region, "eu-west-1");
  EXPECT_EQ(c->credentials.access_key_id, "AK");
  EXPECT_EQ(c->credentials.secret_access_key, "SK");
  EXPECT_TRUE(parse_object_store("https://s3.amazonaws.com/bucket", (dir / "creds").string()));
  for (auto bad : {"ftp://x/b", "http://10.0.0.1/bucket", "http://127.0.0.1/", "http://127.0.0.1/B",
                   "http://127.0.0.1/bucket?x=1", "http://127.0.0.1/bucket/a b",
                   "http://127.0.0.1/bucket/a/../b", "http://127.0.0.1/bucket/a//b"})
    EXPECT_FALSE(parse_object_store(bad, (dir / "creds").string())) << bad;
  EXPECT_FALSE(parse_object_store("http://127.0.0.1/bucket", ""));
  write(dir / "empty", "nothing=here\n");
  EXPECT_FALSE(parse_object_store("http://127.0.0.1/bucket", (dir / "empty").string()));
  // Another host's prefix in the same bucket (a wake of its hibernation), never a path out of it.
  S3Store store(*c);
  EXPECT_EQ(store.prefix(), "pfx/a/");
  auto other = store.under("pfx/b/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->prefix(), "pfx/b/");
  EXPECT_EQ(other->describe(), "http://127.0.0.1:4568/my-bucket/pfx/b/");
  for (const std::string& bad : std::vector<std::string>{
           "pfx/b", "../b/", "pfx/../b/", "/b/", "a//", "a b/", std::string(300, 'a') + "/"})
    EXPECT_FALSE(store.under(bad)) << bad;
  EXPECT_TRUE(valid_key_prefix(""));
  EXPECT_TRUE(valid_key_prefix("hosts/h-1.x_2/"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pandastack::storage
