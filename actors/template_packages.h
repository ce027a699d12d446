// The Debian packages of a custom template build, fetched on the host only as inert files: apt
// resolves the tenant's package names (and everything they depend on, as if nothing were
// installed: the builder guest skips what it has) against the host's signed package lists and
// downloads the .deb files, checking each against the lists' hashes. Nothing is unpacked, run or
// parsed on the host: the files are packed into an ext4 image of the daemon's own making
// (mkfs.ext4 -d over a folder of them) that the builder guest mounts read-only and installs from
// (actors/template_builder.h). The downloads are kept in a cache shared by the host's builds,
// bounded in bytes and pruned oldest first; what one build uses is linked into its own folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "actors/runtime.h"

namespace pandastack::actors {

struct PackageImage {
  std::filesystem::path image;  // ext4, the .deb files at its root ("" when none were asked)
  uint64_t deb_bytes = 0;       // the .deb files' size together
  size_t debs = 0;
};

struct PackageFetch {
  std::filesystem::path cache;  // the shared download cache (root-only)
  uint64_t cache_max_bytes = uint64_t(2) << 30;
  uint64_t max_bytes = uint64_t(2) << 30;  // one build's .deb files together (more: rejected)
  std::function<void(const std::string&)> log;
  std::function<bool()> cancelled;  // polled while apt runs: true stops it
};

// Resolves and downloads `packages` into `work`/debs and packs them into `work`/packages.img.
// invalid_argument when apt knows no such package or they come to more than max_bytes;
// unavailable when the mirror cannot be reached.
Reply<PackageImage> fetch_packages(const std::vector<std::string>& packages,
                                   const std::filesystem::path& work, const PackageFetch& how);

}  // namespace pandastack::actors
