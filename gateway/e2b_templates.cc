// E2B's template builder (`Template().fromTemplate(...).runCmd(...)...` and `Template.build` of
// the e2b SDK) on our custom templates (actors/template_builds.h). The SDK asks for a build
// (POST /v3/templates: a template id, a build id), starts it with its steps
// (POST /v2/templates/{templateID}/builds/{buildID}) and polls its status and log
// (GET /templates/{templateID}/builds/{buildID}/status). The steps become a Dockerfile of ours
// (actors/dockerfile.h), built in a builder microVM like every template; a template's id is its
// name, and E2B's Sandbox.create(name) makes sandboxes of it.
//
// Served: fromTemplate (a shipped template, or one of the tenant's own: a build, an imported or
// pulled image), E2B's default image (e2bdev/base: our base) or fromImage(any other: pulled by
// the build, actors/dockerfile.h kFromImagePrefix), RUN
// (with its user), ENV, WORKDIR, USER, setStartCmd/setReadyCmd (TemplateSpec::start and
// ready_cmd: started before the bake, so every sandbox restores with it running), cpuCount and
// memoryMB. aptInstall's command, exactly as the SDK writes it, becomes the build's Debian
// packages (the builder has no network; packages are installed before the steps). A build of an
// existing template replaces it (refused while sandboxes of it run). COPY: the SDK uploads each
// step's files as a tar (GET /templates/{id}/files/{hash} says whether we keep it, and where to
// PUT it: here, with the key the SDK called with) kept as a build context of the tenant's
// (actors/build_context.h) under E2B's hash; the build's archives are unpacked together, in
// order, in a builder microVM, and each COPY is the Dockerfile's (its user and mode as --chown
// and --chmod). Not served (501): registry credentials (fromImageRegistry), tags.
#include <openssl/rand.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <string_view>

#include "actors/build_context.h"
#include "actors/dockerfile.h"
#include "actors/template_builds.h"
#include "gateway/e2b.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;
using namespace e2b;

// A build asked for (POST /v3/templates) and not started yet: kept in memory, at most
// kMaxPending (the oldest dropped; a restart forgets them: the SDK asks again).
struct Pending {
  std::string build_id, tenant, name;
  uint32_t memory_mib = 0, vcpus = 0;
};
constexpr size_t kMaxPending = 256;
std::mutex pending_mu;
std::deque<Pending> pending;

std::string new_build_id() {  // a UUID v4, as E2B's
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) throw ApiError{Code::internal, "no randomness"};
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += hex[b[i] >> 4];
    out += hex[b[i] & 15];
  }
  return out;
}

std::string template_param(const Call& c) {
  std::string t = c.r.param("templateID");
  if (t.empty() || t.size() > 64) throw ApiError{Code::template_not_found, "no such template"};
  return t;
}

HttpReply request_build(Call& c) {
  Json b = c.r.json();
  std::string name = b["name"].is_string()    ? b["name"].as_string()
                     : b["alias"].is_string() ? b["alias"].as_string()
                                              : "";
  if (name.empty()) throw ApiError{Code::invalid_argument, "name is required"};
  if (name.find(':') != std::string::npos ||
      (b["tags"].is_array() && !b["tags"].as_array().empty()))
    throw ApiError{Code::not_implemented, "template tags are not served here"};
  if (auto no = actors::check_template_name(name)) throw ApiError{no->code, no->message};
  Pending p;
  p.build_id = new_build_id();
  p.tenant = c.tenant();
  p.name = name;
  if (b["memoryMB"].is_number()) p.memory_mib = uint32_t(b["memoryMB"].as_int());
  if (b["cpuCount"].is_number()) p.vcpus = uint32_t(b["cpuCount"].as_int());
  {
    std::lock_guard l(pending_mu);
    if (pending.size() >= kMaxPending) pending.pop_front();
    pending.push_back(p);
  }
  Json out = Json::object();
  out.set("templateID", name);
  out.set("buildID", p.build_id);
  Json names = Json::array();
  names.push(name);
  out.set("names", names);
  out.set("aliases", names);
  out.set("tags", Json::array());
  out.set("public", false);
  return json_reply(202, out);
}

// Text as a double-quoted word of our Dockerfile lexer.
std::string dq(const std::string& v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\' || c == '$') out += '\\';
    out += c;
  }
  return out + "\"";
}

// aptInstall's command as the SDK writes it: the packages, or nothing. The form: the prefix,
// "--no-install-recommends " and "--fix-missing " each optional and in that order, then one or
// more names of [a-z0-9][a-z0-9+.:-]* separated by single spaces.
std::optional<std::vector<std::string>> apt_install(const std::string& cmd) {
  constexpr std::string_view kPrefix =
      "apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y ";
  std::string_view rest = cmd;
  if (rest.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  rest.remove_prefix(kPrefix.size());
  for (std::string_view flag : {"--no-install-recommends ", "--fix-missing "})
    if (rest.substr(0, flag.size()) == flag) rest.remove_prefix(flag.size());
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  std::vector<std::string> out;
  for (;;) {
    size_t sp = rest.find(' ');
    std::string_view name = rest.substr(0, sp);
    if (name.empty() || !alnum(name[0])) return std::nullopt;
    for (char c : name)
      if (!alnum(c) && c != '+' && c != '.' && c != ':' && c != '-') return std::nullopt;
    out.emplace_back(name);
    if (sp == std::string_view::npos) return out;
    rest.remove_prefix(sp + 1);
  }
}

// The E2B build (TemplateBuildStartV2) as a template spec.
actors::TemplateSpec spec_of(const Json& b, const Pending& p, const std::string& tenant,
                             actors::Runtime& rt) {
  std::string from;
  if (b["fromImageRegistry"].is_object())
    throw ApiError{Code::not_implemented,
                   "fromImage with registry credentials is not served here: pull the image as a "
                   "template of yours with a secret (POST /v1/templates {name, image, "
                   "registry_secret}), then build fromTemplate(NAME)"};
  if (b["fromTemplate"].is_string() && !b["fromTemplate"].as_string().empty()) {
    from = template_for(b["fromTemplate"].as_string());
  } else if (b["fromImage"].is_string()) {
    // e2bdev/base is our base; any other image is pulled by the build (anonymously: a private
    // registry's image is pulled first with its secret, POST /v1/templates {name, image,
    // registry_secret}, then built fromTemplate(NAME)).
    const auto& image = b["fromImage"].as_string();
    if (image.empty() || image.find_first_of(" \t\r\n\"\\") != std::string::npos)
      throw ApiError{Code::invalid_argument, "fromImage: an image reference"};
    from = image == "e2bdev/base" || image == "e2bdev/base:latest" ? "base"
           : image.find_first_of("/:@") == std::string::npos       ? image + ":latest"
                                                                   : image;
  } else {
    throw ApiError{Code::invalid_argument, "fromTemplate or fromImage is required"};
  }
  std::string dockerfile = "FROM " + from + "\n";
  std::vector<std::string> packages;
  std::string user;                   // the current USER ("": root)
  std::vector<std::string> contexts;  // the COPY steps' archives
  const Json& steps = b["steps"];
  if (!steps.is_null() && !steps.is_array())
    throw ApiError{Code::invalid_argument, "steps is a list"};
  size_t n = 0;
  for (auto& s : steps.is_array() ? steps.as_array() : Json::Array{}) {
    ++n;
    std::string type = s["type"].is_string() ? s["type"].as_string() : "";
    std::vector<std::string> args;
    if (s["args"].is_array())
      for (auto& a : s["args"].as_array()) {
        if (!a.is_string()) throw ApiError{Code::invalid_argument, "a step's args are strings"};
        args.push_back(a.as_string());
      }
    auto step = "step " + std::to_string(n) + " (" + type + ")";
    if (type == "RUN") {
      if (args.empty()) throw ApiError{Code::invalid_argument, step + ": a command"};
      std::string as = args.size() > 1 ? args[1] : "";
      if (auto pkgs = apt_install(args[0]);
          pkgs && (as == "root" || (as.empty() && user.empty()))) {
        packages.insert(packages.end(), pkgs->begin(), pkgs->end());
        continue;
      }
      Json exec = Json::array();
      for (auto* w : {"/bin/sh", "-c"}) exec.push(w);
      exec.push(args[0]);
      bool switched = !as.empty() && as != (user.empty() ? "root" : user);
      if (switched) dockerfile += "USER " + as + "\n";
      dockerfile += "RUN " + exec.dump() + "\n";
      if (switched) dockerfile += "USER " + (user.empty() ? std::string("root") : user) + "\n";
    } else if (type == "ENV") {
      if (args.empty() || args.size() % 2)
        throw ApiError{Code::invalid_argument, step + ": name, value pairs"};
      dockerfile += "ENV";
      for (size_t i = 0; i < args.size(); i += 2)
        dockerfile += " " + args[i] + "=" + dq(args[i + 1]);
      dockerfile += "\n";
    } else if (type == "WORKDIR") {
      if (args.size() != 1) throw ApiError{Code::invalid_argument, step + ": a path"};
      dockerfile += "WORKDIR " + dq(args[0]) + "\n";
    } else if (type == "USER") {
      if (args.size() != 1) throw ApiError{Code::invalid_argument, step + ": a user"};
      user = args[0] == "root" ? "" : args[0];
      dockerfile += "USER " + args[0] + "\n";
    } else if (type == "COPY") {
      // args: src, dest, user, mode (octal); its files an archive uploaded under filesHash.
      if (args.size() < 2) throw ApiError{Code::invalid_argument, step + ": a source and a dest"};
      auto hash = s["filesHash"].is_string() ? actors::context_key(s["filesHash"].as_string())
                                             : std::nullopt;
      if (!hash) throw ApiError{Code::invalid_argument, step + ": no filesHash of its files"};
      if (!rt.build_context(tenant, *hash))
        throw ApiError{Code::invalid_argument,
                       step + ": its files (" + *hash + ") were not uploaded"};
      if (std::find(contexts.begin(), contexts.end(), *hash) == contexts.end())
        contexts.push_back(*hash);
      std::string flags;
      if (args.size() > 2 && !args[2].empty()) flags += " --chown=" + args[2];
      if (args.size() > 3 && !args[3].empty()) flags += " --chmod=" + args[3];
      Json exec = Json::array();
      exec.push(args[0]);
      exec.push(args[1]);
      dockerfile += "COPY" + flags + " " + exec.dump() + "\n";
    } else {
      throw ApiError{Code::invalid_argument, step + ": not a step type (RUN, ENV, WORKDIR, USER)"};
    }
  }
  std::string start = b["startCmd"].is_string() ? b["startCmd"].as_string() : "";
  std::string ready = b["readyCmd"].is_string() ? b["readyCmd"].as_string() : "";
  if (!ready.empty() && start.empty())
    throw ApiError{Code::invalid_argument, "readyCmd needs a startCmd here"};
  if (!start.empty()) {
    Json exec = Json::array();
    for (auto* w : {"/bin/sh", "-c"}) exec.push(w);
    exec.push(start);
    dockerfile += "CMD " + exec.dump() + "\n";
  }
  auto t = unwrap(actors::template_from_dockerfile(dockerfile, {}, {}, {}, !contexts.empty()));
  t.spec.contexts = contexts;
  t.spec.packages = packages;
  t.spec.ready_cmd = ready;
  t.spec.memory_mib = p.memory_mib;
  t.spec.vcpus = p.vcpus;
  return t.spec;
}

HttpReply start_build(Call& c) {
  auto name = template_param(c);
  std::string id = c.r.param("buildID");
  Pending p;
  {
    std::lock_guard l(pending_mu);
    auto it = std::find_if(pending.begin(), pending.end(), [&](const Pending& x) {
      return x.build_id == id && x.tenant == c.tenant() && x.name == name;
    });
    if (it == pending.end())
      throw ApiError{Code::template_not_found,
                     "no build " + id + " of template " + name + " asked for (POST /v3/templates)"};
    p = *it;
    pending.erase(it);
  }
  auto spec = spec_of(c.r.json(), p, c.tenant(), c.gw.rt);
  auto& rt = c.gw.rt;
  // A new build of an existing template replaces it (as E2B assigns a new build to it).
  if (auto old = rt.custom_template(c.tenant(), name);
      old && (old->status == actors::TemplateStatus::ready ||
              old->status == actors::TemplateStatus::failed))
    unwrap(rt.delete_template(c.tenant(), name));
  unwrap(rt.build_template(c.tenant(), name, spec));
  return json_reply(202, Json::object());
}

HttpReply build_status(Call& c) {
  auto name = template_param(c);
  auto& rt = c.gw.rt;
  auto state = unwrap(rt.custom_template(c.tenant(), name));
  int64_t offset = query_int(c.r, "logsOffset", 0, int64_t(1) << 40);
  Json entries = Json::array();
  std::string status = state.status == actors::TemplateStatus::ready    ? "ready"
                       : state.status == actors::TemplateStatus::failed ? "error"
                                                                        : "building";
  std::string error = state.error;
  if (auto progress = rt.template_build(c.tenant(), name)) {
    std::lock_guard l(progress->mu);
    const auto stamp = rfc3339(now_ms());
    uint64_t at = std::max<uint64_t>(uint64_t(offset), progress->first_line);
    for (; at < progress->first_line + progress->lines.size() && entries.size() < 500; ++at) {
      Json e = Json::object();
      e.set("timestamp", stamp);
      e.set("level", "info");
      e.set("message", progress->lines[at - progress->first_line]);
      entries.push(e);
    }
    if (!progress->done)
      status = "building";
    else if (progress->status != "ready") {
      status = "error";
      error = progress->error;
    }
  }
  Json out = Json::object();
  out.set("templateID", name);
  out.set("buildID", c.r.param("buildID"));
  out.set("status", status);
  out.set("logEntries", entries);
  out.set("logs", Json::array());
  if (status == "error") {
    Json reason = Json::object();
    reason.set("message", error.empty() ? "the build failed" : error);
    reason.set("logEntries", Json::array());
    out.set("reason", reason);
  }
  return json_reply(200, out);
}

std::string hash_param(const Call& c) {
  auto k = actors::context_key(c.r.param("hash"));
  if (!k) throw ApiError{Code::invalid_argument, "a files hash is 64 hex digits"};
  return *k;
}

// GET /templates/{templateID}/files/{hash}: {present, url, headers}. The upload goes to this
// daemon with the key this call came with (the SDK sends `headers` to `url` only).
HttpReply files_link(Call& c) {
  (void)template_param(c);
  auto hash = hash_param(c);
  Json out = Json::object();
  out.set("present", bool(c.gw.rt.build_context(c.tenant(), hash)));
  std::string host = c.r.host.empty() ? "127.0.0.1" : c.r.host;
  out.set("url", c.gw.preview.scheme + "://" + host + "/templates/" + c.r.param("templateID") +
                     "/files/" + hash);
  Json headers = Json::object();
  headers.set("Authorization", c.r.authorization);
  out.set("headers", headers);
  return json_reply(201, out);
}

// PUT /templates/{templateID}/files/{hash}: a COPY step's files (a tar, gzip), spooled to a
// file, kept as a build context under E2B's hash.
Route files_upload_route() {
  auto r = api_route(M::PUT, "/templates/{templateID}/files/{hash}",
                     "E2B: upload a COPY step's files (a tar; kept as a build context)",
                     [](Call& c) -> HttpReply {
                       (void)template_param(c);
                       if (c.r.body_file.empty())
                         throw ApiError{Code::invalid_argument, "the body is a tar of the files"};
                       unwrap(c.gw.rt.put_build_context(c.tenant(), c.r.body_file, hash_param(c)));
                       return json_reply(200, Json::object());
                     });
  r.kind = Route::Kind::file_body;
  r.upload = Route::Upload::context;
  return r;
}

}  // namespace

std::vector<Route> e2b_template_routes() {
  return {
      api_route(M::POST, "/v3/templates", "E2B: ask for a template build (Template.build)",
                request_build),
      api_route(M::POST, "/v2/templates/{templateID}/builds/{buildID}",
                "E2B: start a template build with its steps", start_build),
      api_route(M::GET, "/templates/{templateID}/builds/{buildID}/status",
                "E2B: a template build's status and log lines from logsOffset", build_status,
                {"logsOffset"}),
      api_route(M::GET, "/templates/{templateID}/files/{hash}",
                "E2B: whether a COPY step's files are kept, and where to upload them", files_link),
      files_upload_route(),
      api_route(M::GET, "/templates/aliases/{alias}", "E2B: whether a template exists",
                [](Call& c) {
                  std::string alias = c.r.param("alias");
                  auto t = c.gw.rt.custom_template(c.tenant(), alias);
                  if (!t || t->status != actors::TemplateStatus::ready)
                    throw ApiError{Code::template_not_found, "no template " + alias};
                  Json out = Json::object();
                  out.set("templateID", alias);
                  out.set("public", false);
                  return json_reply(200, out);
                }),
  };
}

}  // namespace pandastack::gateway
