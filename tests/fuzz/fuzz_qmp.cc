// QMP from a QEMU we do not trust (a compromised guest may own its QEMU): the bytes a QMP server
// sends, through the real client (vmm-driver/qmp.cc) over a real socket pair: the greeting, the
// capabilities reply, a command's reply among events, then an event wait. Anything is refused
// with an error or parsed; never a crash, a hang past the deadline, or unbounded memory.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "vmm-driver/qmp.h"

namespace {

std::string socket_path() {
  static const std::string path = [] {
    ::signal(SIGPIPE, SIG_IGN);  // the client writes commands to a server that may have closed
    char dir[] = "/tmp/fuzz-qmp-XXXXXX";
    if (::mkdtemp(dir) == nullptr) std::abort();
    return std::string(dir) + "/qmp.sock";
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace std::chrono;
  const std::string path = socket_path();
  ::unlink(path.c_str());
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0)
    std::abort();
  // The "QEMU": sends the input, then closes its side (EOF ends every read of the client).
  std::thread server([&] {
    int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) return;
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
  });
  auto qmp = pandastack::vmm::QmpClient::connect(path, milliseconds(2000));
  if (qmp) {
    (void)(*qmp)->execute("query-status", {}, milliseconds(500));
    (void)(*qmp)->wait_event(
        "STOP", [](const pandastack::wire::Json&) { return true; }, milliseconds(200));
    (void)(*qmp)->take_events();
    qmp->reset();  // closes the client's end: the server's drain ends
  }
  ::shutdown(listener, SHUT_RDWR);
  server.join();
  ::close(listener);
  return 0;
}
