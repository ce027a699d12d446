#include "gateway/rpc_convert.h"

#include "gateway/http_util.h"
#include "gateway/rest.h"

namespace pandastack::gateway::rpc {

[[noreturn]] void fail(const actors::Rejection& r) {
  kj::throwFatalException(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                                        kj::str(to_string(r.code), ": ", r.message.c_str())));
}

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

void fill_volume(api::VolumeInfo::Builder b, const actors::VolumeInfo& v) {
  b.setId(v.id);
  b.setName(v.name);
  b.setStatus(v.status);
  b.setSizeMib(v.size_mib);
  auto at = b.initAttachedTo(v.attachments.size());
  for (size_t i = 0; i < v.attachments.size(); ++i) at.set(i, v.attachments[i].sandbox);
}

void fill_backup(api::DatabaseBackup::Builder b, const actors::DatabaseBackup& k) {
  b.setId(k.id);
  b.setBytes(k.bytes);
  b.setCreatedAtMs(k.created_at_ms);
}

void fill_database(api::DatabaseInfo::Builder b, const actors::DatabaseInfo& d) {
  b.setId(d.id);
  b.setName(d.name);
  b.setStatus(d.status);
  b.setFailureReason(d.failure_reason);
  auto m = b.initMetadata(d.metadata.size());
  size_t n = 0;
  for (auto& [k, v] : d.metadata) {
    m[n].setKey(k);
    m[n++].setValue(v);
  }
  b.setHost(d.host);
  b.setPort(d.port);
  b.setUser(d.user);
  b.setDatabase(d.database);
  b.setConnectionUri(d.connection_uri());
  b.setPassword(d.password);
  b.setCreatedAtMs(d.created_at_ms);
  auto bk = b.initBackups(d.backups.size());
  for (size_t i = 0; i < d.backups.size(); ++i) fill_backup(bk[i], d.backups[i]);
  b.setRestoredFrom(d.restored_from);
  b.setSandbox(d.sandbox);
  b.setVolume(d.volume);
}

void fill_info(api::SandboxInfo::Builder b, const actors::SandboxInfo& i) {
  b.setId(i.id);
  b.setTemplate(actors::template_display_name(i.template_name));
  b.setState(actors::to_string(i.status));
  b.setCreatedAtMs(i.created_at_ms);
  b.setExpiresAtMs(i.expires_at_ms);
  b.setPersistent(i.persistent);
  auto m = b.initMetadata(i.metadata.size());
  size_t n = 0;
  for (auto& [k, v] : i.metadata) {
    m[n].setKey(k);
    m[n++].setValue(v);
  }
  b.setParent(i.parent);
  auto s = b.initSnapshots(i.snapshots.size());
  for (size_t j = 0; j < i.snapshots.size(); ++j) s.set(j, i.snapshots[j]);
  b.setFailureReason(i.failure_reason);
  b.setMemoryMib(i.memory_mib);
  b.setVcpus(i.vcpus);
  if (i.status == actors::SandboxStatus::hibernated)
    b.setDurable(i.hibernation_remote ? "remote" : i.hibernation_durable ? "local" : "none");
}

namespace {
// Fills a Text list made by `init(n)` with `v`.
template <typename Init>
void set_texts(Init&& init, const std::vector<std::string>& v) {
  auto list = init(unsigned(v.size()));
  for (size_t i = 0; i < v.size(); ++i) list.set(unsigned(i), v[i]);
}
}  // namespace

void fill_secret(api::SecretInfo::Builder b, const storage::SecretInfo& s) {
  b.setName(s.name);
  set_texts([&](unsigned n) { return b.initHosts(n); }, s.hosts);
  b.setVersion(s.version);
  b.setCreatedAtMs(s.created_ms);
  b.setUpdatedAtMs(s.updated_ms);
  b.setExpiresAtMs(s.expires_ms);
  set_texts([&](unsigned n) { return b.initInjectInto(n); }, s.use.places());
  b.setAllowPlainHttp(s.use.allow_plain_http);
}

void fill_egress(api::EgressEntry::Builder b, const vmm::EgressEntry& e) {
  b.setSeq(e.seq);
  b.setTimestampMs(e.time_ms);
  b.setKind(vmm::to_string(e.kind));
  b.setVerdict(e.allowed ? "allowed" : "denied");
  if (!e.allowed) b.setReason(e.reason);
  b.setName(e.name);
  if (e.kind == vmm::EgressEntry::Kind::dns) {
    b.setType(e.qtype);
    set_texts([&](unsigned n) { return b.initAnswers(n); }, e.answers);
    return;
  }
  b.setProtocol(e.protocol);
  b.setDestination(e.destination);
  b.setPort(e.port);
  if (e.kind == vmm::EgressEntry::Kind::secret) {
    b.setMethod(e.method);
    set_texts([&](unsigned n) { return b.initInjected(n); }, e.injected);
    set_texts([&](unsigned n) { return b.initRefused(n); }, e.refused);
    return;
  }
  if (e.allowed) {
    b.setBytesOut(e.bytes_out);
    b.setBytesIn(e.bytes_in);
    b.setEndedMs(e.ended_ms);
  }
}

vmm::EgressQuery to_egress_query(uint64_t after, uint32_t limit, const std::string& kind,
                                 const std::string& verdict) {
  vmm::EgressQuery q;
  q.after = after;
  if (limit > 1000) fail({Code::invalid_argument, "limit must be within 1..1000"});
  q.limit = limit ? limit : 100;
  if (!kind.empty()) {
    q.kind = vmm::egress_kind_from_string(kind);
    if (!q.kind) fail({Code::invalid_argument, "kind must be dns, connection or secret"});
  }
  if (verdict == "allowed" || verdict == "denied")
    q.allowed = verdict == "allowed";
  else if (!verdict.empty())
    fail({Code::invalid_argument, "verdict must be allowed or denied"});
  return q;
}

void fill_result(api::ExecResult::Builder b, const vmm::ExecResult& r) {
  b.setExitCode(r.exit_code);
  b.setTimedOut(r.timed_out);
  b.setStdout(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(r.stdout_data.data()),
                                  r.stdout_data.size()));
  b.setStderr(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(r.stderr_data.data()),
                                  r.stderr_data.size()));
  b.setStdoutTruncated(r.stdout_truncated);
  b.setStderrTruncated(r.stderr_truncated);
  b.setDurationMs(double(r.duration_us) / 1000.0);
}

vmm::ExecRequest to_exec(api::ExecRequest::Reader r, const Limits& limits) {
  vmm::ExecRequest e;
  for (auto a : r.getArgv()) e.argv.push_back(text(a));
  e.shell = text(r.getCmd());
  for (auto v : r.getEnv()) e.env[text(v.getKey())] = text(v.getValue());
  e.cwd = text(r.getCwd());
  e.user = text(r.getUser());
  auto in = r.getStdin();
  e.stdin_data.assign(reinterpret_cast<const char*>(in.begin()), in.size());
  if (auto refused = check_exec(e, limits)) fail(*refused);
  uint32_t t = r.getTimeoutSeconds();
  if (t > limits.max_exec_timeout_s)
    fail({Code::invalid_argument,
          "timeoutSeconds is at most " + std::to_string(limits.max_exec_timeout_s)});
  e.timeout_ms = (t == 0 ? limits.default_exec_timeout_s : t) * 1000;
  return e;
}

std::string checked_path(capnp::Text::Reader p, const Limits& limits) {
  auto s = text(p);
  if (auto err = check_guest_path(s, limits.max_path_bytes)) fail({Code::invalid_path, *err});
  return s;
}

}  // namespace pandastack::gateway::rpc
