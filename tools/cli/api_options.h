// The CLI's API commands' usage text and flags (tools/cli/api_commands.cc): parsed once into
// Opts; a bad flag prints the usage and exits 2.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "wire/json.h"

namespace pandastack::cli {

extern const char* const kApiUsage;

struct Opts {
  std::vector<std::string> pos, metadata, env, cmd, allow, hosts, volumes, packages, runs, files,
      secrets, build_args;
  std::map<std::string, std::string> flags;
  bool json = false, persistent = false, no_network = false, auto_wake = false;
  bool is_public = false;  // --public (sandbox preview)
  bool all = false, no_stdin = false;
  bool inherit_secrets = false;  // --inherit-secrets (sandbox fork)
};

// Prints `why` and the usage, exits 2.
[[noreturn]] void usage(const std::string& why);
// The words of argv from `from` on: positional words, flags, and what follows `--` (cmd).
Opts parse(int argc, char** argv, int from);
// A whole-number flag (seconds, or MiB / vCPUs for --size, --memory, --vcpus).
int64_t seconds_flag(const Opts& o, const char* flag);
// --memory and --vcpus, as memory_mib and vcpus in `body`.
void set_shape(wire::Json& body, const Opts& o);
// KEY=VALUE words as a map (`what` names the flag in the error).
std::map<std::string, std::string> pairs(const std::vector<std::string>& kvs, const char* what);

}  // namespace pandastack::cli
