// E2B's code interpreter (@e2b/code-interpreter, port 49999 on the same URL; spec §10) on ours
// (gateway/code_interpreter.h): POST /execute streams NDJSON lines (stdout, stderr, result,
// error, number_of_executions, end_of_execution); contexts are created, listed, restarted and
// deleted. Requests carry E2b-Sandbox-Id and the sandbox's token (X-Access-Token on /execute,
// E2B-Traffic-Access-Token on /contexts).
#include <chrono>

#include "gateway/code_interpreter.h"
#include "gateway/e2b.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using namespace e2b;

Json context_json(const std::string& id, const std::string& cwd) {
  Json j = Json::object();
  j.set("id", id);
  j.set("language", "python");
  j.set("cwd", cwd.empty() ? "/workspace" : cwd);
  return j;
}

std::string language_of(const Json& j) {
  std::string lang = j["language"].is_string() ? j["language"].as_string() : "python";
  if (lang != "python")
    throw ApiError{Code::invalid_argument,
                   "language \"" + lang.substr(0, 32) + "\": only python is served"};
  return lang;
}

}  // namespace

namespace e2b {

// Runs on a stream worker: /execute's NDJSON lines as the run produces them.
void produce_execute(Server& gw, const Request& r, StreamChannel& ch) {
  std::stop_callback on_shutdown(gw.shutting_down.get_token(), [&ch] { ch.stop.request_stop(); });
  code::RunRequest req;
  Target t;
  try {
    t = target(gw, r);
    Json b = r.json();
    language_of(b);
    if (!b["code"].is_string()) throw ApiError{Code::invalid_argument, "code is required"};
    req.code = b["code"].as_string();
    if (b["context_id"].is_string()) req.context = b["context_id"].as_string();
    if (!code::valid_context(req.context))
      throw ApiError{Code::invalid_argument, "context_id is 1..64 of A-Z a-z 0-9 _ -"};
    if (b["env_vars"].is_object())
      for (auto& [k, v] : b["env_vars"].as_object())
        if (v.is_string()) req.env[k] = v.as_string();
    req.timeout_ms = gw.limits.max_exec_timeout_s * 1000;  // the client times out on its own
    req.user = t.as();  // E2B's code runs as its user (`user` by default), as its commands do
  } catch (const ApiError& e) {
    auto rep = error_reply(e);
    return ch.fail_early(sandbox_gone(e.code) ? envd_error(rep) : api_error(rep));
  }
  ch.begin();
  auto line = [&ch](const Json& j) { ch.push(j.dump() + "\n"); };
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  auto res = code::run(
      gw.rt, t.tenant, t.id, req,
      [&](const Json& e) {
        const std::string& type = e["type"].as_string();
        if (type == "end") {
          Json n = Json::object();
          n.set("type", "number_of_executions");
          n.set("execution_count", e["execution_count"]);
          line(n);
          Json end = Json::object();
          end.set("type", "end_of_execution");
          line(end);
          return;
        }
        Json out = e;
        if (type == "stdout" || type == "stderr") out.set("timestamp", now());
        line(out);
      },
      ch.stop.get_token());
  if (!res || res->timed_out) {
    Json err = Json::object();
    err.set("type", "error");
    err.set("name", res ? "TimeoutError" : "SandboxError");
    err.set("value", res ? "the run was interrupted at its timeout" : res.error().message);
    err.set("traceback", "");
    line(err);
  }
  ch.finish("");
}

}  // namespace e2b

std::vector<Route> e2b_code_routes() {
  return {
      envd_route(M::POST, "/execute", "E2B code interpreter: run code, NDJSON lines as they come",
                 {}, {}, Route::Kind::stream),
      envd_route(M::POST, "/contexts", "E2B code interpreter: a new context",
                 [](Call& c) {
                   auto t = e2b::target(c.gw, c.r);
                   Json b = c.r.json();
                   language_of(b);
                   std::string cwd =
                       b["cwd"].is_string() ? c.gw.checked_path(b["cwd"].as_string()) : "";
                   auto id = new_context_id();
                   unwrap(code::start(c.gw.rt, t.tenant, t.id, id, cwd, t.as()));
                   // (a context starts in the user's home: /workspace for root)
                   return json_reply(200, context_json(id, !cwd.empty()     ? cwd
                                                           : t.as().empty() ? "/workspace"
                                                                            : t.home));
                 }),
      envd_route(M::GET, "/contexts", "E2B code interpreter: the contexts",
                 [](Call& c) {
                   auto t = e2b::target(c.gw, c.r);
                   Json out = Json::array();
                   for (auto& id : unwrap(code::contexts(c.gw.rt, t.tenant, t.id, t.as())))
                     out.push(context_json(id, ""));
                   return json_reply(200, out);
                 }),
      envd_route(M::DELETE, "/contexts/{context}", "E2B code interpreter: remove a context",
                 [](Call& c) {
                   auto t = e2b::target(c.gw, c.r);
                   unwrap(code::stop(c.gw.rt, t.tenant, t.id, c.r.param("context"), t.as()));
                   return no_content();
                 }),
      envd_route(M::POST, "/contexts/{context}/restart", "E2B code interpreter: restart a context",
                 [](Call& c) {
                   auto t = e2b::target(c.gw, c.r);
                   const std::string& ctx = c.r.param("context");
                   auto stopped = code::stop(c.gw.rt, t.tenant, t.id, ctx, t.as());
                   if (!stopped && stopped.error().code != Code::context_not_found) unwrap(stopped);
                   unwrap(code::start(c.gw.rt, t.tenant, t.id, ctx, "", t.as()));
                   return no_content();
                 }),
  };
}

}  // namespace pandastack::gateway
