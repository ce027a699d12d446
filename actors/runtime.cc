#include "actors/runtime.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <caf/all.hpp>
#include <cctype>
#include <fstream>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <stop_token>

#include "actors/cluster.h"
#include "actors/egress_proxies.h"
#include "actors/env.h"
#include "actors/messages.h"
#include "actors/recovery.h"
#include "actors/registry.h"
#include "actors/runtime_impl.h"
#include "actors/secrets.h"
#include "actors/volume_files.h"
#include "storage/api_keys.h"
#include "storage/object_store.h"
#include "vmm-driver/images.h"
#include "vmm-driver/jail.h"
#include "vmm-driver/private_dir.h"
#include "wire/hex.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  if (!impl_ || !impl_->sys) return;
  impl_->builds.reset();  // running template builds are cancelled first
  impl_->ask(caf::make_message(shutdown_atom::value));
  impl_->env->watcher->mute();  // no report of a VM's end reaches an actor from now on
  caf::anon_send_exit(impl_->registry, caf::exit_reason::user_shutdown);
  impl_->registry = nullptr;
  impl_->sys.reset();  // waits for every actor (and so every VM worker) to finish
  impl_->env->watcher.reset();
  // The egress proxies' thread ends before the secrets it reads go (members end in reverse).
  {
    std::lock_guard lock(impl_->env->proxy_mu);
    impl_->env->proxies.reset();
  }
  // Pool members and spares go now, while the subnet book-keeping their networks report to lives.
  impl_->env->pools.clear();
  impl_->env->spares.clear();
  const auto& cfg = impl_->env->config;
  if (cfg.network) {
    // Every VM is gone (hibernated or killed): so are their networks, and the host table.
    vmm::Network::remove_leftovers(cfg.net, {});
    vmm::Network::remove_host_rules(cfg.net);
  }
  // Host memory is not left behind: the staged template copies (~80 MB of RAM file each) go
  // (the next start stages them again from the images folder, in ~0.1 s); so does every run
  // folder, and the RAM-file copies memory bases made ahead (vmm::MemoryBase::copy_file_to).
  // What outlives the stop on purpose stays: hibernated sandboxes and named snapshots. With
  // neither, the state folder itself goes.
  std::error_code ec;
  for (auto root : {cfg.state_dir, cfg.disk_dir})
    for (auto sub : {"templates", "run", "ram-copies"}) {
      fs::remove_all(root / sub, ec);
      fs::create_directories(root / sub, ec);
    }
  auto empty = [&](const fs::path& p) { return !fs::exists(p) || fs::is_empty(p, ec); };
  if (empty(cfg.state_dir / "hibernated") && empty(cfg.state_dir / "snapshots")) {
    fs::remove_all(cfg.state_dir, ec);
    fs::remove_all(cfg.disk_dir, ec);
  }
}

Reply<std::unique_ptr<Runtime>> Runtime::start(RuntimeConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->env = std::make_unique<Env>();
  Env& env = *impl->env;
  if (config.disk_dir.empty()) config.disk_dir = fs::absolute(config.data_dir) / "disks";
  if (config.custom_templates_dir.empty())
    config.custom_templates_dir = fs::absolute(config.data_dir) / "templates";
  if (config.state_dir.empty())
    config.state_dir =
        "/dev/shm/pandastack-" + wire::fnv1a_hex(fs::absolute(config.data_dir).string());
  if (config.network) {
    // The host's own networks (its LAN, its VPC) join the ranges no sandbox reaches.
    for (auto& prefix : vmm::host_interface_prefixes(config.net.prefix))
      config.net.reserved.push_back(prefix);
    for (auto& c : config.net.reserved_allowed)
      if (auto n = vmm::normalize_cidr(c); !n)
        return Rejection{Code::invalid_argument, "--allow-private-egress: " + n.error().message};
      else
        c = *n;
  }
  if (config.jail) {
    // Jail uids must be nobody else's: a host user whose subordinate ids (user namespaces) cover
    // them could signal the QEMUs or open their RAM files.
    const auto& policy = vmm::JailPolicy::builtin();
    for (auto file : {"/etc/subuid", "/etc/subgid"}) {
      std::ifstream in(file);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto overlaps = vmm::subid_overlaps(text, policy.uid_base, policy.uid_count);
      if (!overlaps.empty())
        return Rejection{Code::invalid_argument,
                         std::string(file) + " gives '" + overlaps[0] +
                             "' ids the QEMU jail uses (" + std::to_string(policy.uid_base) + "+" +
                             std::to_string(policy.uid_count) +
                             "): move that user's range or the jail's (vmm-driver/jail.policy)"};
    }
  }
  env.config = config;
  if (!config.object_store.empty()) {
    auto store = storage::parse_object_store(config.object_store, config.object_store_credentials);
    if (!store) return Rejection{Code::invalid_argument, store.error().message};
    env.object_store = std::make_shared<storage::S3Store>(*store);
    spdlog::info("object store: hibernations and named snapshots are uploaded to {}",
                 env.object_store->describe());
  }
  // Ours alone (made 0700 here, refused if someone else made them first): recovery deletes and
  // kills by what it finds in them, and they hold every tenant's memory, disks and events.
  for (auto& dir : {config.data_dir, config.state_dir, config.disk_dir})
    if (auto st = vmm::private_dir(dir); !st)
      return Rejection{Code::invalid_argument,
                       "cannot use " + dir.string() + ": " + st.error().message};
  for (auto sub : {"run", "snapshots", "hibernated", "templates"}) {
    fs::create_directories(config.state_dir / sub);
    fs::create_directories(config.disk_dir / sub);
  }
  auto store = storage::EventStore::open({config.data_dir / "store", true, 1024, {}});
  if (!store) return Rejection{Code::storage_error, store.error().message};
  env.store = std::move(*store);
  impl->keys = std::make_unique<storage::KeyStore>(*env.store);
  // Secrets' values are sealed under a key file of their own, beside the store, never in it.
  auto sealed = storage::SecretStore::open(*env.store, config.data_dir / "secrets.key");
  if (!sealed) return Rejection{Code::storage_error, "secrets: " + sealed.error().message};
  impl->secret_store = std::move(*sealed);
  impl->secrets = std::make_unique<Secrets>(*impl->secret_store);
  env.secrets = impl->secrets.get();
  // Tenants' own quotas (set by an admin).
  if (auto saved = env.store->scan("quota/")) {
    for (auto& [key, value] : *saved) {
      auto j = wire::Json::parse(value);
      auto q =
          j ? quotas_from_json(*j, config.quotas) : std::variant<Quotas, Rejection>(Rejection{});
      if (auto* ok = std::get_if<Quotas>(&q))
        env.tenant_quotas[key.substr(6)] = *ok;
      else
        spdlog::warn("quotas of {}: unreadable record, the defaults apply", key.substr(6));
    }
  }
  env.templates =
      std::make_unique<vmm::TemplateStore>(env.io, config.images_dir, config.custom_templates_dir);
  if (config.network) {
    auto pool = vmm::SubnetPool::parse(config.net.pool_cidr);
    if (!pool) return Rejection{Code::invalid_argument, "subnet pool: " + pool.error().message};
    env.subnet_capacity = pool->capacity();
    auto host = vmm::Network::install_host_rules(config.net);
    if (!host) return Rejection{Code::network_error, "sandbox networking: " + host.error().message};
  }

  auto recovered = recover(env);
  if (!recovered) return recovered.error();
  impl->dropped_manifests = std::move(recovered->dropped_manifests);
  impl->builds = std::make_unique<TemplateBuilds>(env);
  if (auto no = impl->builds->recover()) return *no;
  impl->cfg = std::make_unique<caf::actor_system_config>();
  impl->cfg->set("scheduler.policy", caf::atom("sharing"));
  impl->sys = std::make_unique<caf::actor_system>(*impl->cfg);
  impl->registry = impl->sys->spawn(registry_actor, impl->env.get());
  env.to_adopt = recovered->to_adopt.size();
  for (auto& s : recovered->sandboxes) {
    auto dir = recovered->to_adopt.find(s.id);
    caf::anon_send(impl->registry, adopt_atom::value, s,
                   dir == recovered->to_adopt.end() ? std::string() : dir->second.string());
  }
  // After the sandboxes: attachments to sandboxes that ended are let go.
  for (auto& v : recovered->volumes) caf::anon_send(impl->registry, voladopt_atom::value, v);
  for (auto& d : recovered->databases) caf::anon_send(impl->registry, dbadopt_atom::value, d);
  // A database's sandbox that no database names (a create cut short before its record, a delete
  // cut short after it) goes, with its data volume: nothing runs or holds disk for nobody.
  std::set<std::string> databases;
  for (auto& d : recovered->databases)
    if (d.status != DatabaseStatus::deleted) databases.insert(d.id);
  std::set<std::string> volumes;
  for (auto& v : recovered->volumes)
    if (v.status == VolumeStatus::available) volumes.insert(v.id);
  std::vector<std::string> orphans;
  for (auto& s : recovered->sandboxes) {
    auto m = s.metadata.find(kDatabaseKey);
    if (m == s.metadata.end() || databases.count(m->second)) continue;
    bool ended = s.status == SandboxStatus::stopped || s.status == SandboxStatus::failed;
    bool holds = std::any_of(s.volumes.begin(), s.volumes.end(),
                             [&](auto& v) { return volumes.count(v.volume) > 0; });
    if (!ended || holds) orphans.push_back(s.id);
  }
  if (!orphans.empty()) {
    spdlog::info("runtime: {} database sandbox(es) without a database go, with their volumes",
                 orphans.size());
    caf::anon_send(impl->registry, unfork_atom::value, orphans);
  }
  // Secret bindings of sandboxes that ended while the daemon was down (or whose retirement a
  // crash cut short) go: their placeholders serve nothing now. A live one's actor keeps its own.
  std::set<std::string> live;
  for (auto& s : recovered->sandboxes)
    if (s.live()) live.insert(s.id);
  if (auto n = impl->secrets->unbind_all_but(live))
    spdlog::info("runtime: {} secret binding(s) of ended sandboxes removed", n);
  spdlog::info(
      "runtime: {} sandboxes recovered from {} ({} from state snapshots, {} retired skipped, "
      "{} hibernations and {} snapshots back from the data disk); adopting {} VMs",
      recovered->sandboxes.size(), (config.data_dir / "store").string(), recovered->from_snapshots,
      recovered->retired, recovered->hibernations_restored, recovered->snapshots_restored,
      recovered->to_adopt.size());
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

namespace {
bool valid_shipped_name(const std::string& n) {
  if (n.empty() || n.size() > 64 || n == "kernel" || n == "initramfs") return false;
  for (char c : n)
    if (!(std::islower((unsigned char)c) || std::isdigit((unsigned char)c) || c == '-' || c == '_'))
      return false;
  return true;
}
}  // namespace

std::vector<TemplateInfo> Runtime::templates() {
  std::vector<TemplateInfo> out;
  std::error_code ec;
  for (auto& d : fs::directory_iterator(impl_->env->config.images_dir, ec)) {
    auto name = d.path().filename().string();
    if (!valid_shipped_name(name) || !fs::exists(d.path() / "rootfs.qcow2")) continue;
    bool baked = fs::exists(d.path() / "baked") && !fs::is_empty(d.path() / "baked", ec);
    out.push_back({name, baked});
  }
  std::sort(out.begin(), out.end(),
            [](const TemplateInfo& a, const TemplateInfo& b) { return a.name < b.name; });
  return out;
}

std::optional<Rejection> validate_egress(Egress& e, bool have_resolver) {
  auto mode = vmm::egress_mode_from_string(e.mode);
  if (!mode)
    return Rejection{Code::invalid_argument,
                     "egress mode '" + e.mode + "' is not one of deny_all, allow_all, allowlist"};
  vmm::EgressPolicy p;
  p.mode = *mode;
  p.cidrs = e.cidrs;
  p.domains = e.domains;
  auto v = vmm::validate(p);
  if (!v) return Rejection{Code::invalid_argument, "egress: " + v.error().message};
  if (!v->domains.empty() && !have_resolver)
    return Rejection{
        Code::not_implemented,
        "domain names in an egress allowlist need the platform resolver, and this host "
        "has no upstream DNS server (--dns-upstream): allow CIDRs instead"};
  e.cidrs = v->cidrs;
  e.domains = v->domains;
  return std::nullopt;
}

namespace {

// The hosts of the tenant's secrets `names`, each one a sandbox may be given (secret_not_found
// for a name the tenant has not; invalid_argument for one made through E2B's API).
Reply<std::set<std::string>> secret_hosts(Secrets& secrets, const std::string& tenant,
                                          const std::vector<std::string>& names) {
  if (names.empty() || names.size() > Secrets::kMaxPerSandbox)
    return Rejection{Code::invalid_argument, "secrets: 1.." +
                                                 std::to_string(Secrets::kMaxPerSandbox) +
                                                 " names of the tenant's secrets"};
  std::set<std::string> hosts;
  for (auto& name : names) {
    auto info = secrets.get(tenant, name);
    if (!info) return info.error();
    if (auto no = Secrets::bindable(*info)) return *no;
    hosts.insert(info->hosts.begin(), info->hosts.end());
  }
  return hosts;
}

// Adds secrets' `hosts` to `egress` (deny_all becomes an allowlist of them; allow_all reaches
// them already).
void allow_secret_hosts(const std::set<std::string>& hosts, Egress& egress) {
  if (egress.mode == "allow_all") return;
  if (egress.mode == "deny_all") {
    egress.mode = "allowlist";
    egress.cidrs.clear();
    egress.domains.clear();
  }
  for (auto& h : hosts)
    if (std::find(egress.domains.begin(), egress.domains.end(), h) == egress.domains.end())
      egress.domains.push_back(h);
}

// A running sandbox just bound to secrets (created, or a fork's child that inherits): its egress
// proxy started on its VM's network and, given `ca_pem`, the sandbox's CA added to the guest's
// trust store.
std::optional<Rejection> serve_secrets(Runtime::Impl& impl, const std::string& tenant,
                                       const std::string& id, const std::string* ca_pem) {
  Answer a = impl.ask(caf::make_message(lease_atom::value, tenant, id));
  if (!a.ok) return a.error;
  std::shared_lock l(a.vm->mu);
  auto& vm = a.vm->vm;
  if (!vm) return Rejection{Code::sandbox_not_running, "the sandbox's VM is gone"};
  if (!vm->config().network)
    return Rejection{Code::invalid_argument, "secrets need the sandbox's network"};
  if (auto st = start_egress_proxy(*impl.env, *vm->config().network, id); !st)
    return Rejection{Code::internal, "the sandbox's egress proxy: " + st.error().message};
  if (!ca_pem) return std::nullopt;
  auto r = vm->agent().exec(trust_ca_request(*ca_pem));
  if (!r || r->exit_code != 0)
    return Rejection{Code::agent_error,
                     "adding the sandbox's CA to the guest's trust store: " +
                         (r ? r->stdout_data + r->stderr_data : r.error().message)};
  return std::nullopt;
}

}  // namespace

Reply<SandboxInfo> Runtime::create(const CreateRequest& request) {
  CreateRequest r = request;
  const auto& cfg = impl_->env->config;
  // The name is checked before any path is made of it (the network default is read below).
  // A snapshot by name: its id.
  if (!r.from_snapshot.empty() &&
      (r.from_snapshot.rfind("snap_", 0) != 0 || r.from_snapshot.find(':') != std::string::npos)) {
    auto id = resolve_snapshot(r.tenant, r.from_snapshot);
    if (!id) return id.error();
    r.from_snapshot = *id;
  }
  if (r.from_snapshot.empty() && !valid_shipped_name(r.template_name))
    return Rejection{Code::invalid_argument,
                     "template names are 1-64 characters of a-z, 0-9, '-' and '_'"};
  // The tenant's own template of that name, if it has one (actors/template_builds.h).
  if (r.from_snapshot.empty())
    if (auto id = impl_->builds->resolve(r.tenant, r.template_name)) r.template_name = *id;
  const auto template_dir =
      vmm::template_dir(cfg.images_dir, cfg.custom_templates_dir, r.template_name);
  if (r.network.value_or(false) && !cfg.network)
    return Rejection{Code::network_disabled, "sandbox networking is off on this host"};
  if (!r.network) {
    // The template's default (IMAGES/<template>/network, from its recipe), else on. (From a
    // snapshot: the registry names its template; the daemon's default applies.)
    std::ifstream f;
    if (r.from_snapshot.empty()) f.open(template_dir / "network");
    std::string word;
    f >> word;
    r.network = cfg.network && word != "off";
  }
  std::set<std::string> hosts;  // (the secrets first: an unknown one is 404 on any host)
  if (!r.secrets.empty()) {
    auto h = secret_hosts(*impl_->secrets, r.tenant, r.secrets);
    if (!h) return h.error();
    hosts = std::move(*h);
  }
  if (!r.header_rules.empty())
    if (auto no = impl_->secrets->check_rules(r.tenant, r.header_rules)) return *no;
  if ((!r.secrets.empty() || !r.header_rules.empty()) && !*r.network)
    return Rejection{Code::invalid_argument,
                     "secrets and network rules reach a sandbox through its network's egress "
                     "proxy: a sandbox without a network (network: false) has none"};
  if (*r.network) {
    r.egress = r.egress.value_or(cfg.default_egress);
    if (!r.secrets.empty()) allow_secret_hosts(hosts, *r.egress);
    if (auto bad = validate_egress(*r.egress, !cfg.net.dns_upstream.empty())) return *bad;
  } else if (r.egress) {
    return Rejection{Code::invalid_argument,
                     "an egress policy needs a network (network: false given)"};
  }
  if (r.from_snapshot.empty()) {
    if (!fs::exists(template_dir / "rootfs.qcow2"))
      return Rejection{Code::template_not_found,
                       "no template '" + r.template_name +
                           "' (GET /v1/templates lists them; build one with POST /v1/templates "
                           "or `pandastack template build`)"};
  }
  auto made = to_reply<SandboxInfo>(impl_->ask(caf::make_message(create_atom::value, r)),
                                    [](const Answer& a) { return a.info; });
  // Cluster mode: a snapshot this host lacks may be parked in the object store by its host, which
  // is down (REST's routing placed the create here; RPC and E2B create on the host asked).
  if (!made && made.error().code == Code::snapshot_not_found && impl_->cluster &&
      r.from_snapshot.rfind("snap_", 0) == 0)
    if (auto parked = create_from_parked(r); parked || parked.error().code != Code::conflict)
      return parked;
  if (made) {
    if (auto no = impl_->claim(made->id)) {
      (void)kill(r.tenant, made->id);  // nothing half-made: a sandbox no host answers for
      return *no;
    }
  }
  if (made && (!r.secrets.empty() || !r.header_rules.empty())) {
    // Bound once it exists (its id is its binding's); nothing in it knows a placeholder before.
    auto bound = impl_->secrets->bind(r.tenant, made->id, r.secrets, r.header_rules);
    std::optional<Rejection> no;
    if (!bound)
      no = bound.error();
    else
      no = serve_secrets(*impl_, r.tenant, made->id, &bound->ca_cert);
    if (no) {
      (void)kill(r.tenant, made->id);
      impl_->secrets->unbind(made->id);
      return *no;
    }
  }
  return made;
}

Reply<SandboxInfo> Runtime::get(const std::string& tenant, const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(caf::make_message(get_atom::value, tenant, id)),
                               [](const Answer& a) { return a.info; });
}

Reply<std::vector<SandboxInfo>> Runtime::list(const std::string& tenant,
                                              std::optional<SandboxStatus> status,
                                              const std::map<std::string, std::string>& metadata) {
  return to_reply<std::vector<SandboxInfo>>(
      impl_->ask(caf::make_message(list_atom::value, ListQuery{tenant, status, metadata})),
      [](const Answer& a) { return a.infos; });
}

Reply<SandboxInfo> Runtime::Impl::sandbox_command(const std::string& tenant, const std::string& id,
                                                  Command c) {
  return to_reply<SandboxInfo>(ask(route(tenant, id, std::move(c))),
                               [](const Answer& a) { return a.info; });
}

std::optional<Rejection> Runtime::Impl::refuse_database_sandbox(const std::string& tenant,
                                                                const std::string& id) {
  Answer a = ask(caf::make_message(get_atom::value, tenant, id));
  if (!a.ok) return std::nullopt;  // the command itself answers (sandbox_not_found, ...)
  auto it = a.info.metadata.find(kDatabaseKey);
  if (it == a.info.metadata.end()) return std::nullopt;
  // The entry alone proves nothing (a tenant may write any metadata): the database's own record
  // must name this sandbox.
  Answer dbs = ask(caf::make_message(dblist_atom::value, tenant, false));
  if (!dbs.ok) return dbs.error;
  bool owned = false;
  for (auto& d : dbs.databases)
    owned = owned || (d.id == it->second && d.sandbox == id && d.status != DatabaseStatus::deleted);
  if (!owned) return std::nullopt;
  return Rejection{Code::managed_by_database, "sandbox " + id + " runs database " + it->second +
                                                  ": manage it through /v1/databases/" +
                                                  it->second};
}

Reply<SandboxInfo> Runtime::hibernate(const std::string& tenant, const std::string& id,
                                      bool keep_memory) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return impl_->sandbox_command(tenant, id, cmd::Hibernate{"", !keep_memory});
}

Reply<SandboxInfo> Runtime::wake(const std::string& tenant, const std::string& id) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return impl_->sandbox_command(tenant, id, cmd::Wake{});
}

Reply<SandboxInfo> Runtime::kill(const std::string& tenant, const std::string& id) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return impl_->sandbox_command(tenant, id, cmd::Kill{});
}

Reply<SandboxInfo> Runtime::set_ttl(const std::string& tenant, const std::string& id,
                                    uint32_t ttl) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return impl_->sandbox_command(tenant, id, cmd::SetTtl{ttl});
}

namespace {
// The sandbox's exposed ports, after `change` ran on its VM's network (when the VM runs).
Reply<std::vector<PortInfo>> ports_after(Runtime::Impl& impl, const std::string& tenant,
                                         const std::string& id, const SandboxInfo& info,
                                         const std::function<vmm::Status(vmm::Network&)>& change) {
  std::map<uint16_t, uint16_t> live;
  if (info.status == SandboxStatus::running) {
    Answer a = impl.ask(caf::make_message(lease_atom::value, tenant, id));
    if (a.ok) {
      std::shared_lock l(a.vm->mu);
      if (a.vm->vm && a.vm->vm->config().network) {
        auto& net = *a.vm->vm->config().network;
        if (change) {
          auto st = change(net);
          if (!st) return Rejection{Code::network_error, st.error().message};
        }
        live = net.exposed();
      }
    }
  }
  std::vector<PortInfo> out;
  for (auto p : info.ports) {
    PortInfo pi;
    pi.port = p;
    pi.host = impl.env->config.ports_host;
    if (auto it = live.find(uint16_t(p)); it != live.end()) pi.host_port = it->second;
    out.push_back(pi);
  }
  return out;
}
}  // namespace

Reply<std::vector<PortInfo>> Runtime::expose_port(const std::string& tenant, const std::string& id,
                                                  uint32_t port) {
  Answer a = impl_->ask(route(tenant, id, cmd::ExposePort{port}));
  if (!a.ok) return a.error;
  const auto& host = impl_->env->config.ports_host;
  return ports_after(*impl_, tenant, id, a.info, [&](vmm::Network& n) -> vmm::Status {
    auto p = n.expose(uint16_t(port), host);
    if (!p) return p.error();
    return vmm::Ok{};
  });
}

Reply<std::vector<PortInfo>> Runtime::unexpose_port(const std::string& tenant,
                                                    const std::string& id, uint32_t port) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  Answer a = impl_->ask(route(tenant, id, cmd::UnexposePort{port}));
  if (!a.ok) return a.error;
  return ports_after(*impl_, tenant, id, a.info, [&](vmm::Network& n) -> vmm::Status {
    n.unexpose(uint16_t(port));
    return vmm::Ok{};
  });
}

Reply<std::vector<PortInfo>> Runtime::ports(const std::string& tenant, const std::string& id) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  return ports_after(*impl_, tenant, id, *info, nullptr);
}

Secrets& Runtime::secrets() { return *impl_->secrets; }

Reply<vmm::EgressPage> Runtime::egress(const std::string& tenant, const std::string& id,
                                       const vmm::EgressQuery& q) {
  auto info = get(tenant, id);  // (the tenant's, or sandbox_not_found)
  if (!info) return info.error();
  if (!info->network) return Rejection{Code::network_disabled, "sandbox " + id + " has no network"};
  auto log = impl_->env->egress_log(id, false);
  return log ? log->read(q) : vmm::EgressLog().read(q);  // (none: no VM of it ran since start)
}

Reply<std::vector<MetricSample>> Runtime::metrics(const std::string& tenant, const std::string& id,
                                                  int64_t from_ms, int64_t to_ms) {
  auto info = get(tenant, id);  // (the tenant's, or sandbox_not_found)
  if (!info) return info.error();
  return impl_->env->metrics.range(id, from_ms, to_ms);
}

Reply<SandboxInfo> Runtime::set_egress(const std::string& tenant, const std::string& id,
                                       const Egress& egress) {
  Egress e = egress;
  if (auto bad = validate_egress(e, !impl_->env->config.net.dns_upstream.empty())) return *bad;
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::SetEgress{e})),
                               [](const Answer& a) { return a.info; });
}

Reply<bool> Runtime::set_header_rules(const std::string& tenant, const std::string& id,
                                      const std::vector<storage::HeaderRule>& rules) {
  auto s = get(tenant, id);  // (the tenant's, or sandbox_not_found)
  if (!s) return s.error();
  auto& secrets = *impl_->secrets;
  auto bound = secrets.binding(id);
  if (!bound) return bound.error();
  if (*bound) {  // its proxy and CA are there: the rules apply from the next request
    if (auto st = secrets.set_rules(tenant, id, rules); !st) return st.error();
    return true;
  }
  if (rules.empty()) return false;
  if (auto no = secrets.check_rules(tenant, rules)) return *no;
  if (!s->network)
    return Rejection{Code::invalid_argument,
                     "network rules reach a sandbox through its network's egress proxy: this "
                     "sandbox has no network"};
  if (s->status != SandboxStatus::running)
    return Rejection{Code::sandbox_not_running,
                     "network rules are first given to a running sandbox (its guest trusts its "
                     "egress proxy's CA from then on)"};
  auto made = secrets.bind(tenant, id, {}, rules);
  if (!made) return made.error();
  if (auto no = serve_secrets(*impl_, tenant, id, &made->ca_cert)) {
    secrets.unbind(id);
    return *no;
  }
  return true;
}

Reply<SandboxInfo> Runtime::set_metadata(const std::string& tenant, const std::string& id,
                                         const std::map<std::string, std::string>& metadata) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::SetMetadata{metadata})),
                               [](const Answer& a) { return a.info; });
}

std::optional<std::string> check_snapshot_name(const std::string& name) {
  bool ok =
      !name.empty() && name.size() <= 64 && name.rfind("snap_", 0) != 0 &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      });
  if (ok) return std::nullopt;
  return "a snapshot name is 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-', not starting "
         "with 'snap_'";
}

Reply<std::string> Runtime::snapshot(const std::string& tenant, const std::string& id,
                                     const std::string& name) {
  if (!name.empty())
    if (auto bad = check_snapshot_name(name)) return Rejection{Code::invalid_argument, *bad};
  std::string snap = "snap_" + random_base32(16);
  if (auto no = impl_->claim(snap)) return *no;  // (before it exists: nobody else names it)
  return to_reply<std::string>(impl_->ask(route(tenant, id, cmd::Snapshot{snap, name})),
                               [](const Answer& a) { return a.text; });
}

const SnapshotInfo* find_snapshot(const std::vector<SnapshotInfo>& all, const std::string& tenant,
                                  const std::string& ref) {
  std::string r = ref;
  if (r.size() > 8 && r.compare(r.size() - 8, 8, ":default") == 0) r.resize(r.size() - 8);
  if (r.rfind(tenant + "/", 0) == 0) r = r.substr(tenant.size() + 1);
  for (auto& s : all)
    if (s.id == r || (s.current && s.name == r)) return &s;
  return nullptr;
}

Reply<std::string> Runtime::resolve_snapshot(const std::string& tenant, const std::string& ref) {
  auto all = snapshots(tenant);
  if (!all) return all.error();
  if (auto* s = find_snapshot(*all, tenant, ref)) return s->id;
  return Rejection{Code::snapshot_not_found, "no snapshot '" + ref + "'"};
}

Reply<SandboxInfo> Runtime::delete_snapshot(const std::string& tenant,
                                            const std::string& snapshot_id) {
  return to_reply<SandboxInfo>(
      impl_->ask(caf::make_message(delsnap_atom::value, tenant, snapshot_id)),
      [](const Answer& a) { return a.info; });
}

namespace {
// Bytes a file holds on its file system (allocated blocks: a sparse RAM file counts what is in it).
uint64_t allocated(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? uint64_t(st.st_blocks) * 512 : 0;
}
}  // namespace

Reply<std::vector<SnapshotInfo>> Runtime::snapshots(const std::string& tenant) {
  auto all = list(tenant);
  if (!all) return all.error();
  std::vector<SnapshotInfo> out;
  auto& env = *impl_->env;
  for (auto& sbx : *all)
    for (auto& id : sbx.snapshots) {
      SnapshotInfo i;
      i.id = id;
      i.sandbox = sbx.id;
      if (auto n = sbx.snapshot_names.find(id); n != sbx.snapshot_names.end()) i.name = n->second;
      i.durable = sbx.durable_snapshots.count(id) > 0;
      i.remote = sbx.snapshot_manifests.count(id) > 0;
      i.template_name = sbx.template_name;
      auto dir = env.snapshot_dir(id);
      if (auto snap = vmm::Snapshot::load(dir)) {
        i.created_at_ms = snap->created_unix_ms;
        i.memory_bytes = allocated(snap->mem());
        i.size_bytes = i.memory_bytes + allocated(snap->state());
        for (auto& l : snap->layers) i.size_bytes += allocated(snap->layer(l));
        for (auto slot : snap->volume_copies) i.size_bytes += allocated(snap->volume(slot));
      }
      out.push_back(i);
    }
  std::sort(out.begin(), out.end(), [](const SnapshotInfo& a, const SnapshotInfo& b) {
    return a.created_at_ms < b.created_at_ms;
  });
  // A name stands for the newest snapshot taken with it.
  std::set<std::string> seen;
  for (auto it = out.rbegin(); it != out.rend(); ++it)
    if (!it->name.empty()) it->current = seen.insert(it->name).second;
  return out;
}

Reply<bool> Runtime::check_egress(const std::string& tenant, const std::string& id,
                                  Egress& egress) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  if (!info->network)
    return Rejection{Code::network_disabled, "sandbox " + id + " was created without a network"};
  if (auto bad = validate_egress(egress, !impl_->env->config.net.dns_upstream.empty())) return *bad;
  return true;
}

Reply<std::vector<SandboxInfo>> Runtime::fork(const std::string& tenant, const std::string& id,
                                              uint32_t count, bool inherit_secrets) {
  std::string snap = "snap_" + random_base32(16);
  if (auto no = impl_->claim(snap)) return *no;
  auto children =
      to_reply<std::vector<SandboxInfo>>(impl_->ask(route(tenant, id, cmd::Fork{snap, count})),
                                         [](const Answer& a) { return a.infos; });
  if (children)
    if (auto no = claim_all(*children)) {
      for (auto& k : *children) (void)kill(tenant, k.id);
      return *no;
    }
  // Children that inherit: the parent's placeholders and CA (already in their memory and trust
  // store) with proxies of their own. The others hold placeholders nothing will replace.
  if (children && inherit_secrets)
    for (auto& k : *children) {
      auto inherited = impl_->secrets->inherit(id, k.id);
      std::optional<Rejection> no;
      if (!inherited)
        no = inherited.error();
      else if (*inherited)
        no = serve_secrets(*impl_, tenant, k.id, nullptr);
      if (no) {
        for (auto& x : *children) (void)kill(tenant, x.id);
        return *no;
      }
    }
  return children;
}

const RuntimeConfig& Runtime::config() const { return impl_->env->config; }

RecoveryStatus Runtime::recovery() const {
  auto& env = *impl_->env;
  return {env.to_adopt.load(), env.adopted.load(), env.adopt_failed.load()};
}

}  // namespace pandastack::actors
