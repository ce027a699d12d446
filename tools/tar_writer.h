// A folder as a tar archive (POSIX ustar, with PAX records for long names): what the CLI
// uploads as a Dockerfile build's context (POST /v1/build-contexts). Writing only: the daemon
// never reads a tenant's archive on the host (a builder microVM unpacks it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "wire/result.h"

namespace pandastack::tools {

struct TarLimits {
  uint64_t max_bytes = uint64_t(1) << 30;  // the archive (the daemon's --build-context-mib)
  size_t max_entries = 100000;
};

struct TarError {
  std::string message;
};

// One ustar header block (512 bytes) of an entry owned by root: `name` and `link` at most 100
// bytes each (tar_of_folder puts a PAX record before a longer one), `type` ustar's ('0' a file,
// '5' a folder, '2' a symlink, 'x' a PAX record).
std::string ustar_header(const std::string& name, char type, uint64_t size, uint32_t mode,
                         int64_t mtime, const std::string& link = "");

// The archive of `dir`'s tree (regular files, folders, symlinks as links; other kinds skipped),
// names relative to it, owned by root, modes and times kept. An error names what failed (a
// file that cannot be read, a limit).
Result<std::string, TarError> tar_of_folder(const std::filesystem::path& dir,
                                            const TarLimits& limits = {});

}  // namespace pandastack::tools
