// The WebSocket exec (GET /v1/sandboxes/{id}/exec/ws: stdin in, output out, the exit, a close)
// and the terminal (GET /v1/sandboxes/{id}/pty: the same on a pseudo-terminal, with resizes).
// GCC 12's false -Wmaybe-uninitialized in kj's ExceptionOr<HttpReply> (see rpc.cc), silenced
// for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

// WebSocket exec: the key and the sandbox are checked first (a normal error reply if they fail),
// then the upgrade. Protocol (text frames are JSON):
//   client -> {"cmd": ...} or {"argv": [...]} (+ env, cwd, timeout_seconds): the command
//   server -> {"type":"started","pid":N}
//   server -> {"type":"stdout"|"stderr","data":"..."[,"encoding":"base64"]} ...
//   client -> binary frames or {"type":"stdin","data":"..."}: stdin; {"type":"close_stdin"}
//   server -> {"type":"exit","exit_code":N,"timed_out":false} or {"type":"error",...}, close
// The command runs as a background process with stdin kept open; when the client closes or
// goes away, it is killed.
//
// Terminal (pty): the first message is the settings as JSON text ({} for the defaults):
// {"cmd" or "argv" (default: a login shell, bash when the template has it), "env", "cwd",
// "cols", "rows" (80x24)}; then
//   server -> {"type":"started","pid":N}
//   server -> binary frames: the terminal's output, as it comes
//   client -> binary frames or {"type":"stdin","data":"..."}: typed input;
//             {"type":"resize","cols":C,"rows":R}: a new size (the shell gets SIGWINCH)
//   server -> {"type":"exit","exit_code":N,...} or {"type":"error",...}, close
struct WsFrame {
  bool binary = false;
  std::string data;
};

struct WsSession {
  Server& gw;
  kj::Own<kj::WebSocket> ws;
  std::string tenant, id;
  bool pty = false;
  uint32_t pid = 0;
  std::shared_ptr<CrossThreadQueue<WsFrame>> out;  // bounded (max_stream_buffer_bytes)
  std::shared_ptr<std::stop_source> stop = std::make_shared<std::stop_source>();

  kj::Promise<void> send_text(std::string text) {
    auto owned = kj::heapString(text.data(), text.size());
    auto p = ws->send(owned.asArray());
    return p.attach(kj::mv(owned));
  }
  kj::Promise<void> send_binary(std::string data) {
    auto owned = kj::heapArray<kj::byte>(data.size());
    memcpy(owned.begin(), data.data(), data.size());
    auto p = ws->send(owned.asPtr());
    return p.attach(kj::mv(owned));
  }
  kj::Promise<void> fail(Code code, const std::string& message) {
    Json e = Json::object();
    e.set("type", "error");
    e.set("code", to_string(code));
    e.set("message", message);
    return send_text(e.dump())
        .then([this] { return ws->close(1011, "error"); })
        .catch_([](kj::Exception&&) {});
  }

  kj::Promise<void> run() {
    return ws->receive(gw.limits.max_body_bytes)
        .then([this](kj::WebSocket::Message&& m) -> kj::Promise<void> {
          if (!m.is<kj::String>())
            return fail(Code::invalid_argument,
                        "the first message must be the command as JSON text");
          vmm::ExecRequest req;
          try {
            auto j = Json::parse(m.get<kj::String>().cStr());
            if (!j || !j->is_object())
              throw ApiError{Code::invalid_json, "the command is not a JSON object"};
            req = pty ? terminal_request(*j) : gw.exec_request(*j, true);
          } catch (const ApiError& e) {
            return fail(e.code, e.message);
          }
          req.keep_stdin_open = true;
          using Started = actors::Reply<uint32_t>;
          return gw.pool
              ->offload<Started>(
                  [rt = &gw.rt, t = tenant, i = id, req] { return rt->start_process(t, i, req); },
                  Started(ApiError{Code::too_many_requests, "the server is busy"}))
              .then([this](Started started) -> kj::Promise<void> {
                if (!started) return fail(started.error().code, started.error().message);
                pid = *started;
                start_output();
                Json j = Json::object();
                j.set("type", "started");
                j.set("pid", pid);
                return send_text(j.dump()).then([this] {
                  return pump_out().exclusiveJoin(read_in().then([this] { return kill(); }));
                });
              });
        })
        .catch_([this](kj::Exception&&) { return kill(); });  // the client went away
  }

  // A terminal's settings: the command (a login shell by default) and the size.
  vmm::ExecRequest terminal_request(const Json& j) {
    Fields f(j, {"cmd", "argv", "env", "cwd", "cols", "rows", "user"});
    vmm::ExecRequest e;
    e.shell = f.str("cmd");
    e.argv = f.string_list("argv");
    if (e.shell.empty() && e.argv.empty())
      e.shell = "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi";
    e.env = f.string_map("env");
    if (!e.env.count("TERM")) e.env["TERM"] = "xterm-256color";
    e.cwd = f.str("cwd");
    e.user = f.str("user");
    if (auto refused = check_exec(e, gw.limits)) throw ApiError{refused->code, refused->message};
    e.pty = true;
    e.cols = uint16_t(f.integer("cols", 80, 1, kMaxTerminalSide));
    e.rows = uint16_t(f.integer("rows", 24, 1, kMaxTerminalSide));
    return e;
  }

  // The process's output, streamed on a worker into the queue.
  void start_output() {
    bool queued =
        gw.stream_pool->submit([rt = &gw.rt, t = tenant, i = id, p = pid, q = out, st = stop,
                                pty = pty, shutdown = gw.shutting_down.get_token()] {
          std::stop_callback on_shutdown(shutdown, [st] { st->request_stop(); });
          // A client that stops reading: once its unsent output passes the bound, the process is
          // stopped (as for SSE) and the client told why, instead of the daemon buffering without
          // end.
          auto overflow = std::make_shared<std::atomic<bool>>(false);
          auto r = rt->stream_process(
              t, i, p,
              [q, st, overflow, pty](vmm::StreamKind k, std::string_view d) {
                if (*overflow) return;
                WsFrame frame{pty, std::string(d)};
                if (!pty) {
                  Json j = chunk_json(d);
                  j.set("type", k == vmm::StreamKind::out ? "stdout" : "stderr");
                  frame.data = j.dump();
                }
                size_t n = frame.data.size();
                if (!q->push(std::move(frame), n)) {
                  *overflow = true;
                  st->request_stop();
                }
              },
              st->get_token());
          if (*overflow) (void)rt->kill_process(t, i, p);
          Json j = Json::object();
          if (*overflow) {
            j.set("type", "error");
            j.set("code", to_string(Code::client_too_slow));
            j.set("message",
                  "the client did not read the output: more than the stream buffer "
                  "waited; the process was stopped");
          } else if (r) {
            j.set("type", "exit");
            j.set("exit_code", r->exit_code);
            j.set("timed_out", r->timed_out);
          } else {
            j.set("type", "error");
            j.set("code", to_string(r.error().code));
            j.set("message", r.error().message);
          }
          q->push(WsFrame{false, j.dump()});
          q->close();
        });
    if (!queued) out->close();
  }

  kj::Promise<void> pump_out() {
    return out->ready().then([this]() -> kj::Promise<void> {
      auto [items, closed] = out->take();
      kj::Promise<void> p = kj::READY_NOW;
      for (auto& frame : items)
        p = p.then([this, frame = std::move(frame)]() mutable {
          return frame.binary ? send_binary(std::move(frame.data))
                              : send_text(std::move(frame.data));
        });
      if (closed) return p.then([this] { return ws->close(1000, "exit"); });
      return p.then([this] { return pump_out(); });
    });
  }

  // Stdin from the client until it closes; each write completes before the next is read.
  kj::Promise<void> read_in() {
    return ws->receive(gw.limits.max_body_bytes)
        .then([this](kj::WebSocket::Message&& m) -> kj::Promise<void> {
          if (m.is<kj::WebSocket::Close>()) return kj::READY_NOW;
          std::string data;
          bool close = false;
          if (m.is<kj::Array<kj::byte>>()) {
            auto& b = m.get<kj::Array<kj::byte>>();
            data.assign(reinterpret_cast<const char*>(b.begin()), b.size());
          } else {
            auto j = Json::parse(m.get<kj::String>().cStr());
            std::string type =
                j && j->is_object() && (*j)["type"].is_string() ? (*j)["type"].as_string() : "";
            if (type == "stdin" && (*j)["data"].is_string())
              data = (*j)["data"].as_string();
            else if (type == "close_stdin")
              close = true;
            else if (type == "resize" && pty)
              return resize(*j).then([this] { return read_in(); });
            else
              return read_in();  // unknown messages are ignored
          }
          return gw.pool
              ->offload<bool>([rt = &gw.rt, t = tenant, i = id, p = pid, data,
                               close] { return bool(rt->write_stdin(t, i, p, data, close)); },
                              false)
              .then([this](bool) { return read_in(); });
        });
  }

  // A resize: sizes out of range are ignored (the terminal keeps its size).
  kj::Promise<void> resize(const Json& j) {
    auto side = [&](const char* k) -> int64_t {
      if (!j[k].is_number()) return 0;
      double v = j[k].as_double();
      return v >= 1 && v <= kMaxTerminalSide ? int64_t(v) : 0;
    };
    int64_t cols = side("cols"), rows = side("rows");
    if (cols == 0 || rows == 0) return kj::READY_NOW;
    return gw.pool
        ->offload<bool>(
            [rt = &gw.rt, t = tenant, i = id, p = pid, cols, rows] {
              return bool(rt->resize_pty(t, i, p, uint16_t(cols), uint16_t(rows)));
            },
            false)
        .then([](bool) {});
  }

  kj::Promise<void> kill() {
    stop->request_stop();
    if (pid == 0) return kj::READY_NOW;
    return gw.pool
        ->offload<bool>(
            [rt = &gw.rt, t = tenant, i = id, p = pid] { return bool(rt->kill_process(t, i, p)); },
            false)
        .then([](bool) {});
  }
};

}  // namespace

kj::Promise<void> Server::websocket(const Route& route, Request req,
                                    kj::HttpService::Response& response, Clock::time_point t0) {
  auto r = std::make_shared<Request>(std::move(req));
  return offload<HttpReply>(
             [this, r, &route] {
               try {
                 auto call = admit(route, *r);
                 return HttpReply{101, "", call.key.tenant, std::nullopt, {}};
               } catch (const ApiError& e) {
                 return error_reply(e);
               }
             },
             busy_reply())
      .then([this, r, &response, t0](HttpReply rep) -> kj::Promise<void> {
        if (rep.status != 101) return send(response, std::move(rep), t0);
        count_response(rep);
        kj::HttpHeaders headers(*table);
        bool pty = r->route == "/v1/sandboxes/{id}/pty";
        auto session = kj::heap<WsSession>(
            WsSession{*this, response.acceptWebSocket(headers), rep.body, r->param("id"), pty, 0,
                      std::make_shared<CrossThreadQueue<WsFrame>>(limits.max_stream_buffer_bytes)});
        auto p = session->run();
        return p.attach(kj::mv(session));
      });
}

}  // namespace pandastack::gateway
