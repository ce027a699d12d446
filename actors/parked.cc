#include "actors/parked.h"

#include <algorithm>

#include "actors/env.h"
#include "actors/event_codec.h"

namespace pandastack::actors {

using wire::Json;

std::optional<std::string> unparkable(const SandboxInfo& s) {
  if (s.status != SandboxStatus::hibernated) return "it is not hibernated";
  if (!s.hibernation_remote) return "its hibernation is not in the object store";
  if (s.hibernated_disk_only) return "it is hibernated with its disk only";
  if (!s.volumes.empty()) return "it has volumes (their data is not in the object store)";
  return std::nullopt;
}

Json parked_settings(const SandboxInfo& s) {
  Json j = Json::object();
  j.set("template", s.template_name);
  if (s.ttl_seconds != kNoExpiry) j.set("expires_at_ms", s.expires_at_ms);
  j.set("metadata", string_map_json(s.metadata));
  j.set("persistent", s.persistent);
  j.set("auto_wake", s.auto_wake);
  j.set("idle_timeout_seconds", int64_t(s.idle_timeout_seconds));
  j.set("on_timeout", s.on_timeout == ReapAction::hibernate ? "hibernate" : "kill");
  j.set("timeout_disk_only", s.timeout_disk_only);
  j.set("network", s.network);
  if (s.network) j.set("egress", egress_json(s.egress));
  Json ports = Json::array();
  for (auto p : s.ports) ports.push(int64_t(p));
  j.set("ports", ports);
  return j;
}

void settings_from_json(const Json& j, CreateRequest& c) {
  if (j["template"].is_string()) c.template_name = j["template"].as_string();
  if (j["metadata"].is_object())
    for (auto& [k, v] : j["metadata"].as_object())
      if (v.is_string()) c.metadata[k] = v.as_string();
  c.persistent = j["persistent"].is_bool() && j["persistent"].as_bool();
  c.auto_wake = j["auto_wake"].is_bool() && j["auto_wake"].as_bool();
  if (j["idle_timeout_seconds"].is_integer())
    c.idle_timeout_seconds =
        uint32_t(std::clamp<int64_t>(j["idle_timeout_seconds"].as_int(), 0, UINT32_MAX));
  if (j["on_timeout"].is_string())
    c.on_timeout =
        j["on_timeout"].as_string() == "hibernate" ? ReapAction::hibernate : ReapAction::kill;
  c.network = j["network"].is_bool() && j["network"].as_bool();
}

CreateRequest parked_create(const std::string& tenant, const Json& j, int64_t now_ms,
                            std::vector<uint32_t>& ports) {
  CreateRequest c;
  c.tenant = tenant;
  settings_from_json(j, c);
  if (j["expires_at_ms"].is_integer()) {
    int64_t left = j["expires_at_ms"].as_int() - now_ms;
    c.ttl_seconds = uint32_t(std::clamp<int64_t>((left + 999) / 1000, 1, kNoExpiry - 1));
  }
  c.timeout_disk_only = j["timeout_disk_only"].is_bool() && j["timeout_disk_only"].as_bool();
  // (a policy that does not read is deny_all: never the host's default, which may be wider)
  if (*c.network) c.egress = egress_from_json(j["egress"]).value_or(Egress{});
  ports.clear();
  if (j["ports"].is_array())
    for (auto& p : j["ports"].as_array())
      if (p.is_integer() && p.as_int() > 0 && p.as_int() < 65536 && ports.size() < 64)
        ports.push_back(uint32_t(p.as_int()));
  return c;
}

std::filesystem::path fetched_dir(const Env& env) { return env.config.disk_dir / "fetched"; }

}  // namespace pandastack::actors
