#include "actors/custom_template_codec.h"

#include "actors/codec_util.h"
#include "actors/event_codec.h"
#include "wire/events.capnp.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace w = pandastack::wire::events;

using codec::get_map;
using codec::put_map;

std::string encode_template_event(const TemplateEvent& e) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<w::TemplateEvent>();
  b.setAtMs(e.at_ms);
  using K = TemplateEvent::Kind;
  switch (e.kind) {
    case K::build_started: {
      auto s = b.initBuildStarted();
      s.setTenant(e.tenant);
      s.setName(e.name);
      s.setFrom(e.spec.from);
      auto p = s.initPackages(unsigned(e.spec.packages.size()));
      for (unsigned i = 0; i < p.size(); ++i) p.set(i, e.spec.packages[i]);
      put_map(s.initFiles(unsigned(e.spec.files.size())), e.spec.files);
      auto r = s.initRun(unsigned(e.spec.run.size()));
      for (unsigned i = 0; i < r.size(); ++i) r.set(i, e.spec.run[i]);
      put_map(s.initEnv(unsigned(e.spec.env.size())), e.spec.env);
      s.setNetwork(e.spec.network);
      s.setMemoryMib(e.spec.memory_mib);
      s.setVcpus(e.spec.vcpus);
      s.setStart(e.spec.start);
      s.setReadyPort(e.spec.ready_port);
      s.setReadyCmd(e.spec.ready_cmd);
      s.setImage(e.spec.image);
      auto cx = s.initContexts(unsigned(e.spec.contexts.size()));
      for (unsigned i = 0; i < cx.size(); ++i) cx.set(i, e.spec.contexts[i]);
      break;
    }
    case K::built: {
      auto s = b.initBuilt();
      s.setBuildMs(e.build_ms);
      s.setSizeBytes(e.size_bytes);
      s.setImageRef(e.image.ref);
      s.setImageStart(e.image.start);
      s.setImageReadyPort(e.image.ready_port);
      put_map(s.initImageEnv(unsigned(e.image.env.size())), e.image.env);
      break;
    }
    case K::build_failed: {
      auto s = b.initBuildFailed();
      s.setError(e.error);
      s.setLogTail(e.log_tail);
      break;
    }
    case K::deleted:
      b.setDeleted();
      break;
    case K::published: {
      auto p = b.initPublished();
      p.setTenant(e.tenant);
      p.setName(e.name);
      p.setSandbox(e.sandbox);
      p.setFrom(e.spec.from);
      p.setSizeBytes(e.size_bytes);
      p.setNetwork(e.spec.network);
      p.setMemoryMib(e.spec.memory_mib);
      p.setVcpus(e.spec.vcpus);
      break;
    }
  }
  return codec::to_bytes(msg);
}

std::optional<TemplateEvent> decode_template_event(const std::string& bytes) {
  return codec::from_bytes<w::TemplateEvent, TemplateEvent>(
      bytes, [](w::TemplateEvent::Reader r) -> std::optional<TemplateEvent> {
        TemplateEvent e;
        e.at_ms = r.getAtMs();
        using K = TemplateEvent::Kind;
        switch (r.which()) {
          case w::TemplateEvent::BUILD_STARTED: {
            auto s = r.getBuildStarted();
            e.kind = K::build_started;
            e.tenant = s.getTenant();
            e.name = s.getName();
            e.spec.from = s.getFrom();
            for (auto p : s.getPackages()) e.spec.packages.push_back(p);
            e.spec.files = get_map(s.getFiles());
            for (auto c : s.getRun()) e.spec.run.push_back(c);
            e.spec.env = get_map(s.getEnv());
            e.spec.network = s.getNetwork();
            e.spec.memory_mib = s.getMemoryMib();
            e.spec.vcpus = s.getVcpus();
            e.spec.start = s.getStart();
            e.spec.ready_port = s.getReadyPort();
            e.spec.ready_cmd = s.getReadyCmd();
            e.spec.image = s.getImage();
            for (auto c : s.getContexts()) e.spec.contexts.push_back(c);
            break;
          }
          case w::TemplateEvent::BUILT: {
            auto b = r.getBuilt();
            e.kind = K::built;
            e.build_ms = b.getBuildMs();
            e.size_bytes = b.getSizeBytes();
            e.image.ref = b.getImageRef();
            e.image.start = b.getImageStart();
            e.image.ready_port = b.getImageReadyPort();
            e.image.env = get_map(b.getImageEnv());
            break;
          }
          case w::TemplateEvent::BUILD_FAILED:
            e.kind = K::build_failed;
            e.error = r.getBuildFailed().getError();
            e.log_tail = r.getBuildFailed().getLogTail();
            break;
          case w::TemplateEvent::DELETED:
            e.kind = K::deleted;
            break;
          case w::TemplateEvent::PUBLISHED: {
            auto p = r.getPublished();
            e.kind = K::published;
            e.tenant = p.getTenant();
            e.name = p.getName();
            e.sandbox = p.getSandbox();
            e.spec.from = p.getFrom();
            e.size_bytes = p.getSizeBytes();
            e.spec.network = p.getNetwork();
            e.spec.memory_mib = p.getMemoryMib();
            e.spec.vcpus = p.getVcpus();
            break;
          }
          default:
            return std::nullopt;
        }
        return e;
      });
}

std::string template_event_to_json(const TemplateEvent& e) {
  using wire::Json;
  Json j = Json::object();
  j.set("kind", to_string(e.kind));
  j.set("at_ms", e.at_ms);
  using K = TemplateEvent::Kind;
  auto list = [](const std::vector<std::string>& v) {
    Json a = Json::array();
    for (auto& x : v) a.push(x);
    return a;
  };
  switch (e.kind) {
    case K::build_started: {
      j.set("tenant", e.tenant);
      j.set("name", e.name);
      j.set("from", e.spec.from);
      j.set("packages", list(e.spec.packages));
      Json files = Json::array();  // (paths only: contents may be large)
      for (auto& [path, content] : e.spec.files) files.push(path);
      j.set("files", files);
      j.set("run", list(e.spec.run));
      j.set("env", string_map_json(e.spec.env));
      j.set("network", e.spec.network);
      j.set("memory_mib", e.spec.memory_mib);
      j.set("vcpus", e.spec.vcpus);
      if (!e.spec.start.empty()) {
        j.set("start", e.spec.start);
        j.set("ready_port", int64_t(e.spec.ready_port));
        if (!e.spec.ready_cmd.empty()) j.set("ready_cmd", e.spec.ready_cmd);
      }
      if (!e.spec.image.empty()) j.set("image", e.spec.image);
      break;
    }
    case K::built:
      j.set("build_ms", e.build_ms);
      j.set("size_bytes", e.size_bytes);
      if (!e.image.ref.empty()) {
        j.set("image", e.image.ref);
        if (!e.image.start.empty()) j.set("start", e.image.start);
        j.set("env", string_map_json(e.image.env));
      }
      break;
    case K::build_failed:
      j.set("error", e.error);
      break;
    case K::deleted:
      break;
    case K::published:
      j.set("tenant", e.tenant);
      j.set("name", e.name);
      j.set("sandbox", e.sandbox);
      j.set("from", e.spec.from);
      j.set("size_bytes", e.size_bytes);
      j.set("memory_mib", e.spec.memory_mib);
      j.set("vcpus", e.spec.vcpus);
      break;
  }
  return j.dump();
}

}  // namespace pandastack::actors
