// The runtime facade's managed databases: the work each database command records (a sandbox of
// the postgres template, its role's password, its exposed port, hibernate, wake, kill) is done
// here, on the caller's thread, then the database actor records it.
#include <fcntl.h>
#include <kj/io.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "actors/runtime_impl.h"

namespace pandastack::actors {

namespace {

constexpr const char* kTemplate = "postgres";
constexpr uint32_t kPort = 5432;
// A restore sends the dump into the guest in pieces of this size, onto the data volume.
constexpr size_t kRestoreChunk = 4 << 20;
constexpr const char* kRestoreDir = "/var/lib/postgresql/.restore";

namespace fs = std::filesystem;

// Where a database's backups are kept: data_dir/backups/db_.../bk_....dump (ids the daemon made,
// never a client's string).
fs::path backups_dir(const Env& env, const std::string& database) {
  return env.config.data_dir / "backups" / database;
}

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
// `secret`: text of `sql` (a password) that a refusal's message never shows.
Reply<bool> run_sql(Runtime& rt, const std::string& tenant, const std::string& sandbox,
                    const std::string& sql, const std::string& secret = "") {
  vmm::ExecRequest r;
  r.argv = {"runuser", "-u", "postgres", "--", "psql", "-v", "ON_ERROR_STOP=1", "-qAt"};
  r.stdin_data = sql;
  r.timeout_ms = 120000;
  auto x = rt.exec(tenant, sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0) {
    std::string why = x->stderr_data.substr(0, 500);
    for (size_t at; !secret.empty() && (at = why.find(secret)) != std::string::npos;)
      why.replace(at, secret.size(), "<password>");
    return Rejection{Code::start_failed, "the database server refused: " + why};
  }
  return true;
}

// The server's own TLS key and certificate (a P-256 key, self-signed, its CN the database's id):
// the template's bake made one that every database of it would share (security review 3, L4).
// Written where the server's configuration names them, then the server reloads; a server
// without TLS is left so.
Reply<bool> fresh_tls_key(Runtime& rt, const std::string& tenant, const std::string& sandbox,
                          const std::string& id) {
  vmm::ExecRequest r;
  r.argv = {"sh", "-ec",
            "q() { runuser -u postgres -- psql -qAtc \"$1\"; }\n"
            "[ \"$(q 'show ssl')\" = on ] || exit 0\n"
            "k=$(q 'show ssl_key_file'); c=$(q 'show ssl_cert_file')\n"
            "umask 077\n"
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 "
            "-subj \"/CN=$1\" -keyout \"$k.new\" -out \"$c.new\" 2>/dev/null\n"
            "chown root:ssl-cert \"$k.new\" && chmod 640 \"$k.new\" && chmod 644 \"$c.new\"\n"
            "mv \"$k.new\" \"$k\" && mv \"$c.new\" \"$c\"\n"
            "q 'select pg_reload_conf()' >/dev/null\n",
            "fresh-tls", id};
  r.timeout_ms = 60000;
  auto x = rt.exec(tenant, sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0)
    return Rejection{Code::start_failed,
                     "cannot make the server's TLS key: " + x->stderr_data.substr(0, 500)};
  return true;
}

// A failed database's refusal: its data volume is kept until the database is deleted.
Rejection failed(const DatabaseInfo& d) {
  return {Code::database_failed, "database " + d.id + " failed (" + d.failure_reason +
                                     "); its data volume " + d.volume +
                                     " is kept until the database is deleted"};
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
  i.backups = s.backups;
  return i;
}

// The status a database reports: its record says what was asked (running, hibernated, deleted),
// its sandbox what is. A restart hibernates or fails a sandbox without a database command, its VM
// can die: what the sandbox is wins, and a database without a serving sandbox is failed with why.
void derive(DatabaseInfo& i, const SandboxInfo* s) {
  if (i.status == "deleted") return;
  if (!s) {
    i.status = "failed";
    i.failure_reason = "its sandbox " + i.sandbox + " is gone";
    return;
  }
  switch (s->status) {
    case SandboxStatus::running:
    case SandboxStatus::snapshotting:
    case SandboxStatus::forking:
      i.status = "running";
      return;
    case SandboxStatus::hibernating:
    case SandboxStatus::hibernated:
    case SandboxStatus::waking:
      i.status = "hibernated";
      return;
    case SandboxStatus::creating:
      i.status = "starting";
      return;
    case SandboxStatus::failed:
      i.status = "failed";
      i.failure_reason = "its sandbox " + s->id + " failed: " + s->failure_reason;
      return;
    case SandboxStatus::none:
    case SandboxStatus::stopped:
      i.status = "failed";
      i.failure_reason = "its sandbox " + i.sandbox + " was stopped";
      return;
  }
}

// The refusal of a command that needs the server: a hibernated, starting or failed database.
std::optional<Rejection> not_serving(const DatabaseInfo& d) {
  if (d.status == "running") return std::nullopt;
  if (d.status == "hibernated")
    return Rejection{Code::database_hibernated, "database " + d.id + " is hibernated: wake it"};
  if (d.status == "failed") return failed(d);
  if (d.status == "deleted") return Rejection{Code::database_not_found, "no database " + d.id};
  return Rejection{Code::database_not_running, "database " + d.id + " is " + d.status};
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

// Loads a backup into a fresh database `name` of sandbox `sandbox`: the dump goes onto the data
// volume in pieces (bounded host and guest memory), then pg_restore reads them as `name`'s
// objects (no owner or grants from the source: the new role owns everything).
Reply<bool> restore_dump(Runtime& rt, const std::string& tenant, const std::string& sandbox,
                         const std::string& name, const fs::path& dump) {
  kj::AutoCloseFd fd(::open(dump.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0)
    return Rejection{Code::backup_not_found, "the backup's file is gone: " + dump.string()};
  auto made = rt.mkdir(tenant, sandbox, kRestoreDir, true);
  if (!made) return made.error();
  std::string buf(kRestoreChunk, '\0');
  for (size_t part = 0;; ++part) {
    size_t have = 0;
    ssize_t n = 0;
    while (have < buf.size() && (n = ::read(fd.get(), buf.data() + have, buf.size() - have)) > 0)
      have += size_t(n);
    if (n < 0)
      return Rejection{Code::io_error, "reading the backup: " + std::string(strerror(errno))};
    if (have == 0) break;
    char file[64];
    std::snprintf(file, sizeof file, "%s/part-%05zu", kRestoreDir, part);
    auto w = rt.write_file(tenant, sandbox, file, std::string_view(buf.data(), have), 0600);
    if (!w) return w.error();
    if (have < buf.size()) break;
  }
  vmm::ExecRequest r;
  r.argv = {"sh", "-c",
            std::string("cat ") + kRestoreDir +
                "/part-* | runuser -u postgres -- pg_restore -Fc --no-owner --no-acl "
                "--exit-on-error --single-transaction --role=" +
                name + " -d " + name + "; rc=$?; rm -rf " + kRestoreDir + "; exit $rc"};
  r.timeout_ms = 600000;
  auto x = rt.exec(tenant, sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0 || x->timed_out)
    return Rejection{Code::restore_failed, "pg_restore failed (exit " +
                                               std::to_string(x->exit_code) +
                                               "): " + x->stderr_data.substr(0, 1000)};
  return true;
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
    return Rejection{Code::invalid_argument, kDatabaseNameRule};
  if (auto r = check_metadata(request.metadata, cfg.limits)) return *r;
  fs::path dump;
  if (!request.from_backup.empty()) {
    auto all = list_databases(request.tenant);
    if (!all) return all.error();
    for (auto& d : *all)
      for (auto& b : d.backups)
        if (b.id == request.from_backup) dump = backups_dir(*impl_->env, d.id) / (b.id + ".dump");
    if (dump.empty())
      return Rejection{Code::backup_not_found, "no backup " + request.from_backup.substr(0, 64)};
  }
  if (!cfg.network)
    return Rejection{Code::network_disabled,
                     "databases are reached through an exposed port: this "
                     "host runs without sandbox networking"};
  std::string id = "db_" + random_base32(16);
  if (auto no = impl_->claim(id)) return *no;  // (cluster mode: before it exists)
  CreateRequest sr;
  sr.tenant = request.tenant;
  sr.template_name = kTemplate;
  sr.persistent = true;  // a daemon stop hibernates it rather than killing it
  sr.ttl_seconds = kNoExpiry;
  sr.network = true;
  sr.egress = Egress{};  // deny_all: the server reaches nothing
  sr.metadata = {{kDatabaseKey, id}};
  auto sbx = create(sr);
  if (!sbx) return sbx.error();
  auto undo = [&] {
    (void)impl_->sandbox_command(request.tenant, sbx->id, cmd::Kill{});
    for (auto& v : sbx->volumes) (void)delete_volume(request.tenant, v.volume);
  };
  std::string password = new_password();
  // The role and database share the database's name; a superuser-free owner.
  auto made = run_sql(*this, request.tenant, sbx->id,
                      "CREATE ROLE \"" + request.name + "\" LOGIN PASSWORD '" + password +
                          "';\nCREATE DATABASE \"" + request.name + "\" OWNER \"" + request.name +
                          "\";\nREVOKE CONNECT ON DATABASE postgres FROM PUBLIC;\n",
                      password);
  if (!made) {
    undo();
    return made.error();
  }
  if (auto tls = fresh_tls_key(*this, request.tenant, sbx->id, id); !tls) {
    undo();
    return tls.error();
  }
  if (!dump.empty()) {
    auto restored = restore_dump(*this, request.tenant, sbx->id, request.name, dump);
    if (!restored) {
      undo();
      return restored.error();
    }
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
  out->restored_from = request.from_backup;
  return out;
}

namespace {
// A database as it is: its record, its status derived from its sandbox, its address.
Reply<DatabaseInfo> observe(Runtime& rt, const DatabaseState& s) {
  DatabaseInfo i = info_of(s);
  auto sandbox = rt.get(s.tenant, s.sandbox);
  if (!sandbox && sandbox.error().code != Code::sandbox_not_found) return sandbox.error();
  derive(i, sandbox ? &*sandbox : nullptr);
  fill_address(rt, i);
  return i;
}
}  // namespace

Reply<DatabaseInfo> Runtime::get_database(const std::string& tenant, const std::string& id) {
  Answer a = impl_->ask(caf::make_message(dblist_atom::value, tenant, false));
  if (!a.ok) return a.error;
  for (auto& s : a.databases)
    if (s.id == id) return observe(*this, s);
  return Rejection{Code::database_not_found, "no database " + id};
}

Reply<std::vector<DatabaseInfo>> Runtime::list_databases(const std::string& tenant) {
  Answer a = impl_->ask(caf::make_message(dblist_atom::value, tenant, false));
  if (!a.ok) return a.error;
  std::vector<DatabaseInfo> out;
  for (auto& s : a.databases) {
    auto d = observe(*this, s);
    if (!d) return d.error();
    out.push_back(std::move(*d));
  }
  return out;
}

Reply<DatabaseInfo> Runtime::delete_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  (void)impl_->sandbox_command(tenant, d->sandbox, cmd::Kill{});  // an ended one is fine
  if (!d->volume.empty()) {
    auto v = delete_volume(tenant, d->volume);
    if (!v && v.error().code != Code::volume_not_found) return v.error();
  }
  auto out = record(*impl_, tenant, id, dbcmd::Delete{});
  if (out) {
    std::error_code ec;
    fs::remove_all(backups_dir(*impl_->env, id), ec);
    if (ec) spdlog::warn("database {}: cannot remove its backups: {}", id, ec.message());
  }
  return out;
}

Reply<DatabaseBackup> Runtime::backup_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d.error();
  if (auto no = not_serving(*d)) return *no;
  if (d->backups.size() >= kMaxBackupsPerDatabase)  // the actor decides too; this saves the dump
    return too_many_backups(id, d->backups.size());
  // Backups count against the volume MiB quota: room for the largest dump is asked first.
  if (Answer ok = impl_->ask(caf::make_message(voladmit_atom::value, tenant,
                                               uint64_t(kMaxBackupBytes >> 20), uint32_t(0)));
      !ok.ok)
    return ok.error;
  const std::string bk = "bk_" + random_base32(16);
  const fs::path dir = backups_dir(*impl_->env, id);
  const fs::path tmp = dir / (bk + ".dump.tmp"), final_path = dir / (bk + ".dump");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Rejection{Code::io_error, "cannot make " + dir.string() + ": " + ec.message()};
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return Rejection{Code::io_error, "cannot make " + tmp.string() + ": " + strerror(errno)};
  uint64_t bytes = 0;
  bool too_large = false;
  int write_errno = 0;
  std::string dump_err;
  vmm::ExecRequest r;
  r.argv = {"runuser", "-u", "postgres", "--", "pg_dump", "-Fc", "-d", d->database};
  r.timeout_ms = 600000;
  // On a driver thread, one chunk at a time: the dump goes to the file, never held in memory.
  auto x = exec_stream(tenant, d->sandbox, r, [&](vmm::StreamKind kind, std::string_view data) {
    if (kind == vmm::StreamKind::err) {
      if (dump_err.size() < 2000) dump_err.append(data.substr(0, 2000 - dump_err.size()));
      return;
    }
    if (too_large || write_errno != 0) return;
    if (bytes + data.size() > kMaxBackupBytes) {
      too_large = true;
      return;
    }
    while (!data.empty()) {
      ssize_t n = ::write(fd, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        write_errno = n < 0 ? errno : EIO;
        return;
      }
      bytes += uint64_t(n);
      data.remove_prefix(size_t(n));
    }
  });
  bool synced = x && ::fsync(fd) == 0;
  int sync_errno = errno;
  ::close(fd);
  auto fail = [&](Rejection why) {
    fs::remove(tmp, ec);
    return why;
  };
  if (!x) return fail(x.error());
  if (too_large)
    return fail({Code::backup_too_large, "the dump of " + id + " is larger than " +
                                             std::to_string(kMaxBackupBytes >> 20) + " MiB"});
  if (x->exit_code != 0 || x->timed_out)
    return fail({Code::backup_failed,
                 "pg_dump failed (exit " + std::to_string(x->exit_code) + "): " + dump_err});
  if (write_errno != 0 || !synced) {
    int e = write_errno != 0 ? write_errno : sync_errno;
    return fail({e == ENOSPC ? Code::no_space : Code::io_error,
                 "writing the backup: " + std::string(strerror(e))});
  }
  fs::rename(tmp, final_path, ec);
  if (ec) return fail({Code::io_error, "cannot keep the backup: " + ec.message()});
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);  // the rename is on disk before the event says the backup exists
    ::close(dfd);
  }
  auto out = record(*impl_, tenant, id, dbcmd::Backup{bk, bytes});
  if (!out) {
    fs::remove(final_path, ec);
    return out.error();
  }
  for (auto& b : out->backups)
    if (b.id == bk) return b;
  return Rejection{Code::internal, "backup " + bk + " was recorded but is not listed"};
}

Reply<DatabaseInfo> Runtime::delete_database_backup(const std::string& tenant,
                                                    const std::string& id,
                                                    const std::string& backup) {
  auto out = record(*impl_, tenant, id, dbcmd::DeleteBackup{backup});
  if (!out) return out;
  std::error_code ec;
  fs::remove(backups_dir(*impl_->env, id) / (backup + ".dump"), ec);
  return out;
}

Reply<DatabaseInfo> Runtime::hibernate_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (d->status == "failed") return failed(*d);
  if (d->status != "hibernated") {
    auto h = impl_->sandbox_command(tenant, d->sandbox, cmd::Hibernate{});
    if (!h) return h.error();
  }
  auto out = record(*impl_, tenant, id, dbcmd::Hibernate{});
  if (!out) return out;
  return get_database(tenant, id);
}

Reply<DatabaseInfo> Runtime::wake_database(const std::string& tenant, const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (d->status == "failed") return failed(*d);
  if (d->status != "running") {
    auto w = impl_->sandbox_command(tenant, d->sandbox, cmd::Wake{});
    if (!w) return w.error();
  }
  auto out = record(*impl_, tenant, id, dbcmd::Wake{});
  if (!out) return out;
  return get_database(tenant, id);  // as it is now: running, on its new port
}

Reply<DatabaseInfo> Runtime::rotate_database_password(const std::string& tenant,
                                                      const std::string& id) {
  auto d = get_database(tenant, id);
  if (!d) return d;
  if (auto no = not_serving(*d)) return *no;
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
  if (auto no = not_serving(*d)) return *no;
  vmm::ExecRequest r;
  r.argv = {"tail", "-n", std::to_string(lines), "/var/log/postgresql/postgresql-15-main.log"};
  r.timeout_ms = 30000;
  auto x = exec(tenant, d->sandbox, r);
  if (!x) return x.error();
  if (x->exit_code != 0 || x->timed_out)
    return Rejection{Code::internal, "reading the server log failed (exit " +
                                         std::to_string(x->exit_code) +
                                         "): " + x->stderr_data.substr(0, 500)};
  return x->stdout_data;
}

}  // namespace pandastack::actors
