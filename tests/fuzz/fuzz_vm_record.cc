// A VM's live record (vm.json) as recovery reads it: never a crash, and whatever parses names no
// path outside the shapes recovery may kill or remove.
#include <cstddef>
#include <cstdint>
#include <string>

#include "vmm-driver/live_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = pandastack::vmm::parse_live_record(text);
  if (!r) return 0;
  if (r->pid <= 0) __builtin_trap();
  for (auto& l : r->layers)
    if (l.empty() || l.find('/') != std::string::npos || l == "." || l == "..") __builtin_trap();
  if (!r->disk_dir.empty() && (r->disk_dir[0] != '/' || r->disk_dir.find("/..") != std::string::npos))
    __builtin_trap();
  for (auto& g : r->cgroups)
    if (g.rfind("/sys/fs/cgroup/", 0) != 0 || g.find("/..") != std::string::npos) __builtin_trap();
  return 0;
}
