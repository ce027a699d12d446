// Baked templates: the snapshot every create of a template restores from.
//
// IMAGES/<template>/baked/<key>/ holds the snapshot; the key covers the snapshot format, the QEMU
// version, the kernel, initramfs and root filesystem (their build keys), the accelerator and the
// guest shape (memory, vCPUs, CPU model). Anything changing gives a new key: the next use bakes
// again (one cold boot) and older bakes are removed.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "vmm-driver/snapshot.h"
#include "vmm-driver/vm.h"

namespace pandastack::vmm {

class IoThread;

// Where a bake's script output goes, line by line (a custom template's build log).
using BakeLog = std::function<void(const std::string&)>;

class TemplateStore {
 public:
  // Custom templates' pieces are in `custom_dir` (vmm::template_dir).
  TemplateStore(IoThread& io, std::filesystem::path images_dir,
                std::filesystem::path custom_dir = {});

  // A VmConfig for `template_name` running in `run_dir` with the default shape.
  VmConfig config(const std::string& template_name, const std::filesystem::path& run_dir) const;

  // The baked snapshot of `template_name` for the shape of `shape` (accel, memory, vCPUs, CPU
  // model), baking it first if needed. Concurrent callers for one template share one bake.
  // The template's bake.sh (if any) runs in the guest before the snapshot; its output goes to
  // `log`.
  Result<Snapshot> baked(const std::string& template_name, const VmConfig& shape,
                         const BakeLog& log = {});

  // The cache key for a template and shape (exposed for tests).
  Result<std::string> key(const std::string& template_name, const VmConfig& shape) const;

 private:
  std::filesystem::path dir(const std::string& template_name) const;

  IoThread& io_;
  std::filesystem::path images_, custom_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<std::mutex>> bake_locks_;
};

// The version line of `qemu_binary --version` (cached per binary).
std::string qemu_version_line(const std::string& qemu_binary);

}  // namespace pandastack::vmm
