// A snapshot on disk: everything needed to start VMs from a frozen guest.
//
//   DIR/meta.json   format version, QEMU version, accelerator, guest shape, origin
//   DIR/mem         guest RAM, raw and sparse; a restore copies it (data extents only) into its run
//                   folder and maps that shared; a wake from hibernation takes the file itself
//   DIR/state       QEMU device state (a migration stream without RAM: x-ignore-shared)
//   DISK/disk.qcow2 the disk at snapshot time; immutable, restores put an overlay on it. It is a
//                   hard link to the newest of DIR/layer-*.qcow2: the disk's chain of frozen
//                   qcow2 layers, each naming its parent by a relative name, so the folder is
//                   self-contained (the oldest layer names the template's root filesystem by its
//                   absolute path). Layers are shared between snapshots by hard links: deleting a
//                   snapshot never breaks another one, or a VM restored from it.
//
// DISK is the snapshot's disk folder: DIR itself, or a twin folder on a real disk (`disk_dir`,
// named in meta.json) when DIR is on tmpfs: guest disk writes must not be host RAM.
//
// A snapshot is restorable only by the same QEMU version, accelerator, memory size, vCPU count,
// kernel and initramfs it was made with (a TCG snapshot cannot be restored under KVM):
// `check_compatible` says why not.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "vmm-driver/error.h"
#include "vmm-driver/vm.h"
#include "wire/json.h"

namespace pandastack::vmm {

constexpr int kSnapshotFormat = 4;  // 3: every VM has a virtio-net NIC; 4: and volume slots

struct Snapshot {
  std::filesystem::path dir;
  std::filesystem::path disk_dir;  // where the disk layers are; empty = dir
  int format = kSnapshotFormat;
  std::string qemu_version;
  Accel accel = Accel::tcg;
  unsigned memory_mib = 0;
  unsigned vcpus = 0;
  // The VM's machine revision (kMachineRevision); a snapshot that records none ran revision 0.
  unsigned machine = 0;
  std::string kernel, initramfs;    // paths the guest was booted with (same machine, same files)
  std::string origin;               // "bake:<template>", "snapshot:<vm>", "hibernate:<vm>"
  std::vector<std::string> layers;  // disk layer file names, oldest first; the last is disk.qcow2
  int64_t created_unix_ms = 0;
  // The volume slots bound when it was taken (their guest has them mounted), and of those the
  // ones copied into it (volume(slot)): the volumes' state at the same instant as its memory.
  // Not needed to restore it (a restore binds volume files of its own): a fork's last child
  // takes the copies away.
  std::vector<uint32_t> volume_slots, volume_copies;
  // False: a disk-only snapshot (drop_memory: no DIR/mem, no DIR/state). Its guest is not
  // restored but booted afresh on its disk (Vm::boot_on): what ran is gone, what it wrote stays.
  bool memory = true;

  std::filesystem::path mem() const { return dir / "mem"; }
  std::filesystem::path state() const { return dir / "state"; }
  std::filesystem::path disks() const { return disk_dir.empty() ? dir : disk_dir; }
  std::filesystem::path disk() const { return disks() / "disk.qcow2"; }
  std::filesystem::path layer(const std::string& name) const { return disks() / name; }
  std::filesystem::path volume(uint32_t slot) const {
    return disks() / ("volume-" + std::to_string(slot) + ".img");
  }

  // Reads DIR/meta.json; rejects another format version and missing files.
  static Result<Snapshot> load(const std::filesystem::path& dir);
  Status write_meta() const;
  // meta.json's content, and a snapshot at `dir` described by it (its files not checked: a
  // snapshot received from another host before its files are written).
  wire::Json to_json() const;
  static Result<Snapshot> from_json(const wire::Json& j, const std::filesystem::path& dir);
  // Whether a VM configured as `c` under QEMU `qemu_version` can restore this snapshot.
  Status check_compatible(const VmConfig& c, const std::string& qemu_version) const;
};

// The disk-layer chain rule (security review 3, M2). A layer's header names its backing file,
// and a QEMU (a layer is its overlay until frozen) or a peer (a layer it sent) writes headers:
// the oldest layer must be backed by a template's root file system, every other layer by the
// layer before it (its file name), or the snapshot is refused. Root never opens, nor hands to a
// tool, a name it read from a header.
//   `rootfs` given: the oldest layer's backing is that file (compared canonically: a published
//   template's root file system is a link to the one its chain ends in).
//   `rootfs` empty (a snapshot received before its template is known): the oldest layer's
//   backing is an absolute, normal path `.../<template name>/rootfs.qcow2`.
Status check_layer_chain(const Snapshot& snap, const std::filesystem::path& rootfs = {});

// Copies a snapshot to `dir` (typically onto the file system where VMs run, so restores copy its
// RAM file in the kernel): the RAM file sparsely, layers hard-linked where possible. Reuses `dir`
// when it already holds this snapshot. With `disk_dir`, its disk layers go there (a real disk)
// instead of into `dir`.
Result<Snapshot> stage_snapshot(const Snapshot& snapshot, const std::filesystem::path& dir,
                                const std::filesystem::path& disk_dir = {});

// A copy of `snapshot` at `dir`, on a real disk, that survives a power loss: staged there
// (stage_snapshot without a disk folder: the RAM file copied sparsely, the layers hard-linked
// where they can be), then every file of it and its folder fsynced. What a hibernation on tmpfs
// is made durable with (a host reboot empties tmpfs).
Result<Snapshot> persist_snapshot(const Snapshot& snapshot, const std::filesystem::path& dir);

// Removes a snapshot folder and its disk folder (named in its meta.json; `disk_dir` when the
// caller knows it, e.g. for a snapshot whose metadata was never written). VMs already restored
// from it keep running (their RAM mapping and open disk hold the files), but new restores and
// their snapshots need it.
void remove_snapshot(const std::filesystem::path& dir, const std::filesystem::path& disk_dir = {});
// Makes the snapshot at `dir` disk-only: its RAM file and device state go (the host memory it
// held is free), its meta says so (Snapshot::memory). Its disk must be whole without the guest's
// memory: the guest synced its file systems before the snapshot was taken.
Status drop_memory(const std::filesystem::path& dir);

}  // namespace pandastack::vmm
