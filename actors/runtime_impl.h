// The runtime facade's private part (runtime.cc, runtime_volumes.cc): the actor system, the
// registry and the blocking request to it. Includes CAF: never include it from a public header.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <memory>

#include "actors/deadlines.h"
#include "actors/env.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/secrets.h"
#include "actors/template_builds.h"
#include "storage/api_keys.h"

namespace pandastack::actors {

struct Runtime::Impl {
  std::unique_ptr<Env> env;
  std::unique_ptr<storage::KeyStore> keys;
  std::unique_ptr<storage::SecretStore> secret_store;  // (sealed under data_dir/secrets.key)
  std::unique_ptr<Secrets> secrets;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor registry;
  std::shared_ptr<Cluster> cluster;        // (cluster mode)
  std::unique_ptr<TemplateBuilds> builds;  // (after env: it goes first)
  // Recovered::dropped_manifests, unparked by join_cluster (cluster mode), then cleared.
  std::vector<std::pair<std::string, std::string>> dropped_manifests;

  // Cluster mode: records this host as the owner of a new id. A rejection when it cannot be
  // recorded (etcd unreachable: 503 cluster_unavailable) or another host owns it (409).
  std::optional<Rejection> claim(const std::string& id);

  // A lifecycle command of sandbox `id` as it is, without the ownership check of Runtime's public
  // commands: what the database runtime does to its own sandboxes.
  Reply<SandboxInfo> sandbox_command(const std::string& tenant, const std::string& id, Command c);
  // managed_by_database when sandbox `id` runs a database (its metadata kDatabaseKey names it):
  // such a sandbox is managed through /v1/databases only.
  std::optional<Rejection> refuse_database_sandbox(const std::string& tenant,
                                                   const std::string& id);

  // Every call has a deadline (deadlines.h: the runtime's is the outermost): a stuck effect is
  // an error for the caller, never a hang.
  Answer ask(caf::message msg) {
    caf::scoped_actor self{*sys};
    Answer out = Answer::fail({Code::internal, "no answer"});
    self->request(registry, deadline::kApiCall.limit, std::move(msg))
        .receive([&](Answer& a) { out = std::move(a); },
                 [&](caf::error& e) {
                   out = Answer::fail(deadline::missed(e, deadline::kApiCall, *sys));
                 });
    return out;
  }
};

// Checks and normalizes an egress policy (runtime.cc); domain allowlists are refused until the
// platform resolver exists (`have_resolver`), never silently ignored.
std::optional<Rejection> validate_egress(Egress& e, bool have_resolver);

template <typename T, typename F>
Reply<T> to_reply(const Answer& a, F&& pick) {
  if (!a.ok) return a.error;
  return pick(a);
}

// A command for the tenant's sandbox `id`, through the registry (which checks the tenant).
inline caf::message route(const std::string& tenant, const std::string& id, Command c) {
  return caf::make_message(route_atom::value, tenant, id, std::move(c));
}

}  // namespace pandastack::actors
