#include "storage/secrets.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class SecretStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("secrets-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    auto s = EventStore::open({dir_ / "db", true, 1024, {}});
    ASSERT_TRUE(s);
    store_ = std::move(*s);
    auto sec = SecretStore::open(*store_, dir_ / "secrets.key");
    ASSERT_TRUE(sec) << sec.error().message;
    secrets_ = std::move(*sec);
  }
  void TearDown() override {
    secrets_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }
  SecretInfo info(const std::string& tenant, const std::string& name) {
    SecretInfo i;
    i.tenant = tenant;
    i.name = name;
    i.hosts = {"api.example.com"};
    return i;
  }
  fs::path dir_;
  std::unique_ptr<EventStore> store_;
  std::unique_ptr<SecretStore> secrets_;
};

TEST_F(SecretStoreTest, StoresSealedAndRevealsOnlyToItsTenant) {
  auto made = secrets_->create(info("acme", "GITHUB_TOKEN"), "ghp_value_123");
  ASSERT_TRUE(made) << made.error().message;
  EXPECT_EQ(made->version, 1u);
  EXPECT_GT(made->created_ms, 0);
  EXPECT_EQ(secrets_->reveal("acme", "GITHUB_TOKEN").value(), "ghp_value_123");
  EXPECT_EQ(secrets_->reveal("other", "GITHUB_TOKEN").error().code, ErrorCode::not_found);
  EXPECT_EQ(secrets_->create(info("acme", "GITHUB_TOKEN"), "x").error().code, ErrorCode::conflict);
  // The value is nowhere in the database in the clear.
  auto rows = store_->scan("");
  ASSERT_TRUE(rows);
  for (auto& [k, v] : *rows) EXPECT_EQ(v.find("ghp_value_123"), std::string::npos) << k;
  auto listed = secrets_->list("acme").value();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].name, "GITHUB_TOKEN");
  EXPECT_EQ(listed[0].hosts, (std::vector<std::string>{"api.example.com"}));
  EXPECT_TRUE(secrets_->list("other").value().empty());
}

TEST_F(SecretStoreTest, RotatesRemovesAndExpires) {
  ASSERT_TRUE(secrets_->create(info("acme", "A"), "one"));
  auto r = secrets_->update("acme", "A", std::string("two"),
                            std::vector<std::string>{"*.example.org"}, std::nullopt);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->version, 2u);
  EXPECT_EQ(r->hosts, (std::vector<std::string>{"*.example.org"}));
  EXPECT_EQ(secrets_->reveal("acme", "A").value(), "two");
  // Hosts alone: the value and version stay.
  r = secrets_->update("acme", "A", std::nullopt, std::vector<std::string>{"b.test"}, std::nullopt);
  EXPECT_EQ(r->version, 2u);
  EXPECT_EQ(secrets_->reveal("acme", "A").value(), "two");
  EXPECT_EQ(
      secrets_->update("acme", "B", std::string("x"), std::nullopt, std::nullopt).error().code,
      ErrorCode::not_found);
  ASSERT_TRUE(secrets_->remove("acme", "A"));
  EXPECT_EQ(secrets_->get("acme", "A").error().code, ErrorCode::not_found);
  EXPECT_EQ(secrets_->remove("acme", "A").error().code, ErrorCode::not_found);
  // An expired secret is gone (and its record with it).
  auto old = info("acme", "OLD");
  old.expires_ms = now_ms() - 1;
  ASSERT_TRUE(secrets_->create(old, "v"));
  EXPECT_EQ(secrets_->reveal("acme", "OLD").error().code, ErrorCode::not_found);
  EXPECT_TRUE(secrets_->list("acme").value().empty());
  EXPECT_TRUE(store_->scan("x").value().empty());
}

TEST_F(SecretStoreTest, ASealedValueOpensOnlyAsItselfAndUnderItsKey) {
  ASSERT_TRUE(secrets_->create(info("acme", "A"), "value-a"));
  ASSERT_TRUE(secrets_->create(info("evil", "B"), "value-b"));
  // A record copied under another tenant's name does not open there (sealed with its name).
  std::string a_key = std::string("xacme") + '\0' + "A";
  std::string b_key = std::string("xevil") + '\0' + "B";
  auto a = store_->get(a_key).value().value();
  ASSERT_TRUE(store_->put(b_key, a, true));
  EXPECT_EQ(secrets_->reveal("evil", "B").error().code, ErrorCode::corrupt);
  // Another key file: nothing opens.
  auto other = SecretStore::open(*store_, dir_ / "other.key");
  ASSERT_TRUE(other);
  EXPECT_EQ((*other)->reveal("acme", "A").error().code, ErrorCode::corrupt);
  EXPECT_EQ(secrets_->reveal("acme", "A").value(), "value-a");
}

// Where a value may go (query, body, plain HTTP) is kept with the secret, changed by an update;
// a record written before it existed ("s1") reads as headers over HTTPS only.
TEST_F(SecretStoreTest, KeepsWhereAValueMayGoAndReadsOlderRecords) {
  auto i = info("acme", "Q");
  i.use = {true, false, true};
  ASSERT_TRUE(secrets_->create(i, "value-q"));
  EXPECT_EQ(secrets_->get("acme", "Q").value().use, (SecretUse{true, false, true}));
  ASSERT_TRUE(secrets_->update("acme", "Q", std::nullopt, std::nullopt, std::nullopt,
                               SecretUse{false, true, false}));
  EXPECT_EQ(secrets_->get("acme", "Q").value().use, (SecretUse{false, true, false}));
  // The same record as an older daemon wrote it: "s1", no use byte (after the 28 bytes of times
  // and version).
  std::string key = std::string("xacme") + '\0' + "Q";
  auto now = store_->get(key).value().value();
  ASSERT_EQ(now.substr(0, 2), "s2");
  ASSERT_TRUE(store_->put(key, "s1" + now.substr(2, 28) + now.substr(31), true));
  auto old = secrets_->get("acme", "Q");
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(old->use, SecretUse{});
  EXPECT_EQ(old->hosts, std::vector<std::string>{"api.example.com"});
  EXPECT_EQ(secrets_->reveal("acme", "Q").value(), "value-q");
}

// A sandbox's binding (its placeholders, header rules and CA) is kept sealed, opens only as that
// sandbox's, and goes with unbind.
TEST_F(SecretStoreTest, BindingsAreSealedPerSandbox) {
  SecretBinding b;
  b.tenant = "acme";
  b.sandbox = "sbx_aaaaaaaaaaaaaaaa";
  b.placeholders = {{"GITHUB_TOKEN", "pds_secret_one"}, {"NPM_TOKEN", "pds_secret_two"}};
  b.ca_cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  b.ca_key = "-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n-----END PRIVATE KEY-----\n";
  b.rules = {{"api.example.com", "Authorization", "Bearer ${e2b.secrets.k}"},
             {"*.example.com", "X-Literal", "literal-rule-value"}};
  EXPECT_EQ(secrets_->binding(b.sandbox).value(), std::nullopt);
  ASSERT_TRUE(secrets_->bind(b));
  auto got = secrets_->binding(b.sandbox).value();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tenant, "acme");
  EXPECT_EQ(got->placeholders, b.placeholders);
  EXPECT_EQ(got->ca_cert, b.ca_cert);
  EXPECT_EQ(got->ca_key, b.ca_key);
  EXPECT_EQ(got->rules, b.rules);
  EXPECT_EQ(secrets_->bound().value(), std::vector<std::string>{b.sandbox});
  // The CA's key and the rules' values are nowhere in the clear.
  auto rows = store_->scan("").value();  // (kept: a loop over a temporary's value() dangles)
  for (auto& [k, v] : rows) {
    EXPECT_EQ(v.find("secret-key-bytes"), std::string::npos) << k;
    EXPECT_EQ(v.find("literal-rule-value"), std::string::npos) << k;
  }
  // Copied under another sandbox's key: it does not open there.
  auto raw = store_->get("b" + b.sandbox).value().value();
  ASSERT_TRUE(store_->put("bsbx_bbbbbbbbbbbbbbbb", raw, true));
  EXPECT_EQ(secrets_->binding("sbx_bbbbbbbbbbbbbbbb").error().code, ErrorCode::corrupt);
  ASSERT_TRUE(secrets_->unbind(b.sandbox));
  EXPECT_EQ(secrets_->binding(b.sandbox).value(), std::nullopt);
  // (the secrets' own rows are not bindings)
  ASSERT_TRUE(secrets_->create(info("acme", "A"), "v"));
  EXPECT_EQ(secrets_->bound().value(), std::vector<std::string>{"sbx_bbbbbbbbbbbbbbbb"});
}

TEST_F(SecretStoreTest, TheKeyFileIsPrivateAndChecked) {
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "secrets.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  // Reopened: the same key (values still open).
  ASSERT_TRUE(secrets_->create(info("acme", "A"), "v"));
  auto again = SecretStore::open(*store_, dir_ / "secrets.key");
  ASSERT_TRUE(again);
  EXPECT_EQ((*again)->reveal("acme", "A").value(), "v");
  // Readable by others, or of another size: refused.
  ::chmod((dir_ / "secrets.key").c_str(), 0644);
  EXPECT_EQ(SecretStore::open(*store_, dir_ / "secrets.key").error().code, ErrorCode::corrupt);
  std::ofstream(dir_ / "short.key") << "abc";
  ::chmod((dir_ / "short.key").c_str(), 0600);
  EXPECT_EQ(SecretStore::open(*store_, dir_ / "short.key").error().code, ErrorCode::corrupt);
}

}  // namespace
}  // namespace pandastack::storage
