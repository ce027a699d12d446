// QMP from a QEMU we do not trust (a compromised guest may own its QEMU): the bytes a QMP server
// sends, through the real client (vmm-driver/qmp.cc) over a real socket pair: the greeting, the
// capabilities reply, a command's reply among events, then an event wait. Anything is refused
// with an error or parsed; never a crash, a hang past the deadline, or unbounded memory.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/fuzz/fake_peer.h"
#include "vmm-driver/qmp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace std::chrono;
  const std::string path = fuzz::socket_path("qmp");
  int listener = fuzz::listen_at(path);
  // The "QEMU": sends the input, then closes its side (EOF ends every read of the client).
  std::thread server([&] {
    int c = ::accept(listener, nullptr, nullptr);
    if (c >= 0) fuzz::answer_raw(c, data, size);
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
