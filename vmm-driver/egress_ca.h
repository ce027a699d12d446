// A sandbox's own certificate authority, for the egress proxy that puts secrets into its HTTPS
// requests (vmm-driver/egress_proxy.h): the guest trusts this CA (and never the host's), the
// proxy presents a certificate it signed for each host the guest connects to. One CA per
// sandbox: a certificate minted for one sandbox is worth nothing to another.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

// A certificate and its private key, PEM.
struct PemPair {
  std::string cert, key;
};

class EgressCa {
 public:
  // How long a CA (and what it signs) is valid: a sandbox lives at most its TTL (a day by
  // default); the margin covers hibernations woken later and clock steps in the guest.
  static constexpr int kValidDays = 30;
  // Hosts with a minted certificate kept, at most (then the oldest are minted again).
  static constexpr size_t kMaxLeaves = 256;

  // A new CA (EC P-256, CA:TRUE with pathlen 0, key usage keyCertSign) named after `label` (the
  // sandbox's id).
  static Result<std::shared_ptr<EgressCa>> make(const std::string& label);
  // The CA of a certificate and key made by make() (kept across a daemon restart).
  static Result<std::shared_ptr<EgressCa>> load(const PemPair& ca);

  const PemPair& ca() const { return ca_; }
  // A certificate for `host` (a DNS name, or an IPv4 address: then an IP SAN), signed by this
  // CA, with serverAuth, valid kValidDays; the same one for a host asked again. Its chain (the
  // certificate, then this CA's) and key.
  Result<PemPair> leaf(const std::string& host);

  ~EgressCa();
  EgressCa(const EgressCa&) = delete;
  EgressCa& operator=(const EgressCa&) = delete;

 private:
  EgressCa() = default;
  struct Keys;
  std::unique_ptr<Keys> keys_;
  PemPair ca_;
  std::mutex mu_;
  std::map<std::string, PemPair> leaves_;
};

}  // namespace pandastack::vmm
