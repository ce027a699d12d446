// The runtime facade's managed databases: the work each database command records (a sandbox of
// the postgres template, its role's password, its exposed port, hibernate, wake, kill) is done
// here, on the caller's thread, then the database actor records it.
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include "actors/runtime_impl.h"

namespace pandastack::actors {

namespace {

constexpr const char* kTemplate = "postgres";
constexpr uint32_t kPort = 5432;

std::string new_password() {
  unsigned char raw[24];
  RAND_bytes(raw, sizeof raw);
  static const char* digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out;
  for (unsigned char c : raw) out += digits[c % 62];
  return out;
}

// Runs SQL as the server's superuser (peer login in the guest), the statements on psql's stdin:
// nothing of it is in the exec's recorded command line.
Reply<bool> run_sql(Runtime& rt, const std::string& tenant, const std::string& sandbox,
                    const std::string& sql) {
  vmm::ExecRequest r;
  r.argv = {"runuser", "-u", "postgres", "--", "psql", "-v", "ON_ERROR_STOP=1", "-qAt"};
  r.stdin_data = sql;
  r.timeout_ms = 120000;
  auto x = rt.exec(tenant, sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0)
    return Rejection{"start_failed",
                     "the database server refused: " + x->stderr_data.substr(0, 500)};
  return true;
}

DatabaseInfo info_of(const DatabaseState& s) {
  DatabaseInfo i;
  i.id = s.id;
  i.tenant = s.tenant;
  i.name = s.name;
  i.status = to_string(s.status);
  i.metadata = s.metadata;
  i.sandbox = s.sandbox;
  i.volume = s.volume;
  i.user = s.user;
  i.database = s.database;
  i.created_at_ms = s.created_at_ms;
  i.version = s.version;
  return i;
}

// Where it listens on the host, while it runs.
void fill_address(Runtime& rt, DatabaseInfo& i) {
  if (i.status != "running") return;
  auto ports = rt.ports(i.tenant, i.sandbox);
  if (!ports) return;
  for (auto& p : *ports)
    if (p.port == kPort) {
      i.host = p.host;
      i.port = p.host_port;
    }
}

Reply<DatabaseInfo> record(Runtime::Impl& impl, const std::string& tenant, const std::string& id,
                           DatabaseCommand c) {
  return to_reply<DatabaseInfo>(
      impl.ask(caf::make_message(dbroute_atom::value, tenant, id, std::move(c))),
      [](const Answer& a) { return info_of(a.database); });
}

}  // namespace

std::string DatabaseInfo::connection_uri() const {
  if (host.empty()) return "";
  return "postgresql://" + user + (password.empty() ? "" : ":" + password) + "@" + host + ":" +
         std::to_string(port) + "/" + database;
}

Reply<DatabaseInfo> Runtime::create_database(const DatabaseRequest& request) {
  const auto& cfg = impl_->env->config;
  if (!valid_database_name(request.name))
    return Rejection{"invalid_argument",
                     "a database name is 1-63 of a-z, 0-9 and '_', starting with a letter"};
  if (auto r = check_metadata(request.metadata, cfg.limits)) return *r;
  if (!cfg.network)
    return Rejection{"network_disabled",
                     "databases are reached through an exposed port: this "
                     "host runs without sandbox networking"};
  std::string id = "db_" + random_base32(16);
  CreateRequest sr;
  sr.tenant = request.tenant;
  sr.template_name = kTemplate;
  sr.persistent = true;  // a daemon stop hibernates it rather than killing it
  sr.ttl_seconds = kNoExpiry;
  sr.network = true;
  sr.egress = Egress{};  // deny_all: the server reaches nothing
  sr.metadata = {{"pandastack.database", id}};
  auto sbx = create(sr);
  if (!sbx) return sbx.error();
  auto undo = [&] {
    (void)kill(request.tenant, sbx->id);
    for (auto& v : sbx->volumes) (void)delete_volume(request.tenant, v.volume);
  };
  std::string password = new_password();
  // The role and database share the database's name; a superuser-free owner.
  auto made = run_sql(*this, request.tenant, sbx->id,
                      "CREATE ROLE " + request.name + " LOGIN PASSWORD '" + password +
                          "';\nCREATE DATABASE " + request.name + " OWNER " + request.name +
                          ";\nREVOKE CONNECT ON DATABASE postgres FROM PUBLIC;\n");
  if (!made) {
    undo();
    return made.error();
  }
  auto exposed = expose_port(request.tenant, sbx->id, kPort);
  if (!exposed) {
    undo();
    return exposed.error();
  }
  dbcmd::Create c{request.tenant,
                  request.name,
                  request.metadata,
                  sbx->id,
                  request.name,
                  request.name,
                  sbx->volumes.empty() ? "" : sbx->volumes.front().volume};
  auto out = record(*impl_, request.tenant, id, c);
  if (!out) {
    undo();
    return out;
  }
  fill_address(*this, *out);
  out->password = password;
  return out;
}

Reply<DatabaseInfo> Runtime::get_database(const std::string& tenant, const std::string& id) {
  auto all = list_databases(tenant);
  if (!all) return all.error();
  for (auto& d : *all)
    if (d.id == id) return d;
  return Rejection{"database_not_found", "no database " + id};
}

Reply<std::vector<DatabaseInfo>> Runtime::list_databases(const std::string& tenant) {
  Answer a = impl_->ask(caf::make_message(dblist_atom::value, tenant, false));
  if (!a.ok) return a.error;
  std::vector<DatabaseInfo> out;
  for (auto& s : a.databases) {
    out.push_back(info_of(s));
    fill_address(*this, out.back());
  }
  return out;
}

Reply<DatabaseInfo> Runtime::delete_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  (void)kill(tenant, d->sandbox);  // an already ended sandbox is fine
  if (!d->volume.empty()) {
    auto v = delete_volume(tenant, d->volume);
    if (!v && v.error().code != "volume_not_found") return v.error();
  }
  return record(*impl_, tenant, id, dbcmd::Delete{});
}

Reply<DatabaseInfo> Runtime::hibernate_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (d->status == "running") {
    auto h = hibernate(tenant, d->sandbox);
    if (!h) return h.error();
  }
  return record(*impl_, tenant, id, dbcmd::Hibernate{});
}

Reply<DatabaseInfo> Runtime::wake_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (d->status == "hibernated") {
    auto w = wake(tenant, d->sandbox);
    if (!w) return w.error();
  }
  auto out = record(*impl_, tenant, id, dbcmd::Wake{});
  if (out) fill_address(*this, *out);
  return out;
}

Reply<DatabaseInfo> Runtime::rotate_database_password(const std::string& tenant,
                                                      const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (d->status == "hibernated")
    return Rejection{"database_hibernated", "database " + id + " is hibernated: wake it"};
  std::string password = new_password();
  auto set = run_sql(*this, tenant, d->sandbox,
                     "ALTER ROLE " + d->user + " PASSWORD '" + password + "';\n");
  if (!set) return set.error();
  auto out = record(*impl_, tenant, id, dbcmd::RotatePassword{});
  if (!out) return out;
  fill_address(*this, *out);
  out->password = password;
  return out;
}

Reply<std::string> Runtime::database_logs(const std::string& tenant, const std::string& id,
                                          uint32_t lines) {
  auto d = get_database(tenant, id);
  if (!d) return d.error();
  if (d->status == "hibernated")
    return Rejection{"database_hibernated", "database " + id + " is hibernated: wake it"};
  vmm::ExecRequest r;
  r.argv = {"tail", "-n", std::to_string(lines), "/var/log/postgresql/postgresql-15-main.log"};
  r.timeout_ms = 30000;
  auto x = exec(tenant, d->sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0 || x->timed_out)
    return Rejection{"internal", "reading the server log failed (exit " +
                                     std::to_string(x->exit_code) +
                                     "): " + x->stderr_data.substr(0, 500)};
  return x->stdout_data;
}

}  // namespace pandastack::actors
