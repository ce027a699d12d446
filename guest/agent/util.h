// Small helpers of the guest agent: logging, clocks, errno codes, paths and file utilities.
#pragma once

#include <kj/string.h>
#include <sys/stat.h>
#include <time.h>

#include <cstdint>
#include <string>

#include "guest/agent/users.h"
#include "wire/agent.capnp.h"

namespace pandastack::agent {

namespace w = pandastack::wire::agent;

inline constexpr const char* kVersion = "pandastack-agent/0.3.0";

// A line on the console (the guest's serial port: visible in the host's boot error tail).
void log_line(const std::string& s);

uint64_t now_ms(clockid_t clock);
uint64_t mono_us();
// A wait status as the protocol reports it: the exit code, or -signal.
int decode_status(int status);

// errno as a stable error code of wire/agent.capnp's `Error` ("not_found", ...).
const char* errno_code(int e);
template <typename Builder>
void set_error(Builder&& b, int e, const std::string& what) {
  b.setCode(errno_code(e));
  b.setMessage(what + ": " + strerror(e));
}

// A guest path as the host gave it: relative paths are under /workspace.
std::string resolve(kj::StringPtr path);
// The first line of a small file ("" when unreadable), trailing blanks removed.
std::string read_small(const char* path);
// Replaces a small file's content unless it is already that (best effort: a read-only root just
// keeps the old one).
void write_small_file(const char* path, const std::string& content);
// mkdir -p; 0 or an errno. The folders it makes belong to `owner` when given.
int mkdir_p(const std::string& path, mode_t mode, const Account* owner = nullptr);
// rm -r; 0 or an errno.
int remove_tree(const std::string& path);
// An entry as the protocol has it: `path` is where it is (a symbolic link's target is read
// there), `names` gives its owner's and group's names.
void fill_stat(w::FileStat::Builder b, const std::string& name, const std::string& path,
               const struct stat& st, Names& names);
// Makes the open file's `user.e2b.*` extended attributes exactly `metadata` (names without the
// prefix): 0 or an errno (ENOTSUP: the file system has none).
int set_metadata(int fd, capnp::List<w::EnvVar>::Reader metadata);

}  // namespace pandastack::agent
