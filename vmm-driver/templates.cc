#include "vmm-driver/templates.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "vmm-driver/images.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;

std::string qemu_version_line(const std::string& qemu_binary) {
  static std::mutex mu;
  static std::map<std::string, std::string> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(qemu_binary);
  if (it != cache.end()) return it->second;
  std::string out;
  if (FILE* p = ::popen((qemu_binary + " --version 2>/dev/null").c_str(), "r")) {
    char buf[256];
    if (std::fgets(buf, sizeof buf, p)) out = buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  cache[qemu_binary] = out;
  return out;
}

namespace {
std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TemplateStore::TemplateStore(IoThread& io, fs::path images_dir) : io_(io), images_(fs::absolute(images_dir)) {}

VmConfig TemplateStore::config(const std::string& template_name, const fs::path& run_dir) const {
  return config_for_template(images_, template_name, run_dir);
}

Result<std::string> TemplateStore::key(const std::string& template_name, const VmConfig& shape) const {
  auto rootfs_key = images_ / template_name / "key";
  if (!fs::exists(images_ / template_name / "rootfs.qcow2") || !fs::exists(rootfs_key))
    return make_error(ErrorCode::not_found, "template '" + template_name + "' is not built (make guest)");
  std::string qemu = qemu_version_line(shape.qemu_binary);
  if (qemu.empty()) return make_error(ErrorCode::spawn_failed, "cannot run " + shape.qemu_binary + " --version");
  std::string material = "format=" + std::to_string(kSnapshotFormat) + "\nqemu=" + qemu +
                         "\nrootfs=" + read_file(rootfs_key) + "\ninitramfs=" + read_file(images_ / "initramfs" / "key") +
                         "\nkernel=" + read_file(images_ / "kernel" / "key") + "\naccel=" + to_string(shape.accel) +
                         "\nmemory=" + std::to_string(shape.memory_mib) + "\nvcpus=" + std::to_string(shape.vcpus) +
                         "\ncpu=" + shape.cpu_model;
  return std::string(to_string(shape.accel)) + "-" + std::to_string(shape.memory_mib) + "m-" + fnv1a_hex(material);
}

Result<Snapshot> TemplateStore::baked(const std::string& template_name, const VmConfig& shape) {
  auto k = key(template_name, shape);
  if (!k) return k.error();
  std::mutex* lock;
  {
    std::lock_guard g(mu_);
    auto& l = bake_locks_[template_name];
    if (!l) l = std::make_unique<std::mutex>();
    lock = l.get();
  }
  std::lock_guard bake_lock(*lock);
  fs::path root = images_ / template_name / "baked";
  fs::path dir = root / *k;
  if (auto snap = Snapshot::load(dir)) return snap;
  std::error_code ec;
  fs::create_directories(root, ec);
  // Bake into a temporary folder on the same file system, then rename into place.
  fs::path tmp = root / (".tmp-" + *k + "-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  VmConfig c = config(template_name, tmp / "run");
  c.accel = shape.accel;
  c.memory_mib = shape.memory_mib;
  c.vcpus = shape.vcpus;
  c.cpu_model = shape.cpu_model;
  c.tsc_khz = shape.tsc_khz;
  c.qemu_binary = shape.qemu_binary;
  c.name = "bake-" + template_name;
  spdlog::info("template {}: baking {} (one cold boot)", template_name, *k);
  auto vm = Vm::boot(io_, c);
  if (!vm) {
    fs::remove_all(tmp, ec);
    return vm.error();
  }
  auto snap = (*vm)->bake(tmp / "snap", "bake:" + template_name);
  vm->reset();
  if (!snap) {
    fs::remove_all(tmp, ec);
    return snap.error();
  }
  fs::remove_all(dir, ec);  // a stale or broken bake under the same key
  fs::rename(tmp / "snap", dir, ec);
  fs::remove_all(tmp, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot install baked template: " + ec.message());
  // Older bakes of this template are stale now.
  for (auto& e : fs::directory_iterator(root, ec)) {
    if (e.path() != dir && e.path().filename().string().rfind(".tmp-", 0) != 0) fs::remove_all(e.path(), ec);
  }
  spdlog::info("template {}: baked into {}", template_name, dir.string());
  return Snapshot::load(dir);
}

}  // namespace pandastack::vmm
