// The runtime's tenant-facing administration (runtime.h): the audit log, counts, quotas (limits,
// use, an admin's own per tenant) and API keys. The sandbox, volume, database and template calls
// are in runtime.cc, runtime_volumes.cc, runtime_databases.cc and runtime_templates.cc.
#include <cctype>
#include <set>

#include "actors/custom_template_codec.h"
#include "actors/database_codec.h"
#include "actors/event_codec.h"
#include "actors/runtime.h"
#include "actors/runtime_impl.h"
#include "actors/volume_codec.h"
#include "storage/api_keys.h"

namespace pandastack::actors {

namespace {

KeyInfo key_info(const storage::ApiKey& k) { return {k.id, k.tenant, k.admin, k.created_ms}; }

// A key looked up in the key store: its info, or unauthorized (`gone`: why) when there is none.
Reply<KeyInfo> key_reply(const storage::Result<storage::ApiKey>& k, const char* gone) {
  if (!k) {
    if (k.error().code == storage::ErrorCode::not_found) return Rejection{Code::unauthorized, gone};
    return Rejection{Code::storage_error, k.error().message};
  }
  return key_info(*k);
}

// Tenant names are plain words ("*" means every tenant inside the runtime).
std::optional<Rejection> invalid_tenant(const std::string& tenant) {
  bool ok = !tenant.empty() && tenant.size() <= 128;
  for (char c : tenant) ok &= std::isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
  if (ok) return std::nullopt;
  return Rejection{Code::invalid_argument,
                   "tenant names are 1-128 characters of A-Z a-z 0-9 . - _"};
}

}  // namespace

Reply<std::vector<AuditEvent>> Runtime::audit(const AuditQuery& q) {
  std::optional<std::set<std::string>> allowed;
  if (!q.tenant.empty() && !q.stream.empty()) {
    // One sandbox: its owner is checked, not every sandbox of the tenant listed.
    Answer a = impl_->ask(caf::make_message(get_atom::value, q.tenant, q.stream));
    if (!a.ok) return a.error;
    allowed.emplace();
    allowed->insert(q.stream);
  } else if (!q.tenant.empty()) {
    Answer a = impl_->ask(caf::make_message(list_atom::value, ListQuery{q.tenant, {}, {}}));
    if (!a.ok) return a.error;
    allowed.emplace();
    for (auto& i : a.infos) allowed->insert(i.id);
    ListQuery vq{q.tenant, {}, {}, /*deleted_volumes=*/true};
    Answer vols = impl_->ask(caf::make_message(vollist_atom::value, vq));
    for (auto& i : vols.volumes) allowed->insert(i.id);
    Answer dbs = impl_->ask(caf::make_message(dblist_atom::value, q.tenant, true));
    for (auto& d : dbs.databases) allowed->insert(d.id);
    for (auto& t : impl_->builds->list(q.tenant, true)) allowed->insert("tpl_" + t.id);
    if (!q.stream.empty() && !allowed->count(q.stream)) return not_found(q.stream);
  }
  auto& store = *impl_->env->store;
  storage::Result<std::vector<storage::StoredEvent>> rows =
      !q.stream.empty() ? store.read_stream(q.stream, q.after_version + 1, q.limit)
      : q.from_ms > 0   ? store.read_time_range(q.from_ms, q.to_ms > 0 ? q.to_ms : INT64_MAX)
                        : store.read_all(q.after_seq + 1, allowed ? SIZE_MAX : q.limit);
  if (!rows) return Rejection{Code::storage_error, rows.error().message};
  std::vector<AuditEvent> out;
  for (auto& r : *rows) {
    if (out.size() >= q.limit) break;
    if (r.global_seq <= q.after_seq) continue;
    if (q.from_ms > 0 && r.time_ms < q.from_ms) continue;
    if (q.to_ms > 0 && r.time_ms >= q.to_ms) continue;
    if (allowed && !allowed->count(r.stream)) continue;
    std::string json = "{\"kind\":\"undecodable\"}";
    if (r.stream.starts_with("vol_")) {
      if (auto e = decode_volume_event(r.payload)) json = volume_event_to_json(*e);
    } else if (r.stream.starts_with("db_")) {
      if (auto e = decode_database_event(r.payload)) json = database_event_to_json(*e);
    } else if (r.stream.starts_with("tpl_")) {
      if (auto e = decode_template_event(r.payload)) json = template_event_to_json(*e);
    } else if (auto e = decode_event(r.payload)) {
      json = event_to_json(*e);
    }
    out.push_back({r.stream, r.version, r.global_seq, r.time_ms, r.type, json});
  }
  return out;
}

RuntimeCounts Runtime::counts() {
  RuntimeCounts c;
  Answer a = impl_->ask(caf::make_message(list_atom::value, ListQuery{"*", {}, {}}));
  for (auto& i : a.infos) ++c.by_status[to_string(i.status)];
  c.vm_exits = impl_->env->vm_exits.load();
  return c;
}

Quotas Runtime::quota_limits(const std::string& tenant) { return impl_->env->quotas_of(tenant); }

Reply<std::pair<Quotas, QuotaUse>> Runtime::quotas(const std::string& tenant) {
  auto all = list(tenant);
  if (!all) return all.error();
  QuotaUse u;
  for (auto& i : *all) count_use(i, impl_->env->config.memory_mib, u);
  // Volumes (their snapshots' copies and read-only overlays) and database backups, as the volume
  // quota counts them (registry_volumes.cc admit), and custom templates (exploratory test 3, #14:
  // the answer showed neither).
  auto volumes = list_volumes(tenant);
  if (!volumes) return volumes.error();
  for (auto& v : *volumes) count_volume_use(v, u);
  auto databases = list_databases(tenant);
  if (!databases) return databases.error();
  for (auto& d : *databases) u.volume_mib += backups_mib(d.backups);
  for (auto& t : impl_->builds->list(tenant))
    if (t.status != TemplateStatus::deleted) ++u.templates;
  {
    std::lock_guard l(impl_->env->quotas_mu);
    auto it = impl_->env->execs_running.find(tenant);
    u.execs = it == impl_->env->execs_running.end() ? 0 : it->second;
  }
  return std::make_pair(impl_->env->quotas_of(tenant), u);
}

Reply<Quotas> Runtime::set_quotas(const std::string& tenant, const wire::Json& changes) {
  if (auto bad = invalid_tenant(tenant)) return *bad;
  auto& env = *impl_->env;
  auto q = quotas_from_json(changes, env.quotas_of(tenant));
  if (auto* r = std::get_if<Rejection>(&q)) return *r;
  auto& quotas = std::get<Quotas>(q);
  auto saved = env.store->put("quota/" + tenant, quotas_json(quotas).dump(), true);
  if (!saved) return Rejection{Code::storage_error, saved.error().message};
  std::lock_guard l(env.quotas_mu);
  env.tenant_quotas[tenant] = quotas;
  return quotas;
}

Reply<Quotas> Runtime::reset_quotas(const std::string& tenant) {
  auto& env = *impl_->env;
  auto removed = env.store->remove("quota/" + tenant, true);
  if (!removed) return Rejection{Code::storage_error, removed.error().message};
  std::lock_guard l(env.quotas_mu);
  env.tenant_quotas.erase(tenant);
  return env.config.quotas;
}

Reply<KeyInfo> Runtime::authenticate(const std::string& token) {
  return key_reply(impl_->keys->verify(token), "unknown or revoked API key");
}

Reply<KeyInfo> Runtime::key_by_id(const std::string& key_id) {
  return key_reply(impl_->keys->find(key_id), "the API key this was issued under is revoked");
}

Reply<std::pair<std::string, KeyInfo>> Runtime::create_key(const std::string& tenant, bool admin) {
  if (auto bad = invalid_tenant(tenant)) return *bad;
  auto k = impl_->keys->create(tenant, admin);
  if (!k) return Rejection{Code::storage_error, k.error().message};
  return std::make_pair(k->first, key_info(k->second));
}

Reply<bool> Runtime::revoke_key(const std::string& key_id) {
  auto s = impl_->keys->revoke(key_id);
  if (!s) {
    if (s.error().code == storage::ErrorCode::not_found)
      return Rejection{Code::key_not_found, "no key " + key_id};
    return Rejection{Code::storage_error, s.error().message};
  }
  return true;
}

Reply<std::vector<KeyInfo>> Runtime::list_keys() {
  auto ks = impl_->keys->list();
  if (!ks) return Rejection{Code::storage_error, ks.error().message};
  std::vector<KeyInfo> out;
  for (auto& k : *ks) out.push_back(key_info(k));
  return out;
}

}  // namespace pandastack::actors
