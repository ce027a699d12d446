#include "vmm-driver/usage.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace pandastack::vmm {

Result<ProcessUsage> process_usage(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream stat(dir + "/stat");
  std::string line;
  if (!std::getline(stat, line))
    return make_error(ErrorCode::not_found, "process " + std::to_string(pid) + " is gone");
  // The command name (field 2) may hold spaces and parentheses: fields go on after the last ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos)
    return make_error(ErrorCode::io_error, "unreadable " + dir + "/stat");
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  // Fields 3..: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  ProcessUsage u;
  u.cpu_usec = (utime + stime) * 1000000ull / uint64_t(ticks > 0 ? ticks : 100);
  std::ifstream status(dir + "/status");
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) {
      u.rss_bytes = std::stoull(line.substr(6)) * 1024;  // "VmRSS:   1234 kB"
      break;
    }
  return u;
}

uint64_t allocated_bytes(const std::filesystem::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return 0;
  return uint64_t(st.st_blocks) * 512;
}

}  // namespace pandastack::vmm
