// The QEMU jail: namespaces, a tmpfs root holding only what the policy binds, an unprivileged
// uid, no-new-privs, QEMU's seccomp filter, and cgroup limits where the host offers them.
// The policy is vmm-driver/jail.policy, embedded at build time; `JailPolicy::parse` is what
// enforces it, so the file is the single source of truth.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vmm-driver/error.h"

namespace pandastack::vmm {

struct JailPolicy {
  struct Entry {
    enum class Kind { bind_ro, bind_rw, dev, dev_optional, symlink, proc };
    Kind kind;
    std::string path;    // inside the jail ($IMAGES / $RUN not yet expanded)
    std::string target;  // symlink target
  };
  int clone_flags = 0;          // CLONE_NEW* from `namespace` lines
  std::string root_tmpfs_size;  // "4m"
  std::vector<Entry> entries;
  uint32_t uid_base = 0, uid_count = 0;
  bool no_new_privs = false;
  std::string seccomp;  // QEMU -sandbox argument
  uint64_t memory_overhead_bytes = 0;
  uint32_t pids_max = 0;

  // Parses policy text; every allowance needs a `# reason`. Unknown kinds are errors.
  static Result<JailPolicy> parse(const std::string& text);
  // The policy compiled into this binary (vmm-driver/jail.policy).
  static const JailPolicy& builtin();
  static const std::string& builtin_text();
};

// The jail uids of this process's live VMs: each VM gets one no other live VM has (adopted VMs
// claim theirs from their record), so a VM's sockets can be told from every other VM's by their
// peer's uid.
class JailUids {
 public:
  // A free uid of [base, base + count), or 0 when all are taken.
  static uint32_t acquire(uint32_t base, uint32_t count);
  static void claim(uint32_t uid);
  static void release(uint32_t uid);
};

// The ranges of /etc/subuid or /etc/subgid (user namespaces' uid maps) that overlap
// [base, base + count): "user:start:count" lines. A host user whose subordinate ids cover jail
// uids could signal or read QEMUs; the daemon refuses to start on an overlap.
std::vector<std::string> subid_overlaps(const std::string& file_text, uint32_t base,
                                        uint32_t count);

// Resource limits for one VM's QEMU: a cgroup (v2 when mounted, else v1 memory + pids), removed
// with this object. Empty (no limits) when the host offers no writable cgroup hierarchy.
class Cgroup {
 public:
  // `cpu_weight` (1..10000, v2 scale; 0 = default) and `cpu_max_percent` (of one CPU; 0 = none)
  // are applied where the cpu controller is available; io weight too where io is (v2).
  static std::unique_ptr<Cgroup> create(const std::string& name, uint64_t memory_bytes,
                                        uint32_t pids_max, uint32_t cpu_weight = 0,
                                        uint32_t cpu_max_percent = 0);
  // The groups of an adopted VM (removed when it ends).
  static std::unique_ptr<Cgroup> adopt(bool v2, std::vector<std::filesystem::path> dirs) {
    auto g = std::unique_ptr<Cgroup>(new Cgroup());
    g->v2_ = v2;
    g->dirs_ = std::move(dirs);
    return g;
  }
  // Removes the group `name` wherever create() would have made it (a VM's whose host died before
  // it recorded the VM): an empty group goes, one with processes in it stays (and is logged).
  static void remove(const std::string& name);
  ~Cgroup();
  // Moves `pid` into the group (before it executes anything).
  Status add(pid_t pid);
  // How many times the kernel's OOM killer acted on this group (its memory limit).
  uint64_t oom_kills() const;
  bool v2() const { return v2_; }
  const std::vector<std::filesystem::path>& dirs() const { return dirs_; }

 private:
  bool v2_ = false;
  std::vector<std::filesystem::path> dirs_;
};

// Everything the child needs to enter the jail and exec QEMU, prepared in the parent so that the
// child only makes system calls (it runs after clone in a multi-threaded process).
class JailLaunch {
 public:
  // `images`, `run` and `disk` expand $IMAGES / $RUN / $DISK (more than one images folder may be
  // bound read-only; `disk` empty or the run folder itself: $DISK binds nothing).
  static Result<std::unique_ptr<JailLaunch>> prepare(
      const JailPolicy& policy, const std::vector<std::filesystem::path>& images,
      const std::filesystem::path& run, const std::filesystem::path& disk, uint32_t uid,
      std::vector<std::string> argv, int log_fd, bool die_with_parent,
      std::vector<int> inherit_fds = {});
  // Starts the jailed QEMU; returns its pid (in our pid namespace) once it has exec'd, or the
  // step of the jail set-up that failed. With `die_with_parent` the child gets SIGKILL when the
  // calling *thread* exits: call it from a thread that lives as long as the process.
  // `before_exec(pid)` runs while the child waits, placed in its cgroup, before it may set up the
  // jail and exec: a record written there exists before QEMU does (if this process dies first,
  // the child sees its start pipe close and exits without running anything).
  Result<pid_t> start(Cgroup* cgroup, int nice = 0,
                      const std::function<void(pid_t)>& before_exec = nullptr);

 private:
  struct Step {
    enum Op { mkdir, touch, bind, remount_ro, remount_dev, symlink, proc } op;
    const char* a;  // path in the jail root, or a bind/symlink source
    const char* b;  // bind target / symlink path
    bool optional;
  };
  [[noreturn]] void child(int err_fd);
  std::vector<Step> steps_;
  std::vector<std::string> strings_;  // storage for every path the child uses
  std::vector<std::string> argv_;
  std::vector<char*> argv_ptrs_;
  std::vector<char*> env_ptrs_;
  std::string root_;
  std::string cwd_;  // the run folder: QEMU's working directory inside the jail
  std::string tmpfs_opts_;
  int clone_flags_ = 0;
  uint32_t uid_ = 0;
  bool no_new_privs_ = false;
  bool die_with_parent_ = true;
  int log_fd_ = -1;
  std::vector<int> inherit_fds_;  // kept open across exec (QEMU names them: the tap)
};

}  // namespace pandastack::vmm
