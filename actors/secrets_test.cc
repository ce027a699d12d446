// The secrets service's bindings over a real store: placeholders, the sandbox's CA, the values
// the egress proxy gets, the environment processes get.
#include "actors/secrets.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "vmm-driver/egress_ca.h"

namespace pandastack::actors {
namespace {

namespace fs = std::filesystem;

class SecretsBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("secrets-binding-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    db_ = std::move(*storage::EventStore::open({dir_ / "db", true, 1024, {}}));
    store_ = std::move(*storage::SecretStore::open(*db_, dir_ / "secrets.key"));
    secrets_ = std::make_unique<Secrets>(*store_);
    for (auto [name, value] : {std::pair{"GITHUB_TOKEN", "ghp_1"}, {"NPM_TOKEN", "npm_1"}}) {
      SecretRequest r;
      r.tenant = "acme";
      r.name = name;
      r.value = value;
      r.hosts = {std::string(name) == "GITHUB_TOKEN" ? "api.github.com" : "registry.npmjs.org"};
      ASSERT_TRUE(secrets_->create(r));
    }
  }
  void TearDown() override {
    secrets_.reset();
    store_.reset();
    db_.reset();
    fs::remove_all(dir_);
  }
  fs::path dir_;
  std::unique_ptr<storage::EventStore> db_;
  std::unique_ptr<storage::SecretStore> store_;
  std::unique_ptr<Secrets> secrets_;
};

TEST_F(SecretsBindingTest, ABindingGivesPlaceholdersACaAndTheValuesForTheProxy) {
  EXPECT_FALSE(secrets_->env_of("sbx_a"));
  auto b = secrets_->bind("acme", "sbx_a", {"GITHUB_TOKEN", "NPM_TOKEN"});
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_EQ(b->placeholders.size(), 2u);
  EXPECT_NE(b->placeholders[0].second, b->placeholders[1].second);
  for (auto& [name, p] : b->placeholders) EXPECT_EQ(p.rfind("pds_secret_", 0), 0u) << name;
  // The CA is one the proxy can sign with.
  auto ca = vmm::EgressCa::load({b->ca_cert, b->ca_key});
  ASSERT_TRUE(ca) << ca.error().message;
  EXPECT_TRUE((*ca)->leaf("api.github.com"));
  // Processes get the placeholders (never the values).
  auto env = secrets_->env_of("sbx_a");
  ASSERT_TRUE(env);
  EXPECT_EQ(*env, (std::map<std::string, std::string>{{"GITHUB_TOKEN", b->placeholders[0].second},
                                                      {"NPM_TOKEN", b->placeholders[1].second}}));
  // The proxy gets the values now: a rotation shows; a deleted secret is left out.
  SecretRequest rot;
  rot.tenant = "acme";
  rot.name = "GITHUB_TOKEN";
  rot.value = "ghp_2";
  ASSERT_TRUE(secrets_->update(rot));
  auto bound = secrets_->bound_secrets("sbx_a");
  ASSERT_TRUE(bound);
  ASSERT_EQ(bound->size(), 2u);
  EXPECT_EQ((*bound)[0].value, "ghp_2");
  EXPECT_EQ((*bound)[0].hosts, std::vector<std::string>{"api.github.com"});
  ASSERT_TRUE(secrets_->remove("acme", "NPM_TOKEN"));
  bound = secrets_->bound_secrets("sbx_a");
  ASSERT_EQ(bound->size(), 1u);
  EXPECT_EQ((*bound)[0].name, "GITHUB_TOKEN");
  // Another sandbox of the tenant has nothing bound; after unbind neither has this one.
  EXPECT_TRUE(secrets_->bound_secrets("sbx_b")->empty());
  secrets_->unbind("sbx_a");
  EXPECT_FALSE(secrets_->env_of("sbx_a"));
  EXPECT_FALSE(*secrets_->binding("sbx_a"));
}

TEST_F(SecretsBindingTest, OnlyTheTenantsExistingSecretsBindOnce) {
  EXPECT_EQ(secrets_->bind("other", "sbx_a", {"GITHUB_TOKEN"}).error().code,
            Code::secret_not_found);
  EXPECT_EQ(secrets_->bind("acme", "sbx_a", {"NOPE"}).error().code, Code::secret_not_found);
  EXPECT_EQ(secrets_->bind("acme", "sbx_a", {"GITHUB_TOKEN", "GITHUB_TOKEN"}).error().code,
            Code::invalid_argument);
  EXPECT_EQ(secrets_->bind("acme", "sbx_a", {}).error().code, Code::invalid_argument);
  EXPECT_FALSE(*secrets_->binding("sbx_a"));
}

// A secret made through E2B's API: E2B's names, no hosts; kept, rotated, listed and deleted like
// any, never bound to a sandbox by name (E2B's network rules use it: HeaderRules... below).
TEST_F(SecretsBindingTest, E2bSecretsHaveE2bNamesAndNoHostsAndAreNotBound) {
  SecretRequest r;
  r.tenant = "acme";
  r.name = "openai-api.key_2";
  r.value = "sk-1";
  r.e2b = true;
  auto made = secrets_->create(r);
  ASSERT_TRUE(made) << made.error().message;
  EXPECT_TRUE(made->hosts.empty());
  for (auto bad : {"Upper", "-dash", "sec_x", "a/b", "", "a{b}"}) {
    r.name = bad;
    EXPECT_EQ(secrets_->create(r).error().code, Code::invalid_argument) << bad;
  }
  r.name = "with-hosts";
  r.hosts = std::vector<std::string>{"api.example.com"};
  EXPECT_EQ(secrets_->create(r).error().code, Code::invalid_argument);
  SecretRequest rot;
  rot.tenant = "acme";
  rot.name = "openai-api.key_2";
  rot.value = "sk-2";
  EXPECT_EQ(secrets_->update(rot)->version, 2u);
  EXPECT_EQ(secrets_->get("acme", "openai-api.key_2")->version, 2u);
  EXPECT_EQ(secrets_->bind("acme", "sbx_a", {"openai-api.key_2"}).error().code,
            Code::invalid_argument);
  EXPECT_TRUE(*secrets_->remove("acme", "openai-api.key_2"));
  EXPECT_EQ(secrets_->get("acme", "openai-api.key_2").error().code, Code::secret_not_found);
}

// Header rules (E2B's network rules): bound with or without named secrets; their headers are
// resolved per request (a rotation shows), only over HTTPS, for their host (exact name first,
// else the longest wildcard), and a secret that cannot be put in refuses the request.
TEST_F(SecretsBindingTest, HeaderRulesResolveTheirSecretsPerRequest) {
  SecretRequest e;
  e.tenant = "acme";
  e.name = "openai-key";
  e.value = "sk-1";
  e.e2b = true;
  ASSERT_TRUE(secrets_->create(e));
  std::vector<storage::HeaderRule> rules = {
      {"api.openai.com", "Authorization", "Bearer ${e2b.secrets.openai-key}"},
      {"api.openai.com", "X-Team", "agents"},
      {"*.openai.com", "Authorization", "wildcard ${e2b.secrets.openai-key}"},
      {"*.eu.openai.com", "X-Region", "eu"},
      {"api.github.com", "Authorization", "token ${e2b.secrets.GITHUB_TOKEN}"},
      {"api.github.com", "X-Literal", "x"}};
  // Checked at bind: an unknown secret, a native secret outside its hosts.
  auto unknown = rules;
  unknown.push_back({"a.example", "X-K", "${e2b.secrets.nope}"});
  EXPECT_EQ(secrets_->bind("acme", "sbx_r", {}, unknown).error().code, Code::secret_not_found);
  auto elsewhere = rules;
  elsewhere.push_back({"evil.example", "X-K", "${e2b.secrets.GITHUB_TOKEN}"});
  EXPECT_EQ(secrets_->bind("acme", "sbx_r", {}, elsewhere).error().code, Code::invalid_argument);
  EXPECT_EQ(secrets_->bind("other", "sbx_r", {}, rules).error().code, Code::secret_not_found);
  auto b = secrets_->bind("acme", "sbx_r", {}, rules);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_EQ((*secrets_->binding("sbx_r"))->rules, rules);
  // Bound without placeholders: the environment is empty but there (the CA's variables).
  auto env = secrets_->env_of("sbx_r");
  ASSERT_TRUE(env);
  EXPECT_TRUE(env->empty());

  using Set = std::vector<std::pair<std::string, std::string>>;
  auto h = secrets_->headers_for("sbx_r", "api.openai.com", true);
  EXPECT_EQ(h.set, (Set{{"Authorization", "Bearer sk-1"}, {"X-Team", "agents"}}));
  EXPECT_EQ(h.injected, std::vector<std::string>{"openai-key"});
  EXPECT_TRUE(h.refused.empty());
  // The longest wildcard, not merged with a shorter one; the apex gets none.
  EXPECT_EQ(secrets_->headers_for("sbx_r", "x.eu.openai.com", true).set, (Set{{"X-Region", "eu"}}));
  EXPECT_EQ(secrets_->headers_for("sbx_r", "chat.openai.com", true).set,
            (Set{{"Authorization", "wildcard sk-1"}}));
  EXPECT_TRUE(secrets_->headers_for("sbx_r", "openai.com", true).empty());
  EXPECT_TRUE(secrets_->headers_for("sbx_r", "example.org", true).empty());
  // A native secret for its own host.
  EXPECT_EQ(secrets_->headers_for("sbx_r", "api.github.com", true).set,
            (Set{{"Authorization", "token ghp_1"}, {"X-Literal", "x"}}));
  // Plain HTTP: not transformed, the secrets reported refused.
  h = secrets_->headers_for("sbx_r", "api.openai.com", false);
  EXPECT_TRUE(h.set.empty());
  EXPECT_EQ(h.refused, std::vector<std::string>{"openai-key"});
  EXPECT_EQ(h.why, "plain_http");
  // A rotation shows at the next request; a value that is not one line is refused.
  SecretRequest rot;
  rot.tenant = "acme";
  rot.name = "openai-key";
  rot.value = "sk-2";
  ASSERT_TRUE(secrets_->update(rot));
  EXPECT_EQ(secrets_->headers_for("sbx_r", "api.openai.com", true).set.at(0).second, "Bearer sk-2");
  rot.value = "sk-3\r\nX-Injected: 1";
  ASSERT_TRUE(secrets_->update(rot));
  h = secrets_->headers_for("sbx_r", "api.openai.com", true);
  EXPECT_TRUE(h.set.empty());
  EXPECT_EQ(h.why, "bad_value");
  // Deleted since: refused as unknown (the request is not sent without it).
  ASSERT_TRUE(secrets_->remove("acme", "openai-key"));
  h = secrets_->headers_for("sbx_r", "api.openai.com", true);
  EXPECT_TRUE(h.set.empty());
  EXPECT_EQ(h.refused, std::vector<std::string>{"openai-key"});
  EXPECT_EQ(h.why, "unknown_secret");
  // A fork that inherits gets the rules too.
  ASSERT_TRUE(*secrets_->inherit("sbx_r", "sbx_child"));
  EXPECT_EQ((*secrets_->binding("sbx_child"))->rules, rules);
}

// Recovery keeps the bindings of live sandboxes only.
TEST_F(SecretsBindingTest, RecoveryDropsTheBindingsOfSandboxesThatEnded) {
  for (auto id : {"sbx_live", "sbx_ended", "sbx_gone"})
    ASSERT_TRUE(secrets_->bind("acme", id, {"GITHUB_TOKEN"}));
  EXPECT_EQ(secrets_->unbind_all_but({"sbx_live", "sbx_never_bound"}), 2u);
  EXPECT_TRUE(*secrets_->binding("sbx_live"));
  EXPECT_FALSE(*secrets_->binding("sbx_ended"));
  EXPECT_FALSE(*secrets_->binding("sbx_gone"));
  EXPECT_EQ(secrets_->unbind_all_but({"sbx_live"}), 0u);
}

}  // namespace
}  // namespace pandastack::actors
