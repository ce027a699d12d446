#include "vmm-driver/templates.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "vmm-driver/images.h"
#include "vmm-driver/run_tool.h"
#include "wire/hex.h"

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

TemplateStore::TemplateStore(IoThread& io, fs::path images_dir, fs::path custom_dir)
    : io_(io),
      images_(fs::absolute(images_dir)),
      custom_(custom_dir.empty() ? fs::path() : fs::absolute(custom_dir)) {}

fs::path TemplateStore::dir(const std::string& template_name) const {
  return template_dir(images_, custom_, template_name);
}

VmConfig TemplateStore::config(const std::string& template_name, const fs::path& run_dir) const {
  return config_for_template(images_, template_name, run_dir, custom_);
}

Result<std::string> TemplateStore::key(const std::string& template_name,
                                       const VmConfig& shape) const {
  auto rootfs_key = dir(template_name) / "key";
  if (!fs::exists(dir(template_name) / "rootfs.qcow2") || !fs::exists(rootfs_key))
    return make_error(ErrorCode::not_found,
                      "template '" + template_name + "' is not built (make guest)");
  std::string qemu = qemu_version_line(shape.qemu_binary);
  if (qemu.empty())
    return make_error(ErrorCode::spawn_failed, "cannot run " + shape.qemu_binary + " --version");
  std::string material =
      "format=" + std::to_string(kSnapshotFormat) + "\nqemu=" + qemu +
      "\nrootfs=" + read_file(rootfs_key) +
      "\ninitramfs=" + read_file(images_ / "initramfs" / "key") +
      "\nkernel=" + read_file(images_ / "kernel" / "key") + "\naccel=" + to_string(shape.accel) +
      "\nmemory=" + std::to_string(shape.memory_mib) + "\nvcpus=" + std::to_string(shape.vcpus) +
      "\ncpu=" + shape.cpu_model + "\nmachine=" + std::to_string(shape.machine);
  return std::string(to_string(shape.accel)) + "-" + std::to_string(shape.memory_mib) + "m-" +
         wire::fnv1a_hex(material);
}

namespace {

// A template with a baked data volume (IMAGES/<template>/data_volume: "<MiB> <mount>", written by
// the image build from its recipe): an empty ext4 volume bound to slot 0 of the freshly booted
// guest and mounted. The bake then takes the volume file into the snapshot.
Status bake_data_volume(Vm& vm, const fs::path& image_dir, const fs::path& tmp) {
  std::ifstream spec(image_dir / "data_volume");
  if (!spec) return Ok{};
  uint64_t mib = 0;
  std::string mount;
  spec >> mib >> mount;
  if (mib < 16 || mount.empty() || mount[0] != '/')
    return make_error(ErrorCode::invalid_argument,
                      "bad data volume spec in " + (image_dir / "data_volume").string());
  auto file = tmp / "data-volume.img";
  std::error_code ec;
  fs::create_directories(tmp, ec);
  {
    std::ofstream f(file, std::ios::binary);
    if (!f) return make_error(ErrorCode::io_error, "cannot create " + file.string());
  }
  fs::resize_file(file, mib << 20, ec);
  if (ec)
    return make_error(ErrorCode::io_error, "cannot size " + file.string() + ": " + ec.message());
  auto made =
      run_tool({"mkfs.ext4", "-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                "-L", "pandastack", file.string()});
  if (!made) return made;
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write, ec);
  auto bound = vm.bind_volumes({VolumeBinding{0, file, false}});
  if (!bound) return bound;
  auto mounted = vm.agent().mount_volume(0, mount, false, mib << 20);
  if (!mounted) return mounted;
  spdlog::info("bake: data volume of {} MiB at {} prepared", mib, mount);
  return Ok{};
}

// The template's bake.sh (IMAGES/<template>/bake.sh: a recipe's bake_script, a custom template's
// run commands), run in the freshly booted guest as root, after its data volume is mounted; its
// output's lines go to `log` (when given).
Status run_bake_script(Vm& vm, const fs::path& image_dir, const BakeLog& log) {
  std::ifstream script_file(image_dir / "bake.sh");
  if (!script_file) return Ok{};
  std::stringstream script;
  script << script_file.rdbuf();
  ExecRequest run;
  run.shell = "sh -s";
  run.stdin_data = script.str();
  run.timeout_ms = 600000;
  auto r = vm.agent().exec(run);
  if (!r) return r.error();
  if (log)
    for (auto* out : {&r->stdout_data, &r->stderr_data}) {
      std::istringstream lines(*out);
      for (std::string line; std::getline(lines, line);) log(line);
    }
  if (r->exit_code != 0) {
    // Why, from what it printed last (stderr, else stdout): never an empty reason.
    const std::string& said = r->stderr_data.empty() ? r->stdout_data : r->stderr_data;
    std::string why = said.substr(said.size() > 2000 ? said.size() - 2000 : 0);
    while (!why.empty() && (why.back() == '\n' || why.back() == '\r')) why.pop_back();
    return make_error(ErrorCode::invalid_argument,
                      "the template's bake.sh failed (exit " + std::to_string(r->exit_code) +
                          "): " + (why.empty() ? "it printed nothing" : why));
  }
  return Ok{};
}

}  // namespace

Result<Snapshot> TemplateStore::baked(const std::string& template_name, const VmConfig& shape,
                                      const BakeLog& log) {
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
  fs::path root = dir(template_name) / "baked";
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
  auto prepared = bake_data_volume(**vm, this->dir(template_name), tmp);
  if (prepared) prepared = run_bake_script(**vm, this->dir(template_name), log);
  if (!prepared) {
    vm->reset();
    fs::remove_all(tmp, ec);
    return prepared.error();
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
    if (e.path() != dir && e.path().filename().string().rfind(".tmp-", 0) != 0)
      fs::remove_all(e.path(), ec);
  }
  spdlog::info("template {}: baked into {}", template_name, dir.string());
  return Snapshot::load(dir);
}

}  // namespace pandastack::vmm
