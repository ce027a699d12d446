#include "actors/database.h"

#include <stdexcept>

namespace pandastack::actors {

const char* to_string(DatabaseStatus s) {
  switch (s) {
    case DatabaseStatus::none:
      return "none";
    case DatabaseStatus::running:
      return "running";
    case DatabaseStatus::hibernated:
      return "hibernated";
    case DatabaseStatus::deleted:
      return "deleted";
  }
  return "?";
}

const char* to_string(DatabaseEvent::Kind k) {
  switch (k) {
    case DatabaseEvent::Kind::created:
      return "database-created";
    case DatabaseEvent::Kind::credentials_rotated:
      return "database-credentials-rotated";
    case DatabaseEvent::Kind::hibernated:
      return "database-hibernated";
    case DatabaseEvent::Kind::woken:
      return "database-woken";
    case DatabaseEvent::Kind::deleted:
      return "database-deleted";
    case DatabaseEvent::Kind::backed_up:
      return "database-backed-up";
    case DatabaseEvent::Kind::backup_deleted:
      return "database-backup-deleted";
  }
  return "?";
}

const char* const kDatabaseNameRule =
    "a database name is 1-63 of a-z, 0-9 and '_', starting with a letter, and not one PostgreSQL "
    "keeps for itself (pg_*, postgres, template0, template1, public, none, current_user, "
    "current_role, session_user)";

bool valid_database_name(const std::string& n) {
  if (n.empty() || n.size() > 63 || !(n[0] >= 'a' && n[0] <= 'z')) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  if (n.rfind("pg_", 0) == 0) return false;
  for (const char* kept : {"postgres", "template0", "template1", "public", "none", "current_user",
                           "current_role", "session_user"})
    if (n == kept) return false;
  return true;
}

Rejection too_many_backups(const std::string& id, size_t kept) {
  return {Code::quota_exceeded, "database " + id + " has " + std::to_string(kept) +
                                    " backups, the most a database keeps: delete one"};
}

namespace {

struct Decider {
  const DatabaseState& s;
  int64_t now;
  const Limits& limits;

  std::vector<DatabaseEvent> one(DatabaseEvent::Kind k) const {
    DatabaseEvent e;
    e.kind = k;
    e.at_ms = now;
    return {e};
  }
  Rejection gone() const { return {Code::database_not_found, "no database " + s.id}; }

  DatabaseDecision operator()(const dbcmd::Create& c) const {
    if (s.status != DatabaseStatus::none)
      return Rejection{Code::invalid_state, "database " + s.id + " exists"};
    if (!valid_database_name(c.name)) return Rejection{Code::invalid_argument, kDatabaseNameRule};
    if (auto r = check_metadata(c.metadata, limits)) return *r;
    if (c.sandbox.empty() || c.user.empty() || c.database.empty())
      return Rejection{Code::invalid_argument, "a database needs its sandbox, user and database"};
    auto e = one(DatabaseEvent::Kind::created);
    auto& x = e.front();
    x.tenant = c.tenant;
    x.name = c.name;
    x.metadata = c.metadata;
    x.sandbox = c.sandbox;
    x.user = c.user;
    x.database = c.database;
    x.volume = c.volume;
    return e;
  }
  DatabaseDecision operator()(const dbcmd::RotatePassword&) const {
    if (s.status == DatabaseStatus::hibernated)
      return Rejection{Code::database_hibernated, "database " + s.id + " is hibernated: wake it"};
    if (s.status != DatabaseStatus::running) return gone();
    return one(DatabaseEvent::Kind::credentials_rotated);
  }
  DatabaseDecision operator()(const dbcmd::Hibernate&) const {
    if (s.status == DatabaseStatus::hibernated) return std::vector<DatabaseEvent>{};
    if (s.status != DatabaseStatus::running) return gone();
    return one(DatabaseEvent::Kind::hibernated);
  }
  DatabaseDecision operator()(const dbcmd::Wake&) const {
    if (s.status == DatabaseStatus::running) return std::vector<DatabaseEvent>{};
    if (s.status != DatabaseStatus::hibernated) return gone();
    return one(DatabaseEvent::Kind::woken);
  }
  DatabaseDecision operator()(const dbcmd::Backup& c) const {
    if (s.status == DatabaseStatus::hibernated)
      return Rejection{Code::database_hibernated, "database " + s.id + " is hibernated: wake it"};
    if (s.status != DatabaseStatus::running) return gone();
    if (c.backup.empty()) return Rejection{Code::invalid_argument, "a backup needs its id"};
    if (s.backups.size() >= kMaxBackupsPerDatabase) return too_many_backups(s.id, s.backups.size());
    auto e = one(DatabaseEvent::Kind::backed_up);
    e.front().backup = c.backup;
    e.front().bytes = c.bytes;
    return e;
  }
  DatabaseDecision operator()(const dbcmd::DeleteBackup& c) const {
    if (s.status == DatabaseStatus::none || s.status == DatabaseStatus::deleted) return gone();
    bool known = false;
    for (auto& b : s.backups) known = known || b.id == c.backup;
    if (!known) return Rejection{Code::backup_not_found, "no backup " + c.backup + " of " + s.id};
    auto e = one(DatabaseEvent::Kind::backup_deleted);
    e.front().backup = c.backup;
    return e;
  }
  DatabaseDecision operator()(const dbcmd::Delete&) const {
    if (s.status == DatabaseStatus::none || s.status == DatabaseStatus::deleted) return gone();
    return one(DatabaseEvent::Kind::deleted);
  }
};

[[noreturn]] void impossible(const DatabaseState& s, const DatabaseEvent& e) {
  throw std::logic_error("database " + s.id + ": " + to_string(e.kind) + " in state " +
                         to_string(s.status));
}

}  // namespace

DatabaseDecision decide(const DatabaseState& state, const DatabaseCommand& command, int64_t now_ms,
                        const Limits& limits) {
  return std::visit(Decider{state, now_ms, limits}, command);
}

DatabaseState apply(DatabaseState s, const DatabaseEvent& e) {
  using K = DatabaseEvent::Kind;
  switch (e.kind) {
    case K::created:
      if (s.status != DatabaseStatus::none) impossible(s, e);
      s.status = DatabaseStatus::running;
      s.tenant = e.tenant;
      s.name = e.name;
      s.metadata = e.metadata;
      s.sandbox = e.sandbox;
      s.user = e.user;
      s.database = e.database;
      s.volume = e.volume;
      s.created_at_ms = e.at_ms;
      break;
    case K::credentials_rotated:
      if (s.status != DatabaseStatus::running) impossible(s, e);
      ++s.password_rotations;
      break;
    case K::hibernated:
      if (s.status != DatabaseStatus::running) impossible(s, e);
      s.status = DatabaseStatus::hibernated;
      break;
    case K::woken:
      if (s.status != DatabaseStatus::hibernated) impossible(s, e);
      s.status = DatabaseStatus::running;
      break;
    case K::deleted:
      if (s.status != DatabaseStatus::running && s.status != DatabaseStatus::hibernated)
        impossible(s, e);
      s.status = DatabaseStatus::deleted;
      s.backups.clear();  // their files go with the database
      break;
    case K::backed_up:
      if (s.status != DatabaseStatus::running) impossible(s, e);
      s.backups.push_back({e.backup, e.bytes, e.at_ms});
      break;
    case K::backup_deleted: {
      auto before = s.backups.size();
      std::erase_if(s.backups, [&](const DatabaseBackup& b) { return b.id == e.backup; });
      if (s.backups.size() == before) impossible(s, e);
      break;
    }
  }
  ++s.version;
  return s;
}

}  // namespace pandastack::actors
