// Where `make guest` leaves the guest image pieces (guest/build-image.sh):
//   IMAGES/kernel/vmlinux, IMAGES/initramfs/initramfs.cpio, IMAGES/<template>/rootfs.qcow2
#pragma once

#include <filesystem>
#include <string>

#include "vmm-driver/vm.h"

namespace pandastack::vmm {

// Whether `name` may become a folder name under the images folders: a shipped template's name
// (1..64 of a-z, 0-9, '-' and '_'; not "kernel" or "initramfs") or a custom template's id (such a
// name, '.', 12 hex digits: actors/custom_template.h). Nothing else (a '/', "..", a peer's
// invention: security review 3, M1) ever names a folder.
inline bool safe_template_name(const std::string& name) {
  auto dot = name.find('.');
  std::string base = name.substr(0, dot);
  if (base.empty() || base.size() > 64 || base == "kernel" || base == "initramfs") return false;
  for (char c : base)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) return false;
  if (dot == std::string::npos) return true;
  std::string tag = name.substr(dot + 1);
  if (tag.size() != 12) return false;
  for (char c : tag)
    if (!((c >= 'a' && c <= 'f') || (c >= '0' && c <= '9'))) return false;
  return true;
}

// Where a template's pieces are: a shipped one's in `images_dir`, a custom one's (its id
// `<name>.<tenant hash>`, actors/custom_template.h) in `custom_dir`. A name that is not
// safe_template_name's is a folder that never exists (no path is made of it).
inline std::filesystem::path template_dir(const std::filesystem::path& images_dir,
                                          const std::filesystem::path& custom_dir,
                                          const std::string& template_name) {
  if (!safe_template_name(template_name)) return images_dir / ".no-such-template";
  bool custom = template_name.find('.') != std::string::npos && !custom_dir.empty();
  return (custom ? custom_dir : images_dir) / template_name;
}

// A VmConfig for booting `template_name` from `images_dir` (a custom template's root file system
// from `custom_dir`), running in `run_dir`.
inline VmConfig config_for_template(const std::filesystem::path& images_dir,
                                    const std::string& template_name,
                                    const std::filesystem::path& run_dir,
                                    const std::filesystem::path& custom_dir = {}) {
  VmConfig c;
  c.name = run_dir.filename().string();
  c.run_dir = run_dir;
  c.kernel = images_dir / "kernel" / "vmlinux";
  c.initramfs = images_dir / "initramfs" / "initramfs.cpio";
  c.rootfs = template_dir(images_dir, custom_dir, template_name) / "rootfs.qcow2";
  return c;
}

}  // namespace pandastack::vmm
