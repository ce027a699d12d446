// The code interpreter (gateway/code_interpreter.h): run Python in a context that keeps its
// variables between runs, as one JSON answer or as server-sent events; list, create, restart and
// delete contexts.
#include <algorithm>
#include <random>

#include "gateway/code_interpreter.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

// The most output one answer gathers (stdout, stderr and results each, results also by count);
// the rest is cut (`truncated`).
constexpr size_t kMaxGathered = 16 << 20;
constexpr size_t kMaxResults = 1000;

// A `user` of a request (an account of the guest's; "" and "root" are root).
std::string user_of(const std::string& u) {
  if (!u.empty() && !valid_user_name(u))
    throw ApiError{Code::invalid_argument,
                   "user is an account name of the guest: 1 to 32 of a-z 0-9 _ - (starting with "
                   "a letter or _)"};
  return u == "root" ? "" : u;
}

code::RunRequest run_request(Server& gw, const Request& r) {
  Fields f(r.json(), {"code", "context", "language", "env", "timeout_seconds", "user"});
  if (!f.has("code")) throw ApiError{Code::invalid_argument, "code is required"};
  if (f.str("language", "python") != "python")
    throw ApiError{Code::invalid_argument, "language: only \"python\" is served"};
  code::RunRequest req;
  req.code = f.str("code");
  req.context = f.str("context", "default");
  if (!code::valid_context(req.context))
    throw ApiError{Code::invalid_argument, "context is 1..64 of A-Z a-z 0-9 _ -"};
  req.env = f.string_map("env");
  req.user = user_of(f.str("user"));
  req.timeout_ms = uint32_t(f.integer("timeout_seconds", gw.limits.default_exec_timeout_s, 1,
                                      gw.limits.max_exec_timeout_s)) *
                   1000;
  return req;
}

HttpReply run(Call& c) {
  auto req = run_request(c.gw, c.r);
  Json results = Json::array(), error;
  std::string out, err;
  bool truncated = false;
  size_t results_bytes = 0;  // (results are bounded like the text: kMaxGathered, then truncated)
  auto gathered = unwrap(code::run(
      c.gw.rt, c.tenant(), c.id, req,
      [&](const Json& e) {
        const std::string& type = e["type"].as_string();
        auto add = [&](std::string& to) {
          const std::string& t = e["text"].as_string();
          if (to.size() + t.size() > kMaxGathered) {  // (what fits is kept, as exec keeps it)
            truncated = true;
            to.append(t, 0, kMaxGathered - std::min(kMaxGathered, to.size()));
          } else {
            to += t;
          }
        };
        if (type == "stdout")
          add(out);
        else if (type == "stderr")
          add(err);
        else if (type == "result") {
          auto bytes = e.dump().size();
          if (results_bytes + bytes > kMaxGathered || results.size() >= kMaxResults) {
            truncated = true;
          } else {
            results_bytes += bytes;
            results.push(e);
          }
        } else if (type == "error")
          error = e;
      },
      c.r.cancel));
  Json j = Json::object();
  j.set("results", results);
  j.set("stdout", out);
  j.set("stderr", err);
  if (error.is_null() && gathered.error) error = *gathered.error;  // (a timeout's)
  j.set("error", error);
  j.set("execution_count", gathered.execution_count);
  j.set("timed_out", gathered.timed_out);
  j.set("truncated", truncated);
  return json_reply(200, j);
}

Json context_json(const std::string& id, const std::string& cwd) {
  Json j = Json::object();
  j.set("id", id);
  j.set("language", "python");
  if (!cwd.empty()) j.set("cwd", cwd);
  return j;
}

std::string context_param(const Request& r) {
  const std::string& ctx = r.param("context");
  if (!code::valid_context(ctx))
    throw ApiError{Code::invalid_argument, "context is 1..64 of A-Z a-z 0-9 _ -"};
  return ctx;
}

}  // namespace

std::string new_context_id() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string id = "ctx_";
  for (int i = 0; i < 16; ++i) id += hex[rd() & 15];
  return id;
}

std::vector<Route> code_routes() {
  return {
      route(M::POST, "/v1/sandboxes/{id}/code",
            "Run Python in a context that keeps its state (results, output, error)", run),
      route(M::POST, "/v1/sandboxes/{id}/code/stream",
            "Run Python; events stdout, stderr, result, error, end as they come", {}, {},
            Route::Kind::stream),
      route(M::GET, "/v1/sandboxes/{id}/code/contexts", "The sandbox's running contexts",
            [](Call& c) {
              auto all = unwrap(
                  code::contexts(c.gw.rt, c.tenant(), c.id, user_of(c.r.q("user").value_or(""))));
              return list_reply("contexts", all,
                                [](const std::string& id) { return context_json(id, ""); });
            },
            {"user"}),
      route(M::POST, "/v1/sandboxes/{id}/code/contexts",
            "A new context (its own variables; cwd: its working folder)",
            [](Call& c) {
              Fields f(c.r.json(), {"cwd", "language", "user"});
              if (f.str("language", "python") != "python")
                throw ApiError{Code::invalid_argument, "language: only \"python\" is served"};
              std::string cwd = f.has("cwd") ? c.gw.checked_path(f.str("cwd")) : "";
              auto id = new_context_id();
              unwrap(code::start(c.gw.rt, c.tenant(), c.id, id, cwd, user_of(f.str("user"))));
              return json_reply(201, context_json(id, cwd));
            }),
      route(M::DELETE, "/v1/sandboxes/{id}/code/contexts/{context}",
            "End a context (its variables go)",
            [](Call& c) {
              unwrap(code::stop(c.gw.rt, c.tenant(), c.id, context_param(c.r),
                                user_of(c.r.q("user").value_or(""))));
              return no_content();
            },
            {"user"}),
      route(M::POST, "/v1/sandboxes/{id}/code/contexts/{context}/restart",
            "Restart a context: a fresh interpreter, same name",
            [](Call& c) {
              Fields f(c.r.json(), {"user"});
              auto ctx = context_param(c.r);
              auto user = user_of(f.str("user"));
              auto stopped = code::stop(c.gw.rt, c.tenant(), c.id, ctx, user);
              if (!stopped && stopped.error().code != Code::context_not_found) unwrap(stopped);
              unwrap(code::start(c.gw.rt, c.tenant(), c.id, ctx, "", user));
              return json_reply(200, context_json(ctx, ""));
            }),
  };
}

// The SSE form of a run (Server::produce calls it on a stream worker).
void produce_code(Server& gw, const std::string& tenant, const std::string& id, const Request& r,
                  StreamChannel& ch) {
  code::RunRequest req;
  try {
    req = run_request(gw, r);
  } catch (const ApiError& e) {
    return ch.fail_early(error_reply(e));
  }
  ch.begin();
  auto res = code::run(
      gw.rt, tenant, id, req,
      [&ch](const Json& e) { ch.push(sse_frame(e["type"].as_string(), e)); }, ch.stop.get_token());
  if (!res) {
    Json e = Json::object();
    e.set("code", to_string(res.error().code));
    e.set("message", res.error().message);
    return ch.finish(sse_frame("failure", e));
  }
  if (res->timed_out) {
    Json e = Json::object();
    e.set("code", to_string(Code::timeout));
    e.set("message", "the run was interrupted at its timeout");
    return ch.finish(sse_frame("failure", e));
  }
  ch.finish(": end\n\n");
}

}  // namespace pandastack::gateway
