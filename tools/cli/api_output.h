// How the CLI prints the API's answers (tools/cli/api_commands.cc): UTC dates, sandbox tables
// and records, raw bytes to a descriptor.
#pragma once

#include <cstdint>
#include <string>

#include "wire/json.h"

namespace pandastack::cli {

// `ms` since the epoch as "YYYY-MM-DD HH:MM:SSZ".
std::string when(int64_t ms);
// A sandbox's expiry: "never" for one that never expires (a database's).
std::string expiry_text(const wire::Json& ms);
// Metadata as k=v,k=v.
std::string meta_text(const wire::Json& m);
// Whether a sandbox (as the API shows it) ended: stopped or failed.
bool ended(const wire::Json& s);
// Sandboxes as a table, oldest first.
void print_table(const wire::Json& sandboxes);
// One sandbox: its JSON, or its fields one per line.
void print_sandbox(const wire::Json& s, bool json);
// All of `data` to `fd` (stops at an error).
void write_all(int fd, const std::string& data);

}  // namespace pandastack::cli
