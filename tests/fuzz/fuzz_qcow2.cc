// qcow2 headers the driver reads and rewrites without qemu-img (vmm-driver/qcow2.cc): an overlay
// is written by a QEMU we do not trust. Any bytes give a name or an error; rewriting the backing
// name of what parsed keeps the image parseable with the new name.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "vmm-driver/qcow2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string file = [] {
    char dir[] = "/tmp/fuzz-qcow2-XXXXXX";
    if (::mkdtemp(dir) == nullptr) std::abort();
    return std::string(dir) + "/image.qcow2";
  }();
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, data, size) != ssize_t(size)) std::abort();
  ::close(fd);
  namespace q = pandastack::vmm::qcow2;
  auto name = q::backing_file(file);
  if (name && !name->empty()) {
    if (q::set_backing_file(file, "layer-b.qcow2")) {
      auto again = q::backing_file(file);
      if (!again || *again != "layer-b.qcow2") std::abort();
    }
  }
  return 0;
}
