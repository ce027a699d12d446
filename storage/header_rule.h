// A header a sandbox's HTTPS requests to a host carry, put in by its egress proxy (E2B's network
// rules: `{host: [{transform: {headers: {Authorization: "Bearer ${e2b.secrets.NAME}"}}}]}`). Kept
// in the sandbox's sealed secrets binding (storage/secrets.h); matched and resolved by
// actors/header_rules.h.
#pragma once

#include <string>

namespace pandastack::storage {

struct HeaderRule {
  // "api.example.com", "*.example.com" (its subdomains at any depth, not the apex) or an IPv4
  // address; lower case.
  std::string host;
  std::string header;  // the header's name as given (matched without case)
  // Its value: text and ${e2b.secrets.NAME} markers, each replaced by the tenant's secret NAME's
  // value at each request (a rotation shows at the next one).
  std::string value;
  bool operator==(const HeaderRule&) const = default;
};

}  // namespace pandastack::storage
