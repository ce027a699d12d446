// The daemon's process as the benchmarks see it from outside: which one it is, and its RSS,
// threads and open descriptors (from /proc), so growth under load shows.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace pandastack::tools {

// The daemon's process: the one pandastackd on this host (or none: then no process figures).
inline pid_t find_daemon() {
  pid_t found = -1;
  int n = 0;
  DIR* d = ::opendir("/proc");
  while (auto* e = d ? ::readdir(d) : nullptr) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream comm(std::string("/proc/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "pandastackd") {
      found = pid_t(std::atoi(e->d_name));
      ++n;
    }
  }
  if (d) ::closedir(d);
  return n == 1 ? found : -1;
}

struct ProcSample {
  double rss_mib = 0;
  int threads = 0, fds = 0;
};

inline ProcSample sample(pid_t pid) {
  ProcSample s;
  std::ifstream st("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mib = std::atof(line.c_str() + 6) / 1024.0;
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoi(line.c_str() + 8);
  }
  if (DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str())) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') ++s.fds;
    ::closedir(d);
  }
  return s;
}

}  // namespace pandastack::tools
