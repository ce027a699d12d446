// Templates: the shipped ones (`make guest`) and a tenant's own (actors/template_builds.h):
// build (POST, progress as server-sent events), list, get, delete.
#include "actors/build_context.h"
#include "actors/dockerfile.h"
#include "actors/event_codec.h"
#include "actors/template_builds.h"
#include "gateway/server.h"

namespace pandastack::gateway {

namespace {

using M = kj::HttpMethod;

Json custom_json(const actors::TemplateState& t) {
  Json j = Json::object();
  j.set("name", t.name);
  j.set("kind", "custom");
  j.set("status", actors::to_string(t.status));
  j.set("from", actors::template_display_name(t.spec.from));
  if (!t.sandbox.empty()) j.set("sandbox", t.sandbox);  // published from it
  Json p = Json::array();
  for (auto& x : t.spec.packages) p.push(x);
  j.set("packages", p);
  Json files = Json::array();
  for (auto& [path, content] : t.spec.files) files.push(path);
  j.set("files", files);
  Json run = Json::array();
  for (auto& c : t.spec.run) run.push(c);
  j.set("run", run);
  j.set("env", actors::string_map_json(t.spec.env));
  j.set("network", t.spec.network);
  j.set("memory_mib", int64_t(t.spec.memory_mib));  // its sandboxes' shape
  j.set("vcpus", int64_t(t.spec.vcpus));
  if (!t.spec.image.empty()) j.set("image", t.spec.image);  // imported: what, or its ref
  if (!t.spec.start.empty()) {                              // what every sandbox of it runs
    j.set("start", t.spec.start);
    j.set("ready_port", int64_t(t.spec.ready_port));
    if (!t.spec.ready_cmd.empty()) j.set("ready_cmd", t.spec.ready_cmd);
  }
  j.set("created_at_ms", t.created_at_ms);
  if (t.ended_at_ms > 0) j.set("ended_at_ms", t.ended_at_ms);
  if (t.status == actors::TemplateStatus::ready) {
    j.set("build_ms", int64_t(t.build_ms));
    j.set("size_bytes", int64_t(t.size_bytes));
  }
  if (t.status == actors::TemplateStatus::failed) {
    j.set("error", t.error);
    j.set("log_tail", t.log_tail);
  }
  return j;
}

std::string name_param(const Request& r) {
  std::string n = r.param("name");
  if (n.empty() || n.size() > 64) throw ApiError{Code::template_not_found, "no such template"};
  return n;
}

HttpReply build(Call& c) {
  Json body = c.r.json();
  Fields f(body, {"name", "from", "packages", "files", "run", "env", "network", "memory_mib",
                  "vcpus", "dockerfile", "context", "build_args", "start", "ready_port",
                  "ready_cmd", "image", "registry_secret", "disk_mib"});
  if (!f.has("name")) throw ApiError{Code::invalid_argument, "name is required"};
  actors::TemplateSpec spec;
  if (f.has("image")) {
    // A pull by reference (actors/image_pull.h), imported as an upload is.
    for (auto k : {"from", "packages", "files", "run", "env", "dockerfile", "context", "build_args",
                   "ready_port", "ready_cmd"})
      if (f.has(k))
        throw ApiError{Code::invalid_argument,
                       std::string(k) + " is the image's to say (an import takes none)"};
    spec.network = f.boolean("network", true);
    spec.memory_mib = uint32_t(f.integer("memory_mib", 0, 1, 1 << 20));
    spec.vcpus = uint32_t(f.integer("vcpus", 0, 1, 1024));
    auto disk = uint64_t(
        f.integer("disk_mib", 0, 256, int64_t(c.gw.rt.config().template_image_disk_max_mib)));
    if (f.has("start") && f.str("start") != "auto" && f.str("start") != "none")
      throw ApiError{Code::invalid_argument,
                     "start: \"auto\" (the image's Cmd when it exposes a port) or \"none\""};
    auto t = unwrap(c.gw.rt.pull_template(c.tenant(), f.str("name"), spec, f.str("image"),
                                          f.str("registry_secret"), disk,
                                          f.str("start", "auto") == "auto"));
    auto j = custom_json(t);
    j.set("progress", "/v1/templates/" + t.name + "/build");
    return json_reply(202, j);
  }
  if (f.has("dockerfile")) {
    // A Dockerfile (actors/dockerfile.h) says what from, files, run and env do; packages still
    // come from the host's package lists (the build has no network for RUN apt-get).
    for (auto k : {"from", "files", "run", "env", "start", "ready_port", "ready_cmd"})
      if (f.has(k))
        throw ApiError{
            Code::invalid_argument,
            std::string(k) + " is the Dockerfile's to say (FROM, COPY, RUN, ENV, CMD, EXPOSE)"};
    // The context: files ({path: text}) or archives uploaded before ("sha256:...", or a list).
    const Json& cx = body["context"];
    const bool archived = cx.is_string() || cx.is_array();
    std::vector<std::string> keys;
    for (auto& a : cx.is_string() ? std::vector<std::string>{cx.as_string()}
                   : archived     ? f.string_list("context")
                                  : std::vector<std::string>{}) {
      auto k = actors::context_key(a);
      if (!k)
        throw ApiError{Code::invalid_argument,
                       "context: '" + a.substr(0, 80) +
                           "' is not a build context (sha256:<64 hex>, as POST "
                           "/v1/build-contexts answers)"};
      keys.push_back(*k);
    }
    auto t = unwrap(actors::template_from_dockerfile(
        f.str("dockerfile"),
        archived ? std::map<std::string, std::string>{} : f.string_map("context"),
        f.string_map("build_args"), {}, archived));
    spec = std::move(t.spec);
    spec.contexts = std::move(keys);
  } else {
    for (auto k : {"context", "build_args"})
      if (f.has(k)) throw ApiError{Code::invalid_argument, std::string(k) + " needs a dockerfile"};
    spec.from = f.str("from", "base");
    spec.files = f.string_map("files");
    spec.run = f.string_list("run");
    spec.env = f.string_map("env");
    spec.start = f.str("start");
    spec.ready_port = uint16_t(f.integer("ready_port", 0, 1, 65535));
    spec.ready_cmd = f.str("ready_cmd");
  }
  spec.packages = f.string_list("packages");
  spec.network = f.boolean("network", true);
  // Its guests' shape (0: the host's default); the range is checked with the rest of the spec.
  spec.memory_mib = uint32_t(f.integer("memory_mib", 0, 1, 1 << 20));
  spec.vcpus = uint32_t(f.integer("vcpus", 0, 1, 1024));
  auto t = unwrap(c.gw.rt.build_template(c.tenant(), f.str("name"), spec));
  auto j = custom_json(t);
  j.set("progress", "/v1/templates/" + t.name + "/build");
  return json_reply(202, j);
}

// PUT /v1/templates/{name}/image: the body (spooled to a file) is an image archive.
HttpReply import_image(Call& c) {
  std::string name = c.r.param("name");
  actors::TemplateSpec shape;
  shape.network = query_flag(c.r, "network", true);
  shape.memory_mib = uint32_t(query_int(c.r, "memory_mib", 0, 1 << 20));
  shape.vcpus = uint32_t(query_int(c.r, "vcpus", 0, 1024));
  actors::ImageUpload upload;
  upload.file = c.r.body_file;
  upload.disk_mib = uint64_t(
      query_int(c.r, "disk_mib", 0, int64_t(c.gw.rt.config().template_image_disk_max_mib)));
  if (upload.disk_mib != 0 && upload.disk_mib < 256)
    throw ApiError{Code::invalid_argument, "disk_mib: at least 256"};
  upload.start = query_flag(c.r, "start", true);
  std::error_code ec;
  if (upload.file.empty() || std::filesystem::file_size(upload.file, ec) == 0)
    throw ApiError{Code::invalid_argument,
                   "the body is the image archive (`docker save IMAGE`, or an OCI image layout "
                   "tar): it was empty"};
  auto t = unwrap(c.gw.rt.import_template(c.tenant(), name, shape, upload));
  auto j = custom_json(t);
  j.set("progress", "/v1/templates/" + t.name + "/build");
  return json_reply(202, j);
}

Json context_json(const actors::BuildContextInfo& x) {
  Json j = Json::object();
  j.set("context", "sha256:" + x.key);
  j.set("bytes", int64_t(x.bytes));
  j.set("used_at_ms", x.used_at_ms);
  return j;
}

std::string context_param(const Request& r) {
  auto k = actors::context_key(r.param("key"));
  if (!k) throw ApiError{Code::context_not_found, "no such build context"};
  return *k;
}

Route context_upload(Route r) {
  r.upload = Route::Upload::context;
  return r;
}

// POST /v1/build-contexts: the body (spooled to a file) is a tar of a build context.
HttpReply put_context(Call& c) {
  if (c.r.body_file.empty())
    throw ApiError{Code::invalid_argument, "the body is the build context: a tar, plain or gzip"};
  return json_reply(201,
                    context_json(unwrap(c.gw.rt.put_build_context(c.tenant(), c.r.body_file))));
}

}  // namespace

Json template_json(const actors::TemplateState& t) { return custom_json(t); }

std::vector<Route> template_routes() {
  return {
      route(M::GET, "/v1/templates", "List templates: the shipped ones and your own",
            [](Call& c) {
              Json list = Json::array();
              for (auto& t : c.gw.rt.templates()) {
                Json j = Json::object();
                j.set("name", t.name);
                j.set("kind", "shipped");
                j.set("status", "ready");
                j.set("baked", t.baked);
                const auto& cfg = c.gw.rt.config();  // (the host's shape)
                j.set("memory_mib", int64_t(cfg.memory_mib));
                j.set("vcpus", int64_t(cfg.vcpus));
                list.push(j);
              }
              for (auto& t : c.gw.rt.custom_templates(c.tenant())) list.push(custom_json(t));
              Json out = Json::object();
              out.set("templates", list);
              return json_reply(200, out);
            }),
      route(M::POST, "/v1/templates",
            "Build a template of your own {name, from, packages, files, run, env, network, "
            "memory_mib, vcpus} or {name, dockerfile, context, build_args, packages, network, "
            "memory_mib, vcpus}, or pull an image {name, image, registry_secret, disk_mib, "
            "start, network, memory_mib, vcpus}: 202, then follow GET "
            "/v1/templates/{name}/build",
            build),
      context_upload(route(
          M::POST, "/v1/build-contexts",
          "Upload a Dockerfile build's context: the body is a tar of it (plain or gzip, at most "
          "--build-context-mib; kept by its sha256, unpacked only in a builder microVM); 201 "
          "{context: \"sha256:...\"}, named by POST /v1/templates {dockerfile, context}",
          put_context, {}, Route::Kind::file_body)),
      route(M::GET, "/v1/build-contexts/{key}", "Whether a build context of yours is kept",
            [](Call& c) {
              return json_reply(
                  200, context_json(unwrap(c.gw.rt.build_context(c.tenant(), context_param(c.r)))));
            }),
      route(M::DELETE, "/v1/build-contexts/{key}", "Drop a build context of yours",
            [](Call& c) {
              if (auto no = c.gw.rt.delete_build_context(c.tenant(), context_param(c.r)))
                throw ApiError{no->code, no->message};
              return no_content();
            }),
      route(M::PUT, "/v1/templates/{name}/image",
            "Import an image as a template of yours: the body is a `docker save` archive or an "
            "OCI image layout tar (at most --template-image-mib); 202, then follow GET "
            "/v1/templates/{name}/build",
            import_image, {"memory_mib", "vcpus", "network", "disk_mib", "start"},
            Route::Kind::file_body),
      route(M::POST, "/v1/sandboxes/{id}/template",
            "Publish a running sandbox (its disk and memory, now) as a template of yours {name}",
            [](Call& c) {
              Fields f(c.r.json(), {"name"});
              if (!f.has("name")) throw ApiError{Code::invalid_argument, "name is required"};
              return json_reply(
                  201,
                  custom_json(unwrap(c.gw.rt.publish_template(c.tenant(), c.id, f.str("name")))));
            }),
      route(M::GET, "/v1/templates/{name}", "One of your templates",
            [](Call& c) {
              return json_reply(
                  200, custom_json(unwrap(c.gw.rt.custom_template(c.tenant(), name_param(c.r)))));
            }),
      route(M::DELETE, "/v1/templates/{name}",
            "Delete one of your templates (409 while sandboxes of it have not ended)",
            [](Call& c) {
              return json_reply(
                  200, custom_json(unwrap(c.gw.rt.delete_template(c.tenant(), name_param(c.r)))));
            }),
      // (served by Server::produce: no plain form)
      route(M::GET, "/v1/templates/{name}/build",
            "A build's progress as server-sent events: stage, log lines, then its end", nullptr, {},
            Route::Kind::stream),
  };
}

}  // namespace pandastack::gateway
