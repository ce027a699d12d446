// Integration tests of sandbox networking with real VMs: egress policies, isolation from the host
// and from other sandboxes, clean removal, forks. All traffic goes to an "upstream" network
// namespace this test creates itself (198.18.0.0/15 addresses inside it), never anywhere else.
#include "vmm-driver/network.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "tests/integration/test_env.h"
#include "vmm-driver/snapshot.h"
#include "vmm-driver/templates.h"
#include "vmm-driver/vm.h"

namespace pandastack::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono;
using vmm::EgressPolicy;

constexpr const char* kUpNs = "pnt-upstream";  // not <prefix>-<digits>: never taken for a sandbox's
constexpr const char* kUpLink = "upnt0";       // not matching the prefix: an ordinary host link
// RFC 1918 (three), CGNAT: /24s the upstream namespace also answers on.
constexpr const char* kPrivateNets[] = {"10.77.0", "172.16.77", "192.168.77", "100.64.77"};

class NetworkTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    settings_.pool_cidr = "10.231.0.0/24";
    settings_.prefix = "pnt";
    // The upstream's addresses are in a reserved range (198.18/15): the operator allows it.
    settings_.reserved_allowed = {"198.18.0.0/15"};
    vmm::Network::remove_leftovers(settings_, {});
    auto host = vmm::Network::install_host_rules(settings_);
    if (!host) {
      ADD_FAILURE() << host.error().message;
      return;
    }
    // The upstream: a namespace with two addresses and an HTTP server on each.
    std::system((std::string("ip netns del ") + kUpNs + " 2>/dev/null; ip link del " + kUpLink +
                 " 2>/dev/null")
                    .c_str());
    std::string up = std::string("ip netns add ") + kUpNs + " && ip link add " + kUpLink +
                     " type veth peer name eth0 netns " + kUpNs +
                     " && ip addr add 198.18.0.1/24 dev " + kUpLink +
                     " && ip addr add 198.18.1.1/24 dev " + kUpLink + " && ip link set " + kUpLink +
                     " up && ip -n " + kUpNs + " addr add 198.18.0.2/24 dev eth0 && ip -n " +
                     kUpNs + " addr add 198.18.1.2/24 dev eth0 && ip -n " + kUpNs +
                     " link set eth0 up && ip -n " + kUpNs + " link set lo up";
    // Private ranges on the same upstream: no sandbox may reach them unless the operator says.
    for (auto net : kPrivateNets)
      up += std::string(" && ip addr add ") + net + ".1/24 dev " + kUpLink + " && ip -n " + kUpNs +
            " addr add " + net + ".2/24 dev eth0";
    if (std::system(up.c_str()) != 0) {
      ADD_FAILURE() << "cannot build the upstream namespace";
      return;
    }
    std::vector<std::string> addrs = {"198.18.0.2", "198.18.1.2"};
    for (auto net : kPrivateNets) addrs.push_back(std::string(net) + ".2");
    for (auto& a : addrs) {
      const char* addr = a.c_str();
      pid_t pid = ::fork();
      if (pid == 0) {
        ::execlp("ip", "ip", "netns", "exec", kUpNs, "python3", "-m", "http.server", "--bind", addr,
                 "8080", (char*)nullptr);
        ::_exit(127);
      }
      servers_.push_back(pid);
    }
    // A listener on the host, on every address: a sandbox must never reach it.
    host_listener_ = ::fork();
    if (host_listener_ == 0) {
      ::execlp("python3", "python3", "-m", "http.server", "--bind", "0.0.0.0", "18089",
               (char*)nullptr);
      ::_exit(127);
    }
    // Wait for the servers.
    for (int i = 0; i < 100; ++i) {
      if (std::system((std::string("ip netns exec ") + kUpNs +
                       " python3 -c \"import socket; socket.create_connection(('198.18.1.2', "
                       "8080), 1)\" 2>/dev/null")
                          .c_str()) == 0)
        break;
      std::this_thread::sleep_for(milliseconds(100));
    }

    store_ = new vmm::TemplateStore(io(), images_dir());
    auto shape = store_->config("base", shm("shape"));
    auto baked = store_->baked("base", shape);
    if (!baked) {
      ADD_FAILURE() << "bake failed: " << baked.error().message;
      return;
    }
    auto staged = vmm::stage_snapshot(*baked, shm("template"));
    if (!staged) {
      ADD_FAILURE() << staged.error().message;
      return;
    }
    template_ = new vmm::Snapshot(*staged);
  }
  static void TearDownTestSuite() {
    for (pid_t p : servers_) ::kill(p, SIGTERM);
    if (host_listener_ > 0) ::kill(host_listener_, SIGTERM);
    for (pid_t p : servers_) ::waitpid(p, nullptr, 0);
    if (host_listener_ > 0) ::waitpid(host_listener_, nullptr, 0);
    std::system((std::string("ip netns del ") + kUpNs + " 2>/dev/null; ip link del " + kUpLink +
                 " 2>/dev/null")
                    .c_str());
    vmm::Network::remove_host_rules(settings_);
    if (template_) vmm::remove_snapshot(template_->dir);
    delete template_;
    delete store_;
  }
  void SetUp() override { ASSERT_NE(template_, nullptr); }

  static fs::path shm(const std::string& tag) {
    static int n = 0;
    return fs::path("/dev/shm") /
           ("pnt-" + std::to_string(::getpid()) + "-" + tag + "-" + std::to_string(n++));
  }

  static std::shared_ptr<vmm::Network> network(uint32_t index, EgressPolicy policy) {
    auto n = vmm::Network::create(settings_, index, policy);
    EXPECT_TRUE(n) << n.error().message;
    return n ? *n : nullptr;
  }

  static std::unique_ptr<vmm::Vm> restore(const vmm::Snapshot& from, const std::string& tag,
                                          std::shared_ptr<vmm::Network> net) {
    auto c = store_->config("base", shm(tag));
    c.network = std::move(net);
    auto vm = vmm::Vm::restore(io(), from, c);
    EXPECT_TRUE(vm) << vm.error().message;
    return vm ? std::move(*vm) : nullptr;
  }

  // "ok <first line>" when a TCP connection to addr:port worked and HTTP answered, else the error.
  static std::string fetch(vmm::Vm& vm, const std::string& addr, int port = 8080) {
    vmm::ExecRequest r;
    r.shell = "python3 -c \"import socket,sys\ntry:\n s=socket.create_connection(('" + addr + "'," +
              std::to_string(port) +
              "),3); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print('ok', "
              "s.recv(64).split(b'\\r\\n')[0].decode())\n"
              "except OSError as e: print('error', e)\"";
    r.timeout_ms = 60000;
    auto out = vm.agent().exec(r);
    if (!out) return "exec failed: " + out.error().message;
    auto s = out->stdout_data;
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s + out->stderr_data;
  }

  static vmm::NetworkSettings settings_;
  static std::vector<pid_t> servers_;
  static pid_t host_listener_;
  static vmm::TemplateStore* store_;
  static vmm::Snapshot* template_;
};
vmm::NetworkSettings NetworkTest::settings_;
std::vector<pid_t> NetworkTest::servers_;
pid_t NetworkTest::host_listener_ = -1;
vmm::TemplateStore* NetworkTest::store_ = nullptr;
vmm::Snapshot* NetworkTest::template_ = nullptr;

bool ok(const std::string& fetched) { return fetched.rfind("ok HTTP/1.0 200", 0) == 0; }

TEST_F(NetworkTest, AllowlistDenyAllAndAllowAllAreEnforcedAndChangeable) {
  EgressPolicy list;
  list.mode = EgressPolicy::Mode::allowlist;
  list.cidrs = {"198.18.0.2/32"};
  auto vm = restore(*template_, "policy", network(1, list));
  ASSERT_NE(vm, nullptr);
  EXPECT_TRUE(ok(fetch(*vm, "198.18.0.2"))) << "allowed CIDR";
  auto refused = fetch(*vm, "198.18.1.2");
  EXPECT_EQ(refused.rfind("error", 0), 0u) << refused;

  auto* net = vm->config().network.get();
  ASSERT_TRUE(net->set_policy(EgressPolicy{}));  // deny_all
  EXPECT_EQ(fetch(*vm, "198.18.0.2").rfind("error", 0), 0u);
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  ASSERT_TRUE(net->set_policy(all));
  EXPECT_TRUE(ok(fetch(*vm, "198.18.1.2")));
  EXPECT_TRUE(ok(fetch(*vm, "198.18.0.2")));
}

// The host's private networks are out of reach of every policy, allow_all included, unless the
// operator allows a range (--allow-private-egress): a prompt-injected agent does not reach the
// VPC's databases or a cloud's metadata service at 100.100.100.200.
TEST_F(NetworkTest, NoPolicyReachesPrivateRangesUnlessTheOperatorAllowsThem) {
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  auto vm = restore(*template_, "private", network(7, all));
  ASSERT_NE(vm, nullptr);
  EXPECT_TRUE(ok(fetch(*vm, "198.18.0.2"))) << "the operator allowed 198.18/15";
  for (auto net : kPrivateNets) {
    auto r = fetch(*vm, std::string(net) + ".2");
    EXPECT_EQ(r.rfind("error", 0), 0u) << net << ".2: " << r;
  }
  // An allowlist naming a private address does not open it either.
  EgressPolicy list;
  list.mode = EgressPolicy::Mode::allowlist;
  list.cidrs = {"10.77.0.2/32", "198.18.0.2/32"};
  ASSERT_TRUE(vm->config().network->set_policy(list));
  EXPECT_EQ(fetch(*vm, "10.77.0.2").rfind("error", 0), 0u);
  EXPECT_TRUE(ok(fetch(*vm, "198.18.0.2")));
  vm.reset();
  // The operator allows 192.168.77.0/24: that range (only) is reachable like a public one.
  auto open = settings_;
  open.reserved_allowed.push_back("192.168.77.0/24");
  auto n = vmm::Network::create(open, 7, all);
  ASSERT_TRUE(n) << n.error().message;
  auto vm2 = restore(*template_, "private2", *n);
  ASSERT_NE(vm2, nullptr);
  EXPECT_TRUE(ok(fetch(*vm2, "192.168.77.2")));
  EXPECT_EQ(fetch(*vm2, "10.77.0.2").rfind("error", 0), 0u);
  EXPECT_EQ(fetch(*vm2, "100.64.77.2").rfind("error", 0), 0u);
}

TEST_F(NetworkTest, GuestReachesNeitherTheHostNorAnotherSandbox) {
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  auto a = restore(*template_, "iso-a", network(2, all));
  auto b = restore(*template_, "iso-b", network(3, all));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto pool = *vmm::SubnetPool::parse(settings_.pool_cidr);
  // The host's listener answers on every host address; from the sandbox, none works: not its own
  // gateway (the veth's host end), not the host's address on the upstream link.
  for (auto addr : {pool.host_address(2), std::string("198.18.0.1"), std::string("198.18.1.1")}) {
    auto r = fetch(*a, addr, 18089);
    EXPECT_EQ(r.rfind("error", 0), 0u) << addr << ": " << r;
  }
  // B serves HTTP; A reaches neither B's namespace address nor anything in the pool.
  vmm::ExecRequest serve;
  serve.shell = "cd /tmp && exec python3 -m http.server 8080";
  serve.timeout_ms = 0;
  ASSERT_TRUE(b->agent().start_process(serve));
  for (int i = 0; i < 50 && !ok(fetch(*b, "127.0.0.1")); ++i)
    std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(ok(fetch(*b, "127.0.0.1"))) << "B's server did not start";
  for (auto addr : {pool.ns_address(3), pool.host_address(3)}) {
    auto r = fetch(*a, addr);
    EXPECT_EQ(r.rfind("error", 0), 0u) << addr << ": " << r;
  }
  // ... while the upstream works for both.
  EXPECT_TRUE(ok(fetch(*a, "198.18.0.2")));
  EXPECT_TRUE(ok(fetch(*b, "198.18.0.2")));
}

TEST_F(NetworkTest, KilledSandboxLeavesNoNamespaceLinkOrTable) {
  auto vm = restore(*template_, "gone", network(4, EgressPolicy{}));
  ASSERT_NE(vm, nullptr);
  EXPECT_TRUE(fs::exists("/run/netns/pnt-4"));
  EXPECT_TRUE(fs::exists("/sys/class/net/pnt4"));
  vm.reset();
  EXPECT_FALSE(fs::exists("/run/netns/pnt-4"));
  EXPECT_FALSE(fs::exists("/sys/class/net/pnt4"));
  EXPECT_TRUE(vmm::Network::list_namespaces("pnt").empty());
  // The index is free again: a new network on it comes up.
  auto again = network(4, EgressPolicy{});
  EXPECT_NE(again, nullptr);
}

TEST_F(NetworkTest, ForkedChildHasItsOwnWorkingNetwork) {
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  auto parent = restore(*template_, "parent", network(5, all));
  ASSERT_NE(parent, nullptr);
  ASSERT_TRUE(ok(fetch(*parent, "198.18.0.2")));  // the parent's ARP cache knows its gateway
  auto snap = parent->snapshot(shm("fork"));
  ASSERT_TRUE(snap) << snap.error().message;
  EgressPolicy list;
  list.mode = EgressPolicy::Mode::allowlist;
  list.cidrs = {"198.18.1.0/24"};
  auto child = restore(*snap, "child", network(6, list));
  ASSERT_NE(child, nullptr);
  EXPECT_TRUE(ok(fetch(*child, "198.18.1.2")));
  EXPECT_EQ(fetch(*child, "198.18.0.2").rfind("error", 0), 0u) << "the child has its own policy";
  EXPECT_TRUE(ok(fetch(*parent, "198.18.0.2"))) << "the parent keeps its network";
  vmm::remove_snapshot(snap->dir);
}

// An HTTP GET to 127.0.0.1:port from this (host) process: the status line, or "" on failure.
std::string host_get(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req = "GET / HTTP/1.0\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
    }
  }
  ::close(fd);
  return out.substr(0, out.find("\r\n"));
}

TEST_F(NetworkTest, ExposedGuestPortIsReachableFromTheHostUntilUnexposed) {
  auto vm =
      restore(*template_, "ports", network(7, EgressPolicy{}));  // deny_all: inbound still works
  ASSERT_NE(vm, nullptr);
  vmm::ExecRequest serve;
  serve.shell = "cd /tmp && echo hello > index.html && exec python3 -m http.server 8000";
  serve.timeout_ms = 0;
  ASSERT_TRUE(vm->agent().start_process(serve));
  auto* net = vm->config().network.get();
  auto port = net->expose(8000, "127.0.0.1");
  ASSERT_TRUE(port) << port.error().message;
  EXPECT_EQ(*net->expose(8000, "127.0.0.1"), *port) << "exposing again gives the same port";
  std::string got;
  for (int i = 0; i < 100 && got.rfind("HTTP/1.0 200", 0) != 0; ++i) {
    got = host_get(*port);
    if (got.rfind("HTTP/1.0 200", 0) != 0) std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(got, "HTTP/1.0 200 OK");
  // Several at once.
  std::vector<std::thread> clients;
  std::vector<std::string> results(8);
  for (int i = 0; i < 8; ++i) clients.emplace_back([&, i] { results[i] = host_get(*port); });
  for (auto& t : clients) t.join();
  for (auto& r : results) EXPECT_EQ(r, "HTTP/1.0 200 OK");
  EXPECT_EQ(net->exposed().at(8000), *port);
  net->unexpose(8000);
  EXPECT_EQ(host_get(*port), "");
  EXPECT_TRUE(net->exposed().empty());
}

TEST_F(NetworkTest, SandboxWithoutNetworkHasNoRouteOut) {
  auto vm = restore(*template_, "none", nullptr);
  ASSERT_NE(vm, nullptr);
  // eth0 is down: a connect fails at once (not after its 3 s timeout) and so does a name lookup
  // (nothing leaves the guest: no route at all).
  auto r = fetch(*vm, "198.18.0.2");
  EXPECT_EQ(r.rfind("error", 0), 0u) << r;
  EXPECT_NE(r.find("unreachable"), std::string::npos) << r;
  vmm::ExecRequest lookup;
  lookup.shell =
      "python3 -c \"import socket,time\nt=time.time()\ntry: "
      "socket.getaddrinfo('pandastack.invalid', "
      "80)\nexcept OSError: pass\nprint(time.time()-t)\"";
  lookup.timeout_ms = 60000;
  auto out = vm->agent().exec(lookup);
  ASSERT_TRUE(out) << out.error().message;
  EXPECT_LT(std::stod(out->stdout_data), 0.5)
      << "a name lookup waited for a resolver that is not there";

  // Its snapshot restored on a network: eth0 comes back up, with its address and route.
  auto dir = shm("none-snap");
  auto snap = vm->snapshot(dir);
  ASSERT_TRUE(snap) << snap.error().message;
  EgressPolicy all;
  all.mode = EgressPolicy::Mode::allow_all;
  auto again = restore(*snap, "none-then-net", network(8, all));
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(ok(fetch(*again, "198.18.0.2")));
  vmm::remove_snapshot(dir);
}

}  // namespace
}  // namespace pandastack::testing
