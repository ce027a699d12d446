// The messages the runtime's actors exchange (CAF atoms and the payload types), shared by the
// actor files (registry, sandbox actor, VM worker, template actor) and the facade. Includes CAF:
// only the runtime's own .cc files include it.
#pragma once

#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/database.h"
#include "actors/env.h"
#include "actors/runtime.h"
#include "actors/sandbox.h"
#include "actors/volume.h"

namespace pandastack::actors {

// One reply type for every request inside the runtime.
struct Answer {
  bool ok = true;
  Rejection error;
  SandboxInfo info;
  std::vector<SandboxInfo> infos;
  std::string text;
  std::shared_ptr<VmHandle> vm;  // a lease: agent operations run against it
  std::string exec_id;
  VolumeInfo volume;
  std::vector<VolumeInfo> volumes;
  DatabaseState database;
  std::vector<DatabaseState> databases;

  static Answer fail(Rejection r) {
    Answer a;
    a.ok = false;
    a.error = std::move(r);
    return a;
  }
};

// What a VM worker reports back.
struct WorkerResult {
  bool ok = true;
  std::string error;
  std::optional<uint32_t> subnet;  // restores of a sandbox with a network: the subnet it got
};

// What a restore needs to know of the sandbox's network.
struct NetSpec {
  bool enabled = false;
  Egress egress;
  std::set<uint32_t> ports;        // exposed again on the new VM
  std::optional<uint32_t> subnet;  // adoption: the subnet its network holds
};

struct ListQuery {
  std::string tenant;
  std::optional<SandboxStatus> status;
  std::map<std::string, std::string> metadata;
  bool deleted_volumes = false;  // volumes: deleted ones too (the audit log's ownership check)
};

// What a restore binds (and a create mounts) of the sandbox's volumes.
struct VolumeSpec {
  std::vector<SandboxVolume> volumes;
  bool mount = false;  // a create: mount them in the guest (a woken guest has them mounted)
};

struct ForkRequest {
  std::string tenant, template_name, snapshot_id, parent;
  uint32_t count = 1;
};

}  // namespace pandastack::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Answer)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::WorkerResult)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::NetSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Egress)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::Command)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::CreateRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::SandboxState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::SandboxInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::ListQuery)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::ForkRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::ImportRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::VolumeSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::VolumeCommand)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::VolumeInfo)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::VolumeRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::VolumeState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::DatabaseState)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(pandastack::actors::DatabaseCommand)

namespace pandastack::actors {

using cmd_atom = caf::atom_constant<caf::atom("cmd")>;
using persisted_atom = caf::atom_constant<caf::atom("persisted")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using hibernate_atom = caf::atom_constant<caf::atom("hibernate")>;
using destroy_atom = caf::atom_constant<caf::atom("destroy")>;
using exec_atom = caf::atom_constant<caf::atom("exec")>;
using lease_atom = caf::atom_constant<caf::atom("lease")>;
using create_atom = caf::atom_constant<caf::atom("create")>;
using get_atom = caf::atom_constant<caf::atom("get")>;
using list_atom = caf::atom_constant<caf::atom("list")>;
using route_atom = caf::atom_constant<caf::atom("route")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
using adopt_atom = caf::atom_constant<caf::atom("adopt")>;
using fork_atom = caf::atom_constant<caf::atom("forkkids")>;
using template_atom = caf::atom_constant<caf::atom("template")>;
using bake_atom = caf::atom_constant<caf::atom("bake")>;
using egress_atom = caf::atom_constant<caf::atom("egress")>;
using egress_summary_atom = caf::atom_constant<caf::atom("egsummary")>;
using drop_atom = caf::atom_constant<caf::atom("dropsnap")>;
using delsnap_atom = caf::atom_constant<caf::atom("delsnap")>;
using procs_atom = caf::atom_constant<caf::atom("procs")>;
using vm_exited_atom = caf::atom_constant<caf::atom("vmexited")>;
using exited_atom = caf::atom_constant<caf::atom("exitwhy")>;
using adoptvm_atom = caf::atom_constant<caf::atom("adoptvm")>;
using ended_atom = caf::atom_constant<caf::atom("ended")>;
using retire_atom = caf::atom_constant<caf::atom("retire")>;
using vol_atom = caf::atom_constant<caf::atom("vol")>;
using volinfo_atom = caf::atom_constant<caf::atom("volinfo")>;
using volcreate_atom = caf::atom_constant<caf::atom("volcreate")>;
using volroute_atom = caf::atom_constant<caf::atom("volroute")>;
using vollist_atom = caf::atom_constant<caf::atom("vollist")>;
using voladmit_atom = caf::atom_constant<caf::atom("voladmit")>;
using voladopt_atom = caf::atom_constant<caf::atom("voladopt")>;
using volclone_atom = caf::atom_constant<caf::atom("volclone")>;
using db_atom = caf::atom_constant<caf::atom("db")>;
using dbroute_atom = caf::atom_constant<caf::atom("dbroute")>;
using dblist_atom = caf::atom_constant<caf::atom("dblist")>;
using dbadopt_atom = caf::atom_constant<caf::atom("dbadopt")>;
using dbinfo_atom = caf::atom_constant<caf::atom("dbinfo")>;
using volremove_atom = caf::atom_constant<caf::atom("volremove")>;
using import_atom = caf::atom_constant<caf::atom("import")>;
using unfork_atom = caf::atom_constant<caf::atom("unfork")>;
using sample_atom = caf::atom_constant<caf::atom("sample")>;  // a sandbox samples its VM's use
// A sandbox's VM is gone (destroyed after a kill, a failure or a move): its volumes may go.
using released_atom = caf::atom_constant<caf::atom("vmgone")>;
// A VM worker copies a hibernation onto the data disk (synced) / removes that copy.
using persist_atom = caf::atom_constant<caf::atom("persist")>;
using unpersist_atom = caf::atom_constant<caf::atom("unpersist")>;
// The snapshot persister made a named snapshot's durable copy: (sandbox id, snapshot id).
using snapsaved_atom = caf::atom_constant<caf::atom("snapsaved")>;

// A handler that throws is a bug: log it loudly (CAF would end the actor silently).
// Appends `events` to `stream` (expected at `version`) and tells `me` when they are on disk:
// (persisted_atom, ok, error code, error message); the code is `no_space` when the store's disk is
// full, `storage_error` otherwise. The sandbox, volume and database actors' one write path.
inline void append_and_report(Env& env, const std::string& stream, uint64_t version,
                              std::vector<storage::NewEvent> events, caf::actor me,
                              storage::Durability durability = storage::Durability::synced) {
  env.store->append_async(
      stream, version, std::move(events),
      [me](storage::Result<storage::AppendResult> r) {
        Code code = Code::storage_error;
        std::string err;
        if (!r.ok()) {
          code =
              r.error().code == storage::ErrorCode::no_space ? Code::no_space : Code::storage_error;
          err = r.error().message;
        }
        caf::anon_send(me, persisted_atom::value, r.ok(), code, std::move(err));
      },
      durability);
}

template <typename Self>
void log_exceptions(Self* self, std::string what) {
  self->set_exception_handler(
      [what](caf::scheduled_actor*, std::exception_ptr& eptr) -> caf::error {
        try {
          std::rethrow_exception(eptr);
        } catch (const std::exception& e) {
          spdlog::critical("{}: handler threw: {}", what, e.what());
        } catch (...) {
          spdlog::critical("{}: handler threw a non-std exception", what);
        }
        return caf::make_error(caf::sec::runtime_error);
      });
}

}  // namespace pandastack::actors
