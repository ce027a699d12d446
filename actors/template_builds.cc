#include "actors/template_builds.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "actors/custom_template_codec.h"
#include "actors/dockerfile.h"
#include "actors/env.h"
#include "actors/event_codec.h"
#include "actors/image_import.h"
#include "actors/image_pull.h"
#include "actors/template_builder.h"
#include "actors/template_packages.h"
#include "actors/tenant_hash.h"
#include "vmm-driver/images.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

void BuildProgress::line(std::string l) {
  if (l.size() > kMaxLineBytes) l.resize(kMaxLineBytes);
  std::lock_guard g(mu);
  lines.push_back(std::move(l));
  if (lines.size() > kMaxLines) {
    lines.pop_front();
    ++first_line;
  }
  cv.notify_all();
}

void BuildProgress::at(std::string s, int p) {
  std::lock_guard g(mu);
  stage = std::move(s);
  percent = std::max(percent, p);
  cv.notify_all();
}

void BuildProgress::finish(std::string st, std::string err) {
  std::lock_guard g(mu);
  stage = st;
  if (st == "ready") percent = 100;
  status = std::move(st);
  error = std::move(err);
  done = true;
  cv.notify_all();
}

std::string BuildProgress::tail(size_t n) const {
  std::lock_guard g(mu);
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i)
    out += lines[i] + "\n";
  return out;
}

namespace {

const std::string kStream = "tpl_";

// Bytes a folder takes on disk.
uint64_t disk_usage(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(dir, ec)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
      total += uint64_t(st.st_blocks) * 512;
  }
  return total;
}

// The guest reads a template's folder through its jail's bind mount: readable, not writable, by
// others.
void open_to_jails(const fs::path& dir, std::error_code& ec) {
  fs::permissions(dir,
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                      fs::perms::others_read | fs::perms::others_exec,
                  ec);
}

// A template's guest shape, as Env::template_shape reads it: "<memory MiB> <vCPUs>".
void write_shape(const fs::path& dir, uint32_t memory_mib, uint32_t vcpus) {
  std::ofstream(dir / "shape") << memory_mib << " " << vcpus << "\n";
}

}  // namespace

TemplateBuilds::TemplateBuilds(Env& env)
    : env_(env),
      contexts_(env.config.data_dir / "build-contexts", env.config.build_context_max_mib << 20,
                env.config.max_build_contexts) {}

bool TemplateBuilds::shipped(const std::string& name) const {
  return valid_template_name(name) && fs::exists(env_.config.images_dir / name / "rootfs.qcow2");
}

Reply<std::string> TemplateBuilds::resolve_from(const std::string& tenant,
                                                const std::string& from) {
  auto buildable = [&](const std::string& name) {
    auto dir = env_.config.images_dir / name;  // (a valid name first: no path is made of another)
    return valid_template_name(name) && fs::is_regular_file(dir / "rootfs.qcow2") &&
           !fs::exists(dir / "data_volume");
  };
  if (buildable(from)) return from;
  if (valid_template_name(from)) {
    std::lock_guard g(mu_);
    auto it = states_.find(template_id(tenant, from));
    if (it != states_.end() && it->second.tenant == tenant &&
        it->second.status == TemplateStatus::ready)
      return it->first;
  }
  std::vector<std::string> names;
  std::error_code ec;
  for (auto& d : fs::directory_iterator(env_.config.images_dir, ec))
    if (buildable(d.path().filename().string())) names.push_back(d.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string list;
  for (auto& n : names) list += (list.empty() ? "" : ", ") + n;
  return Rejection{Code::invalid_argument, "from: a shipped template without a data volume (" +
                                               list + ") or a ready template of yours, not '" +
                                               from.substr(0, 64) + "'"};
}

std::optional<Rejection> TemplateBuilds::check_name(const std::string& name) const {
  if (auto no = check_template_name(name)) return no;  // (before a path is made of it)
  if (fs::exists(env_.config.images_dir / name))
    return Rejection{Code::conflict, "'" + name + "' is a shipped template's name"};
  return std::nullopt;
}

TemplateBuilds::~TemplateBuilds() {
  std::vector<std::thread> threads;
  {
    std::lock_guard g(mu_);
    stopping_ = true;
    for (auto& [id, p] : progress_) p->cancel.request_stop();
    threads.swap(threads_);
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

std::optional<Rejection> TemplateBuilds::recover() {
  auto streams = env_.store->streams(kStream);
  if (!streams) return Rejection{Code::storage_error, streams.error().message};
  std::unique_lock g(mu_);
  for (auto& stream : *streams) {
    TemplateState s;
    s.id = stream.substr(kStream.size());
    auto events = env_.store->read_stream(stream);
    if (!events) return Rejection{Code::storage_error, events.error().message};
    for (auto& stored : *events) {
      auto e = decode_template_event(stored.payload);
      if (!e)
        return Rejection{Code::storage_error,
                         "undecodable event " + std::to_string(stored.version) + " of " + stream};
      s = apply(s, *e);
    }
    s.spec = with_shape(s.spec);  // (records from before templates had shapes: the host's)
    states_[s.id] = s;
  }
  // Builds a restart cut short failed; what they left goes.
  std::vector<std::string> interrupted;
  for (auto& [id, s] : states_)
    if (s.status == TemplateStatus::building) interrupted.push_back(id);
  g.unlock();
  for (auto& id : interrupted) {
    (void)command(id, tcmd::Fail{"the build was interrupted by a restart of the daemon", ""});
    spdlog::warn("template {}: its build was interrupted by a restart: recorded failed", id);
  }
  g.lock();
  std::error_code ec;
  for (auto& d : fs::directory_iterator(env_.config.custom_templates_dir, ec)) {
    auto it = states_.find(d.path().filename().string());
    if (it == states_.end() || it->second.status != TemplateStatus::ready) {
      spdlog::info("recovery: removing {} (no ready template owns it)", d.path().string());
      fs::remove_all(d.path(), ec);
    }
  }
  fs::remove_all(env_.config.data_dir / "template-builds", ec);
  fs::remove_all(upload_dir(), ec);  // (uploads a restart cut short)
  // (what the package cache held before it was .deb files apt checked: debootstrap's)
  for (auto& d : fs::directory_iterator(env_.config.data_dir / "template-cache", ec))
    if (d.path().filename() != "debs") fs::remove_all(d.path(), ec);
  return std::nullopt;
}

Reply<TemplateState> TemplateBuilds::command(const std::string& id, const TemplateCommand& c) {
  std::lock_guard g(mu_);
  auto& s = states_[id];
  s.id = id;
  auto d = decide(s, c, now_ms());
  if (auto* r = std::get_if<Rejection>(&d)) {
    if (s.status == TemplateStatus::none) states_.erase(id);
    return *r;
  }
  auto events = std::get<std::vector<TemplateEvent>>(d);
  if (events.empty()) return s;
  std::vector<storage::NewEvent> ne;
  for (auto& e : events)
    ne.push_back({to_string(e.kind), event_format(), encode_template_event(e)});
  auto appended = env_.store->append(kStream + id, s.version, std::move(ne));
  if (!appended) {
    if (s.status == TemplateStatus::none) states_.erase(id);
    return Rejection{Code::storage_error, appended.error().message};
  }
  for (auto& e : events) s = apply(s, e);
  return s;
}

Reply<TemplateState> TemplateBuilds::begin(const std::string& tenant, const std::string& name,
                                           const TemplateSpec& spec) {
  auto& cfg = env_.config;
  if (!cfg.template_builds)
    return Rejection{Code::not_implemented,
                     "template builds are not offered by this daemon (--template-builds 0)"};
  if (auto no = check_name(name)) return *no;
  std::string id = template_id(tenant, name);
  // Its bake boots one guest of its shape here.
  if (auto no = env_.host_admits(spec.memory_mib)) return *no;
  {
    std::lock_guard g(mu_);
    if (stopping_) return Rejection{Code::unavailable, "the daemon is stopping"};
    if (auto no = over_quota(tenant, id)) return *no;
    if (running_ >= cfg.max_template_builds) {
      auto it = states_.find(id);
      if (it != states_.end() && it->second.status == TemplateStatus::building)
        return Rejection{Code::conflict, "template " + name + " is being built"};
      return Rejection{Code::too_many_requests,
                       std::to_string(running_) +
                           " template build(s) running on this host, the "
                           "most it runs at once: try again when one has ended"};
    }
    ++running_;  // (taken before the record: two builds of one name race to the record below)
  }
  auto started = command(id, tcmd::Build{tenant, name, spec});
  if (!started) {
    std::lock_guard g(mu_);
    --running_;
  }
  return started;
}

Reply<TemplateState> TemplateBuilds::build(const std::string& tenant, const std::string& name,
                                           const TemplateSpec& asked) {
  auto spec = with_shape(asked);
  if (spec.contexts.size() > TemplateLimits{}.max_contexts)  // (before they are looked up)
    return Rejection{
        Code::invalid_argument,
        "context: at most " + std::to_string(TemplateLimits{}.max_contexts) + " archives"};
  if (spec.from.rfind(kFromImagePrefix, 0) == 0) {
    // FROM an image: pulled (anonymously) and imported by the build itself, into its folder.
    auto ref = parse_image_ref(spec.from.substr(std::string(kFromImagePrefix).size()));
    if (!ref) return ref.error();
    for (auto& k : spec.contexts)
      if (auto got = contexts_.get(tenant, k); !got) return got.error();
    return launch(tenant, name, spec, std::nullopt);
  }
  auto from = resolve_from(tenant, spec.from);
  if (!from) return from.error();
  for (auto& k : spec.contexts)  // (each taken again when the build starts)
    if (auto got = contexts_.get(tenant, k); !got) return got.error();
  if (*from != spec.from) {
    // On a template of the tenant's: its environment and its start command carry over, as a
    // Docker image's ENV and CMD do (the build's own win).
    std::lock_guard g(mu_);
    auto& parent = states_[*from].spec;
    for (auto& [k, v] : parent.env) spec.env.try_emplace(k, v);
    if (spec.start.empty()) {
      spec.start = parent.start;
      spec.ready_port = parent.ready_port;
      spec.ready_cmd = parent.ready_cmd;
    }
    spec.from = *from;  // (its id)
  }
  return launch(tenant, name, spec, std::nullopt);
}

Reply<TemplateState> TemplateBuilds::launch(const std::string& tenant, const std::string& name,
                                            const TemplateSpec& spec,
                                            std::optional<ImageUpload> image) {
  auto started = begin(tenant, name, spec);
  if (!started) return started;
  if (image && image->ref.empty()) {
    // The build's own folder takes the upload over (one file system: a rename).
    std::error_code ec;
    auto work = env_.config.data_dir / "template-builds" / started->id;
    fs::remove_all(work, ec);
    fs::create_directories(work, ec);
    auto to = work / "image.tar";
    fs::rename(image->file, to, ec);
    image->file = to;
  }
  auto progress = std::make_shared<BuildProgress>();
  std::lock_guard g(mu_);
  progress_[started->id] = progress;
  threads_.emplace_back(
      [this, id = started->id, spec, progress, image] { run(id, spec, progress, image); });
  return started;
}

TemplateSpec TemplateBuilds::image_spec(const TemplateSpec& asked, std::string image) const {
  TemplateSpec spec;
  spec.from.clear();  // (its root file system is the image's)
  spec.image = std::move(image);
  spec.network = asked.network;
  spec.memory_mib = asked.memory_mib;
  spec.vcpus = asked.vcpus;
  return with_shape(spec);
}

fs::path TemplateBuilds::upload_dir() const { return env_.config.data_dir / "template-uploads"; }

Reply<TemplateState> TemplateBuilds::pull(const std::string& tenant, const std::string& name,
                                          const TemplateSpec& asked, const ImageUpload& upload) {
  auto ref = parse_image_ref(upload.ref);
  if (!ref) return ref.error();
  return launch(tenant, name, image_spec(asked, "pull of " + ref->text()), upload);
}

Reply<TemplateState> TemplateBuilds::import(const std::string& tenant, const std::string& name,
                                            const TemplateSpec& asked, const ImageUpload& upload) {
  std::error_code ec;
  auto size = fs::file_size(upload.file, ec);
  if (ec) {
    fs::remove(upload.file, ec);
    return Rejection{Code::storage_error, "the upload: " + ec.message()};
  }
  auto started = launch(tenant, name,
                        image_spec(asked, "upload of " + std::to_string(size) + " bytes"), upload);
  if (!started) fs::remove(upload.file, ec);
  return started;
}

TemplateSpec TemplateBuilds::with_shape(TemplateSpec spec) const {
  if (spec.memory_mib == 0) spec.memory_mib = env_.config.memory_mib;
  if (spec.vcpus == 0) spec.vcpus = env_.config.vcpus;
  return spec;
}

void TemplateBuilds::run(std::string id, TemplateSpec spec, std::shared_ptr<BuildProgress> progress,
                         std::optional<ImageUpload> upload) {
  auto t0 = std::chrono::steady_clock::now();
  auto& cfg = env_.config;
  auto image = cfg.custom_templates_dir / id;
  auto work = cfg.data_dir / "template-builds" / id;
  std::error_code ec;
  // What a tenant reads (its log, its error) names no host folder.
  auto scrub = [&](std::string text) {
    for (auto& [dir, name] :
         {std::pair{cfg.custom_templates_dir, "TEMPLATES"}, std::pair{cfg.disk_dir, "DISKS"},
          std::pair{cfg.state_dir, "STATE"}, std::pair{cfg.images_dir, "IMAGES"},
          std::pair{cfg.data_dir, "DATA"}}) {
      auto d = dir.string();
      if (d.empty() || d == "/") continue;
      for (size_t at; (at = text.find(d)) != std::string::npos;) text.replace(at, d.size(), name);
    }
    return text;
  };
  auto log = [&](const std::string& l) { progress->line(scrub(l)); };
  std::optional<ImportedImage> imported;  // an import's image, once unpacked
  auto finish = [&](std::optional<std::string> raw_error) {
    fs::remove_all(work, ec);
    std::optional<std::string> error;
    if (raw_error) error = scrub(*raw_error);
    if (error) {
      fs::remove_all(image, ec);  // nothing half-made
      auto tail = progress->tail(40);
      if (auto r = command(id, tcmd::Fail{*error, tail}); !r)
        spdlog::error("template {}: its failure not recorded: {}", id, r.error().message);
      spdlog::warn("template {}: build failed: {}", id, *error);
      progress->finish("failed", *error);
    } else {
      uint64_t ms = uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::steady_clock::now() - t0)
                                 .count());
      auto r = command(
          id, tcmd::Finish{ms, disk_usage(image), imported ? imported->facts : ImageFacts{}});
      if (!r) {
        fs::remove_all(image, ec);
        progress->finish("failed", "the build's end not recorded: " + r.error().message);
      } else {
        spdlog::info("template {}: built in {} ms ({} bytes)", id, ms, r->size_bytes);
        progress->finish("ready", "");
      }
    }
    std::lock_guard g(mu_);
    --running_;
  };
  auto cancelled = [&] { return progress->cancel.stop_requested(); };
  auto why_cancelled = [this] {
    std::lock_guard g(mu_);
    return std::string(stopping_ ? "the daemon stopped" : "the build was cancelled (DELETE)");
  };
  const auto deadline = std::chrono::steady_clock::now() + cfg.template_build_timeout;
  auto timed_out = [&] { return std::chrono::steady_clock::now() >= deadline; };
  // A pull of `ref` (checked by whoever took it): the registry's blobs, checked, into an OCI
  // image layout tar (work/image.tar), imported next. The error, if it failed.
  auto pull_to_tar = [&](const std::string& ref, const std::string& username,
                         const std::string& password) -> std::optional<std::string> {
    PullJob pull;
    pull.ref = *parse_image_ref(ref);
    pull.username = username;
    pull.password = password;
    pull.insecure = cfg.insecure_registries;
    pull.out = work / "image.tar";
    pull.max_bytes = cfg.template_image_max_mib << 20;
    pull.deadline = deadline;
    pull.stop = progress->cancel.get_token();
    pull.log = log;
    auto pulled = pull_image(pull);
    if (cancelled()) return why_cancelled();
    if (!pulled) return pulled.error().message;
    log("pull: " + std::to_string(pulled->bytes >> 20) + " MiB, every blob verified");
    return std::nullopt;
  };
  if (upload && !upload->ref.empty()) {
    progress->at("pull", 2);
    if (auto failed = pull_to_tar(upload->ref, upload->username, upload->password))
      return finish(*failed);
    upload->file = work / "image.tar";
  }
  if (upload) {
    progress->at("import", 5);
    ImportJob job;
    job.id = id;
    job.spec = spec;
    job.archive = upload->file;
    job.work_dir = work;
    job.out_dir = image;
    auto archive_mib = fs::file_size(upload->file, ec) >> 20;
    job.disk_bytes = (upload->disk_mib != 0 ? upload->disk_mib
                                            : std::max<uint64_t>(2048, 4 * archive_mib + 1024))
                     << 20;
    job.busybox = cfg.busybox;
    job.start = upload->start;
    job.deadline = deadline;
    job.stop = progress->cancel.get_token();
    job.log = log;
    job.at = [&](int p) { progress->at("import", 5 + p * 70 / 100); };
    fs::remove_all(image, ec);
    auto got = import_in_vm(env_, job);
    fs::remove_all(work, ec);  // (the archive: the importer is done with it)
    if (cancelled()) return finish(why_cancelled());
    if (!got) return finish(got.error().message);
    imported = *got;
    log("image: " + got->facts.ref + " (" + got->format + ", " + std::to_string(got->layers) +
        " layers, " + std::to_string(got->entries) + " entries, " +
        std::to_string(got->bytes >> 20) + " MiB) on a " + std::to_string(job.disk_bytes >> 20) +
        " MiB root disk");
    if (got->facts.start.empty() && !(got->cmd.empty() && got->entrypoint.empty()))
      log(std::string("image: its Entrypoint/Cmd is not started in its sandboxes (") +
          (upload->start ? "it exposes no TCP port to wait for" : "start=false") +
          "): run it with an exec");
    // What its sandboxes get from the image: its environment (in its disk) and start command.
    spec.start = got->facts.start;
    spec.ready_port = got->facts.ready_port;
  } else {
    std::filesystem::path from_dir;  // a FROM image's root file system, pulled here
    if (spec.from.rfind(kFromImagePrefix, 0) == 0) {
      progress->at("pull", 1);
      fs::remove_all(image, ec);
      if (auto failed = pull_to_tar(spec.from.substr(std::string(kFromImagePrefix).size()), "", ""))
        return finish(*failed);
      const auto tar = work / "image.tar";
      ImportJob ij;
      ij.id = id;
      ij.spec = spec;
      ij.archive = tar;
      ij.work_dir = work;
      ij.out_dir = image / "from";
      auto archive_mib = fs::file_size(tar, ec) >> 20;
      ij.disk_bytes = std::max<uint64_t>(2048, 4 * archive_mib + 1024) << 20;
      ij.busybox = cfg.busybox;
      ij.deadline = deadline;
      ij.stop = progress->cancel.get_token();
      ij.log = log;
      ij.at = [&](int p) { progress->at("import", 1 + p * 4 / 100); };
      auto got = import_in_vm(env_, ij);
      fs::remove(tar, ec);
      if (cancelled()) return finish(why_cancelled());
      if (!got) return finish(got.error().message);
      log("image: " + got->facts.ref + " (" + std::to_string(got->layers) + " layers, " +
          std::to_string(got->bytes >> 20) + " MiB): the Dockerfile's steps run on it");
      // Its environment and start command carry over, as a Docker image's ENV and CMD do (the
      // Dockerfile's own win).
      for (auto& [k, v] : got->facts.env) spec.env.try_emplace(k, v);
      if (spec.start.empty()) {
        spec.start = got->facts.start;
        spec.ready_port = got->facts.ready_port;
      }
      from_dir = image / "from";
      imported = *got;  // (its record: the image, and what its sandboxes get of it)
      imported->facts.start = spec.start;
      imported->facts.ready_port = spec.ready_port;
      imported->facts.env = spec.env;
    }
    progress->at("packages", 2);
    PackageFetch fetch;
    fetch.cache = cfg.data_dir / "template-cache" / "debs";
    fetch.cache_max_bytes = cfg.template_cache_max_mib << 20;
    fetch.max_bytes = cfg.template_packages_max_mib << 20;
    fetch.log = log;
    fetch.cancelled = [&] { return cancelled() || timed_out(); };
    if (!spec.packages.empty()) {
      std::string names;
      for (auto& p : spec.packages) names += (names.empty() ? "" : " ") + p;
      log("fetching packages (as files, on the host): " + names);
    }
    auto packages = fetch_packages(spec.packages, work, fetch);
    if (cancelled()) return finish(why_cancelled());
    if (timed_out())
      return finish("the build took longer than its limit of " +
                    std::to_string(cfg.template_build_timeout.count()) + " s");
    if (!packages) return finish(packages.error().message);
    // The step cache (actors/step_cache.h): the tenant's own; a build whose every step is
    // cached needs no context unpacked.
    std::string tenant;
    {
      std::lock_guard g(mu_);
      tenant = states_[id].tenant;
    }
    BuilderJob probe;
    probe.spec = spec;
    probe.from_dir = from_dir;
    probe.tenant = tenant;
    probe.step_cache = cfg.data_dir / "template-cache" / "steps" / tenant_hash(tenant);
    auto cached = cached_steps(env_, probe);
    std::filesystem::path context_disk;
    if (!spec.contexts.empty() && !(cached && *cached == spec.run.size())) {
      // The context's archives unpacked in a builder of their own (actors/build_context.h).
      progress->at("context", 5);
      auto archives = contexts_.take(tenant, spec.contexts, work / "contexts");
      if (!archives) return finish(archives.error().message);
      uint64_t total = 0;
      for (auto& a : *archives) total += fs::file_size(a, ec);
      ContextJob cj;
      cj.id = id;
      cj.memory_mib = spec.memory_mib;
      cj.vcpus = spec.vcpus;
      cj.archives = *archives;
      cj.work_dir = work;
      const uint64_t floor = uint64_t(1) << 30;
      cj.disk_bytes = std::clamp<uint64_t>(8 * total + (uint64_t(512) << 20), floor,
                                           std::max(floor, (cfg.build_context_max_mib << 20) * 8));
      cj.deadline = deadline;
      cj.stop = progress->cancel.get_token();
      cj.log = log;
      auto disk = unpack_context_in_vm(env_, cj);
      fs::remove_all(work / "contexts", ec);
      if (cancelled()) return finish(why_cancelled());
      if (!disk) return finish(disk.error().message);
      context_disk = *disk;
    }
    progress->at("builder", 10);
    BuilderJob job;
    job.context_disk = context_disk;
    job.from_dir = from_dir;
    job.tenant = tenant;
    job.step_cache = probe.step_cache;
    job.id = id;
    job.spec = spec;
    job.packages = *packages;
    job.out_dir = image;
    job.deadline = deadline;
    job.stop = progress->cancel.get_token();
    job.log = log;
    job.at = [&](int p) { progress->at("builder", 10 + p * 65 / 100); };
    if (from_dir.empty()) fs::remove_all(image, ec);
    auto built = build_in_vm(env_, job);
    fs::remove_all(work, ec);  // (the package image: the builder is done with it)
    if (cancelled()) return finish(why_cancelled());
    if (!built) return finish(built.error().message);
  }
  // Its key names this build alone: no other template (another tenant's of the same spec
  // included) shares its bakes or their staged copies.
  std::ofstream(image / "key") << "built:" << id << ":" << random_base32(16) << "\n";
  std::ofstream(image / "network") << (spec.network ? "on" : "off") << "\n";
  // Its guests' shape (Env::template_shape): the bake's guest is the first of them.
  write_shape(image, spec.memory_mib, spec.vcpus);
  // What every sandbox of it runs: started by the bake (vmm-driver/templates.h runs bake.sh).
  if (auto script = start_script(spec); !script.empty()) {
    std::ofstream(image / "bake.sh") << script;
    log("baking: the start command runs in the bake's guest: " + spec.start);
  }
  open_to_jails(image, ec);
  progress->at("bake", 75);
  log("baking: a cold boot of the built disk, a snapshot");
  auto baked = env_.templates->baked(id, env_.vm_config(id, "shape", "shape"), log);
  if (!baked) return finish("the bake failed: " + baked.error().message);
  progress->at("bake", 95);
  if (auto staged = env_.template_snapshot(id); !staged)
    return finish("staging the baked snapshot failed: " + staged.error().message);
  finish(std::nullopt);
}

std::optional<Rejection> TemplateBuilds::over_quota(const std::string& tenant,
                                                    const std::string& id) const {
  size_t n = 0;
  for (auto& [other, s] : states_)
    if (s.tenant == tenant && other != id && s.status != TemplateStatus::deleted &&
        s.status != TemplateStatus::none)
      ++n;
  if (n >= env_.config.max_templates)
    return Rejection{Code::quota_exceeded, "you have " + std::to_string(n) +
                                               " templates, the most you may have: delete one"};
  return std::nullopt;
}

std::optional<Rejection> TemplateBuilds::check_publish(const std::string& tenant,
                                                       const std::string& name) {
  if (auto no = check_name(name)) return no;
  std::lock_guard g(mu_);
  if (auto no = over_quota(tenant, template_id(tenant, name))) return no;
  TemplateState none;
  auto it = states_.find(template_id(tenant, name));
  auto d = decide(it == states_.end() ? none : it->second,
                  tcmd::Publish{tenant, name, "", "", 0, true}, now_ms());
  if (auto* r = std::get_if<Rejection>(&d)) return *r;
  return std::nullopt;
}

Reply<TemplateState> TemplateBuilds::publish(const std::string& tenant, const std::string& name,
                                             const std::string& sandbox, const std::string& from,
                                             bool network, const vmm::Snapshot& snapshot) {
  if (auto no = check_publish(tenant, name)) return *no;
  auto& cfg = env_.config;
  std::string id = template_id(tenant, name);
  auto dir = cfg.custom_templates_dir / id;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  auto fail = [&](const std::string& why) -> Reply<TemplateState> {
    fs::remove_all(dir, ec);
    return Rejection{Code::storage_error, "publishing the template: " + why};
  };
  if (ec) return fail(ec.message());
  open_to_jails(dir, ec);
  // Its disk chain ends in the root file system of the template its sandbox was made from (that
  // one cannot be deleted while this one exists); its key names this snapshot.
  auto base = vmm::template_dir(cfg.images_dir, cfg.custom_templates_dir, from) / "rootfs.qcow2";
  fs::create_symlink(base, dir / "rootfs.qcow2", ec);
  if (ec) return fail(ec.message());
  std::ofstream(dir / "key") << "published:" << snapshot.dir.filename().string() << "\n";
  std::ofstream(dir / "network") << (network ? "on" : "off") << "\n";
  write_shape(dir, snapshot.memory_mib, snapshot.vcpus);
  auto key = env_.templates->key(id, env_.vm_config(id, "shape", "shape"));
  if (!key) return fail(key.error().message);
  auto staged = vmm::stage_snapshot(snapshot, dir / "baked" / *key);
  if (!staged) return fail(staged.error().message);
  auto r = command(id, tcmd::Publish{tenant, name, sandbox, from, disk_usage(dir), network,
                                     snapshot.memory_mib, snapshot.vcpus});
  if (!r) fs::remove_all(dir, ec);
  return r;
}

Reply<TemplateState> TemplateBuilds::get(const std::string& tenant, const std::string& name) {
  std::lock_guard g(mu_);
  auto it = states_.find(template_id(tenant, name));
  if (it == states_.end() || it->second.tenant != tenant ||
      it->second.status == TemplateStatus::deleted)
    return Rejection{Code::template_not_found, "no template " + name};
  return it->second;
}

std::vector<TemplateState> TemplateBuilds::list(const std::string& tenant, bool deleted_too) {
  std::lock_guard g(mu_);
  std::vector<TemplateState> out;
  for (auto& [id, s] : states_)
    if ((tenant == "*" || s.tenant == tenant) &&
        (deleted_too || s.status != TemplateStatus::deleted) && s.status != TemplateStatus::none)
      out.push_back(s);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.name < b.name; });
  return out;
}

Reply<TemplateState> TemplateBuilds::remove(const std::string& tenant, const std::string& name,
                                            size_t in_use) {
  if (shipped(name))
    return Rejection{Code::conflict, "'" + name + "' is a shipped template: it cannot be deleted"};
  auto s = get(tenant, name);
  if (!s) return s;
  if (s->status == TemplateStatus::building) {
    auto p = progress(tenant, name);
    if (p) {
      p->cancel.request_stop();
      std::unique_lock l(p->mu);
      if (!p->cv.wait_for(l, std::chrono::seconds(120), [&] { return p->done; }))
        return Rejection{Code::conflict, "template " + name + " is still stopping its build"};
    }
    s = get(tenant, name);
    if (!s) return s;
  }
  {
    // Templates built on it, or published from sandboxes of it, have their disks based on its
    // root file system.
    std::lock_guard g(mu_);
    for (auto& [id, t] : states_)
      if ((t.status == TemplateStatus::ready || t.status == TemplateStatus::building) &&
          t.spec.from == s->id)
        return Rejection{
            Code::template_in_use,
            "template " + t.name +
                (t.sandbox.empty() ? " is built on " : " was published from a sandbox of ") + name +
                ": delete it first"};
  }
  auto removed = command(s->id, tcmd::Delete{in_use});
  if (!removed) return removed;
  // Its pools, its staged snapshot, its images.
  env_.forget_template(s->id);
  std::error_code ec;
  fs::remove_all(env_.config.custom_templates_dir / s->id, ec);
  return removed;
}

std::shared_ptr<BuildProgress> TemplateBuilds::progress(const std::string& tenant,
                                                        const std::string& name) {
  std::lock_guard g(mu_);
  auto it = progress_.find(template_id(tenant, name));
  return it == progress_.end() ? nullptr : it->second;
}

std::optional<std::string> TemplateBuilds::resolve(const std::string& tenant,
                                                   const std::string& name) {
  std::lock_guard g(mu_);
  auto it = states_.find(template_id(tenant, name));
  if (it == states_.end() || it->second.status != TemplateStatus::ready) return std::nullopt;
  return it->first;
}

}  // namespace pandastack::actors
