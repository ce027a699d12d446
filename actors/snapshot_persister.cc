#include "actors/snapshot_persister.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "actors/env.h"
#include "actors/runtime_ids.h"

namespace pandastack::actors {

caf::behavior snapshot_persister(caf::event_based_actor* self, Env* env, caf::actor registry) {
  (void)self;
  return {
      [env, registry](persist_atom, std::string sandbox, std::string snap) {
        if (!runtime_id(snap, "snap_")) {
          spdlog::error("snapshot persister: refused '{}' (not a snapshot id)", snap);
          return;
        }
        auto t0 = std::chrono::steady_clock::now();
        // Deleted before its turn came: nothing to copy (and nobody to tell).
        auto loaded = vmm::Snapshot::load(env->snapshot_dir(snap));
        if (!loaded) {
          spdlog::info("snapshot persister: {} is gone ({}), not copied", snap,
                       loaded.error().message);
          return;
        }
        auto copy = vmm::persist_snapshot(*loaded, env->persisted_snapshot_dir(snap));
        if (!copy) {
          // Left on tmpfs only (said in the API: durable "none"); a half copy goes.
          std::error_code ec;
          std::filesystem::remove_all(env->persisted_snapshot_dir(snap), ec);
          spdlog::warn("snapshot persister: {} of sandbox {} stays on tmpfs only: {}", snap,
                       sandbox, copy.error().message);
          return;
        }
        spdlog::info("snapshot persister: {} of sandbox {} is on the data disk ({} ms)", snap,
                     sandbox,
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count());
        caf::anon_send(registry, snapsaved_atom::value, sandbox, snap);
      },
      [env](unpersist_atom, std::string snap) {
        if (!runtime_id(snap, "snap_")) return;
        std::error_code ec;
        std::filesystem::remove_all(env->persisted_snapshot_dir(snap), ec);
      },
  };
}

}  // namespace pandastack::actors
