// E2B's sandbox plane (envd, ../shared/specs/e2b-compat.md §4-§7) on our runtime:
// Connect-RPC (JSON over HTTP/1.1) process.Process (Start and Connect stream, with or without a
// PTY; List, SendInput, CloseStdin, SendSignal, Update) and filesystem.Filesystem (Stat, ListDir,
// MakeDir, Move, Remove, WatchDir stream), GET/POST /files (multipart or octet-stream, gzip'd or
// not; file metadata as X-Metadata-* headers) and GET /health. Every
// request names its sandbox in E2b-Sandbox-Id and carries that sandbox's access token
// (X-Access-Token): the token says the tenant, the runtime checks the sandbox is that tenant's.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "gateway/e2b.h"
#include "gateway/server.h"
#include "gateway/signing.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using namespace e2b;

// Relative paths resolve against the user's home.
std::string guest_path(Server& gw, const std::string& p, const Target& t) {
  if (p.empty()) throw ApiError{Code::invalid_path, "path is required"};
  std::string abs = p[0] == '/' ? p : t.home + "/" + p;
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  return gw.checked_path(abs);
}

std::string str(const Json& j, const char* what) {
  if (!j.is_string())
    throw ApiError{Code::invalid_argument, std::string(what) + " must be a string"};
  return j.as_string();
}

uint32_t pid_of(const Json& m) {
  const Json& p = m["process"]["pid"];
  if (!p.is_number() && !(p.is_string() && !p.as_string().empty()))
    throw ApiError{Code::invalid_argument, "process.pid is required (tags are not supported)"};
  int64_t v = p.is_number() ? p.as_int() : std::stoll(p.as_string());
  if (v <= 0 || v > 0xffffffffLL)
    throw ApiError{Code::invalid_argument, "process.pid is out of range"};
  return uint32_t(v);
}

std::string permissions(const vmm::FileStat& s) {
  std::string p = s.type == vmm::FileStat::Type::directory ? "d"
                  : s.type == vmm::FileStat::Type::symlink ? "l"
                                                           : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) p += (s.mode & (0400 >> i)) ? rwx[i] : '-';
  return p;
}

// EntryInfo of `path` (its stat).
Json entry(const std::string& path, const vmm::FileStat& s) {
  Json j = Json::object();
  auto slash = path.find_last_of('/');
  j.set("name", slash == std::string::npos ? path : path.substr(slash + 1));
  j.set("type", s.type == vmm::FileStat::Type::directory ? "FILE_TYPE_DIRECTORY"
                : s.type == vmm::FileStat::Type::symlink ? "FILE_TYPE_SYMLINK"
                : s.type == vmm::FileStat::Type::regular ? "FILE_TYPE_FILE"
                                                         : "FILE_TYPE_UNSPECIFIED");
  j.set("path", path);
  j.set("size", std::to_string(s.size));  // int64: a string in proto3-JSON
  j.set("mode", int64_t(s.mode & 07777));
  j.set("permissions", permissions(s));
  j.set("owner", s.owner.empty() ? "root" : s.owner);  // ("": an agent before protocol 2)
  j.set("group", s.group.empty() ? "root" : s.group);
  if (s.type == vmm::FileStat::Type::symlink && !s.symlink_target.empty())
    j.set("symlinkTarget", s.symlink_target);
  j.set("modifiedTime", rfc3339(s.mtime_ms));
  Json meta = Json::object();
  for (auto& [k, v] : s.metadata) meta.set(k, v);
  j.set("metadata", meta);
  return j;
}

Json entry_of(Call& c, const Target& t, const std::string& path) {
  return entry(path, unwrap(c.gw.rt.stat(t.tenant, t.id, path)));
}

HttpReply ok(Json j = Json::object()) { return json_reply(200, j); }

// ---- process.Process (unary) ----

HttpReply list_processes(Call& c) {
  auto t = target(c.gw, c.r);
  Json out = Json::array();
  for (auto& p : unwrap(c.gw.rt.list_processes(t.tenant, t.id))) {
    if (!p.running) continue;
    Json cfg = Json::object();
    cfg.set("cmd", p.command);
    cfg.set("args", Json::array());
    cfg.set("envs", Json::object());
    Json j = Json::object();
    j.set("pid", int64_t(p.pid));
    j.set("config", cfg);
    out.push(j);
  }
  Json j = Json::object();
  j.set("processes", out);
  return ok(j);
}

// envd: a process that ended is not found (our agent keeps ended ones listed).
// The running process `pid` (process_not_found when it is not running).
vmm::ProcessInfo require_running(Server& gw, const Target& t, uint32_t pid) {
  for (auto& p : unwrap(gw.rt.list_processes(t.tenant, t.id)))
    if (p.pid == pid && p.running) return p;
  throw ApiError{Code::process_not_found, "no running process " + std::to_string(pid)};
}

// A PTY's size ({"size":{"cols","rows"}}); each side 1..kMaxTerminalSide.
std::pair<uint16_t, uint16_t> pty_size(const Json& pty) {
  const Json& s = pty["size"];
  auto side = [&](const char* k) {
    if (!s[k].is_number() || s[k].as_double() < 1 || s[k].as_double() > kMaxTerminalSide)
      throw ApiError{Code::invalid_argument,
                     std::string("pty.size.") + k + " is 1.." + std::to_string(kMaxTerminalSide)};
    return uint16_t(s[k].as_int());
  };
  return {side("cols"), side("rows")};
}

HttpReply send_signal(Call& c) {
  auto t = target(c.gw, c.r);
  Json m = c.r.json();
  const Json& s = m["signal"];
  int sig = 9;
  if (s.is_string()) {
    if (s.as_string() == "SIGNAL_SIGTERM")
      sig = 15;
    else if (s.as_string() != "SIGNAL_SIGKILL")
      throw ApiError{Code::invalid_argument, "signal is SIGNAL_SIGKILL or SIGNAL_SIGTERM"};
  } else if (s.is_number()) {
    if (s.as_int() != 9 && s.as_int() != 15)
      throw ApiError{Code::invalid_argument, "signal is 9 or 15"};
    sig = int(s.as_int());
  }
  uint32_t pid = pid_of(m);
  require_running(c.gw, t, pid);
  unwrap(c.gw.rt.kill_process(t.tenant, t.id, pid, sig));
  return ok();
}

HttpReply send_input(Call& c) {
  auto t = target(c.gw, c.r);
  Json m = c.r.json();
  const Json& in = m["input"];
  bool pty = in.has("pty");
  auto data = base64_decode(str(in[pty ? "pty" : "stdin"], pty ? "input.pty" : "input.stdin"));
  if (!data) throw ApiError{Code::invalid_argument, "the input is not base64"};
  unwrap(c.gw.rt.write_stdin(t.tenant, t.id, pid_of(m), *data, false));
  return ok();
}

// Update: a PTY's new size.
HttpReply update(Call& c) {
  auto t = target(c.gw, c.r);
  Json m = c.r.json();
  if (!m["pty"].is_object()) return ok();  // nothing to change
  auto [cols, rows] = pty_size(m["pty"]);
  unwrap(c.gw.rt.resize_pty(t.tenant, t.id, pid_of(m), cols, rows));
  return ok();
}

HttpReply close_stdin(Call& c) {
  auto t = target(c.gw, c.r);
  unwrap(c.gw.rt.write_stdin(t.tenant, t.id, pid_of(c.r.json()), "", true));
  return ok();
}

// ---- filesystem.Filesystem ----

HttpReply stat(Call& c) {
  auto t = target(c.gw, c.r);
  auto path = guest_path(c.gw, str(c.r.json()["path"], "path"), t);
  Json j = Json::object();
  j.set("entry", entry_of(c, t, path));
  return ok(j);
}

HttpReply list_dir(Call& c) {
  auto t = target(c.gw, c.r);
  Json m = c.r.json();
  auto root = guest_path(c.gw, str(m["path"], "path"), t);
  int64_t depth = m["depth"].is_number() ? m["depth"].as_int() : 1;
  if (depth < 1 || depth > 16) throw ApiError{Code::invalid_argument, "depth is 1..16"};
  constexpr size_t kMaxEntries = 100000;  // as one listing of our own API
  constexpr size_t kMaxFolders = 10000;   // guest calls one listing makes
  Json entries = Json::array();
  std::vector<std::pair<std::string, int64_t>> todo = {{root, 1}};
  size_t folders = 0;
  while (!todo.empty()) {
    auto [dir, level] = todo.back();
    todo.pop_back();
    if (++folders > kMaxFolders)
      throw ApiError{Code::invalid_argument, "more than 10000 folders: list less deep"};
    auto listed = c.gw.rt.list_dir(t.tenant, t.id, dir);
    if (!listed && dir != root) continue;  // a folder that went away meanwhile
    for (auto& s : unwrap(std::move(listed))) {
      std::string p = (dir == "/" ? "" : dir) + "/" + s.name;
      entries.push(entry(p, s));
      if (entries.size() > kMaxEntries)
        throw ApiError{Code::invalid_argument, "more than 100000 entries: list less deep"};
      if (s.type == vmm::FileStat::Type::directory && level < depth) todo.push_back({p, level + 1});
    }
  }
  Json j = Json::object();
  j.set("entries", entries);
  return ok(j);
}

HttpReply make_dir(Call& c) {
  auto t = target(c.gw, c.r);
  auto path = guest_path(c.gw, str(c.r.json()["path"], "path"), t);
  if (c.gw.rt.stat(t.tenant, t.id, path)) throw ApiError{Code::file_exists, path + " exists"};
  unwrap(c.gw.rt.mkdir(t.tenant, t.id, path, true, t.as()));
  Json j = Json::object();
  j.set("entry", entry_of(c, t, path));
  return ok(j);
}

HttpReply move(Call& c) {
  auto t = target(c.gw, c.r);
  Json m = c.r.json();
  auto from = guest_path(c.gw, str(m["source"], "source"), t);
  auto to = guest_path(c.gw, str(m["destination"], "destination"), t);
  unwrap(c.gw.rt.rename(t.tenant, t.id, from, to));
  Json j = Json::object();
  j.set("entry", entry_of(c, t, to));
  return ok(j);
}

HttpReply remove(Call& c) {
  auto t = target(c.gw, c.r);
  auto path = guest_path(c.gw, str(c.r.json()["path"], "path"), t);
  // As E2B's envd: removing what is not there is done, not an error.
  auto removed = c.gw.rt.remove(t.tenant, t.id, path, true);
  if (!removed && removed.error().code == Code::file_not_found) return ok();
  unwrap(std::move(removed));
  return ok();
}

// ---- /files ----

HttpReply read_file(Call& c) {
  auto t = target(c.gw, c.r);
  auto path = guest_path(c.gw, c.r.q("path").value_or(""), t);
  auto data = unwrap(c.gw.rt.read_file(t.tenant, t.id, path, c.gw.limits.max_file_bytes));
  return HttpReply{200, "application/octet-stream", std::move(data), std::nullopt, {}};
}

// An upload's file metadata: its X-Metadata-<key> headers, keys in lower case (an upload
// without any clears the files' metadata).
std::map<std::string, std::string> upload_metadata(const Request& r) {
  std::map<std::string, std::string> m;
  constexpr std::string_view prefix = "x-metadata-";
  for (auto& [k, v] : r.headers)
    if (k.rfind(prefix, 0) == 0) m.emplace(k.substr(prefix.size()), v);
  if (auto bad = vmm::check_file_metadata(m)) throw ApiError{Code::invalid_argument, *bad};
  return m;
}

// POST /files: multipart parts (each named by its file name, or by ?path when there is one), or
// (envd >= 0.5.7) the file itself as application/octet-stream at ?path, gzip'd or not.
HttpReply write_files(Call& c) {
  auto t = target(c.gw, c.r);
  auto metadata = upload_metadata(c.r);
  auto single = c.r.q("path");
  std::string type = header_of(c.r, "content-type");
  std::string encoding = header_of(c.r, "content-encoding");
  std::vector<std::pair<std::string, std::string>> parts;
  if (type.rfind("application/octet-stream", 0) == 0) {
    if (!single) throw ApiError{Code::invalid_argument, "an octet-stream upload needs ?path"};
    parts.emplace_back(*single, std::move(c.r.body));
  } else {
    parts = multipart(type, c.r.body);
  }
  if (!encoding.empty() && encoding != "identity") {
    if (encoding != "gzip")
      throw ApiError{Code::invalid_argument, "Content-Encoding is gzip or none"};
    for (auto& [name, data] : parts) {
      auto plain = gunzip(data, c.gw.limits.max_file_bytes);
      if (!plain)
        throw ApiError{Code::invalid_argument, "the body is not gzip, or inflates past " +
                                                   std::to_string(c.gw.limits.max_file_bytes) +
                                                   " bytes"};
      data = std::move(*plain);
    }
  }
  Json out = Json::array();
  for (auto& [name, data] : parts) {
    auto path = guest_path(c.gw, single && parts.size() == 1 ? *single : name, t);
    auto slash = path.find_last_of('/');
    if (slash > 0) unwrap(c.gw.rt.mkdir(t.tenant, t.id, path.substr(0, slash), true, t.as()));
    unwrap(c.gw.rt.write_file(t.tenant, t.id, path, data, 0, 0, t.as(), metadata));
    // The REST EntryInfo: the RPC one's fields, with a plain type and a numeric size.
    auto st = unwrap(c.gw.rt.stat(t.tenant, t.id, path));
    Json j = entry(path, st);
    j.set("type", st.type == vmm::FileStat::Type::directory ? "dir" : "file");
    j.set("size", int64_t(st.size));
    out.push(j);
  }
  return json_reply(200, out);
}

HttpReply health(Call& c) {
  auto t = target(c.gw, c.r);
  auto s = unwrap(c.gw.rt.get(t.tenant, t.id));
  if (s.status != actors::SandboxStatus::running)
    throw ApiError{Code::sandbox_not_running,
                   "sandbox " + t.id + " is " + actors::to_string(s.status)};
  return no_content();
}

}  // namespace

// ---- process.Process Start / Connect: server streams ----

namespace e2b {

Route envd_route(M m, const char* path, const char* what, Handler h, std::vector<std::string> query,
                 Route::Kind kind) {
  Route r = route(m, path, what, std::move(h), std::move(query), kind, /*auth=*/false);
  r.style = Route::Style::e2b_envd;
  return r;
}

std::string header_of(const Request& r, const char* name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

actors::Reply<Tokens::Claims> verify_signed_url(Server& gw, const Request& r) {
  std::string id = header_of(r, "e2b-sandbox-id");
  if (id.empty())
    return actors::Rejection{Code::unauthorized,
                             "a signed URL names its sandbox in its host name (49983-ID.DOMAIN)"};
  std::string signature = r.q("signature").value_or("");
  std::optional<int64_t> expiration;
  if (auto e = r.q("signature_expiration")) {
    if (e->empty() || e->size() > 12 ||
        !std::all_of(e->begin(), e->end(), [](char c) { return c >= '0' && c <= '9'; }))
      return actors::Rejection{Code::invalid_argument,
                               "signature_expiration is a Unix time in seconds"};
    expiration = std::stoll(*e);
  }
  // Checking costs up to kMaxSigningKeys * 25 hashes: bounded per sandbox like any request.
  if (!gw.limiter.take("e2b-signed:" + id, kSignedUrlsPerSecond))
    return actors::Rejection{Code::too_many_requests,
                             "more than " + std::to_string(kSignedUrlsPerSecond) +
                                 " signed URL requests per second for this sandbox"};
  auto s = gw.rt.preview_target(id);  // (whoever's: the signature is the proof)
  if (!s) return actors::Rejection{Code::unauthorized, "invalid signature"};
  auto keys = gw.rt.list_keys();
  if (!keys) return keys.error();
  const std::string op = r.method == kj::HttpMethod::GET ? "read" : "write";
  const std::string path = r.q("path").value_or(""), user = r.q("username").value_or("");
  const int64_t now = int64_t(std::time(nullptr));
  size_t tried = 0;
  for (auto& k : *keys) {
    if (k.tenant != s->tenant) continue;
    if (++tried > kMaxSigningKeys) break;
    for (auto& token : tokens().live(s->tenant, k.id, id, now)) {
      if (!equal_secret(file_signature(path, op, user, token, expiration), signature)) continue;
      // E2B's order: a signature that matches, then its expiry.
      if (expiration && *expiration < now)
        return actors::Rejection{Code::unauthorized, "signature is already expired"};
      return Tokens::Claims{s->tenant, k.id, 0};
    }
  }
  return actors::Rejection{Code::unauthorized, "invalid signature"};
}

// The sandbox a request is for, and whose it is (from its access token).
Target target(Server& gw, const Request& r) {
  // (The server verified the token for this sandbox before the request got here.)
  if (r.token_tenant.empty()) throw ApiError{Code::unauthorized, "no verified access token"};
  // A token ends with the key it was issued under (revoked: within the key cache's 2 s).
  auto key = gw.rt.key_by_id(r.token_key);
  if (!key || key->tenant != r.token_tenant)
    throw ApiError{Code::unauthorized,
                   "the access token's API key was revoked: connect again with a live key"};
  Target t{r.token_tenant, header_of(r, "e2b-sandbox-id")};
  std::string user;
  if (auto u = r.q("username"); u && !u->empty()) {
    user = *u;
  } else if (r.authorization.rfind("Basic ", 0) == 0 && r.authorization.size() < 512) {
    if (auto d = base64_decode(r.authorization.substr(6))) user = d->substr(0, d->find(':'));
  }
  if (!user.empty()) {
    if (!valid_user_name(user))
      throw ApiError{Code::invalid_argument, "'" + user.substr(0, 64) + "' is not a user name"};
    t.user = user;
    t.home = user == "root" ? "/root" : "/home/" + user;
  }
  uint32_t rate = gw.rt.quota_limits(t.tenant).requests_per_second;
  if (!gw.limiter.take("e2b:" + t.tenant, rate))
    throw ApiError{Code::too_many_requests,
                   "this tenant sent more than " + std::to_string(rate) + " requests per second"};
  return t;
}

namespace {
// The end-stream envelope of a Connect stream: with an error when `code` is given.
void finish_stream(StreamChannel& ch, std::optional<Code> code = std::nullopt,
                   const std::string& message = "") {
  Json j = Json::object();
  if (code) {
    Json e = Json::object();
    // The sandbox went away mid-stream (killed, failed, its VM gone): `unavailable`, which E2B's
    // SDK reports as a TimeoutError, as it does when its sandbox is killed mid-request.
    bool gone = sandbox_gone(code);
    e.set("code", gone ? "unavailable" : connect_code(*code));
    e.set("message", gone ? "The sandbox was killed or reached its end of life while the "
                            "request was in flight (" +
                                message + ")"
                          : message);
    j.set("error", e);
  }
  ch.begin();
  ch.finish(envelope(j, 2));
}
}  // namespace

// Runs on a stream worker: the process's events as Connect envelopes, then the end-stream.
void produce_process(Server& gw, const Request& r, StreamChannel& ch) {
  std::stop_callback on_shutdown(gw.shutting_down.get_token(), [&ch] { ch.stop.request_stop(); });
  Target t;
  uint32_t pid = 0;
  bool pty = false;  // its output is a terminal's
  bool start = r.route == "/process.Process/Start";
  try {
    t = target(gw, r);
    Json m = read_envelope(r.body);
    if (start) {
      const Json& p = m["process"];
      vmm::ExecRequest e;
      e.argv.push_back(str(p["cmd"], "process.cmd"));
      if (p["args"].is_array())
        for (auto& a : p["args"].as_array()) e.argv.push_back(str(a, "process.args"));
      // The sandbox's create-time envVars, then the request's (which win).
      e.env = sandbox_env(gw, unwrap(gw.rt.get(t.tenant, t.id)));
      if (p["envs"].is_object())
        for (auto& [k, v] : p["envs"].as_object()) e.env[k] = str(v, "process.envs");
      e.cwd = p["cwd"].is_string() ? guest_path(gw, p["cwd"].as_string(), t) : t.home;
      e.user = t.as();
      // Old clients omit stdin: open.
      e.keep_stdin_open = !m["stdin"].is_bool() || m["stdin"].as_bool();
      if (m["pty"].is_object()) {
        e.pty = pty = true;
        std::tie(e.cols, e.rows) = pty_size(m["pty"]);
      }
      // Connect-Timeout-Ms is the process's lifetime (none: no limit).
      auto timeout = header_of(r, "connect-timeout-ms");
      if (!timeout.empty()) {
        if (timeout.size() > 10 || timeout.find_first_not_of("0123456789") != std::string::npos)
          throw ApiError{Code::invalid_argument, "Connect-Timeout-Ms is a number of milliseconds"};
        uint64_t ms = std::stoull(timeout);
        e.timeout_ms =
            uint32_t(std::min<uint64_t>(ms, uint64_t(gw.limits.max_exec_timeout_s) * 1000));
      }
      if (auto refused = check_exec(e, gw.limits)) throw ApiError{refused->code, refused->message};
      pid = unwrap(gw.rt.start_process(t.tenant, t.id, e));
    } else {
      pid = pid_of(m);
      pty = require_running(gw, t, pid).pty;
    }
  } catch (const ApiError& e) {
    if (sandbox_gone(e.code)) return ch.fail_early(envd_error(error_reply(e)));
    return finish_stream(ch, e.code, e.message);
  } catch (const std::exception& e) {
    return finish_stream(ch, Code::internal, e.what());
  }
  Json started = Json::object(), ev = Json::object(), pj = Json::object();
  pj.set("pid", int64_t(pid));
  ev.set("start", pj);
  started.set("event", ev);
  ch.push(envelope(started));
  ch.begin();
  auto on_output = [&ch, pty](vmm::StreamKind k, std::string_view d) {
    Json data = Json::object(), ev = Json::object(), msg = Json::object();
    data.set(pty ? "pty" : k == vmm::StreamKind::out ? "stdout" : "stderr", base64_encode(d));
    ev.set("data", data);
    msg.set("event", ev);
    ch.push(envelope(msg));
  };
  auto res = gw.rt.stream_process(t.tenant, t.id, pid, on_output, ch.stop.get_token());
  bool overflow;
  {
    std::lock_guard l(ch.mu);
    overflow = ch.overflowed;
  }
  if (overflow) return finish_stream(ch, Code::client_too_slow, "the client read too slowly");
  if (!res) return finish_stream(ch, res.error().code, res.error().message);
  Json end = Json::object();
  int code = res->exit_code;
  bool signalled = code < 0;
  end.set("exitCode", signalled ? -1 : code);
  end.set("exited", !signalled);
  std::string status = signalled
                           ? (code == -9 ? "signal: killed" : "signal: " + std::to_string(-code))
                           : "exit status " + std::to_string(code);
  end.set("status", status);
  if (code != 0) end.set("error", res->error.empty() ? status : res->error);
  Json ev2 = Json::object(), msg = Json::object();
  ev2.set("end", end);
  msg.set("event", ev2);
  ch.push(envelope(msg));
  finish_stream(ch);
}

// Runs on a stream worker: WatchDir's start, then a filesystem event per change, until the
// client leaves (or the folder goes: the end-stream).
void produce_watch(Server& gw, const Request& r, StreamChannel& ch) {
  std::stop_callback on_shutdown(gw.shutting_down.get_token(), [&ch] { ch.stop.request_stop(); });
  Target t;
  std::string root;
  bool recursive = false, include_entry = false;
  try {
    t = target(gw, r);
    Json m = read_envelope(r.body);
    root = guest_path(gw, str(m["path"], "path"), t);
    recursive = m["recursive"].is_bool() && m["recursive"].as_bool();
    // (allowNetworkMounts: every folder of ours can be watched, volumes included)
    include_entry = m["includeEntry"].is_bool() && m["includeEntry"].as_bool();
  } catch (const ApiError& e) {
    if (sandbox_gone(e.code)) return ch.fail_early(envd_error(error_reply(e)));
    return finish_stream(ch, e.code, e.message);
  }
  auto on_ready = [&ch] {
    Json j = Json::object();
    j.set("start", Json::object());
    ch.push(envelope(j));
    ch.begin();
  };
  auto on_events = [&ch, &root](const std::vector<vmm::WatchEvent>& events) {
    for (auto& e : events) {
      // E2B's names are ours as EVENT_TYPE_*; it has none for an overflow.
      if (e.kind == vmm::WatchEvent::Kind::overflow || e.path.empty()) continue;
      std::string type = std::string("EVENT_TYPE_") + vmm::to_string(e.kind);
      for (auto& c : type) c = char(std::toupper(static_cast<unsigned char>(c)));
      Json fs = Json::object(), j = Json::object();
      fs.set("name", e.path);
      fs.set("type", type);
      if (e.entry) fs.set("entry", entry((root == "/" ? "" : root) + "/" + e.path, *e.entry));
      j.set("filesystem", fs);
      ch.push(envelope(j));
    }
  };
  auto res = gw.rt.watch(t.tenant, t.id, root, recursive, on_ready, on_events, ch.stop.get_token(),
                         include_entry);
  if (!res && res.error().code == Code::cancelled) return finish_stream(ch);
  if (!res) {
    if (sandbox_gone(res.error().code)) return ch.fail_early(envd_error(error_reply(res.error())));
    return finish_stream(ch, res.error().code, res.error().message);
  }
  finish_stream(ch);
}

}  // namespace e2b

kj::Promise<void> Server::connect_stream(const Route& route, Request req,
                                         kj::HttpService::Response& response,
                                         Clock::time_point t0) {
  auto ch = std::make_shared<StreamChannel>(limits.max_stream_buffer_bytes);
  // /execute answers NDJSON (no keepalive: every line must be JSON); the rest Connect envelopes.
  bool ndjson = route.pattern == "/execute";
  std::string content_type = ndjson ? "application/x-ndjson" : "application/connect+json";
  if (ndjson) {
    ch->keepalive = "";
  } else if (route.pattern == "/filesystem.Filesystem/WatchDir") {
    Json ka = Json::object();
    ka.set("keepalive", Json::object());
    ch->keepalive = e2b::envelope(ka);
  } else {
    Json ka = Json::object(), ev = Json::object();
    ev.set("keepalive", Json::object());
    ka.set("event", ev);
    ch->keepalive = e2b::envelope(ka);
  }
  auto r = std::make_shared<Request>(std::move(req));
  bool process =
      route.pattern == "/process.Process/Start" || route.pattern == "/process.Process/Connect";
  bool queued = stream_pool->submit([this, r, ch, process, ndjson] {
    if (ndjson) return e2b::produce_execute(*this, *r, *ch);
    if (process) return e2b::produce_process(*this, *r, *ch);
    e2b::produce_watch(*this, *r, *ch);
  });
  if (!queued) return send(response, e2b::envd_error(busy_reply()), t0);
  return respond(ch, response, t0, content_type);
}

std::vector<Route> e2b_envd_routes() {
  using K = Route::Kind;
  return {
      envd_route(M::POST, "/process.Process/Start", "E2B envd: start a process, stream its events",
                 {}, {}, K::stream),
      envd_route(M::POST, "/process.Process/Connect", "E2B envd: a running process's events", {},
                 {}, K::stream),
      envd_route(M::POST, "/process.Process/List", "E2B envd: running processes", list_processes),
      envd_route(M::POST, "/process.Process/SendSignal", "E2B envd: SIGKILL or SIGTERM a process",
                 send_signal),
      envd_route(M::POST, "/process.Process/SendInput", "E2B envd: write to a process's stdin",
                 send_input),
      envd_route(M::POST, "/process.Process/CloseStdin", "E2B envd: close a process's stdin",
                 close_stdin),
      envd_route(M::POST, "/process.Process/Update", "E2B envd: resize a PTY", update),
      envd_route(M::POST, "/filesystem.Filesystem/Stat", "E2B envd: one entry", stat),
      envd_route(M::POST, "/filesystem.Filesystem/ListDir", "E2B envd: a folder's entries",
                 list_dir),
      envd_route(M::POST, "/filesystem.Filesystem/MakeDir", "E2B envd: make a folder (and parents)",
                 make_dir),
      envd_route(M::POST, "/filesystem.Filesystem/Move", "E2B envd: rename", move),
      envd_route(M::POST, "/filesystem.Filesystem/Remove", "E2B envd: remove (recursively)",
                 remove),
      envd_route(M::POST, "/filesystem.Filesystem/WatchDir", "E2B envd: a folder's changes", {}, {},
                 K::stream),
      envd_route(M::GET, "/files", "E2B envd: a file's bytes", read_file,
                 {"path", "username", "signature", "signature_expiration"}),
      envd_route(M::POST, "/files", "E2B envd: upload files (multipart or octet-stream)",
                 write_files, {"path", "username", "signature", "signature_expiration"},
                 K::raw_body),
      envd_route(M::GET, "/health", "E2B envd: 204 while the sandbox runs", health),
  };
}

}  // namespace pandastack::gateway
