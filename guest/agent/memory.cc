#include "guest/agent/memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

int set_free_page_reporting(bool on, const std::string& sys) {
  const std::string devices = sys + "/bus/virtio/devices";
  std::string balloon;
  if (DIR* d = ::opendir(devices.c_str())) {
    while (auto* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind("virtio", 0) != 0) continue;
      int fd = ::open((devices + "/" + name + "/device").c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      char id[16] = {};
      ssize_t n = ::read(fd, id, sizeof id - 1);
      ::close(fd);
      if (n >= 6 && std::string(id, 6) == "0x0005") {  // VIRTIO_ID_BALLOON
        balloon = name;
        break;
      }
    }
    ::closedir(d);
  }
  if (balloon.empty()) return 0;
  struct stat st {};
  bool bound = ::lstat((devices + "/" + balloon + "/driver").c_str(), &st) == 0;
  if (bound == on) return 0;
  auto file = sys + "/bus/virtio/drivers/virtio_balloon/" + (on ? "bind" : "unbind");
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::write(fd, balloon.data(), balloon.size()) == ssize_t(balloon.size()) ? 0 : errno;
  ::close(fd);
  return err;
}

}  // namespace pandastack::agent
