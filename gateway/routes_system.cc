// System routes: liveness, metrics, the OpenAPI document (no key needed), and templates; and
// what the metrics and OpenAPI routes serve (Server::metrics, Server::openapi).
#include "actors/cluster.h"
#include "gateway/server.h"

namespace pandastack::gateway {

std::vector<Route> system_routes() {
  using M = kj::HttpMethod;
  using K = Route::Kind;
  std::vector<Route> routes = {
      route(
          M::GET, "/healthz",
          "Liveness: \"ok\", or \"recovering\" (with counts) while VMs that outlived a restart "
          "are being adopted",
          [](Call& c) {
            auto r = c.gw.rt.recovery();
            Json j = Json::object();
            j.set("status", r.done() ? "ok" : "recovering");
            if (r.to_adopt > 0) {
              Json a = Json::object();
              a.set("to_adopt", r.to_adopt);
              a.set("adopted", r.adopted);
              a.set("failed", r.failed);
              j.set("recovery", a);
            }
            return json_reply(200, j);
          },
          {}, K::json, false),
      route(
          M::GET, "/metrics", "Prometheus metrics",
          [](Call& c) {
            return HttpReply{200, "text/plain; version=0.0.4", c.gw.metrics(), std::nullopt, {}};
          },
          {}, K::json, false),
      route(
          M::GET, "/openapi.json", "This document",
          [](Call& c) {
            return HttpReply{200, "application/json", c.gw.openapi(), std::nullopt, {}};
          },
          {}, K::json, false),
  };
  routes[0].on_loop = true;  // /healthz: reads counters only
  return routes;
}

std::string Server::metrics() {
  std::string out;
  if (auto* cluster = rt.cluster())
    out +=
        "# HELP pandastack_cluster_host The host these metrics are of (cluster mode).\n"
        "# TYPE pandastack_cluster_host gauge\npandastack_cluster_host{host=\"" +
        cluster->config().host_id + "\"} 1\n";
  auto counts = rt.counts();
  out +=
      "# HELP pandastack_sandboxes Live sandboxes by state.\n# TYPE pandastack_sandboxes gauge\n";
  for (auto st : {actors::SandboxStatus::creating, actors::SandboxStatus::running,
                  actors::SandboxStatus::snapshotting, actors::SandboxStatus::forking,
                  actors::SandboxStatus::hibernating, actors::SandboxStatus::hibernated,
                  actors::SandboxStatus::waking, actors::SandboxStatus::stopped,
                  actors::SandboxStatus::failed}) {
    auto it = counts.by_status.find(actors::to_string(st));
    out += std::string("pandastack_sandboxes{state=\"") + actors::to_string(st) + "\"} " +
           std::to_string(it == counts.by_status.end() ? 0 : it->second) + "\n";
  }
  out +=
      "# HELP pandastack_vm_exits_total VMs that died on their own (crash, OOM kill, kill -9): "
      "their sandboxes failed with vm_exited.\n# TYPE pandastack_vm_exits_total counter\n";
  out += "pandastack_vm_exits_total " + std::to_string(counts.vm_exits) + "\n";
  std::lock_guard l(metrics_mu);
  out +=
      "# HELP pandastack_creates_total Sandboxes created.\n# TYPE pandastack_creates_total "
      "counter\n";
  out += "pandastack_creates_total " + std::to_string(creates) + "\n";
  out += "# HELP pandastack_execs_total Commands run.\n# TYPE pandastack_execs_total counter\n";
  out += "pandastack_execs_total " + std::to_string(execs) + "\n";
  create_latency.render(out, "pandastack_create_seconds", "Create latency (server side).");
  exec_latency.render(out, "pandastack_exec_seconds", "Command latency (server side).");
  out +=
      "# HELP pandastack_preview_requests_total Requests to preview URLs, by outcome (proxied, "
      "websocket, redirected: a token traded for a cookie, refused, forwarded: to the host that "
      "runs the sandbox).\n"
      "# TYPE pandastack_preview_requests_total counter\n";
  for (auto outcome : {"proxied", "websocket", "redirected", "refused", "forwarded"}) {
    auto it = preview_requests.find(outcome);
    out += std::string("pandastack_preview_requests_total{outcome=\"") + outcome + "\"} " +
           std::to_string(it == preview_requests.end() ? 0 : it->second) + "\n";
  }
  out +=
      "# HELP pandastack_http_responses_total Responses by status.\n"
      "# TYPE pandastack_http_responses_total counter\n";
  for (auto& [s, n] : responses_by_status)
    out += "pandastack_http_responses_total{status=\"" + std::to_string(s) + "\"} " +
           std::to_string(n) + "\n";
  out +=
      "# HELP pandastack_errors_total Error responses by code.\n"
      "# TYPE pandastack_errors_total counter\n";
  for (auto& [c, n] : errors_by_code)
    out += "pandastack_errors_total{code=\"" + c + "\"} " + std::to_string(n) + "\n";
  return out;
}

std::string Server::openapi() const {
  Json doc = Json::object();
  doc.set("openapi", "3.0.3");
  Json info = Json::object();
  info.set("title", "PandaStack API");
  info.set("version", "0.1.0");
  doc.set("info", info);
  Json schemes = Json::object();
  Json bearer = Json::object();
  bearer.set("type", "http");
  bearer.set("scheme", "bearer");
  schemes.set("bearer", bearer);
  Json error_schema = Json::object();
  error_schema.set("type", "object");
  Json codes = Json::array();
  for (auto c : all_codes()) codes.push(to_string(c));
  Json code_prop = Json::object();
  code_prop.set("type", "string");
  code_prop.set("enum", codes);
  Json msg_prop = Json::object();
  msg_prop.set("type", "string");
  Json inner_props = Json::object();
  inner_props.set("code", code_prop);
  inner_props.set("message", msg_prop);
  // quota_exceeded: which quota, its limit, the use and what was asked.
  Json str_prop = Json::object(), int_prop = Json::object();
  str_prop.set("type", "string");
  int_prop.set("type", "integer");
  inner_props.set("quota", str_prop);
  for (auto name : {"limit", "used", "asked"}) inner_props.set(name, int_prop);
  Json inner = Json::object();
  inner.set("type", "object");
  inner.set("properties", inner_props);
  Json outer_props = Json::object();
  outer_props.set("error", inner);
  error_schema.set("properties", outer_props);
  Json schemas = Json::object();
  schemas.set("Error", error_schema);
  Json components = Json::object();
  components.set("securitySchemes", schemes);
  components.set("schemas", schemas);
  doc.set("components", components);
  Json statuses = Json::object();
  for (auto c : all_codes()) statuses.set(to_string(c), int64_t(http_status(c)));
  doc.set("x-error-codes", statuses);
  // Every limit the API enforces, and the quotas a tenant has unless an admin set its own.
  Json lim = Json::object();
  lim.set("max_body_bytes", uint64_t(limits.max_body_bytes));
  lim.set("max_file_bytes", uint64_t(limits.max_file_bytes));
  lim.set("max_command_bytes", uint64_t(limits.max_command_bytes));
  lim.set("max_path_bytes", uint64_t(limits.max_path_bytes));
  lim.set("default_exec_timeout_seconds", limits.default_exec_timeout_s);
  lim.set("max_exec_timeout_seconds", limits.max_exec_timeout_s);
  lim.set("max_exec_output_bytes", limits.max_exec_output_bytes);
  lim.set("max_stream_buffer_bytes", uint64_t(limits.max_stream_buffer_bytes));
  lim.set("max_connections", uint64_t(limits.max_connections));
  lim.set("body_timeout_seconds", int64_t(limits.body_timeout.count() / 1000));
  lim.set("max_concurrent_execs_per_sandbox", rt.config().limits.max_concurrent_execs);
  lim.set("max_processes_per_sandbox", rt.config().limits.max_processes);
  lim.set("max_exposed_ports_per_sandbox", rt.config().limits.max_exposed_ports);
  lim.set("max_ttl_seconds", rt.config().limits.max_ttl_seconds);
  doc.set("x-limits", lim);
  doc.set("x-default-quotas", actors::quotas_json(rt.config().quotas));
  Json paths = Json::object();
  for (auto& r : routes) {
    Json item = paths.has(r.pattern) ? paths[r.pattern] : Json::object();
    Json op = Json::object();
    op.set("summary", r.summary);
    Json params = Json::array();
    for (auto& seg : r.compiled.segments)
      if (seg.size() > 2 && seg.front() == '{') {
        Json p = Json::object();
        p.set("name", seg.substr(1, seg.size() - 2));
        p.set("in", "path");
        p.set("required", true);
        Json sch = Json::object();
        sch.set("type", "string");
        p.set("schema", sch);
        params.push(p);
      }
    for (auto& q : r.query) {
      Json p = Json::object();
      p.set("name", q);
      p.set("in", "query");
      p.set("required", false);
      Json sch = Json::object();
      sch.set("type", "string");
      p.set("schema", sch);
      params.push(p);
    }
    op.set("parameters", params);
    if (r.auth) {
      Json sec = Json::array();
      Json s = Json::object();
      s.set("bearer", Json::array());
      sec.push(s);
      op.set("security", sec);
    }
    Json responses = Json::object();
    Json ok = Json::object();
    ok.set("description",
           r.kind == Route::Kind::stream ? "text/event-stream (or JSON)" : "success");
    responses.set("2XX", ok);
    Json err = Json::object();
    err.set("description", "error (see x-error-codes)");
    Json content = Json::object();
    Json media = Json::object();
    Json ref = Json::object();
    ref.set("$ref", "#/components/schemas/Error");
    media.set("schema", ref);
    content.set("application/json", media);
    err.set("content", content);
    responses.set("default", err);
    op.set("responses", responses);
    item.set(method_name(r.method), op);
    paths.set(r.pattern, item);
  }
  doc.set("paths", paths);
  return doc.dump();
}

}  // namespace pandastack::gateway
