// The peer port's TLS (gateway/tls_stream.h) over an in-process pipe, with certificates made by
// scripts/cluster-certs.sh: bytes arrive whole both ways, and each side refuses what the cluster
// CA did not issue or what names another host.
#include "gateway/tls_stream.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pandastack::gateway {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TlsStreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("tls-test-" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    std::string certs = std::string(PANDASTACK_SOURCE_DIR) + "/scripts/cluster-certs.sh";
    for (auto& args :
         {"init " + (*dir_ / "pki").string(), "host " + (*dir_ / "pki").string() + " h1",
          "host " + (*dir_ / "pki").string() + " h2", "init " + (*dir_ / "other").string(),
          "host " + (*dir_ / "other").string() + " h2"})
      ASSERT_EQ(std::system((certs + " " + args + " > /dev/null").c_str()), 0) << args;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  // Host `id`'s credentials from PKI folder `pki`, trusting `ca_pki`'s CA (default: its own).
  static std::unique_ptr<TlsConfig> config(const std::string& pki, const std::string& id,
                                           std::string ca_pki = "") {
    auto d = *dir_ / pki / "hosts" / id;
    auto ca = ca_pki.empty() ? d / "ca.pem" : *dir_ / ca_pki / "ca.pem";
    return std::make_unique<TlsConfig>(read(ca), read(d / "host.pem"), read(d / "host.key"));
  }

  static fs::path* dir_;
};
fs::path* TlsStreamTest::dir_ = nullptr;

TEST_F(TlsStreamTest, BytesArriveWholeBothWaysAndEachSideNamesTheOther) {
  auto io = kj::setupAsyncIo();
  auto server = config("pki", "h1"), client = config("pki", "h2");
  auto pipe = io.provider->newTwoWayPipe();
  auto s = server->server(kj::mv(pipe.ends[0]));
  auto c = client->client(kj::mv(pipe.ends[1]), "h1");
  auto both = kj::joinPromises(kj::arr(s.then([](TlsConfig::Connected x) { return kj::mv(x); }),
                                       c.then([](TlsConfig::Connected x) { return kj::mv(x); })))
                  .wait(io.waitScope);
  EXPECT_EQ(both[0].peer, "h2");
  EXPECT_EQ(both[1].peer, "h1");
  // More than the buffers and a record hold, in several writes, both directions at once.
  std::string big(5 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 2654435761u >> 24);
  auto send = [&](kj::AsyncIoStream& to) {
    return to.write(big.data(), big.size() / 2).then([&to, &big]() {
      return to.write(big.data() + big.size() / 2, big.size() - big.size() / 2);
    });
  };
  auto got = [&](kj::AsyncIoStream& from) { return from.readAllBytes(big.size() + 1); };
  auto w1 = send(*both[1].stream).then([&]() { both[1].stream->shutdownWrite(); });
  auto w0 = send(*both[0].stream).then([&]() { both[0].stream->shutdownWrite(); });
  auto r0 = got(*both[0].stream);
  auto r1 = got(*both[1].stream);
  w1.wait(io.waitScope);
  w0.wait(io.waitScope);
  for (auto* r : {&r0, &r1}) {
    auto bytes = r->wait(io.waitScope);
    EXPECT_TRUE(std::string(bytes.asChars().begin(), bytes.size()) == big);
  }
}

TEST_F(TlsStreamTest, RefusesAnotherCaAndAnotherHostsName) {
  auto io = kj::setupAsyncIo();
  struct Case {
    const char *server_pki, *client_pki, *client_trusts, *name;
  };
  for (auto k : {Case{"pki", "other", "other", "h1"},  // a client of another CA
                 Case{"pki", "other", "pki", "h1"},   // the same, trusting ours: the server refuses
                 Case{"other", "pki", "pki", "h2"},   // a server of another CA
                 Case{"pki", "pki", "pki", "h9"}}) {  // the server is not the host meant
    SCOPED_TRACE(std::string(k.server_pki) + " " + k.client_pki + " " + k.name);
    auto server = config(k.server_pki, std::string(k.server_pki) == "pki" ? "h1" : "h2");
    auto client = config(k.client_pki, "h2", k.client_trusts);
    auto pipe = io.provider->newTwoWayPipe();
    auto s =
        server->server(kj::mv(pipe.ends[0]))
            .then([](TlsConfig::Connected) { return true; }, [](kj::Exception&&) { return false; });
    auto c =
        client->client(kj::mv(pipe.ends[1]), k.name)
            .then([](TlsConfig::Connected) { return true; }, [](kj::Exception&&) { return false; });
    auto c_ok = c.wait(io.waitScope);
    EXPECT_FALSE(c_ok && s.wait(io.waitScope));
  }
}

// The public API's TLS (pandastackd --tls-cert): a server that asks no client certificate takes
// a client whatever its own credentials (it authenticates in HTTP), and still proves its name;
// a key that is not the certificate's is refused when the server is set up.
TEST_F(TlsStreamTest, AServerOnlyConfigAsksNoClientCertificate) {
  auto io = kj::setupAsyncIo();
  auto d = *dir_ / "pki" / "hosts" / "h1";
  auto server = std::make_unique<TlsConfig>(read(d / "host.pem"), read(d / "host.key"));
  auto client = config("other", "h2", "pki");  // (of another CA: a mutual server refuses it)
  auto pipe = io.provider->newTwoWayPipe();
  auto s = server->server(kj::mv(pipe.ends[0]));
  auto c = client->client(kj::mv(pipe.ends[1]), "h1");
  auto conn = c.wait(io.waitScope);
  auto accepted = s.wait(io.waitScope);
  EXPECT_EQ(conn.peer, "h1");
  auto w = conn.stream->write("hello", 5);
  char got[5] = {};
  accepted.stream->read(got, 5).wait(io.waitScope);
  w.wait(io.waitScope);
  EXPECT_EQ(std::string(got, 5), "hello");
  auto other = *dir_ / "pki" / "hosts" / "h2";
  EXPECT_ANY_THROW(TlsConfig(read(d / "host.pem"), read(other / "host.key")));
}

}  // namespace
}  // namespace pandastack::gateway
