#include "vmm-driver/run_tool.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pandastack::vmm {

Status run_tool(const std::vector<std::string>& argv, int ok_up_to) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return make_error(ErrorCode::io_error, strerror(errno));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0 && out.size() < 16384) out.append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) > ok_up_to)
    return make_error(ErrorCode::spawn_failed, argv[0] + " failed: " + out);
  return Ok{};
}

}  // namespace pandastack::vmm
