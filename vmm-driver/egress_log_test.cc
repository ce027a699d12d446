// Unit tests of the egress log (bounded, paged, forwarded) and of the netlink parsers it is fed by.
#include "vmm-driver/egress_log.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/netfilter/nf_conntrack_tcp.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>

#include <cstring>

namespace pandastack::vmm {
namespace {

EgressEntry dns_entry(const std::string& name, bool ok) {
  EgressEntry e;
  e.kind = EgressEntry::Kind::dns;
  e.name = name;
  e.allowed = ok;
  if (!ok) e.reason = "policy";
  return e;
}

EgressEntry conn(const std::string& dst, uint16_t port) {
  EgressEntry e;
  e.protocol = "tcp";
  e.destination = dst;
  e.port = port;
  return e;
}

TEST(EgressLog, KeepsTheNewestAndPagesByCursor) {
  EgressLog log(3);
  for (int i = 0; i < 5; ++i) log.add(dns_entry("n" + std::to_string(i) + ".test", true));
  auto all = log.read({});
  ASSERT_EQ(all.entries.size(), 3u);
  EXPECT_EQ(all.entries.front().seq, 3u);
  EXPECT_EQ(all.entries.front().name, "n2.test");
  EXPECT_EQ(all.dropped, 2u);
  EXPECT_EQ(all.next_after, 5u);
  EgressQuery q;
  q.after = 3;
  q.limit = 1;
  auto page = log.read(q);
  ASSERT_EQ(page.entries.size(), 1u);
  EXPECT_EQ(page.entries[0].seq, 4u);
  EXPECT_EQ(page.next_after, 4u);
  q.after = 5;
  EXPECT_TRUE(log.read(q).entries.empty());
  EXPECT_EQ(log.read(q).next_after, 5u);  // (an empty page keeps the cursor)
}

TEST(EgressLog, FiltersByKindAndVerdict) {
  EgressLog log;
  log.add(dns_entry("a.test", true));
  log.add(dns_entry("b.test", false));
  log.connection_opened(7, conn("192.0.2.1", 443));
  EgressQuery q;
  q.kind = EgressEntry::Kind::dns;
  q.allowed = false;
  auto page = log.read(q);
  ASSERT_EQ(page.entries.size(), 1u);
  EXPECT_EQ(page.entries[0].name, "b.test");
  EXPECT_EQ(page.entries[0].reason, "policy");
  EXPECT_EQ(page.next_after, 3u);  // the cursor passed what the filter left out
  q = {};
  q.kind = EgressEntry::Kind::connection;
  EXPECT_EQ(log.read(q).entries.at(0).destination, "192.0.2.1");
}

TEST(EgressLog, ConnectionsGetCountersAndNames) {
  EgressLog log;
  log.learn_name("192.0.2.1", "api.example.com");
  log.connection_opened(7, conn("192.0.2.1", 443));
  log.connection_opened(8, conn("192.0.2.9", 80));
  log.connection_ended(7, 100, 2000, 1234);
  log.connection_ended(99, 1, 1, 1);  // unknown: ignored
  auto e = log.read({}).entries;
  ASSERT_EQ(e.size(), 2u);
  EXPECT_TRUE(e[0].allowed);
  EXPECT_EQ(e[0].name, "api.example.com");
  EXPECT_EQ(e[0].bytes_out, 100u);
  EXPECT_EQ(e[0].bytes_in, 2000u);
  EXPECT_EQ(e[0].ended_ms, 1234);
  EXPECT_EQ(e[1].name, "");
  EXPECT_EQ(e[1].ended_ms, 0);
}

TEST(EgressLog, ForwardingMovesHistoryAndKeepsOpenConnections) {
  auto sandbox = std::make_shared<EgressLog>();
  sandbox->add(dns_entry("before.test", true));  // (an earlier VM of the same sandbox)
  EgressLog network;
  network.connection_opened(7, conn("192.0.2.1", 443));
  network.forward_to(sandbox);
  network.connection_ended(7, 5, 6, 99);  // after the move: lands on the sandbox's entry
  network.add(dns_entry("after.test", false));
  EXPECT_TRUE(network.read({}).entries.size() == 3);  // reads go through as well
  auto e = sandbox->read({}).entries;
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].name, "before.test");
  EXPECT_EQ(e[1].seq, 2u);
  EXPECT_EQ(e[1].bytes_in, 6u);
  EXPECT_EQ(e[2].name, "after.test");
}

TEST(EgressLog, SummariesSumWhatWasLoggedSinceTheLastOne) {
  auto sandbox = std::make_shared<EgressLog>(2);  // (the sums do not depend on what is kept)
  EXPECT_TRUE(sandbox->take_summary(10).empty());
  EgressLog network;
  network.add(dns_entry("api.test", true));
  network.forward_to(sandbox);  // (what the network logged is the sandbox's)
  sandbox->add(dns_entry("api.test", true));
  sandbox->add(dns_entry("evil.test", false));
  sandbox->learn_name("192.0.2.1", "api.test");
  sandbox->connection_opened(7, conn("192.0.2.1", 443));
  sandbox->connection_opened(8, conn("192.0.2.9", 80));
  auto denied = conn("10.0.0.1", 22);
  denied.kind = EgressEntry::Kind::connection;
  denied.reason = "reserved";
  sandbox->add(denied);
  sandbox->connection_ended(7, 100, 2000, 50);
  EgressEntry secret;
  secret.kind = EgressEntry::Kind::secret;
  secret.name = "api.test";
  secret.allowed = true;
  secret.injected = {"TOKEN"};
  sandbox->add(secret);
  secret.name = "evil.test";
  secret.allowed = false;
  sandbox->add(secret);

  auto s = sandbox->take_summary(1000);
  EXPECT_EQ(s.to_ms, 1000);
  EXPECT_GT(s.from_ms, 0);
  EXPECT_EQ(s.dns, (EgressCount{2, 1}));
  EXPECT_EQ(s.connections, (EgressCount{2, 1}));
  EXPECT_EQ(s.secret_requests, (EgressCount{1, 1}));
  EXPECT_EQ(s.bytes_out, 100u);
  EXPECT_EQ(s.bytes_in, 2000u);
  ASSERT_EQ(s.destinations.size(), 4u);  // api.test, evil.test, 192.0.2.9, 10.0.0.1
  EXPECT_EQ(s.destinations[0], (EgressDestination{"api.test", {4, 0}}));
  EXPECT_EQ(s.destinations[1], (EgressDestination{"evil.test", {0, 2}}));
  EXPECT_EQ(s.other_destinations, 0u);
  // The next period starts empty; an open connection's bytes count when it ends.
  EXPECT_TRUE(sandbox->take_summary(2000).empty());
  sandbox->connection_ended(8, 1, 2, 60);
  auto next = sandbox->take_summary(3000);
  EXPECT_EQ(next.bytes_in, 2u);
  EXPECT_EQ(next.connections, EgressCount{});
  EXPECT_TRUE(next.destinations.empty());
}

TEST(EgressLog, SummariesKeepTheMostUsedDestinations) {
  EgressLog log;
  for (int i = 0; i < 300; ++i)
    for (int k = 0; k < (i == 299 ? 3 : 1); ++k)
      log.add(dns_entry("n" + std::to_string(i) + ".test", true));
  auto s = log.take_summary(1);
  EXPECT_EQ(s.dns.allowed, 302u);
  ASSERT_EQ(s.destinations.size(), EgressSummary::kMaxDestinations);
  // n299 came past the bound of names tracked: counted among the others, per request.
  EXPECT_EQ(s.other_destinations, 256u - EgressSummary::kMaxDestinations + 44u + 2u);
}

// --- netlink parsers -----------------------------------------------------------------------

struct Msg {
  std::string b;
  std::vector<size_t> open;  // nested attributes being written
  Msg(uint16_t type, uint16_t flags = 0, uint32_t seq = 0) {
    b.resize(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)));
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = flags;
    h.nlmsg_seq = seq;
    std::memcpy(b.data(), &h, sizeof h);
    nfgenmsg g{};
    g.nfgen_family = AF_INET;
    std::memcpy(b.data() + NLMSG_HDRLEN, &g, sizeof g);
  }
  void attr(uint16_t type, const void* v, size_t n) {
    nlattr a{};
    a.nla_type = type;
    a.nla_len = uint16_t(NLA_HDRLEN + n);
    b.append(reinterpret_cast<char*>(&a), sizeof a);
    b.append(static_cast<const char*>(v), n);
    b.resize(NLA_ALIGN(b.size()));
  }
  void begin(uint16_t type) {
    open.push_back(b.size());
    nlattr a{};
    a.nla_type = uint16_t(type | NLA_F_NESTED);
    b.append(reinterpret_cast<char*>(&a), sizeof a);
  }
  void end() {
    size_t at = open.back();
    open.pop_back();
    uint16_t len = uint16_t(b.size() - at);
    std::memcpy(b.data() + at, &len, 2);
  }
  const uint8_t* data() {
    uint32_t len = uint32_t(b.size());
    std::memcpy(b.data(), &len, 4);
    return reinterpret_cast<const uint8_t*>(b.data());
  }
};

uint32_t ip(const char* a) {
  in_addr x{};
  inet_pton(AF_INET, a, &x);
  return x.s_addr;
}

Msg conntrack(uint8_t type, uint16_t flags = NLM_F_CREATE | NLM_F_EXCL, uint32_t seq = 0,
              uint8_t tcp_state = 0xff) {
  Msg m(uint16_t(NFNL_SUBSYS_CTNETLINK << 8 | type), flags, seq);
  m.begin(CTA_TUPLE_ORIG);
  m.begin(CTA_TUPLE_IP);
  uint32_t src = ip("172.31.255.2"), dst = ip("192.0.2.7");
  m.attr(CTA_IP_V4_SRC, &src, 4);
  m.attr(CTA_IP_V4_DST, &dst, 4);
  m.end();
  m.begin(CTA_TUPLE_PROTO);
  uint8_t proto = IPPROTO_TCP;
  uint16_t sport = htons(40000), dport = htons(443);
  m.attr(CTA_PROTO_NUM, &proto, 1);
  m.attr(CTA_PROTO_SRC_PORT, &sport, 2);
  m.attr(CTA_PROTO_DST_PORT, &dport, 2);
  m.end();
  m.end();
  uint32_t id = htonl(4242);
  m.attr(CTA_ID, &id, 4);
  if (tcp_state != 0xff) {
    m.begin(CTA_PROTOINFO);
    m.begin(CTA_PROTOINFO_TCP);
    m.attr(CTA_PROTOINFO_TCP_STATE, &tcp_state, 1);
    m.end();
    m.end();
  }
  if (type == IPCTNL_MSG_CT_DELETE || seq != 0) {
    uint64_t out = htobe64(1500), in = htobe64(70000), packets = htobe64(3);
    m.begin(CTA_COUNTERS_ORIG);
    m.attr(CTA_COUNTERS_PACKETS, &packets, 8);
    m.attr(CTA_COUNTERS_BYTES, &out, 8);
    m.end();
    m.begin(CTA_COUNTERS_REPLY);
    m.attr(CTA_COUNTERS_BYTES, &in, 8);
    m.end();
  }
  return m;
}

TEST(EgressParse, ConntrackNewAndDestroy) {
  auto m = conntrack(IPCTNL_MSG_CT_NEW);
  auto ev = egress::parse_conntrack(m.data(), m.b.size());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, egress::ConntrackEvent::Type::created);
  EXPECT_EQ(ev->seq, 0u);
  EXPECT_EQ(ev->id, 4242u);
  EXPECT_EQ(ev->sport, 40000);
  EXPECT_EQ(ev->protocol, IPPROTO_TCP);
  EXPECT_EQ(egress::address(ev->src), "172.31.255.2");
  EXPECT_EQ(egress::address(ev->dst), "192.0.2.7");
  EXPECT_EQ(ev->dport, 443);
  auto d = conntrack(IPCTNL_MSG_CT_DELETE);
  ev = egress::parse_conntrack(d.data(), d.b.size());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, egress::ConntrackEvent::Type::destroyed);
  EXPECT_EQ(ev->bytes_orig, 1500u);
  EXPECT_EQ(ev->bytes_reply, 70000u);
  // An update carrying the TCP state; the answer to a GET (its seq) with the counters.
  auto u = conntrack(IPCTNL_MSG_CT_NEW, 0, 0, TCP_CONNTRACK_TIME_WAIT);
  ev = egress::parse_conntrack(u.data(), u.b.size());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->type, egress::ConntrackEvent::Type::updated);
  EXPECT_TRUE(egress::tcp_ended(ev->tcp_state));
  EXPECT_FALSE(egress::tcp_ended(TCP_CONNTRACK_ESTABLISHED));
  auto g = conntrack(IPCTNL_MSG_CT_NEW, 0, 77);
  ev = egress::parse_conntrack(g.data(), g.b.size());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->seq, 77u);
  EXPECT_EQ(ev->bytes_reply, 70000u);
}

TEST(EgressParse, TheGetRequestNamesTheConnection) {
  auto m = conntrack(IPCTNL_MSG_CT_NEW);
  auto ev = egress::parse_conntrack(m.data(), m.b.size());
  ASSERT_TRUE(ev);
  auto req = egress::conntrack_get(*ev, 9);
  nlmsghdr h;
  std::memcpy(&h, req.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_len, req.size());
  EXPECT_EQ(h.nlmsg_type, NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET);
  EXPECT_EQ(h.nlmsg_seq, 9u);
  // Its tuple parses back (as a conntrack message would).
  h.nlmsg_type = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW;
  std::memcpy(req.data(), &h, sizeof h);
  auto back = egress::parse_conntrack(reinterpret_cast<const uint8_t*>(req.data()), req.size());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->src, ev->src);
  EXPECT_EQ(back->dst, ev->dst);
  EXPECT_EQ(back->sport, 40000);
  EXPECT_EQ(back->dport, 443);
  EXPECT_EQ(back->protocol, IPPROTO_TCP);
}

TEST(EgressParse, TruncatedOrForeignMessagesAreRefused) {
  auto m = conntrack(IPCTNL_MSG_CT_NEW);
  const uint8_t* p = m.data();
  for (size_t cut = 0; cut < m.b.size(); ++cut) {
    // A header claiming more than was read is refused; a shorter one parses what it holds.
    std::string copy(reinterpret_cast<const char*>(p), cut);
    EXPECT_FALSE(egress::parse_conntrack(reinterpret_cast<const uint8_t*>(copy.data()), cut));
  }
  Msg other(uint16_t(NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET));
  EXPECT_FALSE(egress::parse_conntrack(other.data(), other.b.size()));
  // An attribute whose length runs past the message stops the walk (no tuple: refused).
  Msg bad(uint16_t(NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW));
  bad.begin(CTA_TUPLE_ORIG);
  bad.end();
  uint16_t huge = 4000;
  std::memcpy(bad.b.data() + bad.b.size() - 4, &huge, 2);
  EXPECT_FALSE(egress::parse_conntrack(bad.data(), bad.b.size()));
}

TEST(EgressParse, NflogPacketGivesReasonAndDestination) {
  uint8_t pkt[28] = {0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, IPPROTO_UDP};
  uint32_t src = ip("172.31.255.2"), dst = ip("10.1.2.3");
  std::memcpy(pkt + 12, &src, 4);
  std::memcpy(pkt + 16, &dst, 4);
  pkt[20] = 0x9c;  // source port 40000
  pkt[21] = 0x40;
  pkt[22] = 0;  // destination port 53
  pkt[23] = 53;
  Msg m(uint16_t(NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET));
  m.attr(NFULA_PREFIX, "reserved", 9);
  m.attr(NFULA_PAYLOAD, pkt, sizeof pkt);
  auto d = egress::parse_nflog(m.data(), m.b.size());
  ASSERT_TRUE(d);
  EXPECT_EQ(d->prefix, "reserved");
  EXPECT_EQ(d->protocol, IPPROTO_UDP);
  EXPECT_EQ(egress::address(d->dst), "10.1.2.3");
  EXPECT_EQ(d->dport, 53);
  // A later fragment has no port; a bad header length is refused.
  pkt[6] = 0x00;
  pkt[7] = 0x10;
  EXPECT_EQ(egress::parse_ipv4(pkt, sizeof pkt)->dport, 0);
  pkt[0] = 0x4f;  // IHL 60 > 28 bytes
  EXPECT_FALSE(egress::parse_ipv4(pkt, sizeof pkt));
  EXPECT_FALSE(egress::parse_ipv4(pkt, 19));
}

}  // namespace
}  // namespace pandastack::vmm
