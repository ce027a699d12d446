// Commands: run to completion, stream (SSE), WebSocket, and background processes.
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using K = Route::Kind;

Json process_json(const vmm::ProcessInfo& p) {
  Json j = Json::object();
  j.set("pid", p.pid);
  j.set("command", p.command);
  j.set("running", p.running);
  j.set("exit_code", p.exit_code);
  j.set("started_at_ms", p.started_at_ms);
  return j;
}

}  // namespace

std::vector<Route> exec_routes() {
  return {
      route(M::POST, "/v1/sandboxes/{id}/exec", "Run a command to completion",
            [](Call& c) {
              auto req = c.gw.exec_request(c.r.json(), true);
              auto t0 = Clock::now();
              // Cancelled when the client hangs up (or the server stops): the command is killed.
              auto res = unwrap(c.gw.rt.exec(c.tenant(), c.id, req, c.r.cancel));
              c.gw.observe_exec(t0);
              return json_reply(200, exec_json(res));
            }),
      route(M::POST, "/v1/sandboxes/{id}/exec/stream",
            "Run a command, output as server-sent events", nullptr, {}, K::stream),
      route(M::GET, "/v1/sandboxes/{id}/exec/ws",
            "Run a command over a WebSocket: output out, stdin in; closing kills it", nullptr, {},
            K::websocket),
      route(M::GET, "/v1/sandboxes/{id}/pty",
            "A terminal over a WebSocket: a shell on a pseudo-terminal, input, output, resize",
            nullptr, {}, K::websocket),
      route(M::POST, "/v1/sandboxes/{id}/processes", "Start a background process",
            [](Call& c) {
              auto req = c.gw.exec_request(c.r.json(), false);
              auto pid = unwrap(c.gw.rt.start_process(c.tenant(), c.id, req));
              Json j = Json::object();
              j.set("pid", pid);
              return json_reply(201, j);
            }),
      route(M::GET, "/v1/sandboxes/{id}/processes", "List background processes",
            [](Call& c) {
              return list_reply("processes", unwrap(c.gw.rt.list_processes(c.tenant(), c.id)),
                                process_json);
            }),
      route(M::GET, "/v1/sandboxes/{id}/processes/{pid}/stream",
            "A background process's output as server-sent events", nullptr, {}, K::stream),
      route(M::DELETE, "/v1/sandboxes/{id}/processes/{pid}",
            "Signal a background process (?signal=1..64, default 9)",
            [](Call& c) {
              uint32_t pid = parse_pid(c.r.param("pid"));
              int sig = 0;
              if (auto s = c.r.q("signal")) sig = int(parse_number(*s, "signal", 1, 64));
              auto k = c.gw.rt.kill_process(c.tenant(), c.id, pid, sig);
              if (!k && k.error().code == Code::file_not_found)
                throw ApiError{Code::process_not_found, "no process " + std::to_string(pid)};
              unwrap(std::move(k));
              return no_content();
            },
            {"signal"}),
  };
}

}  // namespace pandastack::gateway
