#include "vmm-driver/live_record.h"

#include "wire/json.h"

namespace pandastack::vmm {

namespace {

using wire::Json;

bool plain_name(const std::string& n) {
  return !n.empty() && n.size() <= 255 && n != "." && n != ".." &&
         n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

// Absolute, no "." / ".." / empty segment, no NUL, at most 4096 bytes, at least `depth` segments.
bool clean_absolute(const std::string& p, size_t depth) {
  if (p.empty() || p[0] != '/' || p.size() > 4096 || p.find('\0') != std::string::npos)
    return false;
  size_t segments = 0, start = 1;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    if (slash == std::string::npos) slash = p.size();
    std::string seg = p.substr(start, slash - start);
    if (seg.empty()) {
      if (slash != p.size()) return false;  // "//"
    } else {
      if (seg == "." || seg == "..") return false;
      ++segments;
    }
    start = slash + 1;
  }
  return segments >= depth;
}

Error bad(const std::string& why) {
  return make_error(ErrorCode::invalid_argument, "unusable live record: " + why);
}

// A memory base's memfd name: "pst-base-" digits "-" digits (MemoryBase::make).
bool memfd_name(const std::string& s) {
  const std::string prefix = "pst-base-";
  if (s.size() > 64 || s.rfind(prefix, 0) != 0) return false;
  size_t dashes = 0;
  for (size_t i = prefix.size(); i < s.size(); ++i) {
    if (s[i] == '-' && i > prefix.size() && s[i - 1] != '-' && i + 1 < s.size())
      ++dashes;
    else if (s[i] < '0' || s[i] > '9')
      return false;
  }
  return dashes == 1;
}

}  // namespace

Result<LiveRecord> parse_live_record(std::string_view text) {
  if (text.size() > (1 << 20)) return bad("larger than 1 MiB");
  auto j = Json::parse(text);
  if (!j || !j->is_object()) return bad("not a JSON object");
  const Json& r = *j;
  if (!r["format"].is_integer() || r["format"].as_int() != 1) return bad("unknown format");
  auto str = [&](const char* k) { return r[k].is_string() ? r[k].as_string() : std::string(); };
  auto num = [&](const char* k, int64_t lo, int64_t hi, int64_t& out) {
    if (!r[k].is_integer() || r[k].as_int() < lo || r[k].as_int() > hi) return false;
    out = r[k].as_int();
    return true;
  };
  LiveRecord rec;
  int64_t v = 0;
  if (!num("pid", 1, 4194304, v)) return bad("pid");
  rec.pid = int(v);
  if (!num("start_ticks", 0, INT64_MAX, v)) return bad("start_ticks");
  rec.start_ticks = uint64_t(v);
  rec.name = str("name");
  rec.hostname = str("hostname");
  rec.kernel = str("kernel");
  rec.initramfs = str("initramfs");
  rec.rootfs = str("rootfs");
  rec.accel = str("accel");
  rec.cpu_model = str("cpu_model");
  rec.qemu_binary = str("qemu_binary");
  rec.qemu_version = str("qemu_version");
  if (!num("vcpus", 1, 1024, v)) return bad("vcpus");
  rec.vcpus = unsigned(v);
  if (!num("memory_mib", 1, 1 << 24, v)) return bad("memory_mib");
  rec.memory_mib = unsigned(v);
  rec.tsc_khz = num("tsc_khz", 0, UINT32_MAX, v) ? unsigned(v) : 0;
  rec.machine = num("machine", 0, 1024, v) ? unsigned(v) : 0;
  rec.jail = r["jail"].is_bool() && r["jail"].as_bool();
  rec.jail_uid = num("jail_uid", 0, UINT32_MAX, v) ? uint32_t(v) : 0;
  if (!r["layers"].is_array() || r["layers"].as_array().size() > 4096) return bad("layers");
  for (auto& l : r["layers"].as_array()) {
    if (!l.is_string() || !plain_name(l.as_string())) return bad("a layer is not a file name");
    rec.layers.push_back(l.as_string());
  }
  rec.overlay_seq = num("overlay_seq", 0, INT32_MAX, v) ? int(v) : 0;
  rec.active_overlay = str("active_overlay");
  if (!rec.active_overlay.empty() && !plain_name(rec.active_overlay))
    return bad("the active overlay is not a file name");
  rec.disk_dir = str("disk_dir");
  // Removed with the VM: never "/" or a top-level folder, never a path that climbs.
  if (!rec.disk_dir.empty() && !clean_absolute(rec.disk_dir, 2)) return bad("disk_dir");
  rec.cgroup_v2 = r["cgroup_v2"].is_bool() && r["cgroup_v2"].as_bool();
  if (!r["cgroups"].is_null()) {
    if (!r["cgroups"].is_array() || r["cgroups"].as_array().size() > 64) return bad("cgroups");
    for (auto& g : r["cgroups"].as_array()) {
      // Removed with the VM too: only folders below the cgroup file system.
      if (!g.is_string() || g.as_string().rfind("/sys/fs/cgroup/", 0) != 0 ||
          g.as_string().find("/pandastack/") == std::string::npos ||
          !clean_absolute(g.as_string(), 5))
        return bad("a cgroup is not one of ours under /sys/fs/cgroup");
      rec.cgroups.push_back(g.as_string());
    }
  }
  if (!r["volumes"].is_null()) {
    if (!r["volumes"].is_array() || r["volumes"].as_array().size() > 64) return bad("volumes");
    for (auto& x : r["volumes"].as_array()) {
      LiveRecord::Volume vol;
      if (!x.is_object() || !x["slot"].is_integer() || x["slot"].as_int() < 0 ||
          x["slot"].as_int() > 63 || !x["file"].is_string() ||
          !clean_absolute(x["file"].as_string(), 2))
        return bad("a volume is not a slot and an absolute file");
      vol.slot = uint32_t(x["slot"].as_int());
      vol.file = x["file"].as_string();
      vol.read_only = x["read_only"].is_bool() && x["read_only"].as_bool();
      rec.volumes.push_back(std::move(vol));
    }
  }
  rec.memory_base_file = str("memory_base_file");
  rec.memory_base_memfd = str("memory_base_memfd");
  if (rec.memory_base_file.empty() != rec.memory_base_memfd.empty() ||
      (!rec.memory_base_file.empty() &&
       (!clean_absolute(rec.memory_base_file, 2) || !memfd_name(rec.memory_base_memfd))))
    return bad("memory base");
  return rec;
}

}  // namespace pandastack::vmm
