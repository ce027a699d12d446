// A custom template's builder microVM: the tenant's part of a build happens in a guest, never on
// the host (security review 3, C1 and H5). One cold boot of the `from` template's guest, jailed
// like every sandbox, with no network and the build's shape; its root disk grown (the guest
// grows its file system online); the packages installed by dpkg in the guest from a read-only
// image of .deb files (actors/template_packages.h); the tenant's files written by the agent (so
// every path resolves inside the guest: a symlink of the tree points into the guest's own tree);
// its environment for login shells; its `run` commands as root. The guest then syncs and stops,
// and its disk overlay (a qcow2 on the `from` template's root file system) becomes the template's
// root file system, its backing name rewritten by the daemon to the one it means. The host
// handles only opaque images, as it does for any sandbox's disk.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

#include "actors/custom_template.h"
#include "actors/runtime.h"
#include "actors/sh_quote.h"
#include "actors/template_packages.h"

namespace pandastack::vmm {
class Vm;
struct Snapshot;
}  // namespace pandastack::vmm

namespace pandastack::actors {

struct Env;

struct BuilderJob {
  std::string id;     // the template's id (names the builder's run folder)
  TemplateSpec spec;  // its shape filled in
  PackageImage packages;
  std::filesystem::path out_dir;  // the template's folder: rootfs.qcow2 and its overlay go here
  // The build context unpacked (actors/build_context.h: an ext4 disk, "" = none): mounted
  // read-only at kBuildContextDir before the files and commands.
  std::filesystem::path context_disk;
  // The root file system it builds on when that is not a template's: a FROM image pulled by
  // this build (its folder's rootfs.qcow2; the builder boots our kernel on it). "" = spec.from's.
  std::filesystem::path from_dir;
  // The step cache's folder (actors/step_cache.h; "" = none) and the tenant whose it is.
  std::filesystem::path step_cache;
  std::string tenant;
  uint64_t grow_mib = 1024;  // room added to the `from` root file system
  std::chrono::steady_clock::time_point deadline;
  std::stop_token stop;  // the daemon stopping: the guest's command is killed, the build fails
  std::function<void(const std::string&)> log;
  std::function<void(int percent)> at;  // progress within the build stage (0..100)
};

// Boots a builder microVM: a guest of template `from` (a shipped one or a tenant's id), jailed
// like every sandbox, with no network, `memory_mib` and `vcpus`, never outliving the daemon (a
// restart fails its build), within `deadline`. `what`: the log line's end. `rootfs`: another
// root file system for `from`'s kernel ("" = its own); `disk_of`: a disk-only snapshot of a
// builder of `from` to boot on (a step checkpoint). build_failed.
Reply<std::unique_ptr<vmm::Vm>> boot_builder(
    Env& env, const std::string& from, const std::string& run_name, uint32_t memory_mib,
    uint32_t vcpus, std::chrono::steady_clock::time_point deadline,
    const std::function<void(const std::string&)>& log, const std::string& what,
    const std::filesystem::path& rootfs = {}, const vmm::Snapshot* disk_of = nullptr);

// The empty overlay every sandbox of a template starts from, made next to its root file system
// `rootfs` without opening it (qemu-img -u: no host tool reads what a builder wrote).
std::optional<Rejection> make_template_overlay(const std::filesystem::path& rootfs, uint64_t size);

// Runs `script` as root in a builder's guest (`sh -s`), each line of its output to `log`;
// `what` names it in a failure (with the last line it printed). build_failed, timeout (the
// deadline), unavailable (`stop`).
std::optional<Rejection> run_builder_script(vmm::Vm& vm, const std::string& what,
                                            const std::string& script,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::function<void(const std::string&)>& log,
                                            std::stop_token stop = {});

// How much of `job` its step cache holds: nullopt (nothing), or the number of its commands
// (spec.run) done in the deepest checkpoint (0: its packages and files only).
std::optional<size_t> cached_steps(Env& env, const BuilderJob& job);

// Runs the build in a builder VM and writes out_dir/rootfs.qcow2 (with a step cache: resumed
// from the deepest checkpoint of its prefix, a checkpoint after its packages and each command;
// its root file system is then a chain of layers in out_dir). Fails with the reason (a
// command that failed, the deadline, a guest that died) and leaves no rootfs behind.
Reply<uint64_t> build_in_vm(Env& env, const BuilderJob& job);

}  // namespace pandastack::actors
