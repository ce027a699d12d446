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

#include "vmm-driver/zero_page.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;

namespace {

// Calls `extent(data, hole)` for each data extent of `fd` (`size` bytes) in order, until one
// fails. Holes are skipped: a sparse RAM file is read only where it has data.
template <typename Extent>
Status each_data_extent(int fd, off_t size, Extent extent) {
  for (off_t pos = 0; pos < size;) {
    off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0) break;  // ENXIO: only a hole is left
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = size;
    if (auto st = extent(data, hole); !st) return st;
    pos = hole;
  }
  return Ok{};
}

// Reads [from, to) of `fd` (named `name` in errors) through `buffer` and hands it on a page at a
// time (the last one maybe shorter): `page(offset, bytes, length)`, until one fails.
template <typename Page>
Status each_page(int fd, const fs::path& name, off_t from, off_t to, std::vector<char>& buffer,
                 Page page) {
  while (from < to) {
    ssize_t n = ::pread(fd, buffer.data(), size_t(std::min<off_t>(to - from, buffer.size())), from);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return make_error(ErrorCode::io_error,
                        "read " + name.string() + ": " + strerror(n < 0 ? errno : EIO));
    for (ssize_t off = 0; off < n; off += kPage)
      if (auto st =
              page(from + off, buffer.data() + off, size_t(std::min<ssize_t>(kPage, n - off)));
          !st)
        return st;
    from += n;
  }
  return Ok{};
}

}  // namespace

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
  bool kernel_copy = true;
  std::vector<char> buffer(1 << 20);
  if (st)
    st = each_data_extent(in, sb.st_size, [&](off_t data, off_t hole) -> Status {
      off_t src = data, dst = data;
      while (src < hole && kernel_copy) {
        ssize_t n = ::copy_file_range(in, &src, out, &dst, size_t(hole - src), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 &&
            (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
          kernel_copy = false;  // across file systems: copy through a buffer below
          break;
        }
        if (n <= 0)
          return make_error(ErrorCode::io_error,
                            "copy " + from.string() + ": " + strerror(n < 0 ? errno : EIO));
      }
      // Write only non-zero pages, so the copy stays sparse.
      return each_page(
          in, from, src, hole, buffer, [&](off_t at, const char* p, size_t len) -> Status {
            if (all_zero(p, len) || ::pwrite(out, p, len, at) == ssize_t(len)) return Ok{};
            return make_error(ErrorCode::io_error, "write " + to.string() + ": " + strerror(errno));
          });
    });
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
  std::vector<char> buffer(1 << 20);
  off_t run_start = -1, run_end = -1;  // the zero pages not punched yet
  auto punch = [&]() -> Status {
    off_t start = run_start;
    run_start = -1;
    if (start < 0 ||
        ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, run_end - start) == 0)
      return Ok{};
    return make_error(ErrorCode::io_error,
                      "cannot punch " + file.string() + ": " + strerror(errno));
  };
  Status st = each_data_extent(fd, sb.st_size, [&](off_t data, off_t hole) -> Status {
    auto read =
        each_page(fd, file, data, hole, buffer, [&](off_t at, const char* p, size_t len) -> Status {
          if (len != kPage || !all_zero(p, len)) return Ok{};
          if (run_start >= 0 && run_end == at) {
            run_end += kPage;
            return Ok{};
          }
          auto punched = punch();
          run_start = at;
          run_end = at + kPage;
          return punched;
        });
    auto punched = punch();
    return read ? punched : read;
  });
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
