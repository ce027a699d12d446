// The sandbox's state snapshot codec (SandboxState as JSON, versioned by state_format()): what
// the event store keeps every RuntimeConfig::snapshot_every events so that recovery replays only
// the events after it. Declared in actors/event_codec.h; every field added later is optional.
#include <optional>
#include <string>

#include "actors/event_codec.h"
#include "wire/json.h"

namespace pandastack::actors {

uint32_t state_format() { return 1; }

std::string encode_state(const SandboxState& s) {
  using wire::Json;
  auto strings = [](const std::vector<std::string>& v) {
    Json a = Json::array();
    for (auto& x : v) a.push(x);
    return a;
  };
  auto map = string_map_json;
  Json j = Json::object();
  j.set("id", s.id);
  j.set("status", int(s.status));
  j.set("version", s.version);
  j.set("tenant", s.tenant);
  j.set("template", s.template_name);
  j.set("parent", s.parent);
  j.set("from_snapshot", s.from_snapshot);
  j.set("vcpus", s.vcpus);
  j.set("memory_mib", s.memory_mib);
  j.set("ttl_seconds", s.ttl_seconds);
  j.set("metadata", map(s.metadata));
  j.set("created_at_ms", s.created_at_ms);
  j.set("expires_at_ms", s.expires_at_ms);
  j.set("persistent", s.persistent);
  j.set("auto_wake", s.auto_wake);
  j.set("idle_timeout_seconds", s.idle_timeout_seconds);
  j.set("on_timeout", s.on_timeout == ReapAction::kill ? "kill" : "hibernate");
  j.set("pending_snapshot", s.pending_snapshot);
  j.set("pending_snapshot_name", s.pending_snapshot_name);
  j.set("timeout_disk_only", s.timeout_disk_only);
  j.set("pending_disk_only", s.pending_disk_only);
  j.set("hibernated_disk_only", s.hibernated_disk_only);
  j.set("hibernation_durable", s.hibernation_durable);
  j.set("hibernation_manifest", s.hibernation_manifest);
  j.set("hibernation_persisted_at", int64_t(s.hibernation_persisted_at));
  j.set("snapshot_names", map(s.snapshot_names));
  j.set("snapshot_manifests", map(s.snapshot_manifests));
  j.set("hibernation_snapshot", s.hibernation_snapshot);
  j.set("snapshots", strings(s.snapshots));
  j.set("durable_snapshots",
        strings(std::vector<std::string>(s.durable_snapshots.begin(), s.durable_snapshots.end())));
  j.set("running_execs", map(s.running_execs));
  Json started = Json::object();
  for (auto& [id, ms] : s.exec_started_ms) started.set(id, ms);
  j.set("exec_started_ms", started);
  j.set("execs_finished", s.execs_finished);
  j.set("failure_reason", s.failure_reason);
  j.set("network", s.network);
  j.set("egress", egress_json(s.egress));
  if (s.subnet) j.set("subnet", *s.subnet);
  Json ports = Json::array();
  for (auto p : s.ports) ports.push(p);
  j.set("ports", ports);
  if (!s.previews.empty()) {
    Json previews = Json::array();
    for (auto& [port, p] : s.previews) {
      Json o = Json::object();
      o.set("port", p.port);
      o.set("public", p.is_public);
      o.set("created_at_ms", p.created_at_ms);
      o.set("expires_at_ms", p.expires_at_ms);
      o.set("nonce", p.nonce);
      previews.push(o);
    }
    j.set("previews", previews);
  }
  j.set("volumes", volumes_json(s.volumes));
  if (!s.moved_to.empty()) j.set("moved_to", s.moved_to);
  return j.dump();
}

std::optional<SandboxState> decode_state(const std::string& bytes) {
  auto j = wire::Json::parse(bytes);
  if (!j || !j->is_object()) return std::nullopt;
  const auto& o = *j;
  for (const char* k : {"id", "tenant", "template", "parent", "from_snapshot", "pending_snapshot",
                        "hibernation_snapshot", "failure_reason"})
    if (!o[k].is_string()) return std::nullopt;
  for (const char* k : {"status", "version", "vcpus", "memory_mib", "ttl_seconds", "created_at_ms",
                        "expires_at_ms", "execs_finished"})
    if (!o[k].is_integer()) return std::nullopt;
  for (const char* k : {"metadata", "running_execs"})
    if (!o[k].is_object()) return std::nullopt;
  if (!o["snapshots"].is_array() || !o["persistent"].is_bool() || !o["auto_wake"].is_bool())
    return std::nullopt;
  int status = int(o["status"].as_int());
  if (status < int(SandboxStatus::none) || status > int(SandboxStatus::failed)) return std::nullopt;
  SandboxState s;
  s.id = o["id"].as_string();
  s.status = SandboxStatus(status);
  s.version = uint64_t(o["version"].as_int());
  s.tenant = o["tenant"].as_string();
  s.template_name = o["template"].as_string();
  s.parent = o["parent"].as_string();
  s.from_snapshot = o["from_snapshot"].as_string();
  s.vcpus = uint32_t(o["vcpus"].as_int());
  s.memory_mib = uint32_t(o["memory_mib"].as_int());
  s.ttl_seconds = uint32_t(o["ttl_seconds"].as_int());
  for (auto& [k, v] : o["metadata"].as_object()) {
    if (!v.is_string()) return std::nullopt;
    s.metadata[k] = v.as_string();
  }
  s.created_at_ms = o["created_at_ms"].as_int();
  s.expires_at_ms = o["expires_at_ms"].as_int();
  s.persistent = o["persistent"].as_bool();
  s.auto_wake = o["auto_wake"].as_bool();
  s.pending_snapshot = o["pending_snapshot"].as_string();
  s.hibernation_snapshot = o["hibernation_snapshot"].as_string();
  for (auto& v : o["snapshots"].as_array()) {
    if (!v.is_string()) return std::nullopt;
    s.snapshots.push_back(v.as_string());
  }
  // Snapshot names (absent in state snapshots written before snapshots had names).
  for (auto [k, v] : {std::pair{"timeout_disk_only", &s.timeout_disk_only},
                      std::pair{"pending_disk_only", &s.pending_disk_only},
                      std::pair{"hibernated_disk_only", &s.hibernated_disk_only},
                      std::pair{"hibernation_durable", &s.hibernation_durable}})
    if (o[k].is_bool()) *v = o[k].as_bool();
  if (o["hibernation_manifest"].is_string())  // (absent before the object store)
    s.hibernation_manifest = o["hibernation_manifest"].as_string();
  if (o["hibernation_persisted_at"].is_integer())
    s.hibernation_persisted_at = uint64_t(o["hibernation_persisted_at"].as_int());
  if (o["pending_snapshot_name"].is_string())
    s.pending_snapshot_name = o["pending_snapshot_name"].as_string();
  if (o["durable_snapshots"].is_array())  // (absent before snapshots were persisted)
    for (auto& v : o["durable_snapshots"].as_array()) {
      if (!v.is_string()) return std::nullopt;
      s.durable_snapshots.insert(v.as_string());
    }
  if (o["snapshot_names"].is_object())
    for (auto& [k, v] : o["snapshot_names"].as_object()) {
      if (!v.is_string()) return std::nullopt;
      s.snapshot_names[k] = v.as_string();
    }
  if (o["snapshot_manifests"].is_object())  // (absent before snapshots went to the store)
    for (auto& [k, v] : o["snapshot_manifests"].as_object()) {
      if (!v.is_string()) return std::nullopt;
      s.snapshot_manifests[k] = v.as_string();
    }
  for (auto& [k, v] : o["running_execs"].as_object()) {
    if (!v.is_string()) return std::nullopt;
    s.running_execs[k] = v.as_string();
  }
  s.execs_finished = uint64_t(o["execs_finished"].as_int());
  s.failure_reason = o["failure_reason"].as_string();
  // Network fields (absent in snapshots written before sandboxes had networks).
  if (o["network"].is_bool()) s.network = o["network"].as_bool();
  if (auto e = egress_from_json(o["egress"])) s.egress = *e;
  if (o["subnet"].is_integer()) s.subnet = uint32_t(o["subnet"].as_int());
  if (o["exec_started_ms"].is_object())
    for (auto& [k, v] : o["exec_started_ms"].as_object())
      if (v.is_integer()) s.exec_started_ms[k] = v.as_int();
  // Timeouts (absent in snapshots written before idle timeouts existed).
  if (o["idle_timeout_seconds"].is_integer())
    s.idle_timeout_seconds = uint32_t(o["idle_timeout_seconds"].as_int());
  s.on_timeout = s.persistent ? ReapAction::hibernate : ReapAction::kill;
  if (o["on_timeout"].is_string())
    s.on_timeout = o["on_timeout"].as_string() == "kill" ? ReapAction::kill : ReapAction::hibernate;
  if (o["ports"].is_array())
    for (auto& p : o["ports"].as_array())
      if (p.is_integer()) s.ports.insert(uint32_t(p.as_int()));
  if (o["previews"].is_array())
    for (auto& p : o["previews"].as_array()) {
      if (!p.is_object() || !p["port"].is_integer() || !p["public"].is_bool() ||
          !p["created_at_ms"].is_integer() || !p["expires_at_ms"].is_integer() ||
          !p["nonce"].is_string())
        return std::nullopt;
      Preview v{uint32_t(p["port"].as_int()), p["public"].as_bool(), p["created_at_ms"].as_int(),
                p["expires_at_ms"].as_int(), p["nonce"].as_string()};
      s.previews[v.port] = v;
    }
  if (o["volumes"].is_array())
    for (auto& v : o["volumes"].as_array()) {
      if (!v.is_object() || !v["volume"].is_string() || !v["mount"].is_string() ||
          !v["read_only"].is_bool() || !v["slot"].is_integer())
        return std::nullopt;
      s.volumes.push_back({v["volume"].as_string(), v["mount"].as_string(),
                           v["read_only"].as_bool(), uint32_t(v["slot"].as_int())});
    }
  if (o["moved_to"].is_string()) s.moved_to = o["moved_to"].as_string();
  return s;
}

}  // namespace pandastack::actors
