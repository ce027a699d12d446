// Custom template builds (actors/custom_template.h holds the lifecycle, decided purely): a build
// fetches the tenant's Debian packages as inert files (actors/template_packages.h), runs the rest
// in a builder microVM of the shipped template it builds on (actors/template_builder.h: packages,
// files, environment and commands, all in the guest), whose disk becomes the template's root
// file system, then bakes the template once (a cold boot and a snapshot): a create of it restores
// that snapshot like a shipped template's. Nothing a tenant chose is unpacked, run, mounted or
// written through a path on the host. Each build runs on a thread of its own (at most
// RuntimeConfig::max_template_builds at once), within RuntimeConfig::template_build_timeout; its
// progress (stage, percent, log lines) can be followed while it runs. A failed build leaves
// nothing behind but its record (the error and its log's tail). Every command is
// decided, persisted in the template's stream, then applied, one at a time per host (a mutex,
// not an actor: a build is a long blocking job, its records are a few events).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "actors/build_context.h"
#include "actors/custom_template.h"
#include "actors/runtime.h"
#include "vmm-driver/snapshot.h"

namespace pandastack::actors {

struct Env;

// What a running build is doing, for whoever follows it (GET /v1/templates/{name}/build).
struct BuildProgress {
  static constexpr size_t kMaxLines = 4000;  // the log kept: its last lines

  mutable std::mutex mu;
  std::condition_variable cv;
  static constexpr size_t kMaxLineBytes = 4096;  // a longer line is cut
  std::string stage = "queued";                  // queued, packages, builder, bake, ready | failed
  int percent = 0;
  std::deque<std::string> lines;
  uint64_t first_line = 0;  // the number of lines.front() (lines dropped before it)
  bool done = false;
  std::string status, error;  // when done: ready | failed
  std::stop_source cancel;    // requested: the build stops (its guest command killed) and fails

  void line(std::string l);
  void at(std::string stage, int percent);  // (percent only grows)
  void finish(std::string status, std::string error);
  std::string tail(size_t n) const;  // the last n lines, joined
};

// An image archive uploaded for an import (PUT /v1/templates/{name}/image), or pulled by
// reference from a registry (POST /v1/templates {image}: actors/image_pull.h).
struct ImageUpload {
  std::filesystem::path file;      // in TemplateBuilds::upload_dir() (an upload)
  std::string ref;                 // the reference (a pull; `file` empty)
  std::string username, password;  // its registry credentials ("": anonymous)
  uint64_t disk_mib = 0;           // its root disk (0: 4x the archive + 1 GiB, at least 2 GiB)
  bool start = true;  // the image's Entrypoint/Cmd runs in every sandbox (if it exposes a port)
};

class TemplateBuilds {
 public:
  explicit TemplateBuilds(Env& env);
  ~TemplateBuilds();  // running builds are cancelled (killed), then joined
  TemplateBuilds(const TemplateBuilds&) = delete;
  TemplateBuilds& operator=(const TemplateBuilds&) = delete;

  // Replays every template stream. A build a restart interrupted is recorded failed; images no
  // ready template owns are removed.
  std::optional<Rejection> recover();

  // Starts a build of `tenant`'s template `name`: its record (building) at once. A shape not
  // asked for (0) is the host's; host_full when this host cannot boot a guest of it.
  Reply<TemplateState> build(const std::string& tenant, const std::string& name,
                             const TemplateSpec& spec);
  // Starts an import of an image archive (actors/image_import.h) as `tenant`'s template `name`:
  // its record (building) at once; the upload (a file in upload_dir()) is taken over (moved),
  // whatever the answer. `spec`: its shape and network only.
  Reply<TemplateState> import(const std::string& tenant, const std::string& name,
                              const TemplateSpec& spec, const ImageUpload& upload);
  // Starts a pull of `upload.ref` (checked: parse_image_ref) imported as `tenant`'s template
  // `name`, as import() does with an upload.
  Reply<TemplateState> pull(const std::string& tenant, const std::string& name,
                            const TemplateSpec& spec, const ImageUpload& upload);
  // Where uploads of image archives are written while they arrive (emptied at start-up).
  std::filesystem::path upload_dir() const;
  // The tenants' build context archives (a build names them: TemplateSpec::contexts).
  BuildContexts& contexts() { return contexts_; }

  // Makes `snapshot` (a named snapshot of the tenant's sandbox `sandbox`, made from template
  // `from`, an id) the tenant's template `name`, ready at once: its sandboxes restore it. The
  // snapshot is copied (its RAM file sparsely, its layers linked); the caller deletes it.
  Reply<TemplateState> publish(const std::string& tenant, const std::string& name,
                               const std::string& sandbox, const std::string& from, bool network,
                               const vmm::Snapshot& snapshot);
  // Why `tenant` may not publish a template `name` now (before its snapshot is taken).
  std::optional<Rejection> check_publish(const std::string& tenant, const std::string& name);
  Reply<TemplateState> get(const std::string& tenant, const std::string& name);
  // The tenant's templates (deleted ones too when asked), by name.
  std::vector<TemplateState> list(const std::string& tenant, bool deleted_too = false);
  // `in_use`: the tenant's sandboxes of it that have not ended. A build still running is
  // cancelled first (and waited for): it ends failed, then the template is deleted.
  Reply<TemplateState> remove(const std::string& tenant, const std::string& name, size_t in_use);
  // The progress of the tenant's template's latest build (null: no build since this start).
  std::shared_ptr<BuildProgress> progress(const std::string& tenant, const std::string& name);
  // Whether `name` is a shipped template's (IMAGES/<name>).
  bool shipped(const std::string& name) const;
  // The template id a create of `tenant` naming `name` means: its ready custom template.
  std::optional<std::string> resolve(const std::string& tenant, const std::string& name);

 private:
  // The template id a build of `tenant` from `from` builds on: a shipped template without a
  // baked data volume (its name), or a ready template of the tenant's own (a build, an imported
  // image, a published sandbox: its id). invalid_argument naming what `from` may be otherwise.
  Reply<std::string> resolve_from(const std::string& tenant, const std::string& from);
  // Why `name` cannot name a custom template: not a valid name, or a shipped template's.
  std::optional<Rejection> check_name(const std::string& name) const;
  // quota_exceeded when `tenant` has max_templates others than `id` (under mu_).
  std::optional<Rejection> over_quota(const std::string& tenant, const std::string& id) const;
  // `spec` with the host's shape where it names none.
  TemplateSpec with_shape(TemplateSpec spec) const;
  // decide, persist, apply, under mu_.
  Reply<TemplateState> command(const std::string& id, const TemplateCommand& c);
  // The checks and the record of a new build or import (a running_ slot taken).
  Reply<TemplateState> begin(const std::string& tenant, const std::string& name,
                             const TemplateSpec& spec);
  // begin(), then run() on a thread of its own.
  Reply<TemplateState> launch(const std::string& tenant, const std::string& name,
                              const TemplateSpec& spec, std::optional<ImageUpload> image);
  // An import's spec: what it is of (`image`), and the shape and network `asked`.
  TemplateSpec image_spec(const TemplateSpec& asked, std::string image) const;
  // A build (`image` none) or an import, on its own thread, to its end.
  void run(std::string id, TemplateSpec spec, std::shared_ptr<BuildProgress> progress,
           std::optional<ImageUpload> image);

  Env& env_;
  BuildContexts contexts_;
  std::mutex mu_;
  std::map<std::string, TemplateState> states_;  // by id
  std::map<std::string, std::shared_ptr<BuildProgress>> progress_;
  std::vector<std::thread> threads_;
  uint32_t running_ = 0;
  bool stopping_ = false;
};

}  // namespace pandastack::actors
