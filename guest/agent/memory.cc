#include "guest/agent/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace pandastack::agent {

int64_t meminfo_kib(std::string_view meminfo, std::string_view field) {
  size_t at = 0;
  while (at < meminfo.size()) {
    size_t end = meminfo.find('\n', at);
    if (end == std::string_view::npos) end = meminfo.size();
    std::string_view line = meminfo.substr(at, end - at);
    at = end + 1;
    if (line.size() <= field.size() || line.substr(0, field.size()) != field ||
        line[field.size()] != ':')
      continue;
    int64_t value = -1;
    for (char c : line.substr(field.size() + 1)) {
      if (c >= '0' && c <= '9')
        value = (value < 0 ? 0 : value * 10) + (c - '0');
      else if (value >= 0)
        break;
    }
    return value;
  }
  return -1;
}

namespace {
std::string read_meminfo() {
  std::string text;
  int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  ::close(fd);
  return text;
}
}  // namespace

int zero_free_memory(uint64_t reserve_bytes) {
  constexpr size_t kChunk = size_t(4) << 20;
  std::vector<void*> taken;
  for (;;) {
    int64_t free_kib = meminfo_kib(read_meminfo(), "MemFree");
    if (free_kib < 0 || uint64_t(free_kib) * 1024 < reserve_bytes + kChunk) break;
    // A private writable mapping populated by write faults: each page a newly zeroed one.
    void* p = ::mmap(nullptr, kChunk, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) break;
    taken.push_back(p);
  }
  for (void* p : taken) ::munmap(p, kChunk);
  std::printf("zeroed %zu MiB of free memory\n", taken.size() * (kChunk >> 20));
  return 0;
}

}  // namespace pandastack::agent
