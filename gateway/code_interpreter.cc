#include "gateway/code_interpreter.h"

#include <spdlog/spdlog.h>

#include "gateway/repl_script.h"  // generated from guest/repl/pandastack_repl.py (kReplScript)
#include "wire/hex.h"

namespace pandastack::gateway::code {

namespace {

using actors::Rejection;
using actors::Reply;
using wire::Json;

// Named after the script's content: a daemon with a changed script never talks to an older one
// left in a running (or restored) guest.
const std::string& script_path() {
  static const std::string path = "/run/pandastack/repl-" + wire::fnv1a_hex(kReplScript) + ".py";
  return path;
}

vmm::ExecRequest client(std::vector<std::string> args, std::string in, uint32_t timeout_ms,
                        const std::string& user) {
  vmm::ExecRequest e;
  e.user = user;
  // -S: no site import; the client needs the standard library only (its server, a process of
  // its own, gets site-packages), and each module is latency under TCG (pandastack_repl.py).
  e.argv = {"python3", "-S", script_path()};
  e.argv.insert(e.argv.end(), args.begin(), args.end());
  e.stdin_data = std::move(in);
  e.timeout_ms = timeout_ms;
  e.cwd = "/";
  return e;
}

// Runs the client; installs the script first when the guest does not have it yet.
Reply<vmm::ExecResult> call(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                            const vmm::ExecRequest& e, const vmm::OutputCallback& on_output,
                            std::stop_token stop) {
  for (int attempt = 0;; ++attempt) {
    std::string err;  // the client's stderr (streamed runs do not return it in the result)
    auto tee = [&](vmm::StreamKind k, std::string_view d) {
      if (k == vmm::StreamKind::err && err.size() < 65536) err.append(d);
      on_output(k, d);
    };
    auto r = on_output ? rt.exec_stream(tenant, id, e, tee, stop) : rt.exec(tenant, id, e, stop);
    if (!r) return r;
    if (on_output) r->stderr_data = err;
    if (r->exit_code == 127 && !r->error.empty())
      return Rejection{Code::invalid_state,
                       "no python3 in this sandbox (its template has none): " + r->error};
    bool missing = r->exit_code == 2 && r->stderr_data.find("can't open file") != std::string::npos;
    if (!missing || attempt > 0) return r;
    if (auto made = rt.mkdir(tenant, id, "/run/pandastack", true); !made) return made.error();
    if (auto w = rt.write_file(tenant, id, script_path(), kReplScript, 0644); !w) return w.error();
  }
}

}  // namespace

bool valid_context(const std::string& c) {
  if (c.empty() || c.size() > 64) return false;
  for (char ch : c)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') return false;
  return true;
}

Reply<RunResult> run(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                     const RunRequest& request, const std::function<void(const Json&)>& on_event,
                     std::stop_token stop) {
  if (!valid_context(request.context))
    return Rejection{Code::invalid_argument, "a context name is 1..64 of A-Z a-z 0-9 _ -"};
  Json in = Json::object();
  in.set("code", request.code);
  Json env = Json::object();
  for (auto& [k, v] : request.env) env.set(k, v);
  in.set("env", env);
  RunResult out;
  std::string pending;  // a line not complete yet
  // The caller's stop, and ours: a line over its bound kills the command.
  std::stop_source own;
  std::stop_callback linked(stop, [&own] { own.request_stop(); });
  bool overflow = false;
  uint64_t unreadable = 0, unreadable_bytes = 0;  // lines of the client that are not an event
  auto on_output = [&](vmm::StreamKind kind, std::string_view d) {
    if (kind == vmm::StreamKind::err) {
      if (out.stderr_text.size() < 65536) out.stderr_text.append(d);  // the client's own errors
      return;
    }
    if (overflow) return;
    size_t from = pending.size(), start = 0, nl;  // (only the new bytes are searched)
    pending.append(d);
    while ((nl = pending.find('\n', from)) != std::string::npos) {
      size_t len = nl - start;
      auto j = Json::parse(std::string_view(pending).substr(start, len));
      start = from = nl + 1;
      if (!j || !j->is_object()) {
        ++unreadable;
        unreadable_bytes += len;
        continue;
      }
      const std::string& type = (*j)["type"].as_string();
      if (type == "end") out.execution_count = (*j)["execution_count"].as_int();
      on_event(*j);
    }
    pending.erase(0, start);
    // (what is left is one line not complete yet: at most the bound plus one chunk is held)
    if (pending.size() > kMaxEventLineBytes) {
      overflow = true;
      pending.clear();
      pending.shrink_to_fit();
      own.request_stop();
    }
  };
  std::string client_err;
  // (A context this run starts works in /workspace, as commands and the files API do.)
  auto r = call(rt, tenant, id,
                client({"run", request.context}, in.dump(), request.timeout_ms, request.user),
                on_output, own.get_token());
  if (overflow)
    return Rejection{Code::output_too_large, "the code interpreter wrote a line over " +
                                                 std::to_string(kMaxEventLineBytes >> 20) +
                                                 " MiB: the run was stopped"};
  // (The client writes only events: a line that is not one is a fault worth seeing in the log.)
  if (unreadable > 0)
    spdlog::warn("code: a run in {} had {} lines ({} bytes) that are not events: skipped", id,
                 unreadable, unreadable_bytes);
  if (!r) return r.error();
  if (r->timed_out) {
    out.timed_out = true;
    // Its error says so (the guest's KeyboardInterrupt reaches no one: the client was ended).
    if (!out.error) {
      Json e = Json::object();
      e.set("type", "error");
      e.set("name", "TimeoutError");
      e.set("value", "the run did not finish within " + std::to_string(request.timeout_ms / 1000) +
                         " s: it was interrupted (KeyboardInterrupt in its context)");
      e.set("traceback", "");
      out.error = e;
    }
    return out;
  }
  if (r->exit_code != 0 && out.execution_count == 0)
    return Rejection{Code::exec_failed, "the code interpreter failed (exit " +
                                            std::to_string(r->exit_code) + "): " + out.stderr_text +
                                            r->stderr_data};
  out.stderr_text.clear();
  return out;
}

Reply<std::vector<std::string>> contexts(actors::Runtime& rt, const std::string& tenant,
                                         const std::string& id, const std::string& user) {
  auto r = call(rt, tenant, id, client({"list"}, "", 30000, user), {}, {});
  if (!r) return r.error();
  auto j = Json::parse(r->stdout_data);
  if (r->exit_code != 0 || !j || !j->is_array())
    return Rejection{Code::exec_failed, "cannot list contexts: " + r->stderr_data};
  std::vector<std::string> out;
  for (auto& c : j->as_array())
    if (c.is_string()) out.push_back(c.as_string());
  return out;
}

Reply<bool> start(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                  const std::string& context, const std::string& cwd, const std::string& user) {
  if (!valid_context(context)) return Rejection{Code::invalid_argument, "bad context name"};
  std::vector<std::string> args = {"start", context};
  if (!cwd.empty()) args.push_back(cwd);
  auto r = call(rt, tenant, id, client(args, "", 60000, user), {}, {});
  if (!r) return r.error();
  if (r->exit_code == 3) return Rejection{Code::invalid_cwd, "cwd: " + r->stderr_data};
  if (r->exit_code != 0)
    return Rejection{Code::exec_failed, "cannot start the context: " + r->stderr_data};
  return true;
}

Reply<bool> stop(actors::Runtime& rt, const std::string& tenant, const std::string& id,
                 const std::string& context, const std::string& user) {
  if (!valid_context(context)) return Rejection{Code::invalid_argument, "bad context name"};
  auto r = call(rt, tenant, id, client({"stop", context}, "", 30000, user), {}, {});
  if (!r) return r.error();
  if (r->exit_code == 4) return Rejection{Code::context_not_found, "no code context " + context};
  if (r->exit_code != 0)
    return Rejection{Code::exec_failed, "cannot stop the context: " + r->stderr_data};
  return true;
}

}  // namespace pandastack::gateway::code
