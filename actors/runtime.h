// The actor runtime: one CAF actor per sandbox (event-sourced through the event store), a
// registry that owns the id space and supervises them, a TTL reaper, template bakes through the
// VMM driver, recovery by replay on start and a graceful shutdown. This header is the blocking
// facade the daemon and tests use; CAF stays inside runtime.cc.
//
// Every sandbox command is decided purely (sandbox.h), its events are appended to the sandbox's
// stream with the expected version, applied, and only then are side effects (VMM driver) run, on
// detached workers, never on CAF's shared threads. Replies come when the effect is done: create
// returns a running sandbox, hibernate a hibernated one.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/sandbox.h"
#include "vmm-driver/agent_client.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors {

struct RuntimeConfig {
  std::filesystem::path data_dir;    // the event store lives in data_dir/store
  std::filesystem::path images_dir;  // guest images (make guest)
  // VM run folders, snapshots and hibernated sandboxes (RAM files): tmpfs, kept across restarts
  // of the host process. Empty: /dev/shm/pandastack-<hash of data_dir>.
  std::filesystem::path state_dir;
  vmm::Accel accel = vmm::Accel::tcg;
  unsigned vcpus = 1;
  unsigned memory_mib = 256;
  Limits limits;
  std::chrono::milliseconds reaper_interval{1000};
  bool jail = true;
};

struct SandboxInfo {
  std::string id, tenant, template_name, parent;
  Status status = Status::none;
  std::map<std::string, std::string> metadata;
  int64_t created_at_ms = 0, expires_at_ms = 0;
  bool persistent = false;
  std::vector<std::string> snapshots;
  std::string failure_reason;
};

struct CreateRequest {
  std::string tenant, template_name = "base";
  uint32_t ttl_seconds = 0;  // 0 = the default
  std::map<std::string, std::string> metadata;
  bool persistent = false, auto_wake = false;
  std::string from_snapshot;  // a snapshot id taken from one of the tenant's sandboxes
};

// A result or a refusal with a stable code (see Rejection in sandbox.h).
template <typename T>
class Reply {
 public:
  Reply(T value) : value_(std::move(value)) {}
  Reply(Rejection r) : error_(std::move(r)) {}
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const Rejection& error() const { return error_; }

 private:
  std::optional<T> value_;
  Rejection error_;
};

class Runtime {
 public:
  // Opens the store and rebuilds every sandbox from its events: hibernated ones come back
  // hibernated; ones whose VM did not survive are recorded failed(host_restart) and cleaned up.
  static Reply<std::unique_ptr<Runtime>> start(RuntimeConfig config);
  // Graceful shutdown: persistent running sandboxes are hibernated, the others killed, all
  // recorded in their streams.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Reply<SandboxInfo> create(const CreateRequest& request);
  Reply<SandboxInfo> get(const std::string& tenant, const std::string& id);
  // Filters: status (nullopt = any) and metadata entries that must all match.
  Reply<std::vector<SandboxInfo>> list(const std::string& tenant,
                                       std::optional<Status> status = std::nullopt,
                                       const std::map<std::string, std::string>& metadata = {});
  Reply<vmm::ExecResult> exec(const std::string& tenant, const std::string& id,
                              const vmm::ExecRequest& request);
  Reply<SandboxInfo> hibernate(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> wake(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> kill(const std::string& tenant, const std::string& id);
  Reply<SandboxInfo> set_ttl(const std::string& tenant, const std::string& id,
                             uint32_t ttl_seconds);
  Reply<SandboxInfo> set_metadata(const std::string& tenant, const std::string& id,
                                  const std::map<std::string, std::string>& metadata);
  // A snapshot of a running sandbox; returns its id (usable as CreateRequest::from_snapshot).
  Reply<std::string> snapshot(const std::string& tenant, const std::string& id);
  // `count` children of a running sandbox; the parent keeps running.
  Reply<std::vector<SandboxInfo>> fork(const std::string& tenant, const std::string& id,
                                       uint32_t count);

  struct Impl;

 private:
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "sbx_" + 16 random base32 characters.
std::string new_sandbox_id();

}  // namespace pandastack::actors
