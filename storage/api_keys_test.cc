#include "storage/api_keys.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace pandastack::storage {
namespace {

namespace fs = std::filesystem;

class KeyStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keys-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    auto s = EventStore::open({dir_, true, 1024, {}});
    ASSERT_TRUE(s);
    store_ = std::move(*s);
    keys_ = std::make_unique<KeyStore>(*store_);
  }
  void TearDown() override {
    keys_.reset();
    store_.reset();
    fs::remove_all(dir_);
  }
  fs::path dir_;
  std::unique_ptr<EventStore> store_;
  std::unique_ptr<KeyStore> keys_;
};

TEST_F(KeyStoreTest, CreateVerifyRevoke) {
  auto k = keys_->create("acme", false);
  ASSERT_TRUE(k) << k.error().message;
  const std::string& token = k->first;
  EXPECT_EQ(token.rfind("pds_", 0), 0u);
  auto v = keys_->verify(token);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->tenant, "acme");
  EXPECT_FALSE(v->admin);
  EXPECT_EQ(v->id, k->second.id);
  // By its id too (what credentials issued under a key check: E2B access tokens).
  auto f = keys_->find(k->second.id);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tenant, "acme");
  EXPECT_EQ(keys_->find("nosuchkeyaaa").error().code, ErrorCode::not_found);
  EXPECT_EQ(keys_->find("../../etc").error().code, ErrorCode::not_found);
  ASSERT_TRUE(keys_->revoke(k->second.id));
  EXPECT_EQ(keys_->verify(token).error().code, ErrorCode::not_found);
  EXPECT_EQ(keys_->find(k->second.id).error().code, ErrorCode::not_found);
  EXPECT_EQ(keys_->revoke(k->second.id).error().code, ErrorCode::not_found);
}

TEST_F(KeyStoreTest, TheSecretIsNeverStored) {
  auto k = keys_->create("acme", true);
  ASSERT_TRUE(k);
  std::string secret = k->first.substr(k->first.rfind('_') + 1);
  auto rows = store_->scan("");
  ASSERT_TRUE(rows);
  for (auto& [key, value] : *rows) {
    EXPECT_EQ(key.find(secret), std::string::npos);
    EXPECT_EQ(value.find(secret), std::string::npos);
  }
}

TEST_F(KeyStoreTest, RejectsWrongAndMalformedTokens) {
  auto k = keys_->create("acme", false);
  ASSERT_TRUE(k);
  std::string wrong = k->first;
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  EXPECT_EQ(keys_->verify(wrong).error().code, ErrorCode::not_found);
  for (std::string bad :
       std::vector<std::string>{"", "pds_", "Bearer x", "pds_" + std::string(60, 'a'),
                                k->first + "x", "pdx_" + k->first.substr(4)})
    EXPECT_EQ(keys_->verify(bad).error().code, ErrorCode::not_found) << bad;
  EXPECT_EQ(keys_->create("", false).error().code, ErrorCode::invalid_argument);
}

TEST_F(KeyStoreTest, ListsKeysWithTenants) {
  ASSERT_TRUE(keys_->create("a", true));
  ASSERT_TRUE(keys_->create("b", false));
  auto l = keys_->list();
  ASSERT_TRUE(l);
  ASSERT_EQ(l->size(), 2u);
  int admins = 0;
  for (auto& k : *l) admins += k.admin;
  EXPECT_EQ(admins, 1);
}

}  // namespace
}  // namespace pandastack::storage
