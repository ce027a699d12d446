#include "gateway/api_types.h"

#include <cctype>

#include "actors/event_codec.h"
#include "gateway/e2b.h"
#include "gateway/http_util.h"

namespace pandastack::gateway {

HttpReply json_reply(unsigned status, const Json& j) {
  return {status, "application/json", j.dump(), std::nullopt, {}};
}

HttpReply busy_reply() { return error_reply(Code::too_many_requests, "the server is busy"); }

HttpReply error_reply(const actors::Rejection& e) {
  const Code code = e.code;
  HttpReply r{
      http_status(code), "application/json", error_body(code, e.message, e.quota), code, {}};
  // Refused for now, not for good: say when to come back (the SDKs retry after it).
  if (code == Code::too_many_execs || code == Code::too_many_requests ||
      code == Code::exec_failed || code == Code::host_full)
    r.headers.emplace_back("Retry-After", "1");
  return r;
}

HttpReply no_content() { return {204, "", "", std::nullopt, {}}; }

std::string Request::param(const std::string& k) const {
  auto it = params.find(k);
  return it == params.end() ? "" : it->second;
}

std::optional<std::string> Request::q(const std::string& k) const {
  auto it = query.find(k);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

Json Request::json() const {
  if (body.empty()) return Json::object();
  Json::ParseError err;
  auto j = Json::parse(body, &err);
  if (!j)
    throw ApiError{Code::invalid_json, "request body is not valid JSON (at byte " +
                                           std::to_string(err.offset) + ": " + err.message + ")"};
  if (!j->is_object()) throw ApiError{Code::invalid_json, "request body must be a JSON object"};
  return *j;
}

Fields::Fields(Json j, std::initializer_list<const char*> known) : j_(std::move(j)) {
  for (auto& [k, v] : j_.as_object()) {
    bool ok = false;
    for (auto* n : known) ok |= k == n;
    if (!ok) throw ApiError{Code::invalid_argument, "unknown field '" + k + "'"};
  }
}

bool Fields::has(const char* k) const { return j_.has(k) && !j_[k].is_null(); }

std::string Fields::str(const char* k, std::string def) const {
  if (!has(k)) return def;
  if (!j_[k].is_string())
    throw ApiError{Code::invalid_argument, std::string(k) + " must be a string"};
  return j_[k].as_string();
}

bool Fields::boolean(const char* k, bool def) const {
  if (!has(k)) return def;
  if (!j_[k].is_bool())
    throw ApiError{Code::invalid_argument, std::string(k) + " must be a boolean"};
  return j_[k].as_bool();
}

int64_t Fields::integer(const char* k, int64_t def, int64_t lo, int64_t hi) const {
  if (!has(k)) return def;
  auto range = [&] {
    return ApiError{Code::invalid_argument, std::string(k) + " must be an integer within " +
                                                std::to_string(lo) + ".." + std::to_string(hi)};
  };
  if (!j_[k].is_integer()) {
    // A number too large for 64 bits is out of range, not "not an integer".
    if (j_[k].is_number()) throw range();
    throw ApiError{Code::invalid_argument, std::string(k) + " must be an integer"};
  }
  auto v = j_[k].as_int();
  if (v < lo || v > hi) throw range();
  return v;
}

std::map<std::string, std::string> Fields::string_map(const char* k) const {
  std::map<std::string, std::string> out;
  if (!has(k)) return out;
  if (!j_[k].is_object())
    throw ApiError{Code::invalid_argument, std::string(k) + " must be an object of strings"};
  for (auto& [mk, mv] : j_[k].as_object()) {
    if (!mv.is_string())
      throw ApiError{Code::invalid_argument, std::string(k) + "." + mk + " must be a string"};
    out[mk] = mv.as_string();
  }
  return out;
}

Json Fields::object(const char* k) const {
  if (!has(k)) return Json::object();
  if (!j_[k].is_object())
    throw ApiError{Code::invalid_argument, std::string(k) + " must be an object"};
  return j_[k];
}

std::vector<std::string> Fields::string_list(const char* k) const {
  std::vector<std::string> out;
  if (!has(k)) return out;
  if (!j_[k].is_array())
    throw ApiError{Code::invalid_argument, std::string(k) + " must be an array of strings"};
  for (auto& v : j_[k].as_array()) {
    if (!v.is_string())
      throw ApiError{Code::invalid_argument, std::string(k) + " must be an array of strings"};
    out.push_back(v.as_string());
  }
  return out;
}

actors::Egress egress_from(const Json& j) {
  Fields f(j, {"mode", "cidrs", "domains"});
  actors::Egress e;
  e.cidrs = f.string_list("cidrs");
  e.domains = f.string_list("domains");
  e.mode = f.str("mode", e.cidrs.empty() && e.domains.empty() ? "deny_all" : "allowlist");
  return e;
}

Json sandbox_json(const actors::SandboxInfo& i) {
  Json j = Json::object();
  j.set("id", i.id);
  j.set("template", actors::template_display_name(i.template_name));  // (a custom one: its name)
  j.set("state", actors::to_string(i.status));
  j.set("memory_mib", int64_t(i.memory_mib));  // its guest's shape: its template's
  j.set("vcpus", int64_t(i.vcpus));
  j.set("created_at_ms", i.created_at_ms);
  // A managed database's sandbox never expires: null.
  bool never = i.ttl_seconds == actors::kNoExpiry;
  j.set("expires_at_ms", never ? Json() : Json(i.expires_at_ms));
  j.set("persistent", i.persistent);
  j.set("auto_wake", i.auto_wake);
  j.set("ttl_seconds", never ? Json() : Json(int64_t(i.ttl_seconds)));
  j.set("idle_timeout_seconds", i.idle_timeout_seconds);
  j.set("on_timeout", i.on_timeout == actors::ReapAction::kill ? "kill" : "hibernate");
  j.set("hibernate_memory", !i.timeout_disk_only);
  if (i.status == actors::SandboxStatus::hibernated) {
    j.set("hibernated_memory", !i.hibernated_disk_only);  // false: a wake boots on its disk
    // "local": a synced copy is on the host's data disk (it survives a reboot); "none": only on
    // the host's tmpfs so far (persisted in the background after the hibernate answered).
    j.set("durable", i.hibernation_remote ? "remote" : i.hibernation_durable ? "local" : "none");
  }
  // (E2B envVars kept as metadata by sandboxes created before: never answered.)
  std::map<std::string, std::string> md;
  for (auto& [k, v] : i.metadata)
    if (k.rfind(e2b::kEnvPrefix, 0) != 0) md.emplace(k, v);
  j.set("metadata", actors::string_map_json(md));
  if (!i.parent.empty()) j.set("parent", i.parent);
  Json snaps = Json::array();
  for (auto& s : i.snapshots) snaps.push(s);
  j.set("snapshots", snaps);
  if (!i.failure_reason.empty()) j.set("failure_reason", i.failure_reason);
  if (!i.moved_to.empty()) j.set("moved_to", i.moved_to);  // ended here: that host runs it now
  j.set("tenant", i.tenant);
  j.set("version", i.version);  // events in the sandbox's stream
  j.set("network", i.network);
  if (i.network) {
    j.set("egress", actors::egress_json(i.egress));
    Json ports = Json::array();
    for (auto p : i.ports) ports.push(p);
    j.set("ports", ports);  // exposed guest ports (GET .../ports has their host addresses)
  }
  Json vols = Json::array();
  for (auto& v : i.volumes) {
    Json o = Json::object();
    o.set("volume", v.volume);
    o.set("mount", v.mount);
    o.set("read_only", v.read_only);
    vols.push(o);
  }
  j.set("volumes", vols);
  return j;
}

Json volume_snapshot_json(const std::string& volume, const actors::VolumeSnapshot& s) {
  Json j = Json::object();
  j.set("id", s.id);
  j.set("volume", volume);
  j.set("size_mib", s.size_mib);
  j.set("created_at_ms", s.created_at_ms);
  return j;
}

Json volume_json(const actors::VolumeInfo& v) {
  Json j = Json::object();
  j.set("id", v.id);
  j.set("name", v.name);
  // "in_use" while a sandbox holds it (exploratory test 3 #20), else what its record says.
  j.set("status", v.status == "available" && !v.attachments.empty() ? "in_use" : v.status);
  j.set("size_mib", v.size_mib);
  j.set("metadata", actors::string_map_json(v.metadata));
  j.set("created_at_ms", v.created_at_ms);
  if (!v.origin.empty()) j.set("origin", v.origin);  // what it is a copy of
  Json at = Json::array();
  for (auto& a : v.attachments) {
    Json o = Json::object();
    o.set("sandbox", a.sandbox);
    o.set("mount", a.mount);
    o.set("read_only", a.read_only);
    at.push(o);
  }
  j.set("attachments", at);
  Json snaps = Json::array();
  for (auto& s : v.snapshots) snaps.push(volume_snapshot_json(v.id, s));
  j.set("snapshots", snaps);
  j.set("version", v.version);  // events in the volume's stream
  // "remote": its file as it is, detached, is in the host's object store too; "local": on the
  // data disk only (attached, or not uploaded yet)
  if (v.status == "available") j.set("durable", v.stored ? "remote" : "local");
  return j;
}

bool is_text(std::string_view d) {
  return d.find('\0') == std::string_view::npos && wire::is_valid_utf8(d);
}

namespace {
void set_output(Json& j, const char* name, const std::string& data, bool truncated) {
  bool text = is_text(data);
  j.set(name, text ? data : base64_encode(data));
  j.set(std::string(name) + "_encoding", text ? "utf-8" : "base64");
  j.set(std::string(name) + "_truncated", truncated);
}
}  // namespace

Json exec_json(const vmm::ExecResult& r) {
  Json j = Json::object();
  set_output(j, "stdout", r.stdout_data, r.stdout_truncated);
  set_output(j, "stderr", r.stderr_data, r.stderr_truncated);
  j.set("exit_code", r.exit_code);
  j.set("timed_out", r.timed_out);
  j.set("duration_ms", double(r.duration_us) / 1000.0);
  return j;
}

Json stat_json(const vmm::FileStat& s) {
  static const char* types[] = {"file", "directory", "symlink", "other"};
  Json j = Json::object();
  j.set("name", s.name);
  j.set("type", types[int(s.type)]);
  j.set("size", s.size);
  j.set("mode", s.mode);
  j.set("mtime_ms", s.mtime_ms);
  return j;
}

namespace {
// A metadata key naming a credential: containing key, token, secret or password (any case), or an
// E2B envVar kept as metadata before envVars moved into the guest (e2b.env.*).
bool sensitive_metadata_key(std::string_view k) {
  if (k.rfind(e2b::kEnvPrefix, 0) == 0) return true;  // E2B envVars kept as metadata before (M5)
  std::string lower = ascii_lower(k);
  for (const char* word : {"key", "token", "secret", "password"})
    if (lower.find(word) != std::string::npos) return true;
  return false;
}
}  // namespace

Json audit_json(const actors::AuditEvent& e) {
  Json j = Json::object();
  j.set("sandbox", e.stream);  // the entity: a sandbox, or a volume (vol_...)
  j.set("stream", e.stream);
  j.set("version", e.version);
  j.set("seq", e.global_seq);
  j.set("time_ms", e.time_ms);
  j.set("type", e.type);
  auto ev = Json::parse(e.json);
  // The log keeps what a metadata value was set to, except where its name says it is a
  // credential: the audit trail shows that it was set, not what it is.
  if (ev && ev->is_object() && (*ev)["metadata"].is_object()) {
    Json md = Json::object();
    for (auto& [k, v] : (*ev)["metadata"].as_object())
      md.set(k, sensitive_metadata_key(k) ? Json("[redacted]") : v);
    ev->set("metadata", md);
  }
  j.set("event", ev ? *ev : Json());
  return j;
}

Json chunk_json(std::string_view d) {
  Json j = Json::object();
  bool text = is_text(d);
  j.set("data", text ? std::string(d) : base64_encode(d));
  if (!text) j.set("encoding", "base64");
  return j;
}

std::string sse_frame(const std::string& event, const Json& data) {
  return "event: " + event + "\ndata: " + data.dump() + "\n\n";
}

uint32_t parse_number(const std::string& s, const char* what, uint32_t lo, uint32_t hi) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(s) < lo || std::stoul(s) > hi)
    throw ApiError{Code::invalid_argument, std::string(what) + " must be an integer within " +
                                               std::to_string(lo) + ".." + std::to_string(hi)};
  return uint32_t(std::stoul(s));
}

uint32_t parse_pid(const std::string& s) { return parse_number(s, "pid", 0, 999999999); }

int64_t query_int(const Request& r, const char* k, int64_t def, int64_t hi) {
  auto v = r.q(k);
  if (!v) return def;
  if (v->empty() || v->size() > 18 || v->find_first_not_of("0123456789") != std::string::npos)
    throw ApiError{Code::invalid_argument, std::string(k) + " must be a non-negative integer"};
  auto n = std::stoll(*v);
  if (n > hi)
    throw ApiError{Code::invalid_argument, std::string(k) + " is at most " + std::to_string(hi)};
  return n;
}

bool query_flag(const Request& r, const char* k, bool def) {
  auto v = r.q(k);
  if (!v) return def;
  if (*v == "1" || *v == "true") return true;
  if (*v == "0" || *v == "false") return false;
  throw ApiError{Code::invalid_argument, std::string(k) + " must be 1, 0, true or false"};
}

const char* method_name(kj::HttpMethod m) {
  switch (m) {
    case kj::HttpMethod::GET:
      return "get";
    case kj::HttpMethod::HEAD:
      return "head";
    case kj::HttpMethod::POST:
      return "post";
    case kj::HttpMethod::PUT:
      return "put";
    case kj::HttpMethod::DELETE:
      return "delete";
    case kj::HttpMethod::PATCH:
      return "patch";
    default:
      return "other";
  }
}

}  // namespace pandastack::gateway
