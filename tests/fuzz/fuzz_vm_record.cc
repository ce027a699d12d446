// A VM's live record (vm.json) as recovery reads it: never a crash, and whatever parses names no
// path outside the shapes recovery may kill or remove.
#include <cstddef>
#include <cstdint>
#include <string>

#include "vmm-driver/live_record.h"

namespace {
// Whether `p` has a "." or ".." segment ("..x" is a name like any other).
bool climbs(const std::string& p) {
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    if (slash == std::string::npos) slash = p.size();
    std::string seg = p.substr(start, slash - start);
    if (seg == "." || seg == "..") return true;
    start = slash + 1;
  }
  return false;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = pandastack::vmm::parse_live_record(text);
  if (!r) return 0;
  if (r->pid <= 0) __builtin_trap();
  for (auto& l : r->layers)
    if (l.empty() || l.find('/') != std::string::npos || l == "." || l == "..") __builtin_trap();
  if (!r->disk_dir.empty() && (r->disk_dir[0] != '/' || climbs(r->disk_dir))) __builtin_trap();
  for (auto& g : r->cgroups)
    if (g.rfind("/sys/fs/cgroup/", 0) != 0 || climbs(g)) __builtin_trap();
  return 0;
}
