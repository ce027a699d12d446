#include "vmm-driver/jail.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace pandastack::vmm {

namespace fs = std::filesystem;

extern const char* const kJailPolicyText;  // generated from jail.policy

namespace {

std::vector<std::string> split_ws(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

Result<uint64_t> parse_size(const std::string& s) {
  if (s.empty()) return make_error(ErrorCode::invalid_argument, "empty size");
  uint64_t mult = 1;
  std::string digits = s;
  char last = char(std::tolower(s.back()));
  if (last == 'k' || last == 'm' || last == 'g') {
    mult = last == 'k' ? 1024 : last == 'm' ? 1024 * 1024 : 1024ull * 1024 * 1024;
    digits.pop_back();
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return make_error(ErrorCode::invalid_argument, "bad size '" + s + "'");
  return std::stoull(digits) * mult;
}

}  // namespace

Result<JailPolicy> JailPolicy::parse(const std::string& text) {
  JailPolicy p;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    auto hash = line.find('#');
    std::string body = line.substr(0, hash);
    auto words = split_ws(body);
    if (words.empty()) continue;
    auto err = [&](const std::string& what) {
      return make_error(ErrorCode::invalid_argument,
                        "jail policy line " + std::to_string(n) + ": " + what);
    };
    std::string reason = hash == std::string::npos ? "" : line.substr(hash + 1);
    if (reason.find_first_not_of(" \t") == std::string::npos)
      return err("allowance without a reason: " + body);
    const std::string& k = words[0];
    auto need = [&](size_t count) { return words.size() == count + 1; };
    using K = Entry::Kind;
    if (k == "namespace" && need(1)) {
      static const std::map<std::string, int> ns = {{"mount", CLONE_NEWNS},
                                                    {"pid", CLONE_NEWPID},
                                                    {"ipc", CLONE_NEWIPC},
                                                    {"uts", CLONE_NEWUTS},
                                                    {"net", CLONE_NEWNET}};
      auto it = ns.find(words[1]);
      if (it == ns.end()) return err("unknown namespace " + words[1]);
      p.clone_flags |= it->second;
    } else if (k == "root-tmpfs" && need(1)) {
      if (!parse_size(words[1])) return err("bad size " + words[1]);
      p.root_tmpfs_size = words[1];
    } else if ((k == "bind-ro" || k == "bind-rw") && need(1)) {
      p.entries.push_back({k == "bind-ro" ? K::bind_ro : K::bind_rw, words[1], ""});
    } else if ((k == "dev" || k == "dev-optional") && need(1)) {
      p.entries.push_back({k == "dev" ? K::dev : K::dev_optional, words[1], ""});
    } else if (k == "symlink" && need(2)) {
      p.entries.push_back({K::symlink, words[1], words[2]});
    } else if (k == "proc" && need(0)) {
      p.entries.push_back({K::proc, "/proc", ""});
    } else if (k == "user" && need(2)) {
      p.uid_base = uint32_t(std::stoul(words[1]));
      p.uid_count = uint32_t(std::stoul(words[2]));
      if (p.uid_base == 0 || p.uid_count == 0)
        return err("user range must be unprivileged and non-empty");
    } else if (k == "no-new-privs" && need(0)) {
      p.no_new_privs = true;
    } else if (k == "seccomp" && need(1)) {
      p.seccomp = words[1];
    } else if (k == "cgroup-memory-overhead" && need(1)) {
      auto sz = parse_size(words[1]);
      if (!sz) return err(sz.error().message);
      p.memory_overhead_bytes = *sz;
    } else if (k == "cgroup-pids" && need(1)) {
      p.pids_max = uint32_t(std::stoul(words[1]));
    } else {
      return err("unknown or malformed allowance: " + body);
    }
  }
  if (p.root_tmpfs_size.empty())
    return make_error(ErrorCode::invalid_argument, "jail policy: no root-tmpfs");
  if (p.uid_count == 0)
    return make_error(ErrorCode::invalid_argument, "jail policy: no user range");
  return p;
}

const std::string& JailPolicy::builtin_text() {
  static const std::string text = kJailPolicyText;
  return text;
}

const JailPolicy& JailPolicy::builtin() {
  static const JailPolicy policy = [] {
    auto p = parse(builtin_text());
    if (!p) {
      spdlog::critical("built-in jail policy is invalid: {}", p.error().message);
      std::abort();
    }
    return *p;
  }();
  return policy;
}

// ---------------------------------------------------------------------------------------------
// cgroups

namespace {
bool write_text(const fs::path& p, const std::string& v) {
  std::ofstream out(p);
  out << v;
  out.flush();
  return bool(out);
}

// This process's cgroup path in a v1 hierarchy (e.g. "memory"), from /proc/self/cgroup.
std::string own_v1_path(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1);
    for (auto& c : split_ws([&] {
           std::string x = ctrls;
           for (auto& ch : x)
             if (ch == ',') ch = ' ';
           return x;
         }()))
      if (c == controller) return line.substr(b + 1);
  }
  return "/";
}
}  // namespace

std::unique_ptr<Cgroup> Cgroup::create(const std::string& name, uint64_t memory_bytes,
                                       uint32_t pids_max, uint32_t cpu_weight,
                                       uint32_t cpu_max_percent) {
  constexpr uint64_t kPeriodUs = 100000;
  auto g = std::unique_ptr<Cgroup>(new Cgroup());
  std::error_code ec;
  if (fs::exists("/sys/fs/cgroup/cgroup.controllers")) {
    g->v2_ = true;
    fs::path parent = "/sys/fs/cgroup/pandastack";
    fs::create_directories(parent, ec);
    write_text("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids +cpu");
    write_text(parent / "cgroup.subtree_control", "+memory +pids +cpu");
    fs::path dir = parent / name;
    fs::create_directory(dir, ec);
    if (ec) {
      spdlog::warn("cgroup v2: cannot create {}: {} (no resource limits)", dir.string(),
                   ec.message());
      return nullptr;
    }
    g->dirs_.push_back(dir);
    if (memory_bytes) write_text(dir / "memory.max", std::to_string(memory_bytes));
    if (pids_max) write_text(dir / "pids.max", std::to_string(pids_max));
    if (cpu_weight) write_text(dir / "cpu.weight", std::to_string(cpu_weight));
    if (cpu_max_percent)
      write_text(dir / "cpu.max", std::to_string(kPeriodUs * cpu_max_percent / 100) + " " +
                                      std::to_string(kPeriodUs));
    if (cpu_weight) write_text(dir / "io.weight", "default " + std::to_string(cpu_weight));
    return g;
  }
  // cgroup v1: memory and pids hierarchies, below this process's own groups.
  struct V1 {
    const char* controller;
    const char* file;
    uint64_t value;
  };
  uint64_t shares = uint64_t(cpu_weight) * 1024 / 100;
  for (V1 c :
       {V1{"memory", "memory.limit_in_bytes", memory_bytes}, V1{"pids", "pids.max", pids_max},
        V1{"cpu", "cpu.shares", std::max<uint64_t>(shares, cpu_max_percent ? 1024 : 0)}}) {
    fs::path root = fs::path("/sys/fs/cgroup") / c.controller;
    if (!fs::exists(root / "cgroup.procs") || c.value == 0) continue;
    fs::path dir = root / own_v1_path(c.controller).substr(1) / "pandastack" / name;
    fs::create_directories(dir, ec);
    if (ec || !write_text(dir / c.file, std::to_string(c.value))) {
      spdlog::warn("cgroup v1 {}: cannot set up {}: {}", c.controller, dir.string(),
                   ec ? ec.message() : "write failed");
      fs::remove(dir, ec);
      continue;
    }
    if (std::string(c.controller) == "cpu" && cpu_max_percent) {
      write_text(dir / "cpu.cfs_period_us", std::to_string(kPeriodUs));
      write_text(dir / "cpu.cfs_quota_us", std::to_string(kPeriodUs * cpu_max_percent / 100));
    }
    g->dirs_.push_back(dir);
  }
  if (g->dirs_.empty()) return nullptr;
  return g;
}

Status Cgroup::add(pid_t pid) {
  for (auto& d : dirs_)
    if (!write_text(d / "cgroup.procs", std::to_string(pid)))
      return make_error(ErrorCode::spawn_failed, "cannot move pid into " + d.string());
  return Ok{};
}

uint64_t Cgroup::oom_kills() const {
  // v2: memory.events has "oom_kill N"; v1: memory.oom_control has the same line.
  for (auto& d : dirs_)
    for (const char* f : {"memory.events", "memory.oom_control"}) {
      std::ifstream in(d / f);
      std::string key;
      uint64_t n = 0;
      while (in >> key >> n)
        if (key == "oom_kill") return n;
    }
  return 0;
}

void Cgroup::remove(const std::string& name) {
  std::vector<fs::path> dirs;
  bool v2 = fs::exists("/sys/fs/cgroup/cgroup.controllers");
  if (v2) {
    dirs.push_back(fs::path("/sys/fs/cgroup/pandastack") / name);
  } else {
    for (const char* c : {"memory", "pids", "cpu"})
      dirs.push_back(fs::path("/sys/fs/cgroup") / c / own_v1_path(c).substr(1) / "pandastack" /
                     name);
  }
  std::error_code ec;
  std::erase_if(dirs, [&](const fs::path& d) { return !fs::exists(d, ec); });
  adopt(v2, std::move(dirs));  // the destructor removes them
}

Cgroup::~Cgroup() {
  for (auto& d : dirs_) {
    // The group empties once QEMU is gone; one that just died (or an adopted one, which init
    // reaps) may still count for a moment: EBUSY. Retry for at most 500 ms, else it leaks.
    for (int tries = 0;; ++tries) {
      if (::rmdir(d.c_str()) == 0 || errno == ENOENT) break;
      if (errno != EBUSY || tries >= 50) {
        spdlog::warn("cannot remove cgroup {}: {}", d.string(), strerror(errno));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Uids

namespace {
std::mutex uids_mu;
std::set<uint32_t> uids_in_use;
uint32_t uids_next = 0;
}  // namespace

uint32_t JailUids::acquire(uint32_t base, uint32_t count) {
  std::lock_guard l(uids_mu);
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t uid = base + (uids_next++ % count);
    if (uids_in_use.insert(uid).second) return uid;
  }
  return 0;
}

void JailUids::claim(uint32_t uid) {
  std::lock_guard l(uids_mu);
  uids_in_use.insert(uid);
}

void JailUids::release(uint32_t uid) {
  std::lock_guard l(uids_mu);
  uids_in_use.erase(uid);
}

std::vector<std::string> subid_overlaps(const std::string& text, uint32_t base, uint32_t count) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.rfind(':');
    if (a == std::string::npos || a == b) continue;
    try {
      uint64_t start = std::stoull(line.substr(a + 1, b - a - 1));
      uint64_t n = std::stoull(line.substr(b + 1));
      if (start < uint64_t(base) + count && uint64_t(base) < start + n) out.push_back(line);
    } catch (...) {
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Launch

Result<std::unique_ptr<JailLaunch>> JailLaunch::prepare(const JailPolicy& policy,
                                                        const std::vector<fs::path>& images,
                                                        const fs::path& run, const fs::path& disk,
                                                        uint32_t uid, std::vector<std::string> argv,
                                                        int log_fd, bool die_with_parent,
                                                        std::vector<int> inherit_fds) {
  auto l = std::unique_ptr<JailLaunch>(new JailLaunch());
  l->inherit_fds_ = std::move(inherit_fds);
  l->die_with_parent_ = die_with_parent;
  l->root_ = run.string() + ".jail";
  l->cwd_ = run.string();
  l->tmpfs_opts_ = "mode=0755,size=" + policy.root_tmpfs_size;
  l->clone_flags_ = policy.clone_flags;
  l->uid_ = uid;
  l->no_new_privs_ = policy.no_new_privs;
  l->log_fd_ = log_fd;
  std::error_code ec;
  fs::create_directories(l->root_, ec);
  if (ec)
    return make_error(ErrorCode::io_error,
                      "cannot create jail root " + l->root_ + ": " + ec.message());

  // Paths are stored in a list that never reallocates its strings' buffers once built.
  std::vector<std::tuple<JailLaunch::Step::Op, std::string, std::string, bool>> plan;
  std::set<std::string> made;
  auto mkdirs = [&](const std::string& inside) {
    std::string cur;
    for (auto& part : fs::path(inside)) {
      if (part == "/") continue;
      cur += "/" + part.string();
      if (made.insert(cur).second) plan.push_back({Step::mkdir, l->root_ + cur, "", false});
    }
  };
  auto bind = [&](const std::string& src, bool ro, bool is_dev, bool optional) {
    if (!fs::exists(src)) {
      if (optional) return;
    }
    std::string inside = src;
    if (fs::is_directory(src)) {
      mkdirs(inside);
    } else {
      mkdirs(fs::path(inside).parent_path().string());
      plan.push_back({Step::touch, l->root_ + inside, "", optional});
    }
    plan.push_back({Step::bind, src, l->root_ + inside, optional});
    if (is_dev)
      plan.push_back({Step::remount_dev, l->root_ + inside, "", optional});
    else if (ro)
      plan.push_back({Step::remount_ro, l->root_ + inside, "", optional});
  };
  using K = JailPolicy::Entry::Kind;
  for (auto& e : policy.entries) {
    std::vector<std::string> srcs;
    if (e.path == "$IMAGES")
      for (auto& i : images) srcs.push_back(fs::absolute(i).string());
    else if (e.path == "$RUN")
      srcs.push_back(fs::absolute(run).string());
    else if (e.path == "$DISK") {
      if (!disk.empty() && fs::absolute(disk) != fs::absolute(run))
        srcs.push_back(fs::absolute(disk).string());
    } else
      srcs.push_back(e.path);
    for (auto& src : srcs) {
      switch (e.kind) {
        case K::bind_ro:
          bind(src, true, false, false);
          break;
        case K::bind_rw:
          bind(src, false, false, false);
          break;
        case K::dev:
          bind(src, false, true, false);
          break;
        case K::dev_optional:
          bind(src, false, true, true);
          break;
        case K::symlink:
          plan.push_back({Step::symlink, e.target, l->root_ + src, false});
          break;
        case K::proc:
          mkdirs("/proc");
          plan.push_back({Step::proc, l->root_ + "/proc", "", false});
          break;
      }
    }
  }
  l->strings_.reserve(plan.size() * 2);
  for (auto& [op, a, b, opt] : plan) {
    l->strings_.push_back(a);
    l->strings_.push_back(b);
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    auto& [op, a, b, opt] = plan[i];
    l->steps_.push_back({op, l->strings_[2 * i].c_str(), l->strings_[2 * i + 1].c_str(), opt});
  }
  if (!policy.seccomp.empty()) {
    argv.push_back("-sandbox");
    argv.push_back(policy.seccomp);
  }
  l->argv_ = std::move(argv);
  for (auto& a : l->argv_) l->argv_ptrs_.push_back(a.data());
  l->argv_ptrs_.push_back(nullptr);
  static char path_env[] = "PATH=/usr/bin";
  l->env_ptrs_ = {path_env, nullptr};
  return l;
}

namespace {
struct ChildError {
  int step;
  int err;
};
}  // namespace

void JailLaunch::child(int err_fd) {
  auto die = [&](int step) {
    ChildError e{step, errno};
    ssize_t w = ::write(err_fd, &e, sizeof e);
    (void)w;
    ::_exit(126);
  };
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) die(-1);
  // The copies of the sandboxes' network namespace mounts would keep those namespaces alive for
  // as long as this QEMU runs: drop them (absent when no sandbox network exists).
  ::umount2("/run/netns", MNT_DETACH);
  if (::mount("tmpfs", root_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts_.c_str()) != 0)
    die(-2);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    int r = 0;
    switch (s.op) {
      case Step::mkdir:
        r = (::mkdir(s.a, 0755) == 0 || errno == EEXIST) ? 0 : -1;
        break;
      case Step::touch: {
        int fd = ::open(s.a, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        r = fd < 0 ? -1 : ::close(fd);
        break;
      }
      case Step::bind:
        r = ::mount(s.a, s.b, nullptr, MS_BIND | MS_REC, nullptr);
        break;
      case Step::remount_ro:
        r = ::mount(nullptr, s.a, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
                    nullptr);
        break;
      case Step::remount_dev:
        r = ::mount(nullptr, s.a, nullptr, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC, nullptr);
        break;
      case Step::symlink:
        r = ::symlink(s.a, s.b);
        break;
      case Step::proc:
        r = ::mount("proc", s.a, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
        break;
    }
    if (r != 0 && !s.optional) die(int(i));
  }
  // QEMU works in its run folder (bound at the same path inside): its control sockets are named
  // relative to it, so no socket path grows with the folder's (unix socket paths are < 108 bytes).
  if (::chroot(root_.c_str()) != 0 || ::chdir(cwd_.c_str()) != 0) die(-3);
  // Empty the capability bounding set too: nothing in the jail can ever regain a capability.
  for (int cap = 0; cap <= 63; ++cap) ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
  // Raw system calls, not glibc's wrappers: those broadcast the change to every thread glibc knows
  // of (__nptl_setxid), and this child of a raw clone3 has only the memory of the parent's threads:
  // it waited forever on one that was starting or exiting at the clone (seen as a hung spawn).
  if (::syscall(SYS_setgroups, 0, nullptr) != 0 ||
      ::syscall(SYS_setresgid, uid_, uid_, uid_) != 0 ||
      ::syscall(SYS_setresuid, uid_, uid_, uid_) != 0)
    die(-4);
  if (no_new_privs_ && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(-5);
  if (die_with_parent_)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // after the uid change, which clears it
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull < 0) die(-6);
  ::dup2(devnull, 0);
  // Nothing of the daemon's reaches QEMU but what its command line names: every descriptor from
  // 3 up closes at exec (another VM's netns or a record being written, opened by a concurrent
  // thread without O_CLOEXEC, would otherwise leak in), then the inherited ones are let through.
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) != 0) die(-8);
  for (int fd : inherit_fds_) ::fcntl(fd, F_SETFD, 0);
  if (log_fd_ >= 0) {
    ::dup2(log_fd_, 1);
    ::dup2(log_fd_, 2);
  }
  ::execve(argv_ptrs_[0], argv_ptrs_.data(), env_ptrs_.data());
  die(-7);
  ::_exit(126);
}

Result<pid_t> JailLaunch::start(Cgroup* cgroup, int nice,
                                const std::function<void(pid_t)>& before_exec) {
  int err_pipe[2], go_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0)
    return make_error(ErrorCode::spawn_failed, strerror(errno));
  if (::pipe2(go_pipe, O_CLOEXEC) != 0) {
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    return make_error(ErrorCode::spawn_failed, strerror(errno));
  }
  clone_args args{};
  args.flags = uint64_t(clone_flags_);
  args.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) {
    // Child: wait until the parent placed us in our cgroup, then enter the jail.
    char go;
    ::close(go_pipe[1]);
    ssize_t n;
    do {
      n = ::read(go_pipe[0], &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) ::_exit(125);
    child(err_pipe[1]);
  }
  int clone_errno = errno;
  ::close(err_pipe[1]);
  ::close(go_pipe[0]);
  if (pid < 0) {
    ::close(err_pipe[0]);
    ::close(go_pipe[1]);
    return make_error(ErrorCode::spawn_failed,
                      std::string("clone3 (namespaces need root): ") + strerror(clone_errno));
  }
  Status placed = cgroup ? cgroup->add(pid_t(pid)) : Status(Ok{});
  // Its priority before it runs: every thread QEMU makes inherits it.
  if (placed && nice != 0 && ::setpriority(PRIO_PROCESS, id_t(pid), nice) != 0)
    spdlog::warn("jail: cannot set the priority of pid {}: {}", pid, strerror(errno));
  if (placed && before_exec) before_exec(pid_t(pid));
  char go = 1;
  ssize_t w = placed ? ::write(go_pipe[1], &go, 1) : 0;
  (void)w;
  ::close(go_pipe[1]);
  ChildError e{};
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (!placed || n == ssize_t(sizeof e)) {
    ::kill(pid_t(pid), SIGKILL);
    int status;
    ::waitpid(pid_t(pid), &status, 0);
    if (!placed) return placed.error();
    std::string where;
    switch (e.step) {
      case -1:
        where = "making / private";
        break;
      case -2:
        where = "mounting the root tmpfs at " + root_;
        break;
      case -3:
        where = "chroot";
        break;
      case -4:
        where = "dropping to uid " + std::to_string(uid_);
        break;
      case -5:
        where = "no-new-privs";
        break;
      case -6:
        where = "opening /dev/null";
        break;
      case -7:
        where = "executing " + argv_[0];
        break;
      case -8:
        where = "closing inherited descriptors (close_range, Linux 5.11+)";
        break;
      default:
        where = "step " + std::to_string(e.step) + " (" + std::string(steps_[size_t(e.step)].a) +
                " " + steps_[size_t(e.step)].b + ")";
    }
    return make_error(ErrorCode::spawn_failed,
                      "jail set-up failed at " + where + ": " + strerror(e.err));
  }
  return pid_t(pid);
}

}  // namespace pandastack::vmm
