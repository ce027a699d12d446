// Files in a sandbox: read, write (raw bytes, optional mode), remove, list, stat, mkdir, rename.
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using K = Route::Kind;

// An octal permission mode (?mode=755), 0 when absent.
uint32_t file_mode(const Request& r) {
  auto m = r.q("mode");
  if (!m) return 0;
  if (m->empty() || m->size() > 4 || m->find_first_not_of("01234567") != std::string::npos)
    throw ApiError{Code::invalid_argument, "mode is octal permissions, e.g. 644 or 0755"};
  return uint32_t(std::stoul(*m, nullptr, 8));
}

// ?offset= / ?length= of a file written or read in parts: 0..2^62, `fallback` when absent.
uint64_t byte_count(const Request& r, const char* name, uint64_t fallback) {
  auto v = r.q(name);
  if (!v) return fallback;
  if (v->empty() || v->size() > 19 || v->find_first_not_of("0123456789") != std::string::npos ||
      std::stoull(*v) > (uint64_t(1) << 62))
    throw ApiError{Code::invalid_argument, std::string(name) + " is a byte count, 0..2^62"};
  return std::stoull(*v);
}

}  // namespace

std::vector<Route> file_routes() {
  return {
      route(M::GET, "/v1/sandboxes/{id}/files",
            "Read a file (?path=), raw bytes; ?offset=&length= a part of it (a larger file)",
            [](Call& c) {
              auto path = c.gw.guest_path(c.r);
              const uint64_t limit = c.gw.limits.max_file_bytes;
              if (c.r.q("offset") || c.r.q("length")) {
                uint64_t offset = byte_count(c.r, "offset", 0);
                uint64_t length = byte_count(c.r, "length", limit);
                if (length > limit)
                  throw ApiError{
                      Code::invalid_argument,
                      "length is at most " + std::to_string(limit) + " bytes (the file limit)"};
                auto part = unwrap(c.gw.rt.read_file_range(c.tenant(), c.id, path, offset, length));
                return HttpReply{
                    200, "application/octet-stream", std::move(part.data), std::nullopt, {}};
              }
              auto got = c.gw.rt.read_file(c.tenant(), c.id, path, limit);
              if (!got && got.error().code == Code::file_too_large)
                throw ApiError{Code::file_too_large,
                               got.error().message +
                                   ": read it in parts (?offset=&length=, its size from "
                                   "GET .../files/stat)"};
              return HttpReply{
                  200, "application/octet-stream", unwrap(std::move(got)), std::nullopt, {}};
            },
            {"path", "offset", "length"}),
      route(
          M::PUT, "/v1/sandboxes/{id}/files",
          "Write a file (?path=, ?mode=755: its permissions), raw bytes; parents are made; "
          "?offset=N: a later part of a larger file (appended when it is N bytes long)",
          [](Call& c) {
            auto path = c.gw.guest_path(c.r);
            uint64_t offset = byte_count(c.r, "offset", 0);
            unwrap(c.gw.rt.write_file(c.tenant(), c.id, path, c.r.body, file_mode(c.r), offset));
            Json j = Json::object();
            j.set("path", path);
            j.set("size", uint64_t(offset + c.r.body.size()));
            return json_reply(200, j);
          },
          {"path", "mode", "offset"}, K::raw_body),
      route(M::DELETE, "/v1/sandboxes/{id}/files", "Remove a file or folder (?path=, ?recursive=1)",
            [](Call& c) {
              unwrap(c.gw.rt.remove(c.tenant(), c.id, c.gw.guest_path(c.r),
                                    query_flag(c.r, "recursive")));
              return no_content();
            },
            {"path", "recursive"}),
      route(M::GET, "/v1/sandboxes/{id}/files/list", "List a folder (?path=)",
            [](Call& c) {
              auto path = c.gw.guest_path(c.r);
              Json list = Json::array();
              for (auto& s : unwrap(c.gw.rt.list_dir(c.tenant(), c.id, path)))
                list.push(stat_json(s));
              Json j = Json::object();
              j.set("path", path);
              j.set("entries", list);
              return json_reply(200, j);
            },
            {"path"}),
      route(M::GET, "/v1/sandboxes/{id}/files/watch",
            "Changes in a folder as server-sent events (?path=, ?recursive=1)", nullptr,
            {"path", "recursive"}, K::stream),
      route(M::GET, "/v1/sandboxes/{id}/files/stat", "Stat a path (?path=)",
            [](Call& c) {
              return json_reply(
                  200, stat_json(unwrap(c.gw.rt.stat(c.tenant(), c.id, c.gw.guest_path(c.r)))));
            },
            {"path"}),
      route(M::POST, "/v1/sandboxes/{id}/files/mkdir", "Make a folder",
            [](Call& c) {
              Fields f(c.r.json(), {"path", "parents"});
              if (!f.has("path")) throw ApiError{Code::invalid_path, "path is required"};
              unwrap(c.gw.rt.mkdir(c.tenant(), c.id, c.gw.checked_path(f.str("path")),
                                   f.boolean("parents", true)));
              return no_content();
            }),
      route(M::POST, "/v1/sandboxes/{id}/files/rename", "Rename a path",
            [](Call& c) {
              Fields f(c.r.json(), {"from", "to"});
              for (const char* k : {"from", "to"})
                if (!f.has(k)) throw ApiError{Code::invalid_path, std::string(k) + " is required"};
              unwrap(c.gw.rt.rename(c.tenant(), c.id, c.gw.checked_path(f.str("from")),
                                    c.gw.checked_path(f.str("to"))));
              return no_content();
            }),
  };
}

// GET /v1/sandboxes/{id}/files/watch (on a stream worker): `ready` once the watch is in place,
// then a `change` event per change ({"type","name" (relative to the folder),"path","is_dir"}),
// until the client leaves; `end` when the folder itself goes, `error` when it cannot be watched.
void produce_watch(Server& gw, const std::string& tenant, const std::string& id, const Request& r,
                   StreamChannel& ch) {
  std::string root;
  try {
    root = gw.guest_path(r);
  } catch (const ApiError& e) {
    return ch.fail_early(error_reply(e));
  }
  std::string prefix = root == "/" ? "/" : root + "/";
  // Until the watch is in place, an error is a plain reply (404 for a missing folder).
  auto on_ready = [&ch] {
    ch.begin();
    ch.push(sse_frame("ready", Json::object()));
  };
  auto on_events = [&ch, &prefix](const std::vector<vmm::WatchEvent>& events) {
    for (auto& e : events) {
      Json j = Json::object();
      j.set("type", vmm::to_string(e.kind));
      j.set("name", e.path);
      j.set("path", e.path.empty() ? prefix.substr(0, prefix.size() > 1 ? prefix.size() - 1 : 1)
                                   : prefix + e.path);
      j.set("is_dir", e.is_dir);
      ch.push(sse_frame("change", j));
    }
  };
  auto res = gw.rt.watch(tenant, id, root, query_flag(r, "recursive"), on_ready, on_events,
                         ch.stop.get_token());
  bool started;
  {
    std::lock_guard l(ch.mu);
    started = ch.started;
  }
  if (!res && !started) return ch.fail_early(error_reply(res.error()));
  if (!res && res.error().code != Code::cancelled) {
    Json e = Json::object();
    e.set("code", to_string(res.error().code));
    e.set("message", res.error().message);
    return ch.finish(sse_frame("error", e));
  }
  ch.finish(sse_frame("end", Json::object()));
}

}  // namespace pandastack::gateway
