#include "vmm-driver/memory_base.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "vmm-driver/file_copy.h"
#include "vmm-driver/zero_page.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using std::chrono::steady_clock;

// The copy of the base's RAM file kept ready for the next save, and its maker's state.
struct MemoryBase::Copies {
  fs::path source, dir;
  std::string name;  // the base's memfd name: its copies are `name`-N in `dir`
  std::chrono::milliseconds idle{};
  std::mutex mu;
  std::condition_variable cv;
  fs::path ready;        // a complete copy, or empty (taken, not made yet)
  bool running = false;  // the maker thread is alive
  bool stopped = false;  // the base is gone, or no copy could ever be taken
  steady_clock::time_point last_take;
  uint64_t serial = 0;
};

namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;

// How long after a save took the copy the next is begun.
constexpr std::chrono::milliseconds kCopyDelay{500};

Error errno_error(const std::string& what) {
  return make_error(ErrorCode::io_error, what + ": " + strerror(errno));
}

// Whether `dir` has room for a copy of `file` and as much again: a copy made ahead never takes a
// folder's last space (a save or a create needs it more).
bool room_for_copy(const fs::path& dir, const fs::path& file) {
  struct stat sb {};
  struct statvfs vs {};
  if (::stat(file.c_str(), &sb) != 0 || ::statvfs(dir.c_str(), &vs) != 0) return false;
  return uint64_t(vs.f_bavail) * vs.f_frsize >= 2 * uint64_t(sb.st_blocks) * 512;
}

// Removes the copies in `dir` of bases of processes that are gone (`pst-base-PID-N-M`).
void remove_orphan_copies(const fs::path& dir) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("pst-base-", 0) != 0) continue;
    long pid = std::strtol(name.c_str() + 9, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH)
      fs::remove(e.path(), ec);
  }
}

// A run of QEMU's address space that maps guest RAM [offset, offset + length).
struct RamMapping {
  uint64_t address = 0, offset = 0, length = 0;
};

// QEMU's mappings of the memfd `name` (as /proc/PID/maps shows it), clipped to `size` bytes.
Result<std::vector<RamMapping>> ram_mappings(pid_t pid, const std::string& name, uint64_t size) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  if (!maps) return errno_error("cannot read the maps of process " + std::to_string(pid));
  const std::string path = "/memfd:" + name;
  std::vector<RamMapping> out;
  for (std::string line; std::getline(maps, line);) {
    // start-end perms offset dev inode path
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, file;
    in >> range >> perms >> offset >> dev >> inode;
    std::getline(in >> std::ws, file);
    if (file != path && file != path + " (deleted)") continue;
    auto dash = range.find('-');
    if (dash == std::string::npos) continue;
    uint64_t start = std::stoull(range.substr(0, dash), nullptr, 16);
    uint64_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    uint64_t off = std::stoull(offset, nullptr, 16);
    if (end <= start || off >= size || start % kPage != 0 || off % kPage != 0) continue;
    out.push_back({start, off, std::min(end - start, size - off)});
  }
  if (out.empty())
    return make_error(ErrorCode::not_found,
                      "process " + std::to_string(pid) + " maps no memory base " + name);
  return out;
}

// Calls `run(address, offset, length)` for each run of private pages (present and not the
// file's, or swapped out) of `pid`'s `mappings`, per /proc/PID/pagemap.
template <typename Run>
Status each_private_run(pid_t pid, const std::vector<RamMapping>& mappings, Run run) {
  int fd = ::open(("/proc/" + std::to_string(pid) + "/pagemap").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_error("cannot open the pagemap of process " + std::to_string(pid));
  constexpr uint64_t kPresent = 1ull << 63, kSwapped = 1ull << 62, kFile = 1ull << 61;
  std::vector<uint64_t> entries(4096);
  Status st = Ok{};
  for (auto& m : mappings) {
    uint64_t run_start = 0, run_pages = 0;
    auto flush = [&]() -> Status {
      if (run_pages == 0) return Ok{};
      auto s = run(m.address + run_start * kPage, m.offset + run_start * kPage, run_pages * kPage);
      run_pages = 0;
      return s;
    };
    uint64_t pages = m.length / kPage;
    for (uint64_t first = 0; first < pages && st; first += entries.size()) {
      uint64_t n = std::min<uint64_t>(entries.size(), pages - first);
      off_t at = off_t((m.address / kPage + first) * sizeof(uint64_t));
      ssize_t got = ::pread(fd, entries.data(), n * sizeof(uint64_t), at);
      if (got != ssize_t(n * sizeof(uint64_t))) {
        st = got < 0 ? errno_error("cannot read the pagemap of process " + std::to_string(pid))
                     : make_error(ErrorCode::io_error, "short read of a pagemap");
        break;
      }
      for (uint64_t i = 0; i < n && st; ++i) {
        uint64_t e = entries[i];
        bool own = ((e & kPresent) && !(e & kFile)) || (e & kSwapped);
        if (own && run_pages > 0 && run_start + run_pages == first + i) {
          ++run_pages;
        } else if (own) {
          st = flush();
          run_start = first + i;
          run_pages = 1;
        }
      }
    }
    if (st) st = flush();
    if (!st) break;
  }
  ::close(fd);
  return st;
}

}  // namespace

Result<std::shared_ptr<const MemoryBase>> MemoryBase::make(const fs::path& ram_file,
                                                           const fs::path& copies_dir,
                                                           std::chrono::milliseconds copy_idle) {
  static std::atomic<uint64_t> serial{0};
  std::string name = "pst-base-" + std::to_string(::getpid()) + "-" + std::to_string(++serial);
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return errno_error("memfd_create");
  auto copied = copy_ram_file(ram_file, "/proc/self/fd/" + std::to_string(fd));
  struct stat sb {};
  if (copied && ::fstat(fd, &sb) != 0) copied = errno_error("fstat");
  if (copied && (sb.st_size <= 0 || uint64_t(sb.st_size) % kPage != 0))
    copied =
        make_error(ErrorCode::invalid_argument, "not a RAM file (" + std::to_string(sb.st_size) +
                                                    " bytes): " + ram_file.string());
  // Its holes filled (with zeros) before any QEMU maps it: a fault on a hole would allocate the
  // page in this shared file and charge it to that QEMU's memory limit (a guest that touches all
  // its RAM would be charged twice and killed); so the base costs its RAM size, once.
  if (copied && ::fallocate(fd, 0, 0, sb.st_size) != 0) copied = errno_error("filling " + name);
  if (copied && ::fcntl(fd, F_ADD_SEALS, kSeals) != 0) copied = errno_error("sealing " + name);
  if (copied && unsigned(::fcntl(fd, F_GET_SEALS)) != kSeals)
    copied = make_error(ErrorCode::io_error, "the memory base " + name + " is not sealed");
  std::shared_ptr<Copies> copies;
  if (copied && !copies_dir.empty()) {
    std::error_code ec;
    fs::create_directories(copies_dir, ec);
    if (ec) {  // (a base without copies made ahead: its saves copy)
      spdlog::warn("memory base {}: no copies made ahead: cannot create {}: {}", name,
                   copies_dir.string(), ec.message());
    } else {
      remove_orphan_copies(copies_dir);
      copies = std::make_shared<Copies>();
      copies->source = fs::absolute(ram_file);
      copies->dir = copies_dir;
      copies->name = name;
      copies->idle = copy_idle;
    }
  }
  if (!copied) {
    ::close(fd);
    return copied.error();
  }
  return std::shared_ptr<const MemoryBase>(new MemoryBase(
      fd, fs::absolute(ram_file), uint64_t(sb.st_size), std::move(name), std::move(copies)));
}

MemoryBase::~MemoryBase() {
  if (copies_) {  // its maker removes the copy and ends
    std::lock_guard lock(copies_->mu);
    copies_->stopped = true;
    copies_->cv.notify_all();
  }
  ::close(fd_);
}

void MemoryBase::make_copies(std::shared_ptr<Copies> c) {
  // At a low priority (nice 10): guests and restores come first; on a busy host the copy takes
  // longer, and a save that finds none ready copies, as without.
  ::setpriority(PRIO_PROCESS, pid_t(::gettid()), 10);
  std::unique_lock lock(c->mu);
  while (!c->stopped) {
    // Not while what took the last copy goes on (a fork restores its children, a hibernate ends
    // its QEMU).
    while (!c->stopped && steady_clock::now() < c->last_take + kCopyDelay)
      c->cv.wait_until(lock, c->last_take + kCopyDelay);
    if (c->stopped) break;
    fs::path path = c->dir / (c->name + "-" + std::to_string(++c->serial));
    fs::path part = path.string() + ".part";  // (named once complete, as it becomes ready)
    lock.unlock();
    Status made =
        room_for_copy(c->dir, c->source)
            ? copy_ram_file(c->source, part)
            : Status(make_error(ErrorCode::io_error, "too little room in " + c->dir.string()));
    lock.lock();
    if (made && !c->stopped && ::rename(part.c_str(), path.c_str()) != 0)
      made = errno_error("cannot name " + part.string());
    if (!made || c->stopped) {
      if (!made)
        spdlog::debug("memory base {}: no copy made ahead: {}", c->name, made.error().message);
      ::unlink(part.c_str());  // (`path` is named only on success)
      break;
    }
    c->ready = path;
    // Until a save takes it (then the next), the base is gone, or no save came for a while.
    while (!c->stopped && c->ready == path && steady_clock::now() < c->last_take + c->idle)
      c->cv.wait_until(lock, c->last_take + c->idle);
    if (c->ready == path) {
      c->ready.clear();
      ::unlink(path.c_str());
      break;
    }
  }
  c->running = false;
}

Status MemoryBase::copy_file_to(const fs::path& to) const {
  if (!copies_) return copy_ram_file(source_, to);
  fs::path ready;
  {
    std::lock_guard lock(copies_->mu);
    ready = std::exchange(copies_->ready, {});
    copies_->last_take = steady_clock::now();
    copies_->cv.notify_all();
  }
  // (a rename in one file system; `to` is new)
  bool taken = !ready.empty() && ::rename(ready.c_str(), to.c_str()) == 0;
  const int rename_errno = errno;
  if (!ready.empty() && !taken) ::unlink(ready.c_str());
  Status st = taken ? Status(Ok{}) : copy_ram_file(source_, to);
  std::lock_guard lock(copies_->mu);
  if (!ready.empty() && !taken && rename_errno == EXDEV && !copies_->stopped) {
    // Saves go to another file system than the copies: none could ever be taken.
    spdlog::warn("memory base {}: no more copies made ahead: {} is not on the file system of {}",
                 name_, copies_->dir.string(), to.parent_path().string());
    copies_->stopped = true;
    copies_->cv.notify_all();
  }
  if (!copies_->running && !copies_->stopped) {
    try {
      std::thread(make_copies, copies_).detach();
      copies_->running = true;
    } catch (const std::system_error& e) {  // (no thread to be had: the next save copies)
      spdlog::warn("memory base {}: no copy made ahead: {}", name_, e.what());
    }
  }
  return st;
}

Result<PrivateMemory> private_memory(pid_t pid, const std::string& memfd_name, uint64_t size) {
  auto mappings = ram_mappings(pid, memfd_name, size);
  if (!mappings) return mappings.error();
  PrivateMemory out;
  auto st = each_private_run(pid, *mappings, [&](uint64_t, uint64_t, uint64_t length) -> Status {
    out.pages += length / kPage;
    return Ok{};
  });
  if (!st) return st.error();
  return out;
}

Status copy_memory_base(pid_t pid, const std::string& memfd_name, uint64_t size,
                        const fs::path& base_file, const fs::path& to, const MemoryBase* base) {
  auto mappings = ram_mappings(pid, memfd_name, size);
  if (!mappings) return mappings.error();
  // The base's file, or when it is gone (its template deleted meanwhile) the memfd QEMU maps: the
  // same bytes (whatever QEMU maps under that name only ever goes into its own snapshot).
  fs::path source = base_file;
  std::error_code ec;
  if (!fs::exists(base_file, ec)) {
    auto whole = std::find_if(mappings->begin(), mappings->end(),
                              [&](const RamMapping& m) { return m.offset == 0; });
    if (whole == mappings->end())
      return make_error(ErrorCode::not_found, "the memory base " + base_file.string() +
                                                  " is gone and process " + std::to_string(pid) +
                                                  " maps none of it at 0");
    char range[64];
    std::snprintf(range, sizeof range, "%lx-%lx", (unsigned long)whole->address,
                  (unsigned long)(whole->address + whole->length));
    source = "/proc/" + std::to_string(pid) + "/map_files/" + range;
  }
  struct stat sb {};
  if (::stat(source.c_str(), &sb) != 0 || uint64_t(sb.st_size) != size)
    return make_error(ErrorCode::io_error, "the memory base " + source.string() + " is not " +
                                               std::to_string(size) + " bytes of RAM");
  return base && base->source() == source ? base->copy_file_to(to) : copy_ram_file(source, to);
}

Status write_private_pages(pid_t pid, const std::string& memfd_name, uint64_t size,
                           const fs::path& to) {
  auto mappings = ram_mappings(pid, memfd_name, size);
  if (!mappings) return mappings.error();
  int out = ::open(to.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (out < 0) return errno_error("cannot open " + to.string());
  struct stat ob {};
  if (::fstat(out, &ob) != 0 || !S_ISREG(ob.st_mode) || uint64_t(ob.st_size) != size) {
    ::close(out);
    return make_error(ErrorCode::io_error,
                      to.string() + " is not a copy of " + std::to_string(size) + " bytes of RAM");
  }
  std::vector<char> buffer(1 << 20);
  auto st = each_private_run(
      pid, *mappings, [&](uint64_t address, uint64_t offset, uint64_t length) -> Status {
        for (uint64_t done = 0; done < length;) {
          size_t n = size_t(std::min<uint64_t>(buffer.size(), length - done));
          iovec local{buffer.data(), n};
          iovec remote{reinterpret_cast<void*>(address + done), n};
          if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) != ssize_t(n))
            return errno_error("cannot read the guest's memory from process " +
                               std::to_string(pid));
          // Runs of data pages written, runs of zero pages punched (the base may have data there).
          for (size_t at = 0; at < n;) {
            bool is_zero = all_zero(buffer.data() + at, kPage);
            size_t end = at + kPage;
            while (end < n && all_zero(buffer.data() + end, kPage) == is_zero) end += kPage;
            off_t file_at = off_t(offset + done + at);
            if (is_zero ? ::fallocate(out, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, file_at,
                                      off_t(end - at)) != 0
                        : ::pwrite(out, buffer.data() + at, end - at, file_at) != ssize_t(end - at))
              return errno_error("cannot write " + to.string());
            at = end;
          }
          done += n;
        }
        return Ok{};
      });
  ::close(out);
  if (!st) ::unlink(to.c_str());
  return st;
}

Result<std::string> incoming_state_of_devices(const std::string& devices,
                                              const std::string& machine_type) {
  // QEMU's header: "QEVM" and the file format version 3.
  static const std::string kHeader("QEVM\0\0\0\3", 8);
  if (devices.compare(0, kHeader.size(), kHeader) != 0)
    return make_error(ErrorCode::invalid_argument, "not a QEMU device state");
  if (machine_type.empty() || machine_type.size() > 255)
    return make_error(ErrorCode::invalid_argument, "bad machine type");
  auto be32 = [](std::string& s, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(char((v >> shift) & 0xff));
  };
  auto counted = [](std::string& s, const std::string& text) {
    s.push_back(char(text.size()));
    s += text;
  };
  std::string out = kHeader;
  // QEMU_VM_CONFIGURATION: the machine type, then the subsection of validated capabilities.
  out.push_back(char(0x07));
  be32(out, uint32_t(machine_type.size()));
  out += machine_type;
  out.push_back(char(0x05));  // QEMU_VM_SUBSECTION
  counted(out, "configuration/capabilities");
  be32(out, 1);  // its version
  be32(out, 1);  // one capability
  counted(out, "x-ignore-shared");
  out.append(devices, kHeader.size());
  // QEMU_VM_VMDESCRIPTION: read and skipped by the loader, which warns when it is missing.
  out.push_back(char(0x06));
  be32(out, 2);
  out += "{}";
  return out;
}

}  // namespace pandastack::vmm
