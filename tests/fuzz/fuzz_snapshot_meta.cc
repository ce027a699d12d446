// A snapshot's meta.json (vmm-driver/snapshot.cc Snapshot::load): recovery and restores read it
// from the state folder. Any bytes give a snapshot or an error; a loaded snapshot's layers are
// plain file names of its disk folder (never a path out of it).
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "vmm-driver/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const fs::path dir = [] {
    char d[] = "/tmp/fuzz-snapmeta-XXXXXX";
    if (::mkdtemp(d) == nullptr) std::abort();
    fs::path p(d);
    // The files a snapshot needs, so parsing gets past the existence checks.
    for (auto* f : {"mem", "state", "disk.qcow2", "layer-0.qcow2"}) {
      int fd = ::open((p / f).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      if (fd >= 0) ::close(fd);
    }
    return p;
  }();
  int fd = ::open((dir / "meta.json").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, data, size) != ssize_t(size)) std::abort();
  ::close(fd);
  auto s = pandastack::vmm::Snapshot::load(dir);
  if (s)
    for (auto& l : s->layers)
      if (l.empty() || l.find('/') != std::string::npos || l == "." || l == "..") std::abort();
  return 0;
}
