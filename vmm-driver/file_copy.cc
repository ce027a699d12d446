#include "vmm-driver/file_copy.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace pandastack::vmm {

namespace fs = std::filesystem;

Status copy_ram_file(const fs::path& from, const fs::path& to, bool into_existing) {
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return make_error(ErrorCode::io_error, "cannot open " + from.string() + ": " + strerror(errno));
  int out = into_existing ? ::open(to.c_str(), O_WRONLY | O_CLOEXEC)
                          : ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) {
    ::close(in);
    return make_error(ErrorCode::io_error, "cannot open " + to.string() + ": " + strerror(errno));
  }
  Status st = Ok{};
  struct stat sb {};
  struct stat ob {};
  ::fstat(in, &sb);
  if (into_existing) {
    // The file is mapped (by a waiting QEMU): never truncated, which would take pages from under
    // the mapping. Emptied by punching it whole (the mapping then reads the new pages).
    ::fstat(out, &ob);
    if (ob.st_size != sb.st_size)
      st = make_error(ErrorCode::invalid_argument,
                      "RAM file sizes differ: " + from.string() + " " + std::to_string(sb.st_size) +
                          " bytes, " + to.string() + " " + std::to_string(ob.st_size));
    else if (::fallocate(out, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, ob.st_size) != 0)
      st = make_error(ErrorCode::io_error, "cannot empty " + to.string() + ": " + strerror(errno));
  } else if (::ftruncate(out, sb.st_size) != 0) {
    st = make_error(ErrorCode::io_error, std::string("ftruncate: ") + strerror(errno));
  }
  off_t pos = 0;
  bool kernel_copy = true;
  std::vector<char> buffer(1 << 20);
  while (st && pos < sb.st_size) {
    off_t data = ::lseek(in, pos, SEEK_DATA);
    if (data < 0) break;  // ENXIO: only a hole is left
    off_t hole = ::lseek(in, data, SEEK_HOLE);
    if (hole < 0) hole = sb.st_size;
    off_t src = data, dst = data;
    while (src < hole && kernel_copy) {
      ssize_t n = ::copy_file_range(in, &src, out, &dst, size_t(hole - src), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
        kernel_copy = false;  // across file systems: copy through a buffer below
        break;
      }
      if (n <= 0) {
        st = make_error(ErrorCode::io_error,
                        "copy " + from.string() + ": " + strerror(n < 0 ? errno : EIO));
        break;
      }
    }
    while (st && src < hole) {
      size_t want = size_t(std::min<off_t>(hole - src, off_t(buffer.size())));
      ssize_t n = ::pread(in, buffer.data(), want, src);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        st = make_error(ErrorCode::io_error,
                        "read " + from.string() + ": " + strerror(n < 0 ? errno : EIO));
        break;
      }
      // Write only non-zero pages, so the copy stays sparse.
      for (ssize_t off = 0; off < n && st; off += 4096) {
        size_t len = size_t(std::min<ssize_t>(4096, n - off));
        const char* p = buffer.data() + off;
        if (p[0] == 0 && std::memcmp(p, p + 1, len - 1) == 0) continue;
        if (::pwrite(out, p, len, src + off) != ssize_t(len))
          st = make_error(ErrorCode::io_error, "write " + to.string() + ": " + strerror(errno));
      }
      src += n;
    }
    pos = hole;
  }
  ::close(in);
  ::close(out);
  if (!st && !into_existing) ::unlink(to.c_str());
  return st;
}

Status punch_zero_pages(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return make_error(ErrorCode::io_error, "cannot open " + file.string() + ": " + strerror(errno));
  struct stat sb {};
  ::fstat(fd, &sb);
  Status st = Ok{};
  std::vector<char> buffer(1 << 20);
  off_t run_start = -1, run_end = -1;  // the zero pages not punched yet
  auto punch = [&] {
    if (st && run_start >= 0 &&
        ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, run_start,
                    run_end - run_start) != 0)
      st =
          make_error(ErrorCode::io_error, "cannot punch " + file.string() + ": " + strerror(errno));
    run_start = -1;
  };
  for (off_t pos = 0; st && pos < sb.st_size;) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0) break;  // ENXIO: only a hole is left
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = sb.st_size;
    for (off_t at = data; st && at < hole;) {
      ssize_t n = ::pread(fd, buffer.data(), size_t(std::min<off_t>(hole - at, buffer.size())), at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        st = make_error(ErrorCode::io_error,
                        "read " + file.string() + ": " + strerror(n < 0 ? errno : EIO));
        break;
      }
      for (ssize_t off = 0; off + 4096 <= n; off += 4096) {
        const char* p = buffer.data() + off;
        bool zero = p[0] == 0 && std::memcmp(p, p + 1, 4095) == 0;
        if (zero && run_start >= 0 && run_end == at + off) {
          run_end += 4096;
        } else if (zero) {
          punch();
          run_start = at + off;
          run_end = run_start + 4096;
        }
      }
      at += n;
    }
    punch();
    pos = hole;
  }
  ::close(fd);
  return st;
}

Result<bool> clone_file(const fs::path& from, const fs::path& to) {
  auto tmp = to.parent_path() / (".clone-" + to.filename().string());
  ::unlink(tmp.c_str());
  int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (in < 0)
    return make_error(ErrorCode::io_error, "cannot open " + from.string() + ": " + strerror(errno));
  int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (out < 0) {
    int e = errno;
    ::close(in);
    return make_error(ErrorCode::io_error, "cannot create " + tmp.string() + ": " + strerror(e));
  }
  bool reflink = ::ioctl(out, FICLONE, in) == 0;
  ::close(in);
  Status st = Ok{};
  if (!reflink) {
    ::close(out);
    st = copy_ram_file(from, tmp);  // recreates it (truncated), sparse
    out = st ? ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
    if (st && out < 0)
      st = make_error(ErrorCode::io_error, "cannot open " + tmp.string() + ": " + strerror(errno));
  }
  if (st && ::fsync(out) != 0)
    st = make_error(ErrorCode::io_error, "cannot sync " + tmp.string() + ": " + strerror(errno));
  if (out >= 0) ::close(out);
  if (st && ::rename(tmp.c_str(), to.c_str()) != 0)
    st = make_error(ErrorCode::io_error, "cannot rename " + tmp.string() + ": " + strerror(errno));
  if (!st) {
    ::unlink(tmp.c_str());
    return st.error();
  }
  return reflink;
}

}  // namespace pandastack::vmm
