#include "actors/database.h"

#include <gtest/gtest.h>

#include "actors/database_codec.h"

namespace pandastack::actors {
namespace {

constexpr int64_t kNow = 2'000'000;

DatabaseState run(DatabaseState s, const DatabaseCommand& c) {
  auto d = decide(s, c, kNow);
  if (auto* r = std::get_if<Rejection>(&d)) {
    ADD_FAILURE() << r->code << ": " << r->message;
    return s;
  }
  for (auto& e : std::get<std::vector<DatabaseEvent>>(d)) s = apply(s, e);
  return s;
}

std::string refusal(const DatabaseState& s, const DatabaseCommand& c) {
  auto d = decide(s, c, kNow);
  auto* r = std::get_if<Rejection>(&d);
  return r ? to_string(r->code) : "";
}

dbcmd::Create create(std::string name = "shop") {
  return {"acme", name, {{"k", "v"}}, "sbx_1", name, name, "vol_1"};
}

TEST(Database, NamesAreSafeIdentifiers) {
  EXPECT_TRUE(valid_database_name("shop_2"));
  for (std::string bad :
       {std::string(), std::string("Shop"), std::string("2shop"), std::string("a-b"),
        std::string("a b"), std::string("x;drop"), std::string(64, 'a')})
    EXPECT_FALSE(valid_database_name(bad)) << bad;
  // PostgreSQL's own names fail at once, not after a whole create (exploratory test 3 #8).
  for (std::string kept : {"postgres", "template0", "template1", "pg_x", "public", "none",
                           "current_user", "session_user"})
    EXPECT_FALSE(valid_database_name(kept)) << kept;
  for (std::string keyword : {"user", "select", "table", "pgx", "postgres2"})  // quoted in SQL
    EXPECT_TRUE(valid_database_name(keyword)) << keyword;
  DatabaseState s;
  s.id = "db_a";
  EXPECT_EQ(refusal(s, create("bad name")), "invalid_argument");
}

TEST(Database, LifecycleAndRefusals) {
  DatabaseState s;
  s.id = "db_a";
  EXPECT_EQ(refusal(s, dbcmd::Wake{}), "database_not_found");
  s = run(s, create());
  EXPECT_EQ(s.status, DatabaseStatus::running);
  EXPECT_EQ(s.sandbox + s.user + s.volume, "sbx_1shopvol_1");
  EXPECT_EQ(refusal(s, create()), "invalid_state");
  s = run(s, dbcmd::RotatePassword{});
  EXPECT_EQ(s.password_rotations, 1u);
  s = run(s, dbcmd::Hibernate{});
  EXPECT_EQ(s.status, DatabaseStatus::hibernated);
  EXPECT_EQ(refusal(s, dbcmd::RotatePassword{}), "database_hibernated");
  EXPECT_TRUE(std::get<std::vector<DatabaseEvent>>(decide(s, dbcmd::Hibernate{}, kNow)).empty());
  s = run(s, dbcmd::Wake{});
  EXPECT_EQ(s.status, DatabaseStatus::running);
  s = run(s, dbcmd::Delete{});
  EXPECT_EQ(s.status, DatabaseStatus::deleted);
  EXPECT_EQ(refusal(s, dbcmd::Delete{}), "database_not_found");
  EXPECT_EQ(s.version, 5u);
}

TEST(Database, EventsSurviveTheirPersistedFormAndHoldNoPassword) {
  DatabaseState s, replayed;
  s.id = replayed.id = "db_a";
  std::vector<DatabaseCommand> cmds = {create(), dbcmd::RotatePassword{}, dbcmd::Hibernate{},
                                       dbcmd::Wake{}, dbcmd::Delete{}};
  for (auto& c : cmds) {
    auto d = decide(s, c, kNow);
    for (auto& e : std::get<std::vector<DatabaseEvent>>(d)) {
      s = apply(s, e);
      auto back = decode_database_event(encode_database_event(e));
      ASSERT_TRUE(back) << to_string(e.kind);
      replayed = apply(replayed, *back);
      EXPECT_NE(database_event_to_json(*back).find(to_string(e.kind)), std::string::npos);
      EXPECT_EQ(database_event_to_json(*back).find("password"), std::string::npos);
    }
  }
  EXPECT_EQ(replayed.status, DatabaseStatus::deleted);
  EXPECT_EQ(replayed.metadata, s.metadata);
  EXPECT_EQ(replayed.version, s.version);
  EXPECT_FALSE(decode_database_event("garbage!"));
  DatabaseEvent impossible;
  impossible.kind = DatabaseEvent::Kind::woken;
  EXPECT_THROW(apply(replayed, impossible), std::logic_error);
}

TEST(Database, BackupsAreRecordedListedAndDeleted) {
  DatabaseState s;
  s.id = "db_a";
  s = run(s, create());
  s = run(s, dbcmd::Backup{"bk_1", 4096});
  ASSERT_EQ(s.backups.size(), 1u);
  EXPECT_EQ(s.backups[0].id, "bk_1");
  EXPECT_EQ(s.backups[0].bytes, 4096u);
  EXPECT_EQ(s.backups[0].created_at_ms, kNow);
  EXPECT_EQ(refusal(s, dbcmd::DeleteBackup{"bk_2"}), "backup_not_found");
  EXPECT_EQ(refusal(s, dbcmd::Backup{"", 1}), "invalid_argument");
  for (size_t i = 1; i < kMaxBackupsPerDatabase; ++i)
    s = run(s, dbcmd::Backup{"bk_n" + std::to_string(i), 1});
  EXPECT_EQ(refusal(s, dbcmd::Backup{"bk_x", 1}), "quota_exceeded");
  s = run(s, dbcmd::DeleteBackup{"bk_1"});
  EXPECT_EQ(s.backups.size(), kMaxBackupsPerDatabase - 1);
  s = run(s, dbcmd::Hibernate{});
  EXPECT_EQ(refusal(s, dbcmd::Backup{"bk_y", 1}), "database_hibernated");
  s = run(s, dbcmd::DeleteBackup{"bk_n1"});  // deleting one needs no server
  s = run(s, dbcmd::Delete{});
  EXPECT_TRUE(s.backups.empty());
  EXPECT_EQ(refusal(s, dbcmd::Backup{"bk_z", 1}), "database_not_found");
  EXPECT_EQ(refusal(s, dbcmd::DeleteBackup{"bk_n2"}), "database_not_found");
}

TEST(Database, BackupEventsRoundTrip) {
  DatabaseEvent e;
  e.kind = DatabaseEvent::Kind::backed_up;
  e.at_ms = 7;
  e.backup = "bk_abc";
  e.bytes = 1ull << 33;
  auto back = decode_database_event(encode_database_event(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, e.kind);
  EXPECT_EQ(back->backup, e.backup);
  EXPECT_EQ(back->bytes, e.bytes);
  e.kind = DatabaseEvent::Kind::backup_deleted;
  back = decode_database_event(encode_database_event(e));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, e.kind);
  EXPECT_EQ(back->backup, "bk_abc");
}

}  // namespace
}  // namespace pandastack::actors
