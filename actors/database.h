// The managed database lifecycle as two pure functions (no CAF, no I/O), like the sandbox's and
// the volume's:
//
//   decide(state, command) -> events | error     what a command means in a state
//   apply(state, event)    -> state              how an event changes the state
//
// A database (`db_...`) is a PostgreSQL server in a sandbox of the postgres template (its cluster
// on that sandbox's data volume) with a login role and database of its own. The database actor
// persists these events in the database's own stream; the runtime does the work they record
// (the sandbox's create, the role's password, hibernate, wake, kill) before recording it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "actors/sandbox.h"

namespace pandastack::actors {

enum class DatabaseStatus { none, running, hibernated, deleted };
const char* to_string(DatabaseStatus s);

struct DatabaseEvent {
  enum class Kind {
    created,
    credentials_rotated,
    hibernated,
    woken,
    deleted,
    backed_up,
    backup_deleted
  };
  Kind kind = Kind::created;
  int64_t at_ms = 0;
  // created:
  std::string tenant, name;
  std::map<std::string, std::string> metadata;
  std::string sandbox, user, database, volume;
  // backed_up, backup_deleted:
  std::string backup;
  uint64_t bytes = 0;
};
const char* to_string(DatabaseEvent::Kind k);

// A logical backup of a database: `pg_dump -Fc` of its database, kept on the host.
struct DatabaseBackup {
  std::string id;  // bk_ + 16 base32
  uint64_t bytes = 0;
  int64_t created_at_ms = 0;
};
constexpr size_t kMaxBackupsPerDatabase = 16;

struct DatabaseState {
  std::string id;
  DatabaseStatus status = DatabaseStatus::none;
  uint64_t version = 0;
  std::string tenant, name;
  std::map<std::string, std::string> metadata;
  std::string sandbox, user, database, volume;
  int64_t created_at_ms = 0;
  uint32_t password_rotations = 0;
  std::vector<DatabaseBackup> backups;  // oldest first
};

namespace dbcmd {
struct Create {
  std::string tenant, name;
  std::map<std::string, std::string> metadata;
  std::string sandbox, user, database, volume;
};
struct RotatePassword {};
struct Hibernate {};
struct Wake {};
struct Delete {};
// Records a backup whose file is written (the runtime makes it first).
struct Backup {
  std::string backup;
  uint64_t bytes = 0;
};
struct DeleteBackup {
  std::string backup;
};
}  // namespace dbcmd

using DatabaseCommand =
    std::variant<dbcmd::Create, dbcmd::RotatePassword, dbcmd::Hibernate, dbcmd::Wake, dbcmd::Delete,
                 dbcmd::Backup, dbcmd::DeleteBackup>;
using DatabaseDecision = std::variant<std::vector<DatabaseEvent>, Rejection>;

// A valid database name: 1-63 of a-z, 0-9 and '_', starting with a letter, and none of the
// names PostgreSQL keeps for itself (pg_*, postgres, template0/1, public, none and the
// current_*/session_user role words). It names the database and its role (quoted in SQL).
bool valid_database_name(const std::string& name);
extern const char* const kDatabaseNameRule;  // the sentence a refusal says

// The refusal of a backup beyond kMaxBackupsPerDatabase (`kept` already): decide's, and the
// runtime's before it spends a dump on one.
Rejection too_many_backups(const std::string& id, size_t kept);

// Refusals: invalid_argument, database_not_found (deleted), database_hibernated (rotate or back
// up while hibernated), quota_exceeded (a 17th backup), backup_not_found. An idempotent repeat
// (hibernate a hibernated one, wake a running one) is no events.
DatabaseDecision decide(const DatabaseState& state, const DatabaseCommand& command, int64_t now_ms,
                        const Limits& limits = {});

// The state after `event`. Throws std::logic_error when the event is impossible in `state`.
DatabaseState apply(DatabaseState state, const DatabaseEvent& event);

}  // namespace pandastack::actors
