// The RPC API's structs (wire/pandastack.capnp) to and from the runtime's, and its errors: an
// exception whose description starts with the API's error code. Internal to gateway/rpc.cc.
#pragma once

#include <capnp/message.h>
#include <kj/exception.h>

#include <string>

#include "actors/runtime.h"
#include "gateway/rest.h"
#include "storage/secrets.h"
#include "wire/pandastack.capnp.h"

namespace pandastack::gateway::rpc {

namespace api = wire::api;

// Throws `r` as the call's error: "<code>: <message>".
[[noreturn]] void fail(const actors::Rejection& r);

template <typename T>
T take(actors::Reply<T>& r) {
  if (!r) fail(r.error());
  return std::move(*r);
}

std::string text(capnp::Text::Reader t);
void fill_volume(api::VolumeInfo::Builder b, const actors::VolumeInfo& v);
void fill_backup(api::DatabaseBackup::Builder b, const actors::DatabaseBackup& k);
void fill_database(api::DatabaseInfo::Builder b, const actors::DatabaseInfo& d);
void fill_info(api::SandboxInfo::Builder b, const actors::SandboxInfo& i);
void fill_result(api::ExecResult::Builder b, const vmm::ExecResult& r);
void fill_secret(api::SecretInfo::Builder b, const storage::SecretInfo& s);
void fill_egress(api::EgressEntry::Builder b, const vmm::EgressEntry& e);
// An egress log query as the REST API checks it (limit 0 = 100, at most 1000; kind, verdict).
vmm::EgressQuery to_egress_query(uint64_t after, uint32_t limit, const std::string& kind,
                                 const std::string& verdict);
// A command as the REST API checks it (check_exec), its timeout within the limits.
vmm::ExecRequest to_exec(api::ExecRequest::Reader r, const Limits& limits);
// A guest path as the REST API checks it (check_guest_path).
std::string checked_path(capnp::Text::Reader p, const Limits& limits);

}  // namespace pandastack::gateway::rpc
