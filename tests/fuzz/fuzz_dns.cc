// The platform resolver's packet parsing (vmm-driver/dns.h): a guest sends it arbitrary bytes,
// and the upstream's answers are parsed too; so is the header of a packet the sandbox's ruleset
// refused (vmm-driver/egress_log.h, the egress log: the guest wrote those bytes as well). Nothing
// crashes; whatever the resolver refuses (any packet of 12 bytes or more that is not a plain query
// of an allowed name) gets a REFUSED answer that keeps the question's name and is never a query.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "vmm-driver/dns.h"
#include "vmm-driver/egress_log.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace dns = pandastack::vmm::dns;
  std::string packet(reinterpret_cast<const char*>(data), size);
  (void)dns::a_records(packet);
  auto name = dns::question_name(packet);
  if (name) (void)dns::allowed(*name, {"example.com", "*.example.org"});
  (void)dns::plain_query(packet);
  (void)dns::question_type(packet);
  if (auto d = pandastack::vmm::egress::parse_ipv4(data, size); d && size < 20) std::abort();
  if (packet.size() < 12) return 0;  // the resolver drops those
  auto r = dns::refused(packet);
  if (name && dns::question_name(r) != name) std::abort();
  if (dns::plain_query(r)) std::abort();  // an answer (QR set), never a query again
  return 0;
}
