// The guest's accounts, read from its /etc/passwd and /etc/group (the agent is static: no NSS):
// whom a command runs as, who owns what a file call makes, and the names a listing shows.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pandastack::agent {

struct Account {
  std::string name, home, shell;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // its supplementary groups (/etc/group members), its own first
};

// Where the accounts are read (the guest's own files; a unit test names others).
struct AccountFiles {
  const char* passwd = "/etc/passwd";
  const char* group = "/etc/group";
};

// The account named `name`, or nullopt (no such line, or a malformed one). At most 1 MiB of
// each file is read.
std::optional<Account> find_account(const std::string& name, const AccountFiles& files = {});

// Names of owners and groups for a listing: each file read once, at the first lookup.
class Names {
 public:
  explicit Names(AccountFiles files = {}) : files_(files) {}
  std::string user(uid_t uid);  // the name, or the number when none
  std::string group(gid_t gid);

 private:
  AccountFiles files_;
  std::optional<std::map<uid_t, std::string>> users_;
  std::optional<std::map<gid_t, std::string>> groups_;
};

// The `--run-as UID GID GROUPS PROGRAM ARGV0 ARGS...` mode of the agent's binary (GROUPS: comma
// separated numbers, or "-"): drops to that identity and executes PROGRAM. Started by spawn() for a
// command of another user (posix_spawn cannot change identity); never returns (127 on failure,
// with the reason on stderr).
[[noreturn]] void run_as(int argc, char** argv);

}  // namespace pandastack::agent
