#include "guest/agent/util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

void fill_stat(w::FileStat::Builder b, const std::string& name, const std::string& path,
               const struct stat& st, Names& names) {
  b.setName(name);
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
