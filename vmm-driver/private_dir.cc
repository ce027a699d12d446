#include "vmm-driver/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pandastack::vmm {

namespace fs = std::filesystem;

Status private_dir(const fs::path& dir) {
  std::error_code ec;
  auto abs = fs::absolute(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, dir.string() + ": " + ec.message());
  if (abs.has_parent_path() && abs.parent_path() != abs) {
    fs::create_directories(abs.parent_path(), ec);
    if (ec) return make_error(ErrorCode::io_error, "cannot create " + abs.parent_path().string() + ": " + ec.message());
  }
  if (::mkdir(abs.c_str(), 0700) != 0 && errno != EEXIST)
    return make_error(ErrorCode::io_error, "cannot create " + abs.string() + ": " + strerror(errno));
  struct stat st {};
  if (::lstat(abs.c_str(), &st) != 0)
    return make_error(ErrorCode::io_error, abs.string() + ": " + strerror(errno));
  if (S_ISLNK(st.st_mode))
    return make_error(ErrorCode::invalid_argument,
                      abs.string() + " is a symlink: refusing to use it (it must be a folder of ours)");
  if (!S_ISDIR(st.st_mode))
    return make_error(ErrorCode::invalid_argument, abs.string() + " is not a folder");
  if (st.st_uid != ::geteuid())
    return make_error(ErrorCode::invalid_argument,
                      abs.string() + " belongs to uid " + std::to_string(st.st_uid) +
                          ", not to this daemon's user: someone else made it first; remove it "
                          "or choose another folder");
  if ((st.st_mode & 077) != 0 && ::chmod(abs.c_str(), 0700) != 0)
    return make_error(ErrorCode::io_error, "cannot make " + abs.string() + " private: " + strerror(errno));
  struct stat parent {};
  if (::stat(abs.parent_path().c_str(), &parent) == 0 && (parent.st_mode & S_IWOTH) &&
      !(parent.st_mode & S_ISVTX))
    return make_error(ErrorCode::invalid_argument,
                      abs.parent_path().string() +
                          " is writable by everyone and not sticky: others could replace " +
                          abs.filename().string() + "; choose another place");
  return Ok{};
}

}  // namespace pandastack::vmm
