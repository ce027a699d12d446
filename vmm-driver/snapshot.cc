#include "vmm-driver/snapshot.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "vmm-driver/images.h"
#include "vmm-driver/qcow2.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using wire::Json;

Result<Snapshot> Snapshot::from_json(const Json& j, const fs::path& dir) {
  if (!j.is_object())
    return make_error(ErrorCode::invalid_argument, "corrupt snapshot metadata in " + dir.string());
  Snapshot s;
  s.dir = dir;
  s.format = int(j["format"].as_int());
  if (s.format != kSnapshotFormat)
    return make_error(ErrorCode::invalid_argument,
                      "snapshot format " + std::to_string(s.format) + " in " + dir.string() +
                          ", this driver reads format " + std::to_string(kSnapshotFormat));
  s.qemu_version = j["qemu_version"].as_string();
  s.accel = j["accel"].as_string() == "kvm" ? Accel::kvm : Accel::tcg;
  s.memory_mib = unsigned(j["memory_mib"].as_int());
  s.vcpus = unsigned(j["vcpus"].as_int());
  if (j["machine"].is_number()) s.machine = unsigned(j["machine"].as_int());
  s.kernel = j["kernel"].as_string();
  s.initramfs = j["initramfs"].as_string();
  s.origin = j["origin"].as_string();
  s.created_unix_ms = j["created_unix_ms"].as_int();
  if (j["disk_dir"].is_string()) s.disk_dir = j["disk_dir"].as_string();
  if (j["layers"].is_array())
    for (auto& l : j["layers"].as_array()) s.layers.push_back(l.as_string());
  if (j["volume_slots"].is_array())
    for (auto& v : j["volume_slots"].as_array()) s.volume_slots.push_back(uint32_t(v.as_int()));
  if (j["volume_copies"].is_array())
    for (auto& v : j["volume_copies"].as_array()) s.volume_copies.push_back(uint32_t(v.as_int()));
  if (j["memory"].is_bool()) s.memory = j["memory"].as_bool();
  if (s.layers.empty())
    return make_error(ErrorCode::invalid_argument, "snapshot without disk layers: " + dir.string());
  // A layer is a file of the disk folder, named by the driver: never a path elsewhere.
  for (auto& l : s.layers)
    if (l.empty() || l == "." || l == ".." || l.find('/') != std::string::npos ||
        l.find('\0') != std::string::npos)
      return make_error(ErrorCode::invalid_argument,
                        "snapshot layer name is not a file name in " + dir.string());
  return s;
}

Result<Snapshot> Snapshot::load(const fs::path& dir) {
  std::ifstream in(dir / "meta.json");
  if (!in) return make_error(ErrorCode::not_found, "no snapshot at " + dir.string());
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = Json::parse(ss.str());
  if (!j)
    return make_error(ErrorCode::invalid_argument, "corrupt snapshot metadata in " + dir.string());
  auto s = from_json(*j, dir);
  if (!s) return s;
  std::vector<fs::path> files{s->disk()};
  if (s->memory) files.insert(files.end(), {s->mem(), s->state()});
  for (auto& f : files)
    if (!fs::exists(f))
      return make_error(ErrorCode::invalid_argument, "snapshot file missing: " + f.string());
  for (auto& l : s->layers)
    if (!fs::exists(s->layer(l)))
      return make_error(ErrorCode::invalid_argument,
                        "snapshot layer missing: " + s->layer(l).string());
  return s;
}

Json Snapshot::to_json() const {
  Json j = Json::object();
  j.set("format", format);
  j.set("qemu_version", qemu_version);
  j.set("accel", to_string(accel));
  j.set("memory_mib", memory_mib);
  j.set("vcpus", vcpus);
  j.set("machine", machine);
  j.set("kernel", kernel);
  j.set("initramfs", initramfs);
  j.set("origin", origin);
  j.set("created_unix_ms", created_unix_ms);
  Json ls = Json::array();
  for (auto& l : layers) ls.push(l);
  j.set("layers", ls);
  Json slots = Json::array(), copies = Json::array();
  for (auto v : volume_slots) slots.push(int64_t(v));
  for (auto v : volume_copies) copies.push(int64_t(v));
  j.set("volume_slots", slots);
  j.set("volume_copies", copies);
  if (!disk_dir.empty() && disk_dir != dir) j.set("disk_dir", disk_dir.string());
  if (!memory) j.set("memory", false);
  return j;
}

Status drop_memory(const fs::path& dir) {
  auto s = Snapshot::load(dir);
  if (!s) return s.error();
  s->memory = false;
  auto written = s->write_meta();  // first: a crash in between leaves a disk-only snapshot
  if (!written) return written;
  std::error_code ec;
  fs::remove(s->mem(), ec);
  fs::remove(s->state(), ec);
  return Ok{};
}

Status Snapshot::write_meta() const {
  Json j = to_json();
  auto tmp = dir / "meta.json.tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out) return make_error(ErrorCode::io_error, "cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, dir / "meta.json", ec);  // meta.json last: a snapshot without it does not exist
  if (ec) return make_error(ErrorCode::io_error, "cannot write snapshot metadata: " + ec.message());
  return Ok{};
}

Status Snapshot::check_compatible(const VmConfig& c, const std::string& qemu) const {
  auto mismatch = [&](const std::string& what, const std::string& snap, const std::string& here) {
    return make_error(ErrorCode::invalid_argument, "snapshot " + dir.string() + " was made with " +
                                                       what + " " + snap + ", this VM has " + here);
  };
  if (accel != c.accel) return mismatch("accelerator", to_string(accel), to_string(c.accel));
  if (!qemu.empty() && qemu != qemu_version) return mismatch("QEMU", qemu_version, qemu);
  if (memory_mib != c.memory_mib)
    return mismatch("memory MiB", std::to_string(memory_mib), std::to_string(c.memory_mib));
  if (vcpus != c.vcpus) return mismatch("vCPUs", std::to_string(vcpus), std::to_string(c.vcpus));
  if (machine != c.machine)
    return mismatch("machine revision", std::to_string(machine), std::to_string(c.machine));
  if (kernel != fs::absolute(c.kernel).string())
    return mismatch("kernel", kernel, fs::absolute(c.kernel).string());
  if (initramfs != fs::absolute(c.initramfs).string())
    return mismatch("initramfs", initramfs, fs::absolute(c.initramfs).string());
  return Ok{};
}

Result<Snapshot> stage_snapshot(const Snapshot& snap, const fs::path& dir,
                                const fs::path& disk_dir) {
  if (auto existing = Snapshot::load(dir)) {
    if (existing->created_unix_ms == snap.created_unix_ms && existing->layers == snap.layers)
      return existing;
  }
  std::error_code ec;
  fs::path tmp = dir.string() + ".tmp";
  fs::path disk_tmp = disk_dir.empty() ? tmp : fs::path(disk_dir.string() + ".tmp");
  for (auto& d : {tmp, disk_tmp}) {
    fs::remove_all(d, ec);
    fs::create_directories(d, ec);
    if (ec)
      return make_error(ErrorCode::io_error, "cannot create " + d.string() + ": " + ec.message());
  }
  auto fail = [&](Error e) -> Result<Snapshot> {
    fs::remove_all(tmp, ec);
    fs::remove_all(disk_tmp, ec);
    return e;
  };
  if (snap.memory) {  // (a disk-only snapshot has neither)
    auto copied = copy_ram_file(snap.mem(), tmp / "mem");
    if (!copied) return fail(copied.error());
    fs::copy_file(snap.state(), tmp / "state", ec);
    if (ec) return fail(make_error(ErrorCode::io_error, "cannot copy state: " + ec.message()));
  }
  for (auto& l : snap.layers) {
    fs::create_hard_link(snap.layer(l), disk_tmp / l, ec);
    if (ec) fs::copy_file(snap.layer(l), disk_tmp / l, ec);
    if (ec)
      return fail(make_error(ErrorCode::io_error, "cannot copy layer " + l + ": " + ec.message()));
  }
  fs::create_hard_link(disk_tmp / snap.layers.back(), disk_tmp / "disk.qcow2", ec);
  if (ec) return fail(make_error(ErrorCode::io_error, "cannot link disk: " + ec.message()));
  // Volume copies (a template's baked data volume): sources of copies, never written.
  for (auto slot : snap.volume_copies) {
    auto to = disk_tmp / snap.volume(slot).filename();
    fs::create_hard_link(snap.volume(slot), to, ec);
    if (ec) {
      auto copied = clone_file(snap.volume(slot), to);
      if (!copied) return fail(copied.error());
      ec.clear();
    }
  }
  Snapshot staged = snap;
  staged.dir = fs::absolute(dir);
  staged.disk_dir = disk_dir.empty() ? fs::path() : fs::absolute(disk_dir);
  Snapshot at_tmp = staged;
  at_tmp.dir = tmp;  // the metadata names the final disk folder
  auto meta = at_tmp.write_meta();
  if (!meta) return fail(meta.error());
  if (!disk_dir.empty()) {
    fs::remove_all(disk_dir, ec);
    fs::rename(disk_tmp, disk_dir, ec);
    if (ec)
      return fail(make_error(ErrorCode::io_error,
                             "cannot install " + disk_dir.string() + ": " + ec.message()));
  }
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec)
    return fail(
        make_error(ErrorCode::io_error, "cannot install " + dir.string() + ": " + ec.message()));
  return staged;
}

namespace {
// fsync(2) of a file or a folder.
Status sync_path(const fs::path& p, bool folder) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (folder ? O_DIRECTORY : 0));
  if (fd < 0)
    return make_error(ErrorCode::io_error, "cannot open " + p.string() + ": " + strerror(errno));
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (r != 0)
    return make_error(ErrorCode::io_error, "cannot sync " + p.string() + ": " + strerror(err));
  return Ok{};
}
}  // namespace

Result<Snapshot> persist_snapshot(const Snapshot& snap, const fs::path& dir) {
  auto copy = stage_snapshot(snap, dir);
  if (!copy) return copy;
  std::vector<fs::path> files = {copy->dir / "meta.json"};
  if (copy->memory) {
    files.push_back(copy->mem());
    files.push_back(copy->state());
  }
  for (auto& l : copy->layers) files.push_back(copy->layer(l));
  for (auto slot : copy->volume_copies) files.push_back(copy->volume(slot));
  for (auto& f : files)
    if (auto synced = sync_path(f, false); !synced) return synced.error();
  for (auto& d : {copy->dir, copy->dir.parent_path()})
    if (auto synced = sync_path(d, true); !synced) return synced.error();
  return copy;
}

void remove_snapshot(const fs::path& dir, const fs::path& disk_dir) {
  std::error_code ec;
  // Its disk folder, as its metadata names it (read directly: a consumed snapshot lacks files).
  std::ifstream in(dir / "meta.json");
  std::stringstream ss;
  ss << in.rdbuf();
  if (auto j = Json::parse(ss.str()); j && j->is_object() && (*j)["disk_dir"].is_string())
    fs::remove_all((*j)["disk_dir"].as_string(), ec);
  if (!disk_dir.empty()) fs::remove_all(disk_dir, ec);
  fs::remove_all(dir, ec);
}

Status check_layer_chain(const Snapshot& snap, const std::filesystem::path& rootfs) {
  namespace fs = std::filesystem;
  auto refuse = [&](const std::string& layer, const std::string& why) {
    return make_error(ErrorCode::invalid_argument,
                      "snapshot " + snap.dir.filename().string() + ": layer " + layer + " " + why);
  };
  for (size_t i = 0; i < snap.layers.size(); ++i) {
    const auto& l = snap.layers[i];
    auto backing = qcow2::backing_file(snap.layer(l));
    if (!backing) return backing.error();
    if (i > 0) {
      if (*backing != snap.layers[i - 1])
        return refuse(l, "names a backing file that is not the layer before it");
      continue;
    }
    fs::path base(*backing);
    if (!base.is_absolute() || base.lexically_normal() != base ||
        base.filename() != "rootfs.qcow2" ||
        !safe_template_name(base.parent_path().filename().string()))
      return refuse(l, "is not backed by a template's root file system");
    if (rootfs.empty()) continue;
    std::error_code e1, e2;
    auto want = fs::canonical(fs::absolute(rootfs), e1);
    auto got = fs::weakly_canonical(base, e2);
    if (e1 || e2 || want != got)
      return refuse(l,
                    "is backed by " + base.string() + ", not by the template's " + rootfs.string());
  }
  return Ok{};
}

}  // namespace pandastack::vmm
