#include "vmm-driver/run_tool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace pandastack::vmm {

Status run_tool(const std::vector<std::string>& argv, int ok_up_to,
                std::chrono::milliseconds timeout) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return make_error(ErrorCode::io_error, strerror(errno));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  if (pid < 0) {
    ::close(pipefd[0]);
    return make_error(ErrorCode::spawn_failed, "cannot fork: " + std::string(strerror(errno)));
  }
  ::setpgid(pid, pid);  // (both sides: whichever runs first)
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  char buf[4096];
  bool killed = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(-pid, SIGKILL);
      killed = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    int r = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() < 16384) out.append(buf, size_t(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed)
    return make_error(ErrorCode::timeout, argv[0] + " did not finish within " +
                                              std::to_string(timeout.count()) + " ms");
  if (!WIFEXITED(status) || WEXITSTATUS(status) > ok_up_to)
    return make_error(ErrorCode::spawn_failed, argv[0] + " failed: " + out);
  return Ok{};
}

Status run_logged(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  const std::function<void(const std::string&)>& on_line,
                  const std::function<bool()>& cancelled) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return make_error(ErrorCode::io_error, strerror(errno));
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  if (pid < 0) {
    ::close(pipefd[0]);
    return make_error(ErrorCode::spawn_failed, "cannot fork: " + std::string(strerror(errno)));
  }
  ::setpgid(pid, pid);  // (both sides: whichever runs first)
  std::string line;
  bool killed = false;
  char buf[4096];
  for (;;) {
    pollfd p{pipefd[0], POLLIN, 0};
    int r = ::poll(&p, 1, 200);
    if (r < 0 && errno != EINTR) break;
    if (!killed && cancelled && cancelled()) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    if (r <= 0) continue;
    ssize_t n = ::read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == '\n' || buf[i] == '\r') {
        if (!line.empty()) on_line(line);
        line.clear();
      } else if (line.size() < 4096) {
        line += buf[i];
      }
    }
  }
  if (!line.empty()) on_line(line);
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed) return make_error(ErrorCode::timeout, argv[0] + " was cancelled");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(ErrorCode::spawn_failed,
                      argv[0] + " failed (" +
                          (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                             : "killed by a signal") +
                          ")");
  return Ok{};
}

}  // namespace pandastack::vmm
