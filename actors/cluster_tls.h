// A host's cluster credentials: the folder `pandastackd --cluster-tls DIR` names, made by
// scripts/cluster-certs.sh. What each file is for:
//   ca.pem          the cluster CA: the only issuer etcd's and peers' certificates may chain to
//   host.pem/.key   this host's certificate (CN and DNS SAN = its host id; server and client use):
//                   presented to etcd (--client-cert-auth) and to peers (mutual TLS), so a peer's
//                   identity is its certificate, never what it says
//   records.key     MACs the API key records in etcd (storage/api_keys.h): etcd never holds it
//   e2b-tokens.key  keys E2B access tokens (gateway/e2b.h), independent of any peer credential
#pragma once

#include <string>

#include "storage/error.h"
#include "tools/http_client.h"

namespace pandastack::actors {

struct ClusterTls {
  std::string dir;
  std::string ca_pem, cert_pem, key_pem;    // the files' contents (the peer port's TLS)
  std::string records_key, e2b_tokens_key;  // 32 bytes each (hex in their files)

  // Reads and checks DIR: every file present and private keys not readable by others, the host
  // certificate issued by ca.pem, matching host.key, and naming `host_id` (its CN).
  static storage::Result<ClusterTls> load(const std::string& dir, const std::string& host_id);
  // What the etcd client presents and trusts.
  tools::TlsFiles etcd_files() const;
};

}  // namespace pandastack::actors
