// Header rules (storage/header_rule.h; E2B's network rules) as the API takes them and the egress
// proxy applies them: the checks at create, which rules a request's host gets (E2B's precedence:
// the exact name's rules, else the longest matching wildcard's, never merged) and the markers a
// value holds. Pure functions; actors/secrets.h resolves the markers' values per request.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/sandbox.h"
#include "storage/header_rule.h"

namespace pandastack::actors::header_rules {

inline constexpr size_t kMaxHosts = 32;           // hosts with rules, per sandbox
inline constexpr size_t kMaxHeadersPerHost = 16;  // headers one host's rules set
inline constexpr size_t kMaxValueBytes = 4096;    // a header's value as given (markers unresolved)
inline constexpr size_t kMaxHeaderNameBytes = 128;

// The marker a value names a tenant's secret with, as E2B's `Secret.fill(name)` writes it.
inline constexpr const char* kSecretMarker = "${e2b.secrets.";

// A host pattern as the rules take it (lower-cased first): a DNS name, "*." + a DNS name, or an
// IPv4 address; a bare "*", a CIDR, a port or a wildcard in the middle are refused.
std::optional<Rejection> check_host(const std::string& host);

// Each rule's host, header name (an HTTP token, not one that frames or routes the request: Host,
// Content-Length, Transfer-Encoding, Connection, ...) and value (one line, at most
// kMaxValueBytes, markers well formed; E2B's workload identity markers are not served: 501), and
// the counts. The hosts are lower case already.
std::optional<Rejection> check(const std::vector<storage::HeaderRule>& rules);

// The secrets the values name, each once.
std::set<std::string> secret_names(const std::vector<storage::HeaderRule>& rules);

// The rules that apply to a request to `host` (lower case, no port), in their order: those of
// the host's exact name if it has any, else those of the longest wildcard matching it.
std::vector<const storage::HeaderRule*> for_host(const std::vector<storage::HeaderRule>& rules,
                                                 const std::string& host);

// A value cut into text and markers: {text, false} or {secret name, true}, in order.
std::vector<std::pair<std::string, bool>> parts(const std::string& value);

// Whether a header may carry `value` as it is: one line (no CR, LF or NUL).
bool one_line(const std::string& value);

}  // namespace pandastack::actors::header_rules
