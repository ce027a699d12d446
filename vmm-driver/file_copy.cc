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
