// A custom template's lifecycle as two pure functions (no CAF, no I/O), like a volume's
// (volume.h):
//
//   decide(state, command) -> events | error     what a command means in a state
//   apply(state, event)    -> state              how an event changes the state
//
// A custom template is a tenant's own: a shipped template (`from`) plus Debian packages, files,
// environment variables and shell commands run as root in the guest, built into a root
// filesystem and baked into a snapshot once (actors/template_builds.h runs the build). Its
// events are in its own stream, `tpl_<id>`; its id is `<name>.<tenant hash>` (two tenants may
// both have a "ml" template; neither sees the other's).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/sandbox.h"

namespace pandastack::actors {

enum class TemplateStatus { none, building, ready, failed, deleted };
const char* to_string(TemplateStatus s);

// What a build asks for (POST /v1/templates).
struct TemplateSpec {
  std::string from = "base";  // a shipped template, or (recorded as its id) one of the tenant's
  std::vector<std::string> packages;
  std::map<std::string, std::string> files;  // guest path -> content
  std::vector<std::string> run;
  std::map<std::string, std::string> env;
  bool network = true;  // its sandboxes get a network unless a create says otherwise
  // Its guests' shape, baked into its snapshot: every sandbox of it has this much memory and
  // these vCPUs (a create may not ask for more). 0: the host's default (--memory-mib, --vcpus),
  // which the gateway fills in; records written before templates had shapes have 0.
  uint32_t memory_mib = 0, vcpus = 0;
  // A program every sandbox of it has running (a Dockerfile's CMD/ENTRYPOINT): a shell command
  // started in the background in the bake's guest before its snapshot, so each sandbox restores
  // with it running. The bake waits (120 s at most) for `ready_cmd` (a shell command, run every
  // 0.5 s) to succeed, else for it to listen on `ready_port`; with neither, it must still run 2 s
  // after it started. "": none.
  std::string start;
  uint16_t ready_port = 0;
  std::string ready_cmd;
  // Imported from an image archive (PUT /v1/templates/{name}/image; actors/image_import.h):
  // what was uploaded, then (once built) the image's tag and config digest. Such a template has
  // no `from`, packages, files or run: its root file system is the image's layers.
  std::string image;
  // A Dockerfile build's context as archives (POST /v1/build-contexts; actors/build_context.h):
  // their keys (64 hex), unpacked in this order into one context by a builder microVM, which
  // the build's builder mounts read-only for COPY and ADD. Empty: any context is in `files`.
  std::vector<std::string> contexts;
  bool operator==(const TemplateSpec&) const = default;
};

// What an imported image's configuration says, learned by its build and recorded when it
// ends: its sandboxes' environment and start command.
struct ImageFacts {
  std::string ref;  // its tag (if any) @ its config digest
  std::string start;
  uint16_t ready_port = 0;
  std::map<std::string, std::string> env;
  bool operator==(const ImageFacts&) const = default;
};

// The bake script (IMAGES/<template>/bake.sh, run as root in the bake's guest) that starts
// `spec.start` detached (its output in /var/log/pandastack-start.log) and waits for it to be
// ready; "" when the spec starts nothing.
std::string start_script(const TemplateSpec& spec);

struct TemplateLimits {
  size_t max_name_bytes = 40;
  size_t max_packages = 64;
  size_t max_files = 64;
  size_t max_files_bytes = 1 << 20;  // every file's content together
  size_t max_run = 32;
  size_t max_command_bytes = 4096;
  size_t max_env = 64;
  size_t max_contexts = 64;  // context archives (E2B's builder uploads one per COPY)
  uint32_t min_memory_mib = 128, max_memory_mib = 65536;
  uint32_t max_vcpus = 32;
};

struct TemplateEvent {
  enum class Kind { build_started, built, build_failed, deleted, published };
  Kind kind = Kind::build_started;
  int64_t at_ms = 0;
  std::string tenant, name;  // build_started, published
  TemplateSpec spec;         // build_started; published: from, network, memory_mib, vcpus
  std::string sandbox;       // published: the sandbox it was made from
  uint64_t build_ms = 0, size_bytes = 0;  // built (size_bytes: published too)
  ImageFacts image;                       // built: an imported image's (ref "" otherwise)
  std::string error, log_tail;            // build_failed
};
const char* to_string(TemplateEvent::Kind k);

struct TemplateState {
  std::string id;  // `<name>.<tenant hash>`
  TemplateStatus status = TemplateStatus::none;
  uint64_t version = 0;
  std::string tenant, name;
  TemplateSpec spec;
  int64_t created_at_ms = 0, ended_at_ms = 0;
  uint64_t build_ms = 0, size_bytes = 0;
  std::string error, log_tail;
  std::string sandbox;  // published from this sandbox ("" for a build)
};

namespace tcmd {
struct Build {
  std::string tenant, name;
  TemplateSpec spec;
};
struct Finish {  // the build succeeded
  uint64_t build_ms = 0, size_bytes = 0;
  ImageFacts image;  // an import's image configuration
};
struct Fail {
  std::string error, log_tail;
};
// A sandbox's disk and memory made a template (its snapshot is in place).
struct Publish {
  std::string tenant, name, sandbox, from;
  uint64_t size_bytes = 0;
  bool network = true;
  uint32_t memory_mib = 0, vcpus = 0;  // the sandbox's shape (its snapshot's)
};
// `in_use`: sandboxes of it that have not ended (their number).
struct Delete {
  size_t in_use = 0;
};
}  // namespace tcmd

using TemplateCommand =
    std::variant<tcmd::Build, tcmd::Finish, tcmd::Fail, tcmd::Delete, tcmd::Publish>;
using TemplateDecision = std::variant<std::vector<TemplateEvent>, Rejection>;

// Refusals: invalid_argument (a name, a package, a path, a command beyond the limits),
// conflict (a build of this name is running, or it exists: delete it first), template_in_use
// (delete while sandboxes run from it), template_not_found.
TemplateDecision decide(const TemplateState& state, const TemplateCommand& command, int64_t now_ms,
                        const TemplateLimits& limits = {});
// The state after `event`. Throws std::logic_error when the event is impossible in `state`.
TemplateState apply(TemplateState state, const TemplateEvent& event);

// A template name a tenant may use: 1..40 of [a-z0-9-], starting with a letter or digit.
bool valid_template_name(const std::string& name, const TemplateLimits& limits = {});
// invalid_argument (saying what a name is) unless `name` is a valid one.
std::optional<Rejection> check_template_name(const std::string& name,
                                             const TemplateLimits& limits = {});
// The template id of `tenant`'s template `name` (its stream is "tpl_" + it, its image folder it).
std::string template_id(const std::string& tenant, const std::string& name);
// The name of a template id ("ml" for "ml.1a2b...", a shipped template's name unchanged).
std::string template_display_name(const std::string& id);

}  // namespace pandastack::actors
