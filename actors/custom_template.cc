#include "actors/custom_template.h"

#include <stdexcept>

#include "actors/sh_quote.h"
#include "actors/tenant_hash.h"
#include "wire/hex.h"
#include "wire/sha256.h"

namespace pandastack::actors {

const char* to_string(TemplateStatus s) {
  switch (s) {
    case TemplateStatus::none:
      return "none";
    case TemplateStatus::building:
      return "building";
    case TemplateStatus::ready:
      return "ready";
    case TemplateStatus::failed:
      return "failed";
    case TemplateStatus::deleted:
      return "deleted";
  }
  return "?";
}

const char* to_string(TemplateEvent::Kind k) {
  switch (k) {
    case TemplateEvent::Kind::build_started:
      return "template-build-started";
    case TemplateEvent::Kind::built:
      return "template-built";
    case TemplateEvent::Kind::build_failed:
      return "template-build-failed";
    case TemplateEvent::Kind::deleted:
      return "template-deleted";
    case TemplateEvent::Kind::published:
      return "template-published";
  }
  return "?";
}

bool valid_template_name(const std::string& n, const TemplateLimits& limits) {
  if (n.empty() || n.size() > limits.max_name_bytes || n[0] == '-') return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

std::optional<Rejection> check_template_name(const std::string& name,
                                             const TemplateLimits& limits) {
  if (valid_template_name(name, limits)) return std::nullopt;
  return Rejection{Code::invalid_argument, "name: 1.." + std::to_string(limits.max_name_bytes) +
                                               " of a-z, 0-9 and '-', not starting with '-'"};
}

std::string tenant_hash(const std::string& tenant) {
  return wire::hex_encode(wire::sha256(tenant).substr(0, 6));
}

std::string template_id(const std::string& tenant, const std::string& name) {
  return name + "." + tenant_hash(tenant);
}

std::string template_display_name(const std::string& id) {
  if (id.rfind("docker://", 0) == 0) return id;  // (an image a Dockerfile build pulls)
  auto dot = id.find('.');
  return dot == std::string::npos ? id : id.substr(0, dot);
}

namespace {

Rejection bad(const std::string& why) { return {Code::invalid_argument, why}; }

// A Debian package name (policy 5.6.1), optionally with an architecture qualifier.
bool valid_package(const std::string& p) {
  if (p.size() < 2 || p.size() > 128) return false;
  if (!((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= '0' && p[0] <= '9'))) return false;
  for (char c : p)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' ||
          c == ':'))
      return false;
  return true;
}

// A file a template puts in its root filesystem: an absolute, normalized path, not into the
// guest's agent or its system's own bookkeeping.
std::optional<std::string> bad_file_path(const std::string& p) {
  if (p.empty() || p[0] != '/' || p.back() == '/') return "must be an absolute file path";
  if (p.size() > 256) return "is longer than 256 bytes";
  for (char c : p)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\')
      return "has control characters";
  if (p.find("//") != std::string::npos || p.find("/./") != std::string::npos ||
      p.find("/../") != std::string::npos || p.ends_with("/..") || p.ends_with("/."))
    return "must be normalized (no //, . or ..)";
  for (const char* sys : {"/proc", "/sys", "/dev", "/run", "/sbin/init", "/init",
                          "/usr/local/bin/pandastack-agent", "/var/lib/dpkg"}) {
    std::string s = sys;
    if (p == s || p.starts_with(s + "/")) return "is the guest system's own";
  }
  return std::nullopt;
}

bool valid_env_key(const std::string& k) {
  if (k.empty() || k.size() > 128 || (k[0] >= '0' && k[0] <= '9')) return false;
  for (char c : k)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return true;
}

std::optional<Rejection> check_spec(const TemplateSpec& s, const TemplateLimits& l) {
  if (!s.image.empty()) {
    // An import: the image is its root file system (its own Env and start command arrive
    // with its end, ImageFacts).
    if (!s.from.empty() || !s.packages.empty() || !s.files.empty() || !s.run.empty() ||
        !s.env.empty() || !s.start.empty() || !s.contexts.empty())
      return bad("an image import takes no from, packages, files, run, env, start or context");
    if (s.image.size() > 512) return bad("image: at most 512 bytes");
  } else if (s.from.empty()) {
    return bad("from: a shipped template");
  }
  if (s.packages.size() > l.max_packages)
    return bad("packages: at most " + std::to_string(l.max_packages));
  for (auto& p : s.packages)
    if (!valid_package(p)) return bad("packages: not a Debian package name: '" + p + "'");
  if (s.files.size() > l.max_files) return bad("files: at most " + std::to_string(l.max_files));
  size_t bytes = 0;
  for (auto& [path, content] : s.files) {
    if (auto why = bad_file_path(path)) return bad("files: '" + path + "' " + *why);
    if (content.find('\0') != std::string::npos)
      return bad("files: '" + path + "': text only (no NUL bytes)");
    bytes += content.size();
  }
  if (bytes > l.max_files_bytes)
    return bad("files: at most " + std::to_string(l.max_files_bytes) + " bytes in all");
  if (s.contexts.size() > l.max_contexts)
    return bad("context: at most " + std::to_string(l.max_contexts) + " archives");
  for (auto& k : s.contexts)
    if (k.size() != 64 || k.find_first_not_of("0123456789abcdef") != std::string::npos)
      return bad("context: '" + k + "' is not an archive's key (64 hex digits)");
  if (s.run.size() > l.max_run) return bad("run: at most " + std::to_string(l.max_run));
  for (auto& c : s.run)
    if (c.empty() || c.size() > l.max_command_bytes || c.find('\0') != std::string::npos)
      return bad("run: each command 1.." + std::to_string(l.max_command_bytes) + " bytes");
  if (s.memory_mib != 0 && (s.memory_mib < l.min_memory_mib || s.memory_mib > l.max_memory_mib))
    return bad("memory_mib: " + std::to_string(l.min_memory_mib) + ".." +
               std::to_string(l.max_memory_mib));
  if (s.vcpus > l.max_vcpus) return bad("vcpus: 1.." + std::to_string(l.max_vcpus));
  if (s.start.size() > l.max_command_bytes || s.start.find('\0') != std::string::npos)
    return bad("start: at most " + std::to_string(l.max_command_bytes) + " bytes");
  if ((s.ready_port != 0 || !s.ready_cmd.empty()) && s.start.empty())
    return bad("ready_port, ready_cmd: need a start command");
  if (s.ready_cmd.size() > l.max_command_bytes || s.ready_cmd.find('\0') != std::string::npos)
    return bad("ready_cmd: at most " + std::to_string(l.max_command_bytes) + " bytes");
  if (s.env.size() > l.max_env) return bad("env: at most " + std::to_string(l.max_env));
  for (auto& [k, v] : s.env) {
    if (!valid_env_key(k)) return bad("env: not a variable name: '" + k + "'");
    if (v.size() > 4096 || v.find('\0') != std::string::npos || v.find('\n') != std::string::npos)
      return bad("env: " + k + ": at most 4096 bytes, one line");
  }
  return std::nullopt;
}

struct Decider {
  const TemplateState& s;
  int64_t now;
  const TemplateLimits& limits;

  // A template made under `name`: a valid name, and none of it building or ready.
  std::optional<Rejection> check_new(const std::string& name) const {
    if (auto r = check_template_name(name, limits)) return r;
    if (s.status == TemplateStatus::building)
      return Rejection{Code::conflict, "template " + name + " is being built"};
    if (s.status == TemplateStatus::ready)
      return Rejection{Code::conflict, "template " + name + " exists: delete it first"};
    return std::nullopt;
  }

  // Finish and Fail end a build.
  std::optional<Rejection> check_building() const {
    if (s.status != TemplateStatus::building)
      return Rejection{Code::invalid_state, "template " + s.name + " is not being built"};
    return std::nullopt;
  }

  TemplateEvent event(TemplateEvent::Kind k) const {
    TemplateEvent e;
    e.kind = k;
    e.at_ms = now;
    return e;
  }

  TemplateDecision operator()(const tcmd::Build& c) const {
    if (auto r = check_new(c.name)) return *r;
    if (auto r = check_spec(c.spec, limits)) return *r;
    auto e = event(TemplateEvent::Kind::build_started);
    e.tenant = c.tenant;
    e.name = c.name;
    e.spec = c.spec;
    return std::vector<TemplateEvent>{e};
  }

  TemplateDecision operator()(const tcmd::Publish& c) const {
    if (auto r = check_new(c.name)) return *r;
    auto e = event(TemplateEvent::Kind::published);
    e.tenant = c.tenant;
    e.name = c.name;
    e.sandbox = c.sandbox;
    e.spec.from = c.from;
    e.spec.network = c.network;
    e.spec.memory_mib = c.memory_mib;
    e.spec.vcpus = c.vcpus;
    e.size_bytes = c.size_bytes;
    return std::vector<TemplateEvent>{e};
  }

  TemplateDecision operator()(const tcmd::Finish& c) const {
    if (auto r = check_building()) return *r;
    auto e = event(TemplateEvent::Kind::built);
    e.build_ms = c.build_ms;
    e.size_bytes = c.size_bytes;
    // (a Dockerfile build FROM an image it pulled, kFromImagePrefix, ends with it too: the
    // image's Env and start command merged with the Dockerfile's)
    const bool pulled_from = s.spec.from.rfind("docker://", 0) == 0;
    if (!s.spec.image.empty() || (pulled_from && !c.image.ref.empty())) {
      if (c.image.ref.empty()) return bad("an import ends with its image's configuration");
      if (c.image.ref.size() > 512) return bad("image: at most 512 bytes");
      // Its env and start command within a build's limits (checked as a build's would be).
      TemplateSpec learned;
      learned.start = c.image.start;
      learned.ready_port = c.image.ready_port;
      learned.env = c.image.env;
      if (auto r = check_spec(learned, limits)) return *r;
      e.image = c.image;
    } else if (!c.image.ref.empty()) {
      return bad("only an import ends with an image's configuration");
    }
    return std::vector<TemplateEvent>{e};
  }

  TemplateDecision operator()(const tcmd::Fail& c) const {
    if (auto r = check_building()) return *r;
    auto e = event(TemplateEvent::Kind::build_failed);
    e.error = c.error;
    e.log_tail = c.log_tail;
    return std::vector<TemplateEvent>{e};
  }

  TemplateDecision operator()(const tcmd::Delete& c) const {
    if (s.status == TemplateStatus::none || s.status == TemplateStatus::deleted)
      return Rejection{Code::template_not_found, "no template " + template_display_name(s.id)};
    if (s.status == TemplateStatus::building)
      return Rejection{Code::conflict, "template " + s.name + " is being built"};
    if (c.in_use > 0)
      return Rejection{
          Code::template_in_use,
          std::to_string(c.in_use) + " sandbox(es) of template " + s.name + " have not ended"};
    return std::vector<TemplateEvent>{event(TemplateEvent::Kind::deleted)};
  }
};

[[noreturn]] void impossible(const TemplateState& s, const TemplateEvent& e) {
  throw std::logic_error("template " + s.id + ": " + to_string(e.kind) + " in state " +
                         to_string(s.status));
}

// A template's new life (a build started, or a sandbox published): nothing of an earlier one
// (failed or deleted) is kept but its id and its stream's version.
TemplateState begun(const TemplateState& s, const TemplateEvent& e, TemplateStatus status) {
  if (s.status == TemplateStatus::building || s.status == TemplateStatus::ready) impossible(s, e);
  TemplateState fresh;
  fresh.id = s.id;
  fresh.version = s.version;
  fresh.status = status;
  fresh.tenant = e.tenant;
  fresh.name = e.name;
  fresh.spec = e.spec;
  fresh.created_at_ms = e.at_ms;
  return fresh;
}

}  // namespace

TemplateDecision decide(const TemplateState& state, const TemplateCommand& command, int64_t now_ms,
                        const TemplateLimits& limits) {
  return std::visit(Decider{state, now_ms, limits}, command);
}

TemplateState apply(TemplateState s, const TemplateEvent& e) {
  using K = TemplateEvent::Kind;
  switch (e.kind) {
    case K::build_started:
      s = begun(s, e, TemplateStatus::building);
      break;
    case K::built:
      if (s.status != TemplateStatus::building) impossible(s, e);
      s.status = TemplateStatus::ready;
      s.build_ms = e.build_ms;
      s.size_bytes = e.size_bytes;
      s.ended_at_ms = e.at_ms;
      if (!e.image.ref.empty()) {  // an import: what its image says, its sandboxes have
        s.spec.image = e.image.ref;
        s.spec.start = e.image.start;
        s.spec.ready_port = e.image.ready_port;
        s.spec.env = e.image.env;
      }
      break;
    case K::build_failed:
      if (s.status != TemplateStatus::building) impossible(s, e);
      s.status = TemplateStatus::failed;
      s.error = e.error;
      s.log_tail = e.log_tail;
      s.ended_at_ms = e.at_ms;
      break;
    case K::published:
      s = begun(s, e, TemplateStatus::ready);
      s.sandbox = e.sandbox;
      s.size_bytes = e.size_bytes;
      s.ended_at_ms = e.at_ms;
      break;
    case K::deleted:
      if (s.status != TemplateStatus::ready && s.status != TemplateStatus::failed) impossible(s, e);
      s.status = TemplateStatus::deleted;
      s.ended_at_ms = e.at_ms;
      break;
  }
  ++s.version;
  return s;
}

std::string sh_quote(const std::string& v) {
  std::string out = "'";
  for (char c : v) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string start_script(const TemplateSpec& spec) {
  if (spec.start.empty()) return "";
  std::string port = std::to_string(spec.ready_port);
  std::string s =
      "#!/bin/sh\n"
      "# The template's start command (a Dockerfile's CMD/ENTRYPOINT), started before the bake:\n"
      "# every sandbox of the template restores with it running.\n"
      "set -u\n"
      "log=/var/log/pandastack-start.log\n"
      "mkdir -p /var/log\n"
      "echo \"start: \"" +
      sh_quote(spec.start) +
      "\n"
      "setsid sh -c " +
      sh_quote(spec.start) +
      " </dev/null >>\"$log\" 2>&1 &\n"
      "pid=$!\n"
      "fail() { echo \"start: $1; its output:\"; tail -n 20 \"$log\"; exit 1; }\n";
  if (!spec.ready_cmd.empty()) {
    s += "i=0\n"
         "until sh -c " +
         sh_quote(spec.ready_cmd) +
         " >/dev/null 2>&1; do\n"
         "  kill -0 \"$pid\" 2>/dev/null || fail \"it ended before it was ready\"\n"
         "  i=$((i + 1))\n"
         "  [ \"$i\" -lt 240 ] || fail \"its ready command did not succeed within 120 s: \"" +
         sh_quote(spec.ready_cmd) +
         "\n"
         "  sleep 0.5\n"
         "done\n"
         "echo \"start: ready (pid $pid)\"\n";
  } else if (spec.ready_port == 0) {
    s += "sleep 2\n"
         "kill -0 \"$pid\" 2>/dev/null || fail \"it ended within 2 s\"\n"
         "echo \"start: running (pid $pid)\"\n";
  } else {
    // A listening TCP socket on the port (IPv4 or IPv6): state 0A in /proc/net/tcp*.
    s += "hex=$(printf '%04X' " + port +
         ")\n"
         "i=0\n"
         "until grep -q \":$hex [0-9A-F]*:[0-9A-F]* 0A\" /proc/net/tcp /proc/net/tcp6 "
         "2>/dev/null; do\n"
         "  kill -0 \"$pid\" 2>/dev/null || fail \"it ended before it listened on port " +
         port +
         "\"\n"
         "  i=$((i + 1))\n"
         "  [ \"$i\" -lt 1200 ] || fail \"nothing listened on port " +
         port +
         " within 120 s\"\n"
         "  sleep 0.1\n"
         "done\n"
         "echo \"start: listening on port " +
         port + " (pid $pid)\"\n";
  }
  return s;
}

}  // namespace pandastack::actors
