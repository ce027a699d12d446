#include "actors/template_builder.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "actors/dockerfile.h"
#include "actors/env.h"
#include "actors/step_cache.h"
#include "vmm-driver/file_copy.h"
#include "vmm-driver/images.h"
#include "vmm-driver/qcow2.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/vm.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

constexpr const char* kPackagesMount = "/run/pandastack-build";

// Installs the .deb files at kPackagesMount that the guest does not have at that version: dpkg
// unpacks them together, then configures them (their maintainer scripts run in the guest).
const char* const kInstallScript = R"(set -e
export DEBIAN_FRONTEND=noninteractive
cd /run/pandastack-build
need=""
for f in *.deb; do
  p=$(dpkg-deb -f "$f" Package); v=$(dpkg-deb -f "$f" Version)
  have=$(dpkg-query -W -f='${Version} ${db:Status-Abbrev}\n' "$p" 2>/dev/null | head -1 || true)
  case "$have" in "$v ii"*) continue ;; esac
  need="$need /run/pandastack-build/$f"
done
if [ -z "$need" ]; then echo "packages: the guest has them all"; exit 0; fi
echo "packages: installing$need"
dpkg --force-confold -i $need
rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* 2>/dev/null || true
)";

// The root disk grew by the host's block_resize: once the guest's kernel sees it, its file
// system grows online into it.
// (POSIX sh and the image's own `sleep`: the `from` may be an imported image with no more)
std::string grow_script(uint64_t bytes) {
  return "set -e\nwant=" + std::to_string(bytes / 512) +
         "\ni=0\nwhile :; do\n  read s < /sys/block/vda/size\n  [ \"$s\" = \"$want\" ] && "
         "break\n  i=$((i + 1))\n  [ $i -lt 400 ] || { echo \"the root disk did not grow\" >&2; "
         "exit 1; }\n  sleep 0.05\ndone\nif command -v resize2fs >/dev/null 2>&1; then\n  "
         "resize2fs /dev/vda 2>&1 | tail -1\nelse\n  echo \"the file system keeps its size (no "
         "resize2fs in the guest)\"\nfi\n";
}

uint32_t left_ms(steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now()).count();
  return uint32_t(std::clamp<int64_t>(left, 1, int64_t(UINT32_MAX)));
}

}  // namespace

Reply<std::unique_ptr<vmm::Vm>> boot_builder(Env& env, const std::string& from,
                                             const std::string& run_name, uint32_t memory_mib,
                                             uint32_t vcpus, steady_clock::time_point deadline,
                                             const std::function<void(const std::string&)>& log,
                                             const std::string& what, const fs::path& rootfs,
                                             const vmm::Snapshot* disk_of) {
  auto c = env.vm_config(from, run_name, run_name);
  if (!rootfs.empty()) c.rootfs = rootfs;
  c.memory_mib = memory_mib;
  c.vcpus = vcpus;
  c.name = run_name;
  c.hostname = "builder";
  c.die_with_parent = true;  // (a builder never outlives the daemon: a restart fails its build)
  c.network = nullptr;       // no network: what it needs comes on a disk
  c.boot_timeout = std::min<milliseconds>(milliseconds(left_ms(deadline)), c.boot_timeout);
  if (log)
    log("builder: booting a " + std::to_string(c.memory_mib) + " MiB guest of " +
        template_display_name(from) + " (no network)" + what);
  auto booted = disk_of ? vmm::Vm::boot_on(env.io, *disk_of, c) : vmm::Vm::boot(env.io, c);
  if (!booted) return Rejection{Code::build_failed, "the builder VM: " + booted.error().message};
  return std::move(*booted);
}

std::optional<Rejection> make_template_overlay(const fs::path& rootfs, uint64_t size) {
  auto overlay =
      vmm::run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b",
                     rootfs.string(), rootfs.string() + ".overlay", std::to_string(size)});
  if (!overlay) return Rejection{Code::storage_error, overlay.error().message};
  return std::nullopt;
}

std::optional<Rejection> run_builder_script(vmm::Vm& vm, const std::string& what,
                                            const std::string& script,
                                            steady_clock::time_point deadline,
                                            const std::function<void(const std::string&)>& log,
                                            std::stop_token stop) {
  if (stop.stop_requested()) return Rejection{Code::unavailable, "the daemon stopped"};
  if (steady_clock::now() >= deadline)
    return Rejection{Code::timeout, "the build's time ran out before " + what};
  vmm::ExecRequest run;
  run.shell = "sh -s";
  run.stdin_data = script;
  run.timeout_ms = left_ms(deadline);
  std::string partial[2], last;  // last: the last line it printed (a failure's reason)
  auto on_output = [&](vmm::StreamKind k, std::string_view data) {
    auto& line = partial[k == vmm::StreamKind::err ? 1 : 0];
    for (char c : data) {
      if (c == '\n' || c == '\r') {
        if (!line.empty() && log) log(line);
        if (!line.empty()) last = line;
        line.clear();
      } else if (line.size() < 4096) {
        line += c;
      }
    }
  };
  auto r = vm.agent().exec_stream(run, on_output, stop);
  if (stop.stop_requested()) return Rejection{Code::unavailable, "the daemon stopped"};
  for (auto& l : partial)
    if (!l.empty()) {
      if (log) log(l);
      last = l;
    }
  if (!r) return Rejection{Code::build_failed, what + ": " + r.error().message};
  if (r->timed_out)
    return Rejection{Code::timeout, what + " did not finish before the build's deadline"};
  if (!r->error.empty()) return Rejection{Code::build_failed, what + ": " + r->error};
  if (r->exit_code != 0)
    return Rejection{Code::build_failed, what + " failed (exit " + std::to_string(r->exit_code) +
                                             (last.empty() ? ")" : "): " + last.substr(0, 512))};
  return std::nullopt;
}

namespace {

// The root file system a job builds on, and the size of its builder's disk.
struct BuildBase {
  fs::path rootfs;
  uint64_t size = 0;
};

Reply<BuildBase> build_base(Env& env, const BuilderJob& job) {
  // The shipped template it builds on (checked by the caller): a root file system we made.
  // (or a ready template of the tenant's: an id, checked by the caller, whose disk chain ends in
  // a shipped template's or in an imported image's; or a FROM image this build pulled)
  auto rootfs = fs::absolute(
      (job.from_dir.empty() ? vmm::template_dir(env.config.images_dir,
                                                env.config.custom_templates_dir, job.spec.from)
                            : job.from_dir) /
      "rootfs.qcow2");
  auto base_size = vmm::qcow2::virtual_size(rootfs);
  if (!base_size) return Rejection{Code::internal, base_size.error().message};
  return BuildBase{rootfs, *base_size + (job.grow_mib << 20)};
}

// The build's step cache, when it has one (not for a FROM image pulled by this very build).
std::optional<StepCache> step_cache_of(const BuilderJob& job) {
  if (job.step_cache.empty() || !job.from_dir.empty()) return std::nullopt;
  return StepCache(job.step_cache);
}

// The layers of checkpoint `last` as the template's own (copies: a checkpoint is the cache's to
// drop), each naming the one below it by its absolute name in `out_dir`, the oldest the root
// file system the build was on, so that a template on this one, or a sandbox of it published,
// opens the chain from anywhere. The name the template's root file system is to name.
Reply<std::string> install_layers(const vmm::Snapshot& last, const fs::path& out_dir,
                                  const fs::path& from_rootfs) {
  std::string below = from_rootfs.string();
  for (auto& l : last.layers) {
    auto to = out_dir / l;
    std::error_code ec;
    fs::remove(to, ec);
    auto copied = vmm::clone_file(last.layer(l), to);
    if (!copied)
      return Rejection{Code::storage_error, "keeping the cached disk: " + copied.error().message};
    auto named = vmm::qcow2::set_backing_file(to, below);
    if (!named || ::chmod(to.c_str(), 0644) != 0)
      return Rejection{Code::storage_error, "keeping the cached disk: " + to.string()};
    below = to.string();
  }
  return below;
}

}  // namespace

std::optional<size_t> cached_steps(Env& env, const BuilderJob& job) {
  auto cache = step_cache_of(job);
  auto base = build_base(env, job);
  if (!cache || !base) return std::nullopt;
  auto found = cache->deepest(step_keys(job.tenant, base->rootfs, base->size, job.spec));
  if (!found) return std::nullopt;
  return found->first;
}

Reply<uint64_t> build_in_vm(Env& env, const BuilderJob& job) {
  auto& spec = job.spec;
  auto log = [&](const std::string& l) {
    if (job.log) job.log(l);
  };
  auto at = [&](int p) {
    if (job.at) job.at(p);
  };
  auto base = build_base(env, job);
  if (!base) return base.error();
  const auto from_rootfs = base->rootfs;
  const uint64_t size = base->size;

  // Where an earlier build of the same prefix left off (actors/step_cache.h).
  auto cache = step_cache_of(job);
  std::vector<std::string> keys;
  std::optional<std::pair<size_t, vmm::Snapshot>> resumed;
  if (cache) {
    keys = step_keys(job.tenant, from_rootfs, size, spec);
    resumed = cache->deepest(keys);
  }
  std::optional<vmm::Snapshot> last;  // the newest checkpoint under the builder's disk
  if (resumed) last = resumed->second;
  const size_t first_step = resumed ? resumed->first : 0;  // the first command to run
  if (resumed)
    log("builder: " + std::string(first_step == 0 ? "its packages and files" : "") +
        (first_step > 0 ? std::to_string(first_step) + " of its " +
                              std::to_string(spec.run.size()) + " commands"
                        : "") +
        " from the step cache (an earlier build of the same prefix)");

  if (resumed && first_step == spec.run.size()) {
    // Every command is cached: the template's disk is the last checkpoint's, as it is.
    std::error_code ec;
    fs::create_directories(job.out_dir, ec);
    auto top = install_layers(*last, job.out_dir, from_rootfs);
    if (!top) return top.error();
    auto out = job.out_dir / "rootfs.qcow2";
    auto made = vmm::run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-u", "-b",
                               *top, out.string(), std::to_string(size)});
    if (!made) return Rejection{Code::storage_error, made.error().message};
    if (auto no = make_template_overlay(out, size)) return *no;
    at(100);
    return size;
  }
  auto booted = resumed
                    ? boot_builder(env, spec.from, "build-" + job.id, spec.memory_mib, spec.vcpus,
                                   job.deadline, log, " on its cached steps", {}, &resumed->second)
                : job.from_dir.empty()
                    ? boot_builder(env, spec.from, "build-" + job.id, spec.memory_mib, spec.vcpus,
                                   job.deadline, log, "")
                    : boot_builder(env, "base", "build-" + job.id, spec.memory_mib, spec.vcpus,
                                   job.deadline, log, " on the pulled image", from_rootfs);
  if (!booted) return booted.error();
  auto& vm = **booted;
  at(10);
  // A checkpoint costs a sync and a pause while the guest's disk becomes a layer: one is taken
  // after work that took longer than 2 s, and after the last command.
  auto since = std::chrono::steady_clock::now();
  auto checkpoint = [&](size_t k, bool always = false) -> std::optional<Rejection> {
    if (!cache) return std::nullopt;
    if (!always && std::chrono::steady_clock::now() - since < std::chrono::seconds(2))
      return std::nullopt;
    auto t0 = std::chrono::steady_clock::now();
    if (auto no = run_builder_script(vm, "a checkpoint", "sync\n", job.deadline, nullptr, job.stop))
      return *no;
    auto t1 = std::chrono::steady_clock::now();
    auto kept = cache->keep(vm, keys[k], size);
    if (!kept) return kept.error();  // (the disk's layers are then not what `last` says)
    last = *kept;
    since = std::chrono::steady_clock::now();
    auto ms = [](auto d) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    log("builder: step checkpoint " + std::to_string(k) + " kept (sync " + ms(t1 - t0) +
        " ms, disk " + ms(since - t1) + " ms)");
    return std::nullopt;
  };

  if (!resumed) {
    wire::Json resize = wire::Json::object();
    resize.set("device", "root");
    resize.set("size", int64_t(size));
    if (auto r = vm.qmp().execute("block_resize", resize); !r)
      return Rejection{Code::build_failed, "growing the builder's disk: " + r.error().message};
    if (auto no = run_builder_script(vm, "growing the root file system", grow_script(size),
                                     job.deadline, log, job.stop))
      return *no;
  }
  at(15);

  if (!resumed && !job.packages.image.empty()) {
    std::error_code ec;
    auto bytes = fs::file_size(job.packages.image, ec);
    if (ec) return Rejection{Code::storage_error, "the package image: " + ec.message()};
    auto bound = vm.bind_volumes({vmm::VolumeBinding{0, job.packages.image, true}});
    if (!bound)
      return Rejection{Code::build_failed, "attaching the packages: " + bound.error().message};
    auto mounted = vm.agent().mount_volume(0, kPackagesMount, true, bytes);
    if (!mounted)
      return Rejection{Code::build_failed, "mounting the packages: " + mounted.error().message};
    if (auto no = run_builder_script(vm, "installing the packages", kInstallScript, job.deadline,
                                     log, job.stop))
      return *no;
  }
  const bool steps_left = first_step < spec.run.size();
  if (!job.context_disk.empty() && steps_left) {
    // The build context (actors/build_context.h), read-only where COPY and ADD read it.
    std::error_code ec;
    auto bytes = fs::file_size(job.context_disk, ec);
    if (ec) return Rejection{Code::storage_error, "the build context: " + ec.message()};
    uint32_t slot = (job.packages.image.empty() || resumed) ? 0 : 1;
    auto bound = vm.bind_volumes({vmm::VolumeBinding{slot, job.context_disk, true}});
    if (!bound)
      return Rejection{Code::build_failed, "attaching the context: " + bound.error().message};
    auto mounted = vm.agent().mount_volume(slot, kBuildContextDir, true, bytes);
    if (!mounted)
      return Rejection{Code::build_failed, "mounting the context: " + mounted.error().message};
    // The static busybox its COPY steps run with (kBuildCopyScript): the image's tools are
    // not needed.
    std::ifstream bb(env.config.busybox, std::ios::binary);
    std::ostringstream bytes_of;
    bytes_of << bb.rdbuf();
    if (!bb || bytes_of.str().empty())
      return Rejection{Code::unavailable,
                       "a build with a context archive needs a static busybox "
                       "on the host (" +
                           env.config.busybox.string() + ")"};
    auto wrote = vm.agent().write_file(kBuildBusyboxPath, bytes_of.str(), 0755, true);
    if (!wrote)
      return Rejection{Code::build_failed, "staging the copy tools: " + wrote.error().message};
    log("builder: the build context mounted (read-only)");
  }
  at(60);

  // The tenant's files and environment: written by the agent, so every path is the guest's.
  // (A build resumed from its cache has its files: they are part of its keys. Its environment's
  // files are written again: a command may have read them, none is expected to change them.)
  auto files = resumed ? std::map<std::string, std::string>{} : spec.files;
  if (!spec.env.empty()) {
    std::string profile;
    std::string entries;  // (for every process the agent starts: guest/agent/spawn.cc)
    for (auto& [k, v] : spec.env) {
      profile += "export " + k + "=" + sh_quote(v) + "\n";
      entries += k + "=" + v + std::string(1, '\0');
    }
    files["/etc/profile.d/pandastack-template.sh"] = profile;
    files["/etc/pandastack/env"] = entries;
  }
  for (auto& [path, content] : files) {
    auto written = vm.agent().write_file(path, content, 0644, true);
    if (!written)
      return Rejection{Code::build_failed, "writing " + path + ": " + written.error().message};
  }
  if (!files.empty()) log("builder: " + std::to_string(files.size()) + " files written");
  if (!resumed)
    if (auto no = checkpoint(0, spec.run.empty())) return *no;
  at(70);

  // Each command on its own, a checkpoint after each (with a step cache).
  std::string prelude = "set -e\n";
  for (auto& [k, v] : spec.env) prelude += "export " + k + "=" + sh_quote(v) + "\n";
  prelude += "cd /workspace 2>/dev/null || cd /\n";
  for (size_t i = first_step; i < spec.run.size(); ++i) {
    auto& cmd = spec.run[i];
    if (auto no = run_builder_script(vm, "the template's commands",
                                     prelude + "echo " + sh_quote("+ " + cmd) + "\n" + cmd + "\n",
                                     job.deadline, log, job.stop))
      return *no;
    if (auto no = checkpoint(i + 1, i + 1 == spec.run.size())) return *no;
    at(70 + int(20 * (i + 1) / spec.run.size()));
  }
  if (cache) cache->trim();
  at(90);

  // The disk as the guest leaves it: everything written out, the file system clean.
  if (auto no =
          run_builder_script(vm, "finishing the disk",
                             std::string("for d in ") + kPackagesMount + " " + kBuildContextDir +
                                 "; do umount \"$d\" 2>/dev/null || true; rmdir \"$d\" "
                                 "2>/dev/null || true; done\nsync\nmount -o remount,ro / "
                                 "2>/dev/null || true\nsync\n",
                             job.deadline, log, job.stop))
    return *no;
  std::error_code ec;
  fs::create_directories(job.out_dir, ec);
  auto out = job.out_dir / "rootfs.qcow2";
  auto tmp = job.out_dir / "rootfs.qcow2.tmp";
  fs::remove(tmp, ec);
  (void)vm.qmp().execute("quit", {}, std::chrono::seconds(10));
  fs::create_hard_link(vm.disk_file(), tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(vm.disk_file(), tmp, ec);
  }
  booted->reset();  // (its run folder goes; the disk lives on as `tmp`)
  if (ec) return Rejection{Code::storage_error, "keeping the builder's disk: " + ec.message()};
  // With checkpoints, its disk is their layers and what came after them: the template's own.
  std::string backing = from_rootfs.string();
  if (last) {
    auto top = install_layers(*last, job.out_dir, from_rootfs);
    if (!top) {
      fs::remove(tmp, ec);
      return top.error();
    }
    backing = *top;
  }
  // Root's own file from here: its backing name is the one the daemon means, whatever the
  // builder's QEMU wrote; its size is the one it was given.
  if (::chown(tmp.c_str(), 0, 0) != 0 || ::chmod(tmp.c_str(), 0644) != 0)
    return Rejection{Code::storage_error, "cannot take over " + tmp.string()};
  auto named = vmm::qcow2::set_backing_file(tmp, backing);
  auto got = vmm::qcow2::virtual_size(tmp);
  if (!named || !got || *got != size) {
    fs::remove(tmp, ec);
    return Rejection{Code::build_failed, "the builder's disk is not the image it was given"};
  }
  fs::rename(tmp, out, ec);
  if (ec) return Rejection{Code::storage_error, "installing the root file system: " + ec.message()};
  if (auto no = make_template_overlay(out, size)) return *no;
  at(100);
  return size;
}

}  // namespace pandastack::actors
