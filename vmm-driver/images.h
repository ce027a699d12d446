// Where `make guest` leaves the guest image pieces (guest/build-image.sh):
//   IMAGES/kernel/vmlinux, IMAGES/initramfs/initramfs.cpio, IMAGES/<template>/rootfs.qcow2
#pragma once

#include <filesystem>
#include <string>

#include "vmm-driver/vm.h"

namespace pandastack::vmm {

// Where a template's pieces are: a shipped one's in `images_dir`, a custom one's (its id
// `<name>.<tenant hash>`, actors/custom_template.h) in `custom_dir`.
inline std::filesystem::path template_dir(const std::filesystem::path& images_dir,
                                          const std::filesystem::path& custom_dir,
                                          const std::string& template_name) {
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
