// A Dockerfile build's context as archives (issue 37): a tar of the build context (plain or
// gzip), uploaded once (`POST /v1/build-contexts`, or E2B's `/templates/{id}/files/{hash}` for
// each COPY of its template builder) and named by its key in builds
// (`POST /v1/templates {dockerfile, context: "sha256:..."}`).
//
// The host keeps the bytes and never opens them. A build's archives are unpacked in a builder
// microVM of its own (a `base` guest, no network, jailed like every sandbox) by the importer that
// unpacks image layers (guest/image_import.py --context: every path resolved from a descriptor
// of the new root, nothing reaching outside it, `.dockerignore` applied) into an ext4 disk it
// formats itself; the build's builder (a guest of its FROM) mounts that disk read-only at
// kBuildContextDir, where COPY and ADD read it (actors/dockerfile.h, `context_archives`).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "actors/runtime.h"

namespace pandastack::actors {

struct Env;

struct BuildContextInfo {
  std::string key;  // 64 hex: the sha256 of its bytes, or the hash E2B's SDK named it by
  uint64_t bytes = 0;
  int64_t used_at_ms = 0;  // kept (uploaded) or last named by a build
};

// A key as the API writes one: "sha256:<64 hex>" or the 64 hex alone (lower case). nullopt for
// anything else.
std::optional<std::string> context_key(const std::string& s);

// The archives kept per tenant: DIR/<tenant hash>/<key>.tar. Thread-safe.
class BuildContexts {
 public:
  // At most `max_bytes` each, `max_per_tenant` per tenant (the least recently used go first).
  BuildContexts(std::filesystem::path dir, uint64_t max_bytes, uint32_t max_per_tenant);

  // `upload` (a file on the same file system, taken over: moved, or removed on a refusal) kept
  // as `key` ("": the sha256 of its bytes). invalid_argument (empty, a bad key),
  // file_too_large, storage_error.
  Reply<BuildContextInfo> put(const std::string& tenant, const std::filesystem::path& upload,
                              const std::string& key = "");
  // context_not_found unless the tenant keeps `key`.
  Reply<BuildContextInfo> get(const std::string& tenant, const std::string& key);
  std::optional<Rejection> remove(const std::string& tenant, const std::string& key);
  // Hard links of the tenant's archives `keys` in `into` (a build's own copies: an eviction or
  // a delete while it runs changes nothing), in order. context_not_found naming the first
  // missing one.
  Reply<std::vector<std::filesystem::path>> take(const std::string& tenant,
                                                 const std::vector<std::string>& keys,
                                                 const std::filesystem::path& into);

 private:
  std::filesystem::path tenant_dir(const std::string& tenant) const;
  void evict(const std::filesystem::path& dir);  // (under mu_) down to max_per_tenant_

  std::filesystem::path dir_;
  uint64_t max_bytes_;
  uint32_t max_per_tenant_;
  std::mutex mu_;
};

struct ContextJob {
  std::string id;  // the template's id (names the builder's run folder)
  uint32_t memory_mib = 0, vcpus = 0;
  std::vector<std::filesystem::path> archives;  // in order (a later one's file wins)
  std::filesystem::path work_dir;  // on a real disk: the bundle and the context disk go here
  uint64_t disk_bytes = 0;         // the context disk's size
  std::chrono::steady_clock::time_point deadline;
  std::stop_token stop;
  std::function<void(const std::string&)> log;
};

// The archives as one read-only disk of the unpacker's guest: a header of the host's own making
// (JSON: each archive's offset and size), then each archive's bytes at a 512-byte boundary
// (copied, never read as anything but bytes). Written to `out`; its size.
Reply<uint64_t> write_context_bundle(const std::vector<std::filesystem::path>& archives,
                                     const std::filesystem::path& out);

// Unpacks the job's archives in a builder VM into work_dir/context.raw, an ext4 disk for the
// build's builder to mount read-only; its path. build_failed with the unpacker's reason (an
// escaping entry, not a tar, too large for its disk), timeout, unavailable.
Reply<std::filesystem::path> unpack_context_in_vm(Env& env, const ContextJob& job);

}  // namespace pandastack::actors
