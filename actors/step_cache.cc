#include "actors/step_cache.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "actors/dockerfile.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/vm.h"
#include "wire/sha256.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

// Each part with its length: no two sequences of parts hash alike.
class Hash {
 public:
  Hash& add(const std::string& part) {
    h_.add(std::to_string(part.size()) + ":").add(part);
    return *this;
  }
  std::string hex() const { return h_.hex(); }

 private:
  wire::Sha256 h_;
};

}  // namespace

std::vector<std::string> step_keys(const std::string& tenant, const fs::path& rootfs,
                                   uint64_t disk_bytes, const TemplateSpec& spec) {
  struct stat st {};
  ::stat(rootfs.c_str(), &st);
  Hash h;
  h.add("pandastack-template-steps-1").add(tenant).add(fs::absolute(rootfs).string());
  h.add(std::to_string(st.st_ino) + "/" + std::to_string(st.st_size) + "/" +
        std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec));
  h.add(std::to_string(disk_bytes));
  for (auto& p : spec.packages) h.add("package").add(p);
  for (auto& [path, content] : spec.files) h.add("file").add(path).add(content);
  for (auto& [k, v] : spec.env) h.add("env").add(k).add(v);
  std::vector<std::string> keys{h.hex()};
  bool context = false;
  for (auto& cmd : spec.run) {
    h.add("run").add(cmd);
    if (!context && (cmd.find(kBuildContextDir) != std::string::npos ||
                     cmd.find(kBuildCopyPath) != std::string::npos)) {
      context = true;  // (from here on, what the context holds is part of the disk)
      for (auto& k : spec.contexts) h.add("context").add(k);
    }
    keys.push_back(h.hex());
  }
  return keys;
}

std::optional<std::pair<size_t, vmm::Snapshot>> StepCache::deepest(
    const std::vector<std::string>& keys) {
  for (size_t i = keys.size(); i-- > 0;) {
    auto d = dir_ / keys[i];
    std::error_code ec;
    if (!fs::exists(d / "meta.json", ec)) continue;
    auto snap = vmm::Snapshot::load(d);
    if (!snap || snap->memory) continue;
    fs::last_write_time(d, fs::file_time_type::clock::now(), ec);  // (recently used)
    return std::pair{i, *snap};
  }
  return std::nullopt;
}

Reply<vmm::Snapshot> StepCache::keep(vmm::Vm& vm, const std::string& key, uint64_t disk_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  auto final_dir = dir_ / key;
  auto disk = dir_ / (key + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(disk, ec);
  // Disk-only: the guest pauses while its disk becomes a layer (no RAM, no device state).
  auto taken = vm.checkpoint_disk(disk);
  if (!taken) return Rejection{Code::build_failed, "a checkpoint: " + taken.error().message};
  vmm::Snapshot snap = *taken;
  snap.dir = fs::absolute(final_dir);
  if (fs::exists(final_dir, ec)) {
    // Another build made it meanwhile: this one's disk is its own layers all the same (the
    // other's are the same steps, not the same bytes). They stay, under a name the cache never
    // serves and trim() drops once stale, until this build has made its template of them.
    auto own = dir_ / (key + ".tmp-own-" + std::to_string(::getpid()) + "-" +
                       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::rename(disk, own, ec);
    if (ec) return Rejection{Code::storage_error, "a checkpoint: " + ec.message()};
    snap.dir = fs::absolute(own);
    return snap;
  }
  // (a builder booted on it gets this overlay: the grown disk's size, not the root file
  // system's; -u: its backing is named, never read)
  auto overlay = vmm::run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-u",
                                "-b", snap.layers.back(), (disk / "overlay.qcow2").string(),
                                std::to_string(disk_bytes)});
  if (!overlay) {
    fs::remove_all(disk, ec);
    return Rejection{Code::storage_error, "a checkpoint: " + overlay.error().message};
  }
  // (its meta.json is checkpoint_disk's; the folder appears under its key whole, by a rename)
  fs::rename(disk, final_dir, ec);
  if (ec) {
    fs::remove_all(disk, ec);
    return Rejection{Code::storage_error, "a checkpoint: " + ec.message()};
  }
  return snap;
}

void StepCache::trim() {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> kept;
  auto stale = fs::file_time_type::clock::now() - std::chrono::hours(6);
  for (auto& e : fs::directory_iterator(dir_, ec)) {
    auto name = e.path().filename().string();
    auto t = e.last_write_time(ec);
    if (name.find(".tmp-") != std::string::npos) {
      if (t < stale) fs::remove_all(e.path(), ec);  // (an interrupted checkpoint)
      continue;
    }
    kept.push_back({t, e.path()});
  }
  if (kept.size() <= max_entries_) return;
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + max_entries_ < kept.size(); ++i) fs::remove_all(kept[i].second, ec);
  spdlog::info("template step cache: {} checkpoints dropped (the least recently used beyond {})",
               kept.size() - max_entries_, max_entries_);
}

}  // namespace pandastack::actors
