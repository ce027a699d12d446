// Starting a command in the guest: its own session and process group, pipes or a terminal.
#pragma once

#include <sys/types.h>

#include <string>

#include "wire/agent.capnp.h"

namespace pandastack::agent {

namespace w = pandastack::wire::agent;

struct SpawnResult {
  pid_t pid = -1;
  // Non-blocking, close-on-exec. With a terminal, `in` and `out` are two descriptors of its master
  // side (the command's stdin, stdout and stderr are the terminal) and `err` is already at EOF.
  int in = -1, out = -1, err = -1;
  bool pty = false;
  std::string error;  // why it could not start
};

// The command as a line (argv joined, or the shell text).
std::string describe(w::ExecRequest::Reader req);

// Starts `req` (argv, or `shell` under /bin/sh -c) with the agent's environment plus req.env, in
// req.cwd (default /workspace, or / without one). With req.pty the command runs on a new
// pseudo-terminal of req.cols x req.rows (80x24 when 0) that is its controlling terminal. With
// req.user, as that account of the guest (HOME, USER, LOGNAME its own; cwd default its home).
SpawnResult spawn(w::ExecRequest::Reader req);

}  // namespace pandastack::agent
