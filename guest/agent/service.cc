#include "guest/agent/service.h"

#include <dirent.h>
#include <fcntl.h>
#include <kj/debug.h>
#include <linux/random.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "guest/agent/memory.h"
#include "guest/agent/processes.h"
#include "guest/agent/system.h"
#include "guest/agent/util.h"
#include "guest/agent/watcher.h"

namespace pandastack::agent {

namespace {

constexpr size_t kMaxReadChunk = 4u << 20;  // readFile cap per call

// A command that could not start: why, and exit code 127 (as a shell says).
void fill_start_error(w::ExecResult::Builder r, const std::string& error) {
  r.setError(error);
  r.setExitCode(127);
}

// Grows the ext4 file system mounted at `path` to `disk_bytes` (EXT4_IOC_RESIZE_FS, what an
// online resize2fs does); nothing to do when it fills its disk already. 0 or an errno.
int grow_to_disk(const std::string& path, uint64_t disk_bytes) {
  constexpr unsigned long kExt4ResizeFs = _IOW('f', 16, uint64_t);  // <linux/ext4.h>'s
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct statvfs st {};
  int e = 0;
  if (::fstatvfs(fd, &st) != 0 || st.f_frsize == 0) {
    e = errno != 0 ? errno : EINVAL;
  } else {
    uint64_t blocks = disk_bytes / st.f_frsize;
    // (the kernel answers 0 at once for the size the file system has)
    if (::ioctl(fd, kExt4ResizeFs, &blocks) != 0) e = errno;
  }
  ::close(fd);
  return e;
}

// The account a file call's `owner` names (none for ""), or false with the call's error set.
template <typename Results>
bool owner_of(capnp::Text::Reader name, std::optional<Account>& owner, Results& r) {
  if (name.size() == 0) return true;
  owner = find_account(name.cStr());
  if (owner) return true;
  auto err = r.initError();
  err.setCode("invalid_argument");
  err.setMessage(std::string("no user '") + name.cStr() + "' in the guest");
  return false;
}

class AgentImpl final : public w::Agent::Server {
 public:
  AgentImpl(Processes& procs, std::string boot_id, std::function<void()> end_session)
      : procs_(procs), boot_id_(kj::mv(boot_id)), end_session_(kj::mv(end_session)) {}

  kj::Promise<void> endSession(EndSessionContext) override {
    end_session_();
    return kj::READY_NOW;
  }

  kj::Promise<void> health(HealthContext ctx) override {
    auto r = ctx.getResults();
    r.setVersion(kVersion);
    r.setProtocolVersion(w::PROTOCOL_VERSION);
    r.setUptimeMs(now_ms(CLOCK_BOOTTIME));
    r.setBootId(boot_id_);
    return kj::READY_NOW;
  }

  kj::Promise<void> exec(ExecContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto req = ctx.getParams().getRequest();
    size_t cap = req.getMaxOutputBytes() > 0 ? req.getMaxOutputBytes() : kDefaultMaxOutput;
    auto started = procs_.start(req);
    KJ_SWITCH_ONEOF(started) {
      KJ_CASE_ONEOF(err, std::string) {
        fill_start_error(ctx.getResults().initResult(), err);
        return kj::READY_NOW;
      }
      KJ_CASE_ONEOF(cmd, kj::Own<Command>) {
        struct Buffers {
          std::string out, err;
          bool out_trunc = false, err_trunc = false;
        };
        auto bufs = kj::heap<Buffers>();
        Buffers* b = bufs.get();
        auto handler = kj::heap<ChunkHandler>(
            [b, cap](w::StreamKind kind, kj::ArrayPtr<const kj::byte> data) -> kj::Promise<void> {
              auto& s = kind == w::StreamKind::STDOUT ? b->out : b->err;
              auto& t = kind == w::StreamKind::STDOUT ? b->out_trunc : b->err_trunc;
              size_t room = cap > s.size() ? cap - s.size() : 0;
              size_t n = std::min(room, data.size());
              s.append(reinterpret_cast<const char*>(data.begin()), n);
              if (n < data.size()) t = true;
              return kj::READY_NOW;
            });
        auto in = kj::heapArray<const kj::byte>(req.getStdin().begin(), req.getStdin().size());
        return procs_.run(kj::mv(cmd), kj::mv(in), kj::mv(handler))
            .then([ctx, b](RunOutcome o) mutable {
              auto r = ctx.getResults().initResult();
              fill_result(r, o);
              r.setStdout(
                  kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->out.data()), b->out.size()));
              r.setStderr(
                  kj::arrayPtr(reinterpret_cast<const kj::byte*>(b->err.data()), b->err.size()));
              r.setStdoutTruncated(b->out_trunc);
              r.setStderrTruncated(b->err_trunc);
            })
            .attach(kj::mv(bufs));
      }
    }
    KJ_UNREACHABLE;
  }

  kj::Promise<void> execStream(ExecStreamContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto params = ctx.getParams();
    auto req = params.getRequest();
    auto sink = kj::heap<w::OutputSink::Client>(params.getSink());
    auto started = procs_.start(req);
    KJ_SWITCH_ONEOF(started) {
      KJ_CASE_ONEOF(err, std::string) {
        fill_start_error(ctx.getResults().initResult(), err);
        return kj::READY_NOW;
      }
      KJ_CASE_ONEOF(cmd, kj::Own<Command>) {
        w::OutputSink::Client* s = sink.get();
        auto handler = kj::heap<ChunkHandler>(
            [s](w::StreamKind kind, kj::ArrayPtr<const kj::byte> data) -> kj::Promise<void> {
              auto r = s->writeRequest();
              r.setKind(kind);
              r.setData(data);
              return r.send();
            });
        auto in = kj::heapArray<const kj::byte>(req.getStdin().begin(), req.getStdin().size());
        return procs_.run(kj::mv(cmd), kj::mv(in), kj::mv(handler))
            .then([ctx](RunOutcome o) mutable { fill_result(ctx.getResults().initResult(), o); })
            .attach(kj::mv(sink));
      }
    }
    KJ_UNREACHABLE;
  }

  kj::Promise<void> startProcess(StartProcessContext ctx) override {
    uint32_t pid = 0;
    KJ_IF_MAYBE (err, procs_.start_background(ctx.getParams().getRequest(), pid)) {
      ctx.getResults().setError(*err);
    } else {
      ctx.getResults().setPid(pid);
    }
    return kj::READY_NOW;
  }

  static void fill_bg_result(w::ExecResult::Builder r, Processes::Background& b) {
    fill_result(r, b.outcome);
    r.setStdout(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.out.data()), b.out.size()));
    r.setStderr(kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.err.data()), b.err.size()));
  }

  kj::Promise<void> waitProcess(WaitProcessContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto* b = procs_.find(ctx.getParams().getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
      return kj::READY_NOW;
    }
    kj::Own<Processes::Background> ref = kj::addRef(*b);
    KJ_IF_MAYBE (d, b->done) {
      return d->addBranch().then([ctx, ref = kj::mv(ref)]() mutable {
        fill_bg_result(ctx.getResults().initResult(), *ref);
      });
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> killProcess(KillProcessContext ctx) override {
    auto p = ctx.getParams();
    auto* b = procs_.find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
    } else if (b->running) {
      ::kill(-pid_t(b->pid), p.getSignal() != 0 ? p.getSignal() : SIGKILL);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> writeStdin(WriteStdinContext ctx) override {
    auto p = ctx.getParams();
    auto* b = procs_.find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
    } else if (!b->in) {
      ctx.getResults().setError(
          "stdin is closed (or the process was not started with keepStdinOpen)");
    } else {
      Processes::write_stdin(*b, p.getData(), p.getClose());
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> streamProcess(StreamProcessContext ctx) override {
    ctx.allowCancellation();  // a dropped call (cancel, disconnect) kills the command
    auto p = ctx.getParams();
    auto* b = procs_.find(p.getPid());
    if (b == nullptr) {
      ctx.getResults().setError("no such process");
      return kj::READY_NOW;
    }
    auto sink = p.getSink();
    // Replay what is buffered, then attach for live output; E-order on `sink` keeps it in order.
    kj::Vector<kj::Promise<void>> sends;
    for (auto kind : {w::StreamKind::STDOUT, w::StreamKind::STDERR}) {
      auto& s = kind == w::StreamKind::STDOUT ? b->out : b->err;
      if (s.empty()) continue;
      auto r = sink.writeRequest();
      r.setKind(kind);
      r.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size()));
      sends.add(r.send());
    }
    kj::Own<Processes::Background> ref = kj::addRef(*b);
    auto replayed = kj::joinPromises(sends.releaseAsArray());
    if (!b->running) {
      return replayed.then([ctx, ref = kj::mv(ref)]() mutable {
        auto r = ctx.getResults().initResult();
        fill_result(r, ref->outcome);
      });
    }
    uint64_t sink_id = ++b->next_sink;
    b->sinks.emplace(sink_id, kj::mv(sink));
    // The stream ends with this call: a cancelled call (the host stopped reading) must not keep
    // its sink, or every later chunk would go to a host that no longer listens.
    auto detach = kj::defer([b = kj::addRef(*b), sink_id]() mutable { b->sinks.erase(sink_id); });
    KJ_IF_MAYBE (d, b->done) {
      return replayed.then([d]() { return d->addBranch(); })
          .then([ctx, ref = kj::mv(ref)]() mutable {
            fill_result(ctx.getResults().initResult(), ref->outcome);
          })
          .attach(kj::mv(detach));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> listProcesses(ListProcessesContext ctx) override {
    auto& all = procs_.background();
    auto list = ctx.getResults().initProcesses(all.size());
    size_t i = 0;
    for (auto& [pid, b] : all) {
      auto e = list[i++];
      e.setPid(pid);
      e.setCommand(b->command);
      e.setRunning(b->running);
      e.setExitCode(b->outcome.exit_code);
      e.setStartedAtMs(b->started_ms);
      e.setPty(b->pty);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> resizePty(ResizePtyContext ctx) override {
    auto p = ctx.getParams();
    KJ_IF_MAYBE (err, procs_.resize(p.getPid(), p.getCols(), p.getRows())) {
      ctx.getResults().setError(*err);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> watch(WatchContext ctx) override {
    ctx.allowCancellation();  // the host stops watching by dropping the call
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    int e = 0;
    auto watcher = Watcher::open(procs_.io(), path, p.getRecursive(), e);
    if (watcher.get() == nullptr) {
      auto err = ctx.getResults().initError();
      if (e == E2BIG) {
        err.setCode("too_many");
        err.setMessage(path + ": more than " + std::to_string(kMaxWatchedDirs) +
                       " directories to watch");
      } else {
        set_error(err, e, path);
      }
      return kj::READY_NOW;
    }
    if (p.getIncludeEntry()) watcher->include_entries();
    auto run = watcher->run(p.getSink());
    return run.attach(kj::mv(watcher));
  }

  kj::Promise<void> readFile(ReadFileContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    auto r = ctx.getResults();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    KJ_DEFER(::close(fd));
    struct stat st {};
    ::fstat(fd, &st);
    if (S_ISDIR(st.st_mode)) {
      set_error(r.initError(), EISDIR, path);
      return kj::READY_NOW;
    }
    r.setSize(uint64_t(st.st_size));
    size_t want =
        std::min<size_t>(p.getLength() == 0 ? kMaxReadChunk : p.getLength(), kMaxReadChunk);
    auto buf = kj::heapArray<kj::byte>(want);
    size_t got = 0;
    while (got < want) {
      // At most 64 KiB per read: some special files refuse large ones (/proc/sys allocates a
      // kernel buffer of the request's size: ENOMEM for 4 MiB).
      size_t piece = std::min<size_t>(want - got, 64u << 10);
      ssize_t n = ::pread(fd, buf.begin() + got, piece, off_t(p.getOffset() + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        set_error(r.initError(), errno, path);
        return kj::READY_NOW;
      }
      if (n == 0) break;
      got += size_t(n);
    }
    r.setData(buf.slice(0, got));
    return kj::READY_NOW;
  }

  kj::Promise<void> writeFile(WriteFileContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    auto r = ctx.getResults();
    std::optional<Account> owner;
    if (!owner_of(p.getOwner(), owner, r)) return kj::READY_NOW;
    if (p.getMakeParents()) {
      auto slash = path.find_last_of('/');
      int e = mkdir_p(path.substr(0, slash), 0755, owner ? &*owner : nullptr);
      if (e != 0) {
        set_error(r.initError(), e, path);
        return kj::READY_NOW;
      }
    }
    mode_t mode = p.getMode() != 0 ? mode_t(p.getMode() & 07777) : 0644;
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    if (p.getTruncate()) flags |= O_TRUNC;
    if (p.getAppend()) flags |= O_APPEND;
    // Made by this call: it belongs to the owner (an existing file keeps its own).
    int fd = owner ? ::open(path.c_str(), flags | O_EXCL, mode) : -1;
    bool made = fd >= 0;
    if (!made) fd = ::open(path.c_str(), flags, mode);
    if (fd < 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    KJ_DEFER(::close(fd));
    if (made && ::fchown(fd, owner->uid, owner->gid) != 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    if (p.getTruncate() && p.getMode() != 0) ::fchmod(fd, mode);
    auto data = p.getData();
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd, data.begin() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        set_error(r.initError(), errno, path);
        return kj::READY_NOW;
      }
      done += size_t(n);
    }
    if (p.getSetMetadata()) {
      int e = set_metadata(fd, p.getMetadata());
      // (nothing to set and nothing settable: the file simply has no metadata)
      if (e == ENOTSUP && p.getMetadata().size() == 0) e = 0;
      if (e == ENOTSUP) {
        auto err = r.initError();
        err.setCode("invalid_argument");
        err.setMessage(path + ": its file system keeps no metadata (user extended attributes)");
      } else if (e != 0) {
        set_error(r.initError(), e, path);
      }
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> listDir(ListDirContext ctx) override {
    auto path = resolve(ctx.getParams().getPath());
    auto r = ctx.getResults();
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    std::vector<std::pair<std::string, struct stat>> entries;
    // At most one entry more than the host takes (vmm-driver/agent_client.h, kMaxListEntries):
    // the host refuses the listing instead of the reply growing past its message limit.
    while (auto* e = ::readdir(d)) {
      if (entries.size() > 100000) break;
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st {};
      if (::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        entries.emplace_back(n, st);
    }
    ::closedir(d);
    std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.first < b.first; });
    auto list = r.initEntries(entries.size());
    Names names;
    for (size_t i = 0; i < entries.size(); ++i)
      fill_stat(list[i], entries[i].first, path + "/" + entries[i].first, entries[i].second, names);
    return kj::READY_NOW;
  }

  kj::Promise<void> stat(StatContext ctx) override {
    auto path = resolve(ctx.getParams().getPath());
    auto r = ctx.getResults();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      set_error(r.initError(), errno, path);
      return kj::READY_NOW;
    }
    auto slash = path.find_last_of('/');
    Names names;
    fill_stat(r.initStat(), path.substr(slash + 1), path, st, names);
    return kj::READY_NOW;
  }

  kj::Promise<void> remove(RemoveContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    int e = 0;
    if (p.getRecursive()) {
      e = remove_tree(path);
    } else {
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0)
        e = errno;
      else if (S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) != 0 : ::unlink(path.c_str()) != 0)
        e = errno;
    }
    if (e != 0) set_error(ctx.getResults().initError(), e, path);
    return kj::READY_NOW;
  }

  kj::Promise<void> rename(RenameContext ctx) override {
    auto p = ctx.getParams();
    auto from = resolve(p.getFrom()), to = resolve(p.getTo());
    if (::rename(from.c_str(), to.c_str()) != 0)
      set_error(ctx.getResults().initError(), errno, from);
    return kj::READY_NOW;
  }

  kj::Promise<void> mkdir(MkdirContext ctx) override {
    auto p = ctx.getParams();
    auto path = resolve(p.getPath());
    auto r = ctx.getResults();
    std::optional<Account> owner;
    if (!owner_of(p.getOwner(), owner, r)) return kj::READY_NOW;
    mode_t mode = p.getMode() != 0 ? mode_t(p.getMode() & 07777) : 0755;
    int e = 0;
    if (p.getParents())
      e = mkdir_p(path, mode, owner ? &*owner : nullptr);
    else if (::mkdir(path.c_str(), mode) != 0)
      e = errno;
    else if (owner && ::lchown(path.c_str(), owner->uid, owner->gid) != 0)
      e = errno;
    if (e != 0) set_error(r.initError(), e, path);
    return kj::READY_NOW;
  }

  kj::Promise<void> setClock(SetClockContext ctx) override {
    int64_t ns = ctx.getParams().getUnixNanos();
    timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
      KJ_FAIL_REQUIRE("clock_settime failed", strerror(errno));
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> reseedRng(ReseedRngContext ctx) override {
    auto entropy = ctx.getParams().getEntropy();
    KJ_REQUIRE(entropy.size() > 0 && entropy.size() <= 4096, "entropy size", entropy.size());
    int fd = ::open("/dev/urandom", O_RDWR | O_CLOEXEC);
    KJ_REQUIRE(fd >= 0, "open /dev/urandom", strerror(errno));
    KJ_DEFER(::close(fd));
    auto info = kj::heapArray<kj::byte>(sizeof(rand_pool_info) + entropy.size());
    auto* rpi = reinterpret_cast<rand_pool_info*>(info.begin());
    rpi->entropy_count = int(entropy.size() * 8);
    rpi->buf_size = int(entropy.size());
    memcpy(rpi->buf, entropy.begin(), entropy.size());
    KJ_REQUIRE(::ioctl(fd, RNDADDENTROPY, rpi) == 0, "RNDADDENTROPY", strerror(errno));
    // Force the CRNG to reseed now, so the very next random bytes already differ between forks.
    KJ_REQUIRE(::ioctl(fd, RNDRESEEDCRNG) == 0, "RNDRESEEDCRNG", strerror(errno));
    return kj::READY_NOW;
  }

  kj::Promise<void> setNetwork(SetNetworkContext ctx) override {
    if (ctx.getParams().getEnabled())
      configure_network();
    else
      take_network_down();
    return kj::READY_NOW;
  }

  kj::Promise<void> setFreePageReporting(SetFreePageReportingContext ctx) override {
    // Binding the balloon's driver takes the guest tens of milliseconds under TCG: done in the
    // background (in order), so a restore's reply does not wait for it.
    bool on = ctx.getParams().getEnabled();
    std::thread([on] {
      static std::mutex mu;
      std::lock_guard lock(mu);
      if (int e = set_free_page_reporting(on); e != 0)
        log_line(std::string("free page reporting: the balloon driver: ") + strerror(e));
    }).detach();
    return kj::READY_NOW;
  }

  kj::Promise<void> mountVolume(MountVolumeContext ctx) override {
    auto p = ctx.getParams();
    auto fail = [&](int e, const std::string& what) {
      set_error(ctx.getResults().initError(), e, what);
      return kj::READY_NOW;
    };
    std::string path(p.getPath().cStr());
    if (path.empty() || path[0] != '/' || path == "/") return fail(EINVAL, "mount path " + path);
    // The disk whose serial names the slot (the guest has no udev: /sys is the map).
    std::string serial = "pds-vol" + std::to_string(p.getSlot()), dev;
    if (DIR* d = ::opendir("/sys/block")) {
      while (auto* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name.rfind("vd", 0) == 0 &&
            read_small(("/sys/block/" + name + "/serial").c_str()) == serial)
          dev = name;
      }
      ::closedir(d);
    }
    if (dev.empty()) return fail(ENODEV, "no disk " + serial);
    // The host grew the slot when it bound the volume; the kernel applies that asynchronously.
    auto size_file = "/sys/block/" + dev + "/size";
    uint64_t want = p.getSizeBytes() / 512;
    for (int i = 0;
         i < 4000 && std::strtoull(read_small(size_file.c_str()).c_str(), nullptr, 10) != want; ++i)
      ::usleep(500);
    if (std::strtoull(read_small(size_file.c_str()).c_str(), nullptr, 10) != want)
      return fail(EIO,
                  "disk " + dev + " did not reach " + std::to_string(p.getSizeBytes()) + " bytes");
    if (int e = mkdir_p(path, 0755); e != 0) return fail(e, path);
    unsigned long flags = MS_NOATIME | MS_NODEV | MS_NOSUID;
    if (p.getReadOnly()) flags |= MS_RDONLY;
    auto node = "/dev/" + dev;
    if (::mount(node.c_str(), path.c_str(), "ext4", flags, p.getReadOnly() ? "noload" : "") != 0)
      return fail(errno, "mount " + node + " on " + path);
    // A volume the host grew (it only extends the file: it never reads the guest's file system)
    // grows here, online, by the guest's own kernel, into the whole disk.
    if (!p.getReadOnly()) {
      if (int e = grow_to_disk(path, want * 512); e != 0) {
        ::umount2(path.c_str(), MNT_DETACH);
        return fail(e, "growing the file system on " + node + " to its disk's size");
      }
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> setHostname(SetHostnameContext ctx) override {
    auto h = ctx.getParams().getHostname();
    KJ_REQUIRE(h.size() > 0 && h.size() < 64, "hostname length", h.size());
    KJ_REQUIRE(::sethostname(h.cStr(), h.size()) == 0, "sethostname", strerror(errno));
    // The files that name it too, so `hostname`, /etc/hostname and name lookups agree.
    write_small_file("/etc/hostname", std::string(h.cStr()) + "\n");
    write_small_file("/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 " + std::string(h.cStr()) +
                                       "\n::1 localhost ip6-localhost ip6-loopback\n");
    return kj::READY_NOW;
  }

 private:
  Processes& procs_;
  std::string boot_id_;
  std::function<void()> end_session_;
};

}  // namespace

kj::Own<wire::agent::Agent::Server> make_service(Processes& procs, std::string boot_id,
                                                 std::function<void()> end_session) {
  return kj::heap<AgentImpl>(procs, kj::mv(boot_id), kj::mv(end_session));
}

}  // namespace pandastack::agent
