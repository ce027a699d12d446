// Where `make guest` leaves the guest image pieces (guest/build-image.sh):
//   IMAGES/kernel/vmlinux, IMAGES/initramfs/initramfs.cpio, IMAGES/<template>/rootfs.qcow2
#pragma once

#include <filesystem>
#include <string>

#include "vmm-driver/vm.h"

namespace pandastack::vmm {

// A VmConfig for booting `template_name` from `images_dir`, running in `run_dir`.
inline VmConfig config_for_template(const std::filesystem::path& images_dir, const std::string& template_name,
                                    const std::filesystem::path& run_dir) {
  VmConfig c;
  c.name = run_dir.filename().string();
  c.run_dir = run_dir;
  c.kernel = images_dir / "kernel" / "vmlinux";
  c.initramfs = images_dir / "initramfs" / "initramfs.cpio";
  c.rootfs = images_dir / template_name / "rootfs.qcow2";
  return c;
}

}  // namespace pandastack::vmm
