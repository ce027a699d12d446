// Wake anywhere (issue 39): a hibernated sandbox whose hibernation is in the object store is
// parked in the cluster (actors/cluster.h, Parked) with the settings it was made with, so that
// another host can start it once its own host is gone (Runtime::wake_parked). This is the
// settings' form, written by the owner and read, as a peer's, by the host that wakes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "actors/runtime.h"
#include "wire/json.h"

namespace pandastack::actors {

struct Env;

// Why sandbox `s` cannot be parked (woken elsewhere), or nullopt when it can: hibernated with
// its memory, its hibernation in the store, and no volumes (their data is not in the store).
std::optional<std::string> unparkable(const SandboxInfo& s);

// What it was made with: template (its id), expiry, metadata, persistence, auto-wake, idle
// timeout and what it does then, network and egress policy, exposed ports.
wire::Json parked_settings(const SandboxInfo& s);

// What a sandbox's settings as JSON (parked_settings', or the API's sandbox JSON a peer sends
// with a cross-host fork or migration) say of its template, metadata, persistence, auto-wake,
// idle timeout and what it does then, and network, into `c`; what is missing or of the wrong
// type stays as it is there.
void settings_from_json(const wire::Json& j, CreateRequest& c);

// The create a parked sandbox is started with for `tenant` (the checks of a create follow in
// Runtime::start_imported); its exposed ports into `ports`. `now_ms`: what is left of its TTL
// counts from now (at least a second). Bad fields are left at a create's defaults.
CreateRequest parked_create(const std::string& tenant, const wire::Json& settings, int64_t now_ms,
                            std::vector<uint32_t>& ports);

// What a wake fetches at most: the host's guest RAM, its device state (vmm::ReceiveLimits) and
// this much disk (a sandbox's disk layers: its template's root file system and what it wrote).
constexpr uint64_t kMaxParkedDiskBytes = 64ull << 30;

// Where a wake fetches a parked hibernation on the data disk (a folder per wake, removed after
// it, and the whole folder at the next start).
std::filesystem::path fetched_dir(const Env& env);

}  // namespace pandastack::actors
