// Managed databases: create (PostgreSQL in a sandbox of the postgres template), list, get,
// delete, hibernate, wake, rotate the password, the server log, backups (pg_dump on the host) and
// restores of them into new databases.
#include "actors/event_codec.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json backup_json(const std::string& database, const actors::DatabaseBackup& b) {
  Json j = Json::object();
  j.set("id", b.id);
  j.set("database", database);
  j.set("bytes", int64_t(b.bytes));
  j.set("format", "pg_dump-custom");
  j.set("created_at_ms", b.created_at_ms);
  return j;
}

Json database_json(const actors::DatabaseInfo& d) {
  Json j = Json::object();
  j.set("id", d.id);
  j.set("name", d.name);
  j.set("status", d.status);
  if (!d.failure_reason.empty()) j.set("failure_reason", d.failure_reason);
  j.set("metadata", actors::string_map_json(d.metadata));
  j.set("host", d.host);  // "" while hibernated
  j.set("port", int64_t(d.port));
  j.set("user", d.user);
  j.set("database", d.database);
  // With the password only in the answers of create and rotate-password: it is stored nowhere.
  j.set("connection_uri", d.connection_uri());
  if (!d.password.empty()) j.set("password", d.password);
  j.set("sandbox", d.sandbox);
  j.set("volume", d.volume);
  j.set("created_at_ms", d.created_at_ms);
  j.set("version", d.version);
  Json backups = Json::array();
  for (auto& b : d.backups) backups.push(backup_json(d.id, b));
  j.set("backups", backups);
  if (!d.restored_from.empty()) j.set("restored_from", d.restored_from);
  return j;
}

std::string database_param(const Request& r) {
  const std::string& id = r.param("database_id");
  if (id.size() != 19 || id.rfind("db_", 0) != 0)
    throw ApiError{Code::database_not_found, "no database " + id.substr(0, 64)};
  return id;
}

bool valid_backup_id(const std::string& id) {
  return id.size() == 19 && id.rfind("bk_", 0) == 0 &&
         id.find_first_not_of("abcdefghijklmnopqrstuvwxyz234567", 3) == std::string::npos;
}

HttpReply create(Call& c) {
  Fields f(c.r.json(), {"name", "metadata", "from_backup"});
  if (!f.has("name")) throw ApiError{Code::invalid_argument, "name is required"};
  actors::DatabaseRequest req;
  req.tenant = c.tenant();
  req.name = f.str("name");
  req.metadata = f.string_map("metadata");
  if (f.has("from_backup")) {
    req.from_backup = f.str("from_backup");
    if (!valid_backup_id(req.from_backup))
      throw ApiError{Code::backup_not_found, "no backup " + req.from_backup.substr(0, 64)};
  }
  return json_reply(201, database_json(unwrap(c.gw.rt.create_database(req))));
}

template <typename F>
Route action(const char* path, const char* what, F f) {
  return route(M::POST, path, what, [f](Call& c) {
    Fields fields(c.r.json(), {});
    return json_reply(200, database_json(unwrap(f(c, database_param(c.r)))));
  });
}

}  // namespace

std::vector<Route> database_routes() {
  return {
      route(M::POST, "/v1/databases",
            "Create a PostgreSQL database (a restore of the postgres template; the password is "
            "shown once)",
            create),
      route(M::GET, "/v1/databases", "List this tenant's databases",
            [](Call& c) {
              return list_reply("databases", unwrap(c.gw.rt.list_databases(c.tenant())),
                                database_json);
            }),
      route(M::GET, "/v1/databases/{database_id}", "One database (its URI without the password)",
            [](Call& c) {
              return json_reply(
                  200,
                  database_json(unwrap(c.gw.rt.get_database(c.tenant(), database_param(c.r)))));
            }),
      route(M::DELETE, "/v1/databases/{database_id}",
            "Delete a database: its server, its data volume",
            [](Call& c) {
              unwrap(c.gw.rt.delete_database(c.tenant(), database_param(c.r)));
              return no_content();
            }),
      action("/v1/databases/{database_id}/hibernate", "Hibernate (pause) a database",
             [](Call& c, const std::string& id) {
               return c.gw.rt.hibernate_database(c.tenant(), id);
             }),
      action("/v1/databases/{database_id}/wake", "Wake a hibernated database",
             [](Call& c, const std::string& id) { return c.gw.rt.wake_database(c.tenant(), id); }),
      action("/v1/databases/{database_id}/rotate-password",
             "A new password for the database's role (shown once)",
             [](Call& c, const std::string& id) {
               return c.gw.rt.rotate_database_password(c.tenant(), id);
             }),
      route(M::GET, "/v1/databases/{database_id}/logs", "The server log's last lines (?lines=)",
            [](Call& c) {
              uint32_t lines = 200;
              if (auto it = c.r.query.find("lines"); it != c.r.query.end()) {
                const auto& v = it->second;
                if (v.empty() || v.size() > 5 ||
                    v.find_first_not_of("0123456789") != std::string::npos || std::stoul(v) == 0 ||
                    std::stoul(v) > 10000)
                  throw ApiError{Code::invalid_argument, "lines is 1..10000"};
                lines = uint32_t(std::stoul(v));
              }
              Json j = Json::object();
              j.set("log", unwrap(c.gw.rt.database_logs(c.tenant(), database_param(c.r), lines)));
              return json_reply(200, j);
            },
            {"lines"}),
      route(M::POST, "/v1/databases/{database_id}/backups",
            "Back up a running database (pg_dump, custom format, kept on the host)",
            [](Call& c) {
              Fields fields(c.r.json(), {});
              auto id = database_param(c.r);
              return json_reply(201,
                                backup_json(id, unwrap(c.gw.rt.backup_database(c.tenant(), id))));
            }),
      route(M::GET, "/v1/databases/{database_id}/backups", "A database's backups, oldest first",
            [](Call& c) {
              auto id = database_param(c.r);
              auto d = unwrap(c.gw.rt.get_database(c.tenant(), id));
              return list_reply("backups", d.backups, [&](const actors::DatabaseBackup& b) {
                return backup_json(id, b);
              });
            }),
      route(M::DELETE, "/v1/databases/{database_id}/backups/{backup_id}", "Delete a backup",
            [](Call& c) {
              auto id = database_param(c.r);
              const std::string& bk = c.r.param("backup_id");
              if (!valid_backup_id(bk))
                throw ApiError{Code::backup_not_found, "no backup " + bk.substr(0, 64)};
              unwrap(c.gw.rt.delete_database_backup(c.tenant(), id, bk));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
