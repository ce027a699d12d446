#include "guest/agent/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "guest/agent/users.h"

extern char** environ;

namespace pandastack::agent {

namespace {

// Adds the entries of /etc/pandastack/env ("K=V" entries, each ended by a NUL; at most 64 KiB,
// else none) to `env`. Every process the agent starts gets them, as a Dockerfile's ENV.
void template_env(std::map<std::string, std::string>& env) {
  constexpr size_t kMax = 64 << 10;
  int fd = ::open("/etc/pandastack/env", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::string data(kMax + 1, '\0');
  ssize_t n = ::read(fd, data.data(), data.size());
  ::close(fd);
  if (n <= 0 || size_t(n) > kMax) return;
  data.resize(size_t(n));
  size_t at = 0;
  while (at < data.size()) {
    auto end = data.find('\0', at);
    if (end == std::string::npos) break;  // (an entry not ended: not taken)
    auto kv = std::string_view(data).substr(at, end - at);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos && eq > 0)
      env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    at = end + 1;
  }
}

// A new pseudo-terminal of cols x rows: its master in r.in and r.out (two descriptors, so that
// the writer and the reader can be closed apart), the slave's path in `slave`.
bool open_terminal(uint16_t cols, uint16_t rows, SpawnResult& r, std::string& slave) {
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) {
    r.error = std::string("cannot open a terminal: ") + strerror(errno);
    return false;
  }
  char name[64];
  if (::grantpt(master) != 0 || ::unlockpt(master) != 0 ||
      ::ptsname_r(master, name, sizeof name) != 0) {
    r.error = std::string("cannot set up a terminal: ") + strerror(errno);
    ::close(master);
    return false;
  }
  winsize ws{};
  ws.ws_col = cols != 0 ? cols : 80;
  ws.ws_row = rows != 0 ? rows : 24;
  ::ioctl(master, TIOCSWINSZ, &ws);
  int writer = ::fcntl(master, F_DUPFD_CLOEXEC, 0);
  if (writer < 0) {
    r.error = std::string("dup: ") + strerror(errno);
    ::close(master);
    return false;
  }
  r.out = master;
  r.in = writer;
  r.pty = true;
  slave = name;
  return true;
}

}  // namespace

std::string describe(w::ExecRequest::Reader req) {
  if (req.getArgv().size() > 0) {
    std::string s;
    for (auto a : req.getArgv()) {
      if (!s.empty()) s += ' ';
      s += a.cStr();
    }
    return s;
  }
  return req.getShell().cStr();
}

SpawnResult spawn(w::ExecRequest::Reader req) {
  SpawnResult r;
  std::vector<std::string> argv;
  if (req.getArgv().size() > 0) {
    for (auto a : req.getArgv()) argv.emplace_back(a.cStr());
  } else if (req.getShell().size() > 0) {
    argv = {"/bin/sh", "-c", req.getShell().cStr()};
  } else {
    r.error = "empty command: give argv or shell";
    return r;
  }
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  // A custom template's environment (its `env`, written by its build): under the request's own.
  template_env(env);
  // Another account: its identity, its environment (under the request's), its home.
  std::optional<Account> as;
  if (req.getUser().size() > 0) {
    as = find_account(req.getUser().cStr());
    if (!as) {
      r.error = std::string("no user '") + req.getUser().cStr() + "' in the guest";
      return r;
    }
    env["HOME"] = as->home;
    env["USER"] = env["LOGNAME"] = as->name;
  }
  for (auto v : req.getEnv()) env[v.getName().cStr()] = v.getValue().cStr();
  std::vector<std::string> envs;
  for (auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::string cwd = req.getCwd().size() > 0 ? std::string(req.getCwd().cStr())
                    : as                    ? as->home
                                            : "/workspace";
  if (req.getCwd().size() == 0 && ::access(cwd.c_str(), X_OK) != 0) cwd = "/";

  // Resolve the program with the command's PATH (posix_spawnp would use the agent's).
  std::string program = argv[0];
  if (program.find('/') == std::string::npos) {
    std::string path = env.count("PATH") ? env["PATH"] : "/usr/local/bin:/usr/bin:/bin";
    std::string found;
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir =
          path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      std::string cand = (dir.empty() ? "." : dir) + "/" + program;
      if (::access(cand.c_str(), X_OK) == 0) {
        found = cand;
        break;
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    if (found.empty()) {
      r.error = "exec " + program + ": No such file or directory";
      return r;
    }
    program = found;
  }
  if (::access(cwd.c_str(), X_OK) != 0) {
    r.error = "cwd " + cwd + ": " + strerror(errno);
    return r;
  }

  // The command's ends (child) and ours (parent); every descriptor is close-on-exec, so the
  // child keeps only what the file actions give it as 0, 1 and 2.
  int child_in = -1, child_out = -1, child_err = -1;
  std::string slave;
  auto close_all = [&] {
    for (int fd : {r.in, r.out, r.err, child_in, child_out, child_err})
      if (fd >= 0) ::close(fd);
    r.in = r.out = r.err = -1;
  };
  if (req.getPty()) {
    if (!open_terminal(req.getCols(), req.getRows(), r, slave)) return r;
    if (as) (void)!::chown(slave.c_str(), as->uid, as->gid);  // (its own terminal, as login gives)
    // stderr is the terminal: the parent's stream of it is a pipe that is already at its end.
    int perr[2];
    if (::pipe2(perr, O_CLOEXEC) != 0) {
      r.error = std::string("pipe: ") + strerror(errno);
      close_all();
      return r;
    }
    r.err = perr[0];
    ::close(perr[1]);
  } else {
    int p[3][2];
    for (int i = 0; i < 3; ++i) {
      if (::pipe2(p[i], O_CLOEXEC) != 0) {
        r.error = std::string("pipe: ") + strerror(errno);
        for (int j = 0; j < i; ++j) ::close(p[j][0]), ::close(p[j][1]);
        return r;
      }
    }
    child_in = p[0][0], r.in = p[0][1];
    r.out = p[1][0], child_out = p[1][1];
    r.err = p[2][0], child_err = p[2][1];
  }
  // Another user's command starts as this binary's --run-as mode, which drops to that identity
  // and executes the program (users.h): posix_spawn cannot change identity.
  if (as && as->uid != 0) {
    std::string groups;
    for (gid_t g : as->groups) groups += (groups.empty() ? "" : ",") + std::to_string(g);
    std::vector<std::string> wrapped = {"pandastack-agent",
                                        "--run-as",
                                        std::to_string(as->uid),
                                        std::to_string(as->gid),
                                        groups.empty() ? "-" : groups,
                                        program};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    argv = std::move(wrapped);
    program = "/proc/self/exe";
  }
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  // posix_spawn: glibc clones with CLONE_VM|CLONE_VFORK, so the agent's page tables are not copied
  // and no copy-on-write faults are taken (fork+exec is several times slower under TCG).
  // The child gets its own session and process group, so a timeout or cancel kills everything it
  // started; signals are unblocked and reset to their defaults. A terminal's slave side is opened
  // after setsid (glibc runs the file actions after it), so it becomes the controlling terminal.
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (r.pty) {
    posix_spawn_file_actions_addopen(&fa, 0, slave.c_str(), O_RDWR, 0);
    posix_spawn_file_actions_adddup2(&fa, 0, 1);
    posix_spawn_file_actions_adddup2(&fa, 0, 2);
  } else {
    posix_spawn_file_actions_adddup2(&fa, child_in, 0);
    posix_spawn_file_actions_adddup2(&fa, child_out, 1);
    posix_spawn_file_actions_adddup2(&fa, child_err, 2);
  }
  posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int err = ::posix_spawn(&pid, program.c_str(), &fa, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  for (int* fd : {&child_in, &child_out, &child_err}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (err != 0) {
    r.error = "exec " + program + ": " + strerror(err);
    close_all();
    return r;
  }
  r.pid = pid;
  for (int fd : {r.in, r.out, r.err}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return r;
}

}  // namespace pandastack::agent
