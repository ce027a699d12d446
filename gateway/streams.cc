// Server-sent events: exec/stream, a background process's stream, and events?follow=1. A worker
// produces frames into a StreamChannel; the event loop writes them to the client.
#include <spdlog/spdlog.h>

#include <thread>

#include "actors/template_builds.h"
#include "gateway/server.h"

namespace pandastack::gateway {

using actors::Rejection;
using actors::Reply;

void StreamChannel::wake() {
  if (waiter) {
    waiter->fulfill();
    waiter = nullptr;
  }
}

void StreamChannel::push(std::string frame) {
  std::lock_guard l(mu);
  if (pending.size() + frame.size() > limit) {
    if (!overflowed) {
      overflowed = true;
      stop.request_stop();  // the client reads too slowly: end the command
    }
    return;
  }
  pending += frame;
  wake();
}

void StreamChannel::begin() {
  std::lock_guard l(mu);
  started = true;
  wake();
}

void StreamChannel::fail_early(HttpReply r) {
  std::lock_guard l(mu);
  early = std::move(r);
  done = true;
  wake();
}

void StreamChannel::finish(std::string frame) {
  std::lock_guard l(mu);
  pending += frame;
  done = true;
  wake();
}

// Server-sent events: a worker produces frames into a channel; the loop writes them.
kj::Promise<void> Server::stream(const Route& route, Request req,
                                 kj::HttpService::Response& response, Clock::time_point t0) {
  if (route.style == Route::Style::e2b_envd)
    return connect_stream(route, std::move(req), response, t0);
  auto ch = std::make_shared<StreamChannel>(limits.max_stream_buffer_bytes);
  auto r = std::make_shared<Request>(std::move(req));
  bool follow = r->q("follow") == "1" || r->q("follow") == "true";
  if (route.handler && !follow) {  // the route's plain JSON form (events without ?follow)
    return offload<HttpReply>([this, r, &route] { return handle(route, *r); }, busy_reply())
        .then([this, &response, t0](HttpReply rep) { return send(response, std::move(rep), t0); });
  }
  bool queued = stream_pool->submit([this, r, ch, &route] { produce(route, *r, *ch); });
  if (!queued) return send(response, busy_reply(), t0);
  return respond(ch, response, t0, "text/event-stream");
}

kj::Promise<void> Server::respond(std::shared_ptr<StreamChannel> ch,
                                  kj::HttpService::Response& response, Clock::time_point t0,
                                  std::string content_type) {
  // When this promise ends for any reason (done, client gone, shutdown), the command stops.
  auto guard = kj::defer([ch] { ch->stop.request_stop(); });
  return wait_channel(ch)
      .then([this, ch, &response, t0, content_type](bool) -> kj::Promise<void> {
        std::unique_lock l(ch->mu);
        if (ch->early) {
          auto rep = std::move(*ch->early);
          l.unlock();
          return send(response, std::move(rep), t0);
        }
        l.unlock();
        HttpReply ok{200, content_type, "", std::nullopt, {}};
        count_response(ok);
        kj::HttpHeaders headers(*table);
        headers.set(kj::HttpHeaderId::CONTENT_TYPE, kj::str(content_type.c_str()));
        headers.set(h_cache_control, "no-cache");
        auto out = response.send(200, "OK", headers);
        auto& ref = *out;
        return pump(ch, ref).attach(kj::mv(out));
      })
      .attach(kj::mv(guard));
}

// Resolves when the channel has news (true) or the keepalive interval passed (false).
kj::Promise<bool> Server::wait_channel(std::shared_ptr<StreamChannel> ch) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  bool started;
  {
    std::lock_guard l(ch->mu);
    if (ch->early || ch->done || (ch->started && !ch->pending.empty())) return true;
    started = ch->started;
    ch->waiter = kj::mv(paf.fulfiller);
  }
  auto news = paf.promise.then([] { return true; });
  if (!started) return news;  // the worker decides first (reply or stream)
  return news.exclusiveJoin(
      timer.afterDelay(limits.sse_keepalive.count() * kj::MILLISECONDS).then([] { return false; }));
}

kj::Promise<void> Server::pump(std::shared_ptr<StreamChannel> ch, kj::AsyncOutputStream& out) {
  return wait_channel(ch).then([this, ch, &out](bool news) -> kj::Promise<void> {
    std::string data;
    bool done;
    {
      std::lock_guard l(ch->mu);
      data.swap(ch->pending);
      done = ch->done;
    }
    if (!news && data.empty()) data = ch->keepalive;  // also finds clients that left
    if (data.empty() && done) return kj::READY_NOW;
    auto buf = kj::heapString(data.data(), data.size());
    auto w = out.write(buf.begin(), buf.size()).attach(kj::mv(buf));
    if (done) return w;
    return w.then([this, ch, &out] { return pump(ch, out); });
  });
}

// -------------------------------------------------------------------------------------------
// Worker side: blocking runtime calls.

// Streams: runs on a worker; validation errors become a normal reply (early), the rest frames.
void Server::produce(const Route& route, const Request& r, StreamChannel& ch) {
  std::stop_callback on_shutdown(shutting_down.get_token(), [&ch] { ch.stop.request_stop(); });
  std::string tenant, id = r.param("id");
  vmm::ExecRequest req;
  uint32_t pid = 0;
  try {
    tenant = admit(route, r).key.tenant;
    if (r.route == "/v1/sandboxes/{id}/exec/stream") req = exec_request(r.json(), true);
    if (r.route == "/v1/sandboxes/{id}/processes/{pid}/stream") pid = parse_pid(r.param("pid"));
  } catch (const ApiError& e) {
    return ch.fail_early(error_reply(e));
  } catch (const std::exception& e) {
    return ch.fail_early(error_reply(Code::internal, e.what()));
  }
  auto on_output = [&ch](vmm::StreamKind k, std::string_view d) {
    ch.push(sse_frame(k == vmm::StreamKind::out ? "stdout" : "stderr", chunk_json(d)));
  };
  auto finish = [&ch](Reply<vmm::ExecResult> res) {
    bool overflow;
    {
      std::lock_guard l(ch.mu);
      overflow = ch.overflowed;
    }
    if (overflow) res = Rejection{Code::cancelled, "the client read too slowly; command cancelled"};
    if (!res) {
      Json e = Json::object();
      e.set("code", to_string(res.error().code));
      e.set("message", res.error().message);
      return ch.finish(sse_frame("error", e));
    }
    Json j = Json::object();
    j.set("exit_code", res->exit_code);
    j.set("timed_out", res->timed_out);
    j.set("duration_ms", double(res->duration_us) / 1000.0);
    ch.finish(sse_frame("exit", j));
  };
  if (r.route == "/v1/templates/{name}/build") return produce_build(tenant, r.param("name"), ch);
  if (r.route == "/v1/sandboxes/{id}/code/stream") return produce_code(*this, tenant, id, r, ch);
  if (r.route == "/v1/sandboxes/{id}/files/watch") return produce_watch(*this, tenant, id, r, ch);
  if (r.route == "/v1/sandboxes/{id}/exec/stream") {
    ch.begin();
    auto t0 = Clock::now();
    auto res = rt.exec_stream(tenant, id, req, on_output, ch.stop.get_token());
    observe_exec(t0);
    return finish(std::move(res));
  }
  if (r.route == "/v1/sandboxes/{id}/processes/{pid}/stream") {
    ch.begin();
    return finish(rt.stream_process(tenant, id, pid, on_output, ch.stop.get_token()));
  }
  // Events, followed: poll the log, end when the sandbox ended or after the idle timeout.
  ch.begin();
  uint64_t after = 0;
  auto idle_since = Clock::now();
  while (!ch.stop.stop_requested()) {
    actors::AuditQuery q;  // (the tenant was checked: admit())
    q.tenant = tenant;
    q.stream = id;
    q.after_version = after;  // only what is new since the last poll
    q.limit = 100000;
    auto events = rt.audit(q);
    if (!events) return finish(events.error());
    bool ended = false;
    for (auto& e : *events) {
      if (e.version <= after) continue;
      after = e.version;
      idle_since = Clock::now();
      ch.push(sse_frame("event", audit_json(e)));
      ended |= e.type == "killed" || e.type == "failed" ||
               (e.type == "reaped" && e.json.find("\"kill\"") != std::string::npos);
    }
    if (ended || Clock::now() - idle_since > limits.events_idle_timeout) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ch.finish(": end\n\n");
}

// A template build's progress: `stage` {stage, percent} when it changes, `log` {n, line} per line
// of its log (the lines kept: its last BuildProgress::kMaxLines), then `end` (the template). A
// build that ended before this start of the daemon: its end alone (its log's tail in it).
void Server::produce_build(const std::string& tenant, const std::string& name, StreamChannel& ch) {
  auto t = rt.custom_template(tenant, name);
  if (!t) return ch.fail_early(error_reply(t.error()));
  auto progress = rt.template_build(tenant, name);
  ch.begin();
  if (progress) {
    std::string stage;
    int percent = -1;
    uint64_t next = 0;
    for (;;) {
      std::vector<std::pair<uint64_t, std::string>> lines;
      bool done;
      {
        std::unique_lock l(progress->mu);
        progress->cv.wait_for(l, std::chrono::milliseconds(500), [&] {
          return progress->done || progress->stage != stage || progress->percent != percent ||
                 next < progress->first_line + progress->lines.size();
        });
        if (progress->stage != stage || progress->percent != percent) {
          stage = progress->stage;
          percent = progress->percent;
          Json j = Json::object();
          j.set("stage", stage);
          j.set("percent", percent);
          ch.push(sse_frame("stage", j));
        }
        next = std::max(next, progress->first_line);
        for (; next < progress->first_line + progress->lines.size(); ++next)
          lines.push_back({next, progress->lines[size_t(next - progress->first_line)]});
        done = progress->done;
      }
      for (auto& [n, line] : lines) {
        Json j = Json::object();
        j.set("n", int64_t(n));
        j.set("line", wire::is_valid_utf8(line) ? line : std::string("(not UTF-8)"));
        ch.push(sse_frame("log", j));
      }
      if (done || ch.stop.stop_requested()) break;
    }
    if (auto again = rt.custom_template(tenant, name)) t = std::move(again);
  }
  ch.finish(sse_frame("end", template_json(*t)));
}

}  // namespace pandastack::gateway
