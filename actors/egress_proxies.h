// A sandbox's egress proxy (issue 35; vmm-driver/egress_proxy.h): started on each VM's network of
// a sandbox with bound secrets (actors/secrets.h), its own connections held to the sandbox's
// egress rules (made inside the sandbox's namespace), each request that carried a placeholder
// written to the sandbox's egress log. And what the guest needs to use it: the sandbox's CA in its
// trust store (installed at create), a placeholder per secret in its processes' environment.
#pragma once

#include <map>
#include <string>

#include "vmm-driver/agent_client.h"
#include "vmm-driver/error.h"

namespace pandastack::vmm {
class Network;
}  // namespace pandastack::vmm

namespace pandastack::actors {

struct Env;

// Where the guest keeps the sandbox's CA, and the bundle it is added to (Debian's).
inline constexpr const char* kGuestCaFile =
    "/usr/local/share/ca-certificates/pandastack-egress.crt";
inline constexpr const char* kGuestCaBundle = "/etc/ssl/certs/ca-certificates.crt";

// Starts sandbox `id`'s egress proxy on `n` (its guest's TCP 443 and 80 redirected to it) when
// the sandbox has bound secrets; nothing when it has none. Stopped with the network.
vmm::Status start_egress_proxy(Env& env, vmm::Network& n, const std::string& id);

// What each process of sandbox `id` gets on top of its own environment: NAME=placeholder per
// bound secret and the trust store's paths for the usual TLS clients (OpenSSL, curl, Python
// requests, Node). Empty for a sandbox without secrets.
std::map<std::string, std::string> secret_env(Env& env, const std::string& id);

// The command (run as root) that adds `ca_pem` to the guest's trust store.
vmm::ExecRequest trust_ca_request(const std::string& ca_pem);

}  // namespace pandastack::actors
