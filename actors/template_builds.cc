#include "actors/template_builds.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "actors/custom_template_codec.h"
#include "actors/env.h"
#include "actors/event_codec.h"
#include "vmm-driver/images.h"
#include "vmm-driver/run_tool.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

void BuildProgress::line(std::string l) {
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

std::string recipe_get(const fs::path& recipe, const std::string& key) {
  std::ifstream in(recipe);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    auto eq = line.find('=');
    if (eq != std::string::npos && line.substr(0, eq) == key) return line.substr(eq + 1);
  }
  return "";
}

// A value in single quotes for sh.
std::string sh_quote(const std::string& v) {
  std::string out = "'";
  for (char c : v) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

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

// debootstrap's progress lines, as a share of the root file system stage (5..70%).
int rootfs_percent(const std::string& line) {
  static const std::pair<const char*, int> marks[] = {
      {"I: Retrieving Release", 8},     {"I: Resolving dependencies", 12},
      {"I: Retrieving ", 20},           {"I: Validating ", 30},
      {"I: Extracting ", 40},           {"I: Installing core", 48},
      {"I: Unpacking required", 52},    {"I: Configuring required", 56},
      {"I: Unpacking the base", 60},    {"I: Configuring the base", 64},
      {"I: Base system installed", 68}, {"[guest] rootfs ready", 70}};
  int p = 0;
  for (auto& [prefix, pct] : marks)
    if (line.rfind(prefix, 0) == 0) p = pct;
  return p;
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

TemplateBuilds::TemplateBuilds(Env& env) : env_(env) {}

fs::path TemplateBuilds::shipped_recipe(const std::string& from) const {
  return env_.config.template_builder.parent_path() / "templates" / (from + ".recipe");
}

std::optional<Rejection> TemplateBuilds::check_name(const std::string& name) const {
  if (auto no = check_template_name(name)) return no;  // (before a path is made of it)
  if (fs::exists(env_.config.images_dir / name))
    return Rejection{"conflict", "'" + name + "' is a shipped template's name"};
  return std::nullopt;
}

TemplateBuilds::~TemplateBuilds() {
  std::vector<std::thread> threads;
  {
    std::lock_guard g(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

std::optional<Rejection> TemplateBuilds::recover() {
  auto streams = env_.store->streams(kStream);
  if (!streams) return Rejection{"storage_error", streams.error().message};
  std::unique_lock g(mu_);
  for (auto& stream : *streams) {
    TemplateState s;
    s.id = stream.substr(kStream.size());
    auto events = env_.store->read_stream(stream);
    if (!events) return Rejection{"storage_error", events.error().message};
    for (auto& stored : *events) {
      auto e = decode_template_event(stored.payload);
      if (!e)
        return Rejection{"storage_error",
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
    return Rejection{"storage_error", appended.error().message};
  }
  for (auto& e : events) s = apply(s, e);
  return s;
}

Reply<TemplateState> TemplateBuilds::build(const std::string& tenant, const std::string& name,
                                           const TemplateSpec& asked) {
  auto& cfg = env_.config;
  auto spec = with_shape(asked);
  if (cfg.template_builder.empty() || !fs::exists(cfg.template_builder))
    return Rejection{"not_implemented",
                     "template builds are not offered by this daemon (no guest image build: "
                     "--template-builder)"};
  if (auto no = check_name(name)) return *no;
  // Only a shipped template's recipe, one without a baked data volume.
  auto recipe = shipped_recipe(spec.from);
  if (!valid_template_name(spec.from) || !fs::exists(recipe) ||
      !recipe_get(recipe, "data_volume_mib").empty())
    return Rejection{"invalid_argument",
                     "from: a shipped template without a data volume (base, code-interpreter)"};
  std::string id = template_id(tenant, name);
  // Its bake boots one guest of its shape here.
  if (auto no = env_.host_admits(spec.memory_mib)) return *no;
  {
    std::lock_guard g(mu_);
    if (stopping_) return Rejection{"unavailable", "the daemon is stopping"};
    if (auto no = over_quota(tenant, id)) return *no;
    if (running_ >= cfg.max_template_builds) {
      auto it = states_.find(id);
      if (it != states_.end() && it->second.status == TemplateStatus::building)
        return Rejection{"conflict", "template " + name + " is being built"};
      return Rejection{"too_many_requests",
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
    return started;
  }
  auto progress = std::make_shared<BuildProgress>();
  std::lock_guard g(mu_);
  progress_[id] = progress;
  threads_.emplace_back([this, id, spec, progress] { run(id, spec, progress); });
  return started;
}

TemplateSpec TemplateBuilds::with_shape(TemplateSpec spec) const {
  if (spec.memory_mib == 0) spec.memory_mib = env_.config.memory_mib;
  if (spec.vcpus == 0) spec.vcpus = env_.config.vcpus;
  return spec;
}

Reply<std::filesystem::path> TemplateBuilds::write_recipe(const TemplateSpec& spec,
                                                          const fs::path& work) {
  auto base = shipped_recipe(spec.from);
  std::string packages = recipe_get(base, "packages");
  for (auto& p : spec.packages) packages += (packages.empty() ? "" : ",") + p;
  uint64_t size_mb = 1024;
  try {
    size_mb = std::stoull(recipe_get(base, "size_mb")) + 1024;  // room for what it adds
  } catch (...) {
  }
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec) return Rejection{"storage_error", "cannot make " + work.string() + ": " + ec.message()};
  std::ofstream r(work / "template.recipe");
  r << "# A custom template's recipe (written by the daemon)\n";
  r << "suite=" << recipe_get(base, "suite") << "\n";
  r << "packages=" << packages << "\n";
  r << "size_mb=" << size_mb << "\n";
  r << "network=" << (spec.network ? "on" : "off") << "\n";
  // Its environment for login shells of its sandboxes too (the commands below get it exported).
  auto files = spec.files;
  if (!spec.env.empty()) {
    std::string profile;
    for (auto& [k, v] : spec.env) profile += "export " + k + "=" + sh_quote(v) + "\n";
    files["/etc/profile.d/pandastack-template.sh"] = profile;
  }
  if (!files.empty()) {
    r << "files=files\n";
    for (auto& [path, content] : files) {
      auto f = work / "files" / path.substr(1);  // (checked: absolute, normalized)
      fs::create_directories(f.parent_path(), ec);
      std::ofstream out(f, std::ios::binary);
      out << content;
      if (!out) return Rejection{"storage_error", "cannot write " + f.string()};
    }
  }
  if (!spec.run.empty()) {
    r << "bake_script=bake.sh\n";
    std::ofstream b(work / "bake.sh");
    b << "#!/bin/sh\n# The template's commands, run as root in its guest before the bake.\nset "
         "-e\n";
    for (auto& [k, v] : spec.env) b << "export " << k << "=" << sh_quote(v) << "\n";
    b << "cd /workspace 2>/dev/null || cd /\n";
    for (auto& c : spec.run) b << "echo " << sh_quote("+ " + c) << "\n" << c << "\n";
  }
  if (!r) return Rejection{"storage_error", "cannot write the recipe"};
  return work / "template.recipe";
}

void TemplateBuilds::run(std::string id, TemplateSpec spec,
                         std::shared_ptr<BuildProgress> progress) {
  auto t0 = std::chrono::steady_clock::now();
  auto& cfg = env_.config;
  auto image = cfg.custom_templates_dir / id;
  auto work = cfg.data_dir / "template-builds" / id;
  std::error_code ec;
  auto log = [&](const std::string& l) { progress->line(l); };
  auto finish = [&](std::optional<std::string> error) {
    fs::remove_all(work, ec);
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
      auto r = command(id, tcmd::Finish{ms, disk_usage(image)});
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
  auto cancelled = [this] {
    std::lock_guard g(mu_);
    return stopping_;
  };
  progress->at("recipe", 2);
  auto recipe = write_recipe(spec, work);
  if (!recipe) return finish(recipe.error().message);
  progress->at("rootfs", 5);
  log("building the root file system: " + spec.from + (spec.packages.empty() ? "" : " + ") + [&] {
    std::string p;
    for (auto& x : spec.packages) p += (p.empty() ? "" : " ") + x;
    return p;
  }());
  auto built = vmm::run_logged(
      {cfg.template_builder.string(), "rootfs", image.string(), recipe->string()},
      // (a tenant's image never goes to the shipped images' cache outside the data folder)
      {"PANDASTACK_DEBOOTSTRAP_CACHE=" + (cfg.data_dir / "template-cache").string(),
       "PANDASTACK_BUILD_VERBOSE=1", "PANDASTACK_IMAGE_CACHE=off"},
      [&](const std::string& l) {
        log(l);
        if (int p = rootfs_percent(l)) progress->at("rootfs", p);
      },
      cancelled);
  if (!built) {
    auto tail = progress->tail(5);
    return finish("the root file system build failed: " + built.error().message +
                  (tail.empty() ? "" : ": " + tail.substr(0, tail.size() - 1)));
  }
  if (cancelled()) return finish("the daemon stopped");
  // Its guests' shape (Env::template_shape): the bake's guest is the first of them.
  write_shape(image, spec.memory_mib, spec.vcpus);
  open_to_jails(image, ec);
  progress->at("bake", 75);
  log("baking: a cold boot, the template's commands in the guest, a snapshot");
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
    return Rejection{"quota_exceeded", "you have " + std::to_string(n) +
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
    return Rejection{"storage_error", "publishing the template: " + why};
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
    return Rejection{"template_not_found", "no template " + name};
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
  auto s = get(tenant, name);
  if (!s) return s;
  {
    // Templates published from sandboxes of it have their disks based on its root file system.
    std::lock_guard g(mu_);
    for (auto& [id, t] : states_)
      if (t.status == TemplateStatus::ready && t.spec.from == s->id)
        return Rejection{"template_in_use",
                         "template " + t.name + " was published from a sandbox of " + name};
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
