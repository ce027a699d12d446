#include "guest/agent/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace pandastack::agent {

void log_line(const std::string& s) {
  // The console is the guest's serial port: visible in the host's boot error tail.
  std::string line = std::string("pandastack-agent: ") + s + "\n";
  ssize_t r = ::write(STDERR_FILENO, line.data(), line.size());
  (void)r;
}

uint64_t now_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}
uint64_t mono_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Errors of file operations as stable codes.

const char* errno_code(int e) {
  switch (e) {
    case ENOENT:
      return "not_found";
    case ENOTDIR:
      return "not_a_directory";
    case EISDIR:
      return "is_a_directory";
    case EACCES:
    case EPERM:
      return "permission_denied";
    case EEXIST:
      return "exists";
    case ENOTEMPTY:
      return "not_empty";
    case EINVAL:
    case ENAMETOOLONG:
      return "invalid_argument";
    case ENOSPC:
      return "no_space";
    default:
      return "io_error";
  }
}

std::string resolve(kj::StringPtr path) {
  std::string p(path.cStr());
  if (p.empty() || p[0] != '/') p = "/workspace/" + p;
  return p;
}

void write_small_file(const char* path, const std::string& content) {
  // Unchanged content is not written again: on ext4, truncating and rewriting a file makes the
  // kernel start its writeback at close (auto_da_alloc), a disk write each restore would pay.
  if (int r = ::open(path, O_RDONLY | O_CLOEXEC); r >= 0) {
    std::string old(content.size() + 1, '\0');
    ssize_t n = ::read(r, old.data(), old.size());
    ::close(r);
    if (n == ssize_t(content.size()) && old.compare(0, content.size(), content) == 0) return;
  }
  int f = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f < 0) return;
  ssize_t w = ::write(f, content.data(), content.size());
  (void)w;
  ::close(f);
}

int mkdir_p(const std::string& path, mode_t mode, const Account* owner) {
  if (path.empty() || path == "/") return 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    int r = mkdir_p(path.substr(0, slash), mode, owner);
    if (r != 0) return r;
  }
  if (::mkdir(path.c_str(), mode) != 0) return errno == EEXIST ? 0 : errno;
  if (owner && ::lchown(path.c_str(), owner->uid, owner->gid) != 0) return errno;
  return 0;
}

int remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return errno;
    while (auto* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      int r = remove_tree(path + "/" + n);
      if (r != 0) {
        ::closedir(d);
        return r;
      }
    }
    ::closedir(d);
    if (::rmdir(path.c_str()) != 0) return errno;
    return 0;
  }
  if (::unlink(path.c_str()) != 0) return errno;
  return 0;
}

namespace {
constexpr std::string_view kMetaPrefix = "user.e2b.";
constexpr size_t kMaxMetaBytes = 4096;  // names (with the prefix) and values, per file

// The `user.e2b.*` attribute names of a file: of an open file (fd >= 0), else of `path`
// (not following a symbolic link).
std::vector<std::string> meta_names(int fd, const std::string& path) {
  char buf[8192];
  ssize_t n =
      fd >= 0 ? ::flistxattr(fd, buf, sizeof buf) : ::llistxattr(path.c_str(), buf, sizeof buf);
  std::vector<std::string> out;
  for (ssize_t at = 0; at < n;) {
    std::string_view name(buf + at);
    if (name.substr(0, kMetaPrefix.size()) == kMetaPrefix) out.emplace_back(name);
    at += ssize_t(name.size()) + 1;
  }
  return out;
}
}  // namespace

int set_metadata(int fd, capnp::List<w::EnvVar>::Reader metadata) {
  for (auto& name : meta_names(fd, "")) {
    bool kept = false;
    for (auto m : metadata) kept |= name.substr(kMetaPrefix.size()) == m.getName().cStr();
    if (!kept && ::fremovexattr(fd, name.c_str()) != 0 && errno != ENODATA) return errno;
  }
  for (auto m : metadata) {
    std::string name = std::string(kMetaPrefix) + m.getName().cStr();
    auto v = m.getValue();
    if (::fsetxattr(fd, name.c_str(), v.begin(), v.size(), 0) != 0) return errno;
  }
  return 0;
}

void fill_stat(w::FileStat::Builder b, const std::string& name, const std::string& path,
               const struct stat& st, Names& names) {
  b.setName(name);
  if (!S_ISLNK(st.st_mode)) {  // (a symbolic link has no user attributes)
    std::vector<std::pair<std::string, std::string>> meta;
    size_t total = 0;
    for (auto& n : meta_names(-1, path)) {
      char v[kMaxMetaBytes];
      ssize_t len = ::lgetxattr(path.c_str(), n.c_str(), v, sizeof v);
      if (len < 0) continue;
      total += n.size() + size_t(len);
      if (total > kMaxMetaBytes) break;
      meta.emplace_back(n.substr(kMetaPrefix.size()), std::string(v, size_t(len)));
    }
    auto list = b.initMetadata(unsigned(meta.size()));
    for (unsigned i = 0; i < meta.size(); ++i) {
      list[i].setName(meta[i].first);
      list[i].setValue(meta[i].second);
    }
  }
  b.setOwner(names.user(st.st_uid));
  b.setGroup(names.group(st.st_gid));
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    ssize_t n = ::readlink(path.c_str(), target, sizeof target);
    if (n > 0) b.setSymlinkTarget(std::string(target, size_t(n)));
  }
  w::FileType t = w::FileType::OTHER;
  if (S_ISREG(st.st_mode))
    t = w::FileType::REGULAR;
  else if (S_ISDIR(st.st_mode))
    t = w::FileType::DIRECTORY;
  else if (S_ISLNK(st.st_mode))
    t = w::FileType::SYMLINK;
  b.setType(t);
  b.setSize(uint64_t(st.st_size));
  b.setMode(st.st_mode & 07777);
  b.setMtimeMs(int64_t(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000);
}
std::string read_small(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace pandastack::agent
