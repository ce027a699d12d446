#include "actors/template_packages.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "vmm-driver/run_tool.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

// apt-get for the build: the host's lists (signed; nothing unauthenticated), a status file of
// its own (empty: every dependency is listed, the guest skips what it has) and `archives` as
// the download folder; no lock on the host's apt (nothing of the host's is changed).
std::vector<std::string> apt_get(const fs::path& status, const fs::path& archives) {
  return {"apt-get",
          "-q",
          "-y",
          "-o",
          "Dir::State::status=" + status.string(),
          "-o",
          "Dir::Cache::archives=" + archives.string(),
          "-o",
          "Debug::NoLocking=1",
          "-o",
          "APT::Install-Recommends=false",
          "-o",
          "APT::Get::AllowUnauthenticated=false",
          "-o",
          "Acquire::AllowInsecureRepositories=false"};
}

// A .deb file name as apt writes it (package_version_arch.deb): nothing else is linked or kept.
bool valid_deb_name(const std::string& n) {
  if (n.size() < 5 || n.size() > 255 || !n.ends_with(".deb") || n[0] == '.') return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '+' || c == '-' || c == '_' || c == '~' || c == ':' || c == '%'))
      return false;
  return true;
}

// apt's last error lines, for a rejection.
std::string errors_of(const std::vector<std::string>& lines) {
  std::string out;
  for (auto& l : lines)
    if (l.rfind("E: ", 0) == 0) out += (out.empty() ? "" : "; ") + l.substr(3);
  return out;
}

Rejection apt_failed(const std::string& what, const std::vector<std::string>& lines) {
  auto errors = errors_of(lines);
  if (errors.find("Unable to locate package") != std::string::npos ||
      errors.find("has no installation candidate") != std::string::npos ||
      errors.find("Unable to correct problems") != std::string::npos ||
      errors.find("unmet dependencies") != std::string::npos)
    return {Code::invalid_argument, "packages: " + errors};
  return {Code::unavailable, what + (errors.empty() ? "" : ": " + errors)};
}

// Drops the oldest files of the cache until it holds at most `max` bytes.
void prune(const fs::path& cache, uint64_t max) {
  struct Entry {
    fs::path path;
    int64_t mtime;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(cache, ec)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({e.path(), int64_t(st.st_mtime), uint64_t(st.st_size)});
    total += uint64_t(st.st_size);
  }
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.mtime < b.mtime; });
  for (auto& e : entries) {
    if (total <= max) break;
    fs::remove(e.path, ec);
    total -= e.bytes;
    spdlog::debug("template packages: pruned {} from the cache", e.path.filename().string());
  }
}

}  // namespace

Reply<PackageImage> fetch_packages(const std::vector<std::string>& packages, const fs::path& work,
                                   const PackageFetch& how) {
  PackageImage out;
  if (packages.empty()) return out;
  std::error_code ec;
  auto debs = work / "debs";
  fs::create_directories(debs / "partial", ec);
  fs::create_directories(how.cache, ec);
  if (ec)
    return Rejection{Code::storage_error,
                     "cannot make " + how.cache.string() + ": " + ec.message()};
  fs::permissions(how.cache, fs::perms::owner_all, ec);
  auto status = work / "dpkg-status";
  std::ofstream(status).flush();
  auto log = [&](const std::string& l) {
    if (how.log) how.log(l);
  };

  // What apt would download: `'URI' file size hash`, one line each.
  std::vector<std::string> lines;
  auto args = apt_get(status, debs);
  args.insert(args.end(), {"--print-uris", "install"});
  args.insert(args.end(), packages.begin(), packages.end());
  auto listed = vmm::run_logged(
      args, {}, [&](const std::string& l) { lines.push_back(l); }, how.cancelled);
  if (!listed) {
    for (auto& l : lines) log(l);
    return apt_failed("resolving the packages failed (" + listed.error().message + ")", lines);
  }
  std::vector<std::string> files;
  for (auto& l : lines) {
    if (l.empty() || l[0] != '\'') continue;
    std::istringstream in(l);
    std::string uri, file;
    uint64_t size = 0;
    if (!(in >> uri >> file >> size) || !valid_deb_name(file))
      return Rejection{Code::internal, "apt answered a download this build does not take: " + l};
    files.push_back(file);
    out.deb_bytes += size;
  }
  if (out.deb_bytes > how.max_bytes)
    return Rejection{Code::invalid_argument,
                     "packages: they come to " + std::to_string(out.deb_bytes >> 20) +
                         " MiB of downloads with what they depend on, more than the " +
                         std::to_string(how.max_bytes >> 20) + " MiB a build may fetch"};
  log("packages: " + std::to_string(files.size()) + " files, " +
      std::to_string(out.deb_bytes >> 10) + " KiB with their dependencies");

  // What the cache has already (apt checks each against the lists' hashes before using it).
  for (auto& f : files) {
    auto cached = how.cache / f;
    if (!fs::is_regular_file(cached, ec) || fs::is_symlink(cached, ec)) continue;
    fs::create_hard_link(cached, debs / f, ec);
    if (ec) fs::copy_file(cached, debs / f, ec);
    fs::last_write_time(cached, fs::file_time_type::clock::now(), ec);  // (recently used)
  }
  lines.clear();
  args = apt_get(status, debs);
  args.insert(args.end(), {"--download-only", "install"});
  args.insert(args.end(), packages.begin(), packages.end());
  auto fetched = vmm::run_logged(
      args, {},
      [&](const std::string& l) {
        lines.push_back(l);
        log(l);
      },
      how.cancelled);
  if (!fetched)
    return apt_failed("downloading the packages failed (" + fetched.error().message + ")", lines);
  fs::remove_all(debs / "partial", ec);
  for (auto& f : files) {
    if (!fs::is_regular_file(debs / f, ec))
      return Rejection{Code::internal, "apt did not download " + f};
    if (!fs::exists(how.cache / f, ec)) {
      fs::create_hard_link(debs / f, how.cache / f, ec);
      if (ec) fs::copy_file(debs / f, how.cache / f, ec);
    }
  }
  out.debs = files.size();
  // Nothing but the listed files goes to the guest.
  for (auto& e : fs::directory_iterator(debs, ec))
    if (std::find(files.begin(), files.end(), e.path().filename().string()) == files.end())
      fs::remove_all(e.path(), ec);
  prune(how.cache, how.cache_max_bytes);

  // An ext4 image of them: room for the files, their blocks and the file system's own.
  out.image = work / "packages.img";
  uint64_t mib =
      (out.deb_bytes + out.deb_bytes / 8 + (uint64_t(files.size()) << 13)) / (1 << 20) + 16;
  {
    std::ofstream f(out.image, std::ios::binary);
    if (!f) return Rejection{Code::storage_error, "cannot create " + out.image.string()};
  }
  fs::resize_file(out.image, mib << 20, ec);
  if (ec) return Rejection{Code::storage_error, "cannot size the package image: " + ec.message()};
  auto made = vmm::run_tool({"mkfs.ext4", "-q", "-F", "-m", "0", "-L", "pandastack-pkgs", "-E",
                             "nodiscard,lazy_itable_init=0,lazy_journal_init=0", "-d",
                             debs.string(), out.image.string()});
  if (!made)
    return Rejection{Code::storage_error, "making the package image: " + made.error().message};
  return out;
}

}  // namespace pandastack::actors
