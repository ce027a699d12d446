#include "guest/agent/users.h"

#include <grp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace pandastack::agent {

namespace {

// The colon-separated fields of each line of a small file (at most 1 MiB is read).
std::vector<std::vector<std::string>> table(const char* path) {
  std::vector<std::vector<std::string>> out;
  std::ifstream f(path);
  std::string line;
  size_t read = 0;
  while (std::getline(f, line) && (read += line.size() + 1) <= (1u << 20)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, ':')) fields.push_back(field);
    if (!line.empty() && line.back() == ':') fields.emplace_back();
    out.push_back(std::move(fields));
  }
  return out;
}

template <typename T>
std::optional<T> number(const std::string& s) {
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

[[noreturn]] void die(const std::string& why) {
  std::string line = "pandastack-agent: cannot run as the user: " + why + "\n";
  (void)!::write(2, line.data(), line.size());
  ::_exit(127);
}

}  // namespace

std::optional<Account> find_account(const std::string& name, const AccountFiles& files) {
  if (name.empty()) return std::nullopt;
  for (auto& f : table(files.passwd)) {
    if (f.size() < 7 || f[0] != name) continue;
    auto uid = number<uid_t>(f[2]);
    auto gid = number<gid_t>(f[3]);
    if (!uid || !gid) return std::nullopt;
    Account a{f[0], f[5].empty() ? "/" : f[5], f[6], *uid, *gid, {*gid}};
    for (auto& g : table(files.group)) {
      if (g.size() < 4) continue;
      auto id = number<gid_t>(g[2]);
      if (!id || *id == a.gid) continue;
      std::stringstream members(g[3]);
      std::string m;
      while (std::getline(members, m, ','))
        if (m == name) a.groups.push_back(*id);
    }
    return a;
  }
  return std::nullopt;
}

namespace {
// The name of `id` in `file` (/etc/passwd or /etc/group: name, password, id), read into `cache`
// at the first call; its number when it has none.
template <typename Id>
std::string name_in(std::optional<std::map<Id, std::string>>& cache, const char* file, Id id) {
  if (!cache) {
    cache.emplace();
    for (auto& f : table(file))
      if (f.size() >= 3)
        if (auto n = number<Id>(f[2])) cache->emplace(*n, f[0]);
  }
  auto it = cache->find(id);
  return it != cache->end() ? it->second : std::to_string(id);
}
}  // namespace

std::string Names::user(uid_t uid) { return name_in(users_, files_.passwd, uid); }

std::string Names::group(gid_t gid) { return name_in(groups_, files_.group, gid); }

void run_as(int argc, char** argv) {
  // argv: agent --run-as UID GID GROUPS PROGRAM ARGV0 [ARGS...]
  if (argc < 7) die("usage: --run-as UID GID GROUPS PROGRAM ARGV0 [ARGS...]");
  auto uid = number<uid_t>(argv[2]);
  auto gid = number<gid_t>(argv[3]);
  if (!uid || !gid) die("bad uid or gid");
  std::vector<gid_t> groups;
  if (std::strcmp(argv[4], "-") != 0) {
    std::stringstream ss(argv[4]);
    std::string g;
    while (std::getline(ss, g, ','))
      if (auto id = number<gid_t>(g)) groups.push_back(*id);
  }
  // (single-threaded here: the libc calls change the whole process, as they must)
  if (::setgroups(groups.size(), groups.data()) != 0)
    die(std::string("setgroups: ") + strerror(errno));
  if (::setresgid(*gid, *gid, *gid) != 0) die(std::string("setgid: ") + strerror(errno));
  if (::setresuid(*uid, *uid, *uid) != 0) die(std::string("setuid: ") + strerror(errno));
  ::execve(argv[5], argv + 6, environ);
  int e = errno;
  std::string line = std::string("exec ") + argv[5] + ": " + strerror(e) + "\n";
  (void)!::write(2, line.data(), line.size());
  ::_exit(e == ENOENT ? 127 : 126);
}

}  // namespace pandastack::agent
