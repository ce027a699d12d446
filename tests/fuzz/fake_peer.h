// The socket side of fuzz targets that drive a real client (QMP, the agent's) against a fake
// peer answering from the input: a unix socket of the process's own, and a raw answer.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace fuzz {

// /tmp/fuzz-NAME-XXXXXX/NAME.sock, made once per process (SIGPIPE ignored: a client may write to
// a peer that has closed).
inline std::string socket_path(const std::string& name) {
  static const std::string path = [&] {
    ::signal(SIGPIPE, SIG_IGN);
    std::string dir = "/tmp/fuzz-" + name + "-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) std::abort();
    return dir + "/" + name + ".sock";
  }();
  return path;
}

// A listening socket at `path` (a previous one is replaced); aborts when it cannot be made.
inline int listen_at(const std::string& path) {
  ::unlink(path.c_str());
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0)
    std::abort();
  return listener;
}

// Sends `data` on the connection `c`, closes its sending side (EOF ends every read of the
// client), reads what the client sends until it closes, and closes `c`.
inline void answer_raw(int c, const uint8_t* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    ssize_t n = ::send(c, data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += size_t(n);
  }
  ::shutdown(c, SHUT_WR);
  char sink[4096];
  while (::recv(c, sink, sizeof sink, 0) > 0) {
  }
  ::close(c);
}

}  // namespace fuzz
