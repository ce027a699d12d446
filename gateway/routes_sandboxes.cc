// Sandboxes: create, list, get, change (TTL, metadata, egress), kill; their lifecycle (fork,
// hibernate, wake), exposed ports and event stream.
#include <spdlog/spdlog.h>

#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using K = Route::Kind;

// "volumes": [{"volume": "vol_...", "mount": "/data", "read_only": false}, ...] (at most 4).
std::vector<actors::CreateRequest::Volume> volumes_from(const Json& j) {
  std::vector<actors::CreateRequest::Volume> out;
  if (j.is_null()) return out;
  if (!j.is_array()) throw ApiError{Code::invalid_argument, "volumes is a list of objects"};
  if (j.as_array().size() > actors::kVolumeSlots)
    throw ApiError{Code::invalid_argument,
                   "at most " + std::to_string(actors::kVolumeSlots) + " volumes per sandbox"};
  for (auto& v : j.as_array()) {
    if (!v.is_object()) throw ApiError{Code::invalid_argument, "volumes is a list of objects"};
    Fields f(v, {"volume", "mount", "read_only"});
    if (!f.has("volume") || !f.has("mount"))
      throw ApiError{Code::invalid_argument, "each volume needs \"volume\" and \"mount\""};
    out.push_back({f.str("volume"), f.str("mount"), f.boolean("read_only")});
  }
  return out;
}

Json metric_json(const actors::MetricSample& m) {
  Json j = Json::object();
  j.set("timestamp_ms", m.at_ms);
  j.set("cpu_used_pct", m.cpu_used_pct);
  j.set("cpu_count", m.cpu_count);
  j.set("mem_used_bytes", m.mem_used_bytes);
  j.set("mem_total_bytes", m.mem_total_bytes);
  j.set("disk_used_bytes", m.disk_used_bytes);
  j.set("disk_total_bytes", m.disk_total_bytes);
  return j;
}

Json text_list(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (auto& x : v) a.push(Json(x));
  return a;
}

Json egress_entry_json(const vmm::EgressEntry& e) {
  Json j = Json::object();
  j.set("seq", int64_t(e.seq));
  j.set("timestamp_ms", e.time_ms);
  j.set("kind", vmm::to_string(e.kind));
  j.set("verdict", e.allowed ? "allowed" : "denied");
  if (!e.allowed) j.set("reason", e.reason);
  if (e.kind == vmm::EgressEntry::Kind::dns) {
    j.set("name", e.name);
    j.set("type", e.qtype);
    j.set("answers", text_list(e.answers));
    return j;
  }
  j.set("protocol", e.protocol);
  j.set("destination", e.destination);
  if (e.port) j.set("port", int64_t(e.port));
  if (!e.name.empty()) j.set("name", e.name);
  if (e.kind == vmm::EgressEntry::Kind::secret) {
    j.set("method", e.method);
    j.set("injected", text_list(e.injected));
    j.set("refused", text_list(e.refused));
    return j;
  }
  if (e.allowed) {
    j.set("bytes_out", int64_t(e.bytes_out));
    j.set("bytes_in", int64_t(e.bytes_in));
    j.set("ended_ms", e.ended_ms ? Json(e.ended_ms) : Json());
  }
  return j;
}

HttpReply egress_log(Call& c) {
  vmm::EgressQuery q;
  q.after = uint64_t(query_int(c.r, "after", 0, INT64_MAX));
  q.limit = size_t(query_int(c.r, "limit", 100, 1000));
  if (q.limit == 0) throw ApiError{Code::invalid_argument, "limit must be within 1..1000"};
  if (auto k = c.r.q("kind")) {
    q.kind = vmm::egress_kind_from_string(std::string(*k));
    if (!q.kind) throw ApiError{Code::invalid_argument, "kind must be dns, connection or secret"};
  }
  if (auto v = c.r.q("verdict")) {
    if (*v != "allowed" && *v != "denied")
      throw ApiError{Code::invalid_argument, "verdict must be allowed or denied"};
    q.allowed = *v == "allowed";
  }
  auto page = unwrap(c.gw.rt.egress(c.tenant(), c.id, q));
  Json entries = Json::array();
  for (auto& e : page.entries) entries.push(egress_entry_json(e));
  Json j = Json::object();
  j.set("entries", entries);
  j.set("next_after", int64_t(page.next_after));
  j.set("dropped", int64_t(page.dropped));
  j.set("lost", int64_t(page.lost));
  return json_reply(200, j);
}

HttpReply create(Call& c) {
  auto& rt = c.gw.rt;
  const auto& limits = rt.config().limits;
  Fields f(c.r.json(),
           {"template", "ttl_seconds", "metadata", "persistent", "auto_wake", "from_snapshot",
            "network", "egress", "idle_timeout_seconds", "on_timeout", "volumes", "placement",
            "memory_mib", "vcpus", "hibernate_memory", "secrets"});
  actors::CreateRequest req;
  req.tenant = c.tenant();
  // Secrets reach a sandbox through its egress proxy, which puts their values into requests to
  // their hosts; the guest's processes get a placeholder each (actors/egress_proxies.h).
  if (f.has("secrets")) {
    req.secrets = f.string_list("secrets");
    if (req.secrets.empty())
      throw ApiError{Code::invalid_argument, "secrets: a list of 1 or more secret names"};
  }
  if (f.has("template") && f.has("from_snapshot"))
    throw ApiError{Code::invalid_argument,
                   "give a template or from_snapshot, not both (a snapshot has its template)"};
  req.template_name = f.str("template", "base");
  req.ttl_seconds = uint32_t(f.integer("ttl_seconds", 0, 1, limits.max_ttl_seconds));
  req.metadata = f.string_map("metadata");
  req.persistent = f.boolean("persistent");
  req.auto_wake = f.boolean("auto_wake");
  req.idle_timeout_seconds =
      uint32_t(f.integer("idle_timeout_seconds", 0, 1, limits.max_ttl_seconds));
  if (f.has("on_timeout")) {
    auto a = f.str("on_timeout");
    if (a != "kill" && a != "hibernate")
      throw ApiError{Code::invalid_argument, "on_timeout must be \"kill\" or \"hibernate\""};
    req.on_timeout = a == "kill" ? actors::ReapAction::kill : actors::ReapAction::hibernate;
  }
  // false: a hibernation at its timeout keeps only the disk (as POST .../hibernate {memory: false})
  if (f.has("hibernate_memory")) req.timeout_disk_only = !f.boolean("hibernate_memory");
  req.from_snapshot = f.str("from_snapshot");
  // (cluster mode: the receiving host placed the create by it, cluster_routes.cc)
  if (f.has("placement")) Fields(f.object("placement"), {"host"}).str("host");
  if (f.has("network")) req.network = f.boolean("network");
  if (f.has("egress")) req.egress = egress_from(f.object("egress"));
  req.volumes = volumes_from(c.r.json()["volumes"]);
  // At most its template's shape (exceeds_template): a sandbox has the shape it was baked with.
  req.memory_mib = uint32_t(f.integer("memory_mib", 0, 1, 1 << 20));
  req.vcpus = uint32_t(f.integer("vcpus", 0, 1, 1024));
  auto t0 = Clock::now();
  auto created = rt.create(req);
  if (!created && created.error().code == Code::sandbox_failed)
    throw ApiError{Code::start_failed, created.error().message};
  auto s = unwrap(std::move(created));
  {
    std::lock_guard l(c.gw.metrics_mu);
    ++c.gw.creates;
    c.gw.create_latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return json_reply(201, sandbox_json(s));
}

HttpReply list(Call& c) {
  std::optional<actors::SandboxStatus> status;
  std::map<std::string, std::string> metadata;
  bool all_tenants = query_flag(c.r, "all");
  if (all_tenants && !c.key.admin) throw ApiError{Code::forbidden, "all=1 needs an admin key"};
  for (auto& [k, v] : c.r.query) {
    if (k == "state") {
      status = actors::status_from_string(v);
      if (!status) throw ApiError{Code::invalid_argument, "unknown state '" + v + "'"};
    } else if (k.rfind("metadata.", 0) == 0) {
      metadata[k.substr(9)] = v;
    }
  }
  return list_reply("sandboxes",
                    unwrap(c.gw.rt.list(all_tenants ? "*" : c.tenant(), status, metadata)),
                    sandbox_json);
}

// PATCH: every part is checked before any is applied, so a refused part changes nothing.
HttpReply change(Call& c) {
  auto& rt = c.gw.rt;
  const auto& limits = rt.config().limits;
  Fields f(c.r.json(), {"ttl_seconds", "metadata", "egress"});
  if (!f.has("ttl_seconds") && !f.has("metadata") && !f.has("egress"))
    throw ApiError{Code::invalid_argument, "give ttl_seconds, metadata and/or egress"};
  std::optional<uint32_t> ttl;
  if (f.has("ttl_seconds")) ttl = uint32_t(f.integer("ttl_seconds", 0, 1, limits.max_ttl_seconds));
  std::optional<std::map<std::string, std::string>> metadata;
  if (f.has("metadata")) {
    metadata = f.string_map("metadata");
    if (auto bad = actors::check_metadata(*metadata, limits))
      throw ApiError{bad->code, bad->message};
  }
  std::optional<actors::Egress> egress;
  if (f.has("egress")) {
    egress = egress_from(f.object("egress"));
    unwrap(rt.check_egress(c.tenant(), c.id, *egress));
  }
  actors::SandboxInfo s;
  if (egress) s = unwrap(rt.set_egress(c.tenant(), c.id, *egress));
  if (metadata) s = unwrap(rt.set_metadata(c.tenant(), c.id, *metadata));
  if (ttl) s = unwrap(rt.set_ttl(c.tenant(), c.id, *ttl));
  return json_reply(200, sandbox_json(s));
}

Json port_json(const actors::PortInfo& p) {
  Json j = Json::object();
  j.set("port", p.port);
  j.set("host", p.host);
  if (p.host_port) {
    j.set("host_port", p.host_port);
    j.set("address", p.host + ":" + std::to_string(p.host_port));
  } else {
    j.set("host_port", Json());  // recorded; forwarded again when the sandbox runs
  }
  return j;
}

}  // namespace

std::vector<Route> sandbox_routes() {
  return {
      route(M::POST, "/v1/sandboxes", "Create a sandbox", create),
      route(M::GET, "/v1/sandboxes", "List sandboxes (?state=, ?metadata.KEY=VALUE, admin ?all=1)",
            list, {"state", "metadata.*", "all"}),
      route(M::GET, "/v1/sandboxes/{id}", "Get a sandbox",
            [](Call& c) {
              return json_reply(200, sandbox_json(unwrap(c.gw.rt.get(c.tenant(), c.id))));
            }),
      route(M::PATCH, "/v1/sandboxes/{id}", "Change ttl_seconds, metadata or the egress policy",
            change),
      route(M::DELETE, "/v1/sandboxes/{id}", "Kill a sandbox",
            [](Call& c) {
              return json_reply(200, sandbox_json(unwrap(c.gw.rt.kill(c.tenant(), c.id))));
            }),
      route(M::POST, "/v1/sandboxes/{id}/fork",
            "Fork a running sandbox into count children (default 1), on hosts (cluster mode)",
            [](Call& c) {
              Fields f(c.r.json(), {"count", "hosts", "inherit_secrets"});
              const auto& limits = c.gw.rt.config().limits;
              auto count = uint32_t(f.integer("count", 1, 1, limits.max_fork_children));
              bool inherit = f.boolean("inherit_secrets");
              if (f.has("hosts")) {
                if (inherit)
                  throw ApiError{Code::not_implemented,
                                 "inherit_secrets on other hosts: secrets are kept by the host "
                                 "that stores them (fork on this host)"};
                return fork_across_hosts(c, count, f.string_list("hosts"));
              }
              auto children = c.gw.rt.fork(c.tenant(), c.id, count, inherit);
              // In a cluster, a host short of memory places the children on another host.
              if (!children && children.error().code == Code::host_full && c.gw.rt.cluster() &&
                  !inherit)
                return fork_elsewhere(c, count, children.error());
              auto reply = list_reply("sandboxes", unwrap(std::move(children)), sandbox_json);
              reply.status = 201;
              return reply;
            }),
      route(M::POST, "/v1/sandboxes/{id}/hibernate",
            "Hibernate a sandbox (memory: false keeps only its disk; a wake boots on it)",
            [](Call& c) {
              Fields f(c.r.json(), {"memory"});
              bool memory = !f.has("memory") || f.boolean("memory");
              return json_reply(200,
                                sandbox_json(unwrap(c.gw.rt.hibernate(c.tenant(), c.id, memory))));
            }),
      route(M::POST, "/v1/sandboxes/{id}/wake", "Wake a hibernated sandbox",
            [](Call& c) {
              Fields f(c.r.json(), {});
              // (cluster mode: a sandbox whose host is down may be woken here from the store; a
              // record of it here is of a copy that moved away)
              if (c.r.owner_down) return wake_elsewhere(c);
              return json_reply(200, sandbox_json(unwrap(c.gw.rt.wake(c.tenant(), c.id))));
            }),
      route(
          M::GET, "/v1/sandboxes/{id}/events",
          "The sandbox's audit events (?follow=1: server-sent events until it ends)",
          [](Call& c) {
            query_flag(c.r, "follow");  // (followed streams are served elsewhere; 400 if bad)
            actors::AuditQuery q;
            q.tenant = c.tenant();
            q.stream = c.id;
            q.limit = 100000;
            return list_reply("events", unwrap(c.gw.rt.audit(q)), audit_json);
          },
          {"follow"}, K::stream),
      route(M::GET, "/v1/sandboxes/{id}/metrics",
            "The sandbox's CPU, memory and disk use over time (from_ms, to_ms)",
            [](Call& c) {
              auto from = int64_t(query_int(c.r, "from_ms", 0, INT64_MAX));
              auto to = c.r.q("to_ms") ? int64_t(query_int(c.r, "to_ms", 0, INT64_MAX)) : INT64_MAX;
              return list_reply("metrics", unwrap(c.gw.rt.metrics(c.tenant(), c.id, from, to)),
                                metric_json);
            },
            {"from_ms", "to_ms"}),
      route(M::GET, "/v1/sandboxes/{id}/egress",
            "What the sandbox's network answered, let out and refused (after, limit, kind, "
            "verdict)",
            egress_log, {"after", "limit", "kind", "verdict"}),
      route(M::POST, "/v1/sandboxes/{id}/ports", "Expose a guest TCP port on a host address",
            [](Call& c) {
              Fields f(c.r.json(), {"port"});
              if (!f.has("port")) throw ApiError{Code::invalid_argument, "port is required"};
              auto port = uint32_t(f.integer("port", 0, 1, 65535));
              for (auto& p : unwrap(c.gw.rt.expose_port(c.tenant(), c.id, port)))
                if (p.port == port) return json_reply(201, port_json(p));
              throw ApiError{Code::internal, "the exposed port is not listed"};
            }),
      route(M::GET, "/v1/sandboxes/{id}/ports", "Exposed guest ports and their host addresses",
            [](Call& c) {
              return list_reply("ports", unwrap(c.gw.rt.ports(c.tenant(), c.id)), port_json);
            }),
      route(M::DELETE, "/v1/sandboxes/{id}/ports/{port}", "Stop exposing a guest port",
            [](Call& c) {
              unwrap(c.gw.rt.unexpose_port(c.tenant(), c.id,
                                           parse_number(c.r.param("port"), "port", 1, 65535)));
              return no_content();
            }),
  };
}

}  // namespace pandastack::gateway
