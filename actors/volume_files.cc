#include "actors/volume_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "vmm-driver/run_tool.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

vmm::Status sync_file(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return vmm::make_error(vmm::ErrorCode::io_error, p.string() + ": " + strerror(errno));
  int r = ::fsync(fd);
  ::close(fd);
  if (r != 0) return vmm::make_error(vmm::ErrorCode::io_error, p.string() + ": " + strerror(errno));
  return vmm::Ok{};
}

}  // namespace

fs::path volume_file(const fs::path& dir, const std::string& id) { return dir / (id + ".img"); }

vmm::Status sync_volume_file(const fs::path& file) { return sync_file(file); }

fs::path volume_snapshot_file(const fs::path& dir, const std::string& id) {
  return dir / "snapshots" / (id + ".img");
}

vmm::Status make_volume_file(const fs::path& to, uint64_t size_mib) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  ::chmod(to.parent_path().c_str(), 0700);
  auto tmp = to.parent_path() / (".new-" + to.filename().string());
  fs::remove(tmp, ec);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return vmm::make_error(vmm::ErrorCode::io_error, tmp.string() + ": " + strerror(errno));
  int r = ::ftruncate(fd, off_t(size_mib) << 20);
  int e = errno;
  ::close(fd);
  if (r != 0) {
    fs::remove(tmp, ec);
    return vmm::make_error(vmm::ErrorCode::io_error,
                           "cannot size " + tmp.string() + ": " + strerror(e));
  }
  // No lazy init left for the guest to do in the background; no discard pass over a new file.
  auto made = vmm::run_tool({"mkfs.ext4", "-q", "-F", "-E",
                             "nodiscard,lazy_itable_init=0,lazy_journal_init=0", "-L", "pandastack",
                             tmp.string()});
  if (made) made = sync_file(tmp);
  if (made && ::rename(tmp.c_str(), to.c_str()) != 0)
    made = vmm::make_error(vmm::ErrorCode::io_error,
                           "cannot rename " + tmp.string() + ": " + strerror(errno));
  if (!made) fs::remove(tmp, ec);
  return made;
}

vmm::Status grow_volume_file(const fs::path& file, uint64_t size_mib) {
  // Only the file grows (sparsely): its file system is the guest's and grows in the guest, online,
  // the next time it is mounted read-write (the agent's mountVolume). The host never reads it.
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return vmm::make_error(vmm::ErrorCode::io_error, file.string() + ": " + strerror(errno));
  struct stat st {};
  int r = ::fstat(fd, &st);
  if (r == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) < (size_mib << 20))
    r = ::ftruncate(fd, off_t(size_mib) << 20);
  if (r == 0) r = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (r != 0)
    return vmm::make_error(vmm::ErrorCode::io_error,
                           "cannot grow " + file.string() + ": " + strerror(e));
  return vmm::Ok{};
}

void remove_volume_file(const fs::path& file) {
  std::error_code ec;
  fs::remove(file, ec);
}

}  // namespace pandastack::actors
