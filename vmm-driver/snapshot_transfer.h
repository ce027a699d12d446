// Moving a snapshot to another host (a cluster's cross-host fork and migration; the bytes travel
// over Cap'n Proto, gateway/peer_snapshots.h). The sending side describes a snapshot (offer_of:
// its RAM file, device state and disk layers, each layer by the SHA-256 of its content) and sends
// only data extents (a RAM file is mostly holes). The receiving side (SnapshotReceiver) takes the
// layers its layer cache already holds (a host that has a layer is never sent it again: layers
// are immutable and shared by every snapshot of a chain), writes the other files into a staging
// folder, and makes that folder a snapshot only when every file is complete and every received
// layer matches its hash. An unfinished transfer leaves nothing behind.
//
// The oldest layer names the template's root filesystem by its absolute path, and a snapshot
// names its kernel and initramfs: the receiving host must have the same images at the same paths
// (hosts of one cluster install the same release); commit() says so when it does not.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "vmm-driver/error.h"
#include "vmm-driver/snapshot.h"

namespace pandastack::vmm {

struct TransferFile {
  // "mem", "state", a disk layer's file name, a volume copy's ("volume-<slot>.img"), or a
  // carried file's ("<volume or volume snapshot id>.img")
  std::string name;
  uint64_t size = 0;
  std::string sha256;  // layers: their content's hash (64 hex digits); "" for the others
};

struct SnapshotOffer {
  wire::Json meta;  // Snapshot::to_json(), its folders left out
  // mem, state, the layers oldest first, the snapshot's volume copies (Snapshot::volume_copies,
  // in order), then the files carried along (a migration's volumes).
  std::vector<TransferFile> files;
  std::vector<std::filesystem::path> paths;  // the sender's: where each file is (not sent)
};

// What a snapshot's sender offers, with files `carried` along (a migrated sandbox's volumes and
// their snapshots: regular files named `<id>.img`). A layer's hash is computed once per layer
// file (they are immutable: cached by device, inode, size and modification time).
Result<SnapshotOffer> offer_of(const Snapshot& snap,
                               const std::vector<std::filesystem::path>& carried = {});

struct Extent {
  uint64_t offset = 0, length = 0;
};
// The data extents of an open file of `size` bytes (SEEK_DATA/SEEK_HOLE; the whole file where
// the file system does not report holes).
Result<std::vector<Extent>> data_extents(int fd, uint64_t size);

// Bounds on what a peer may send (beyond these the offer is refused before anything is written).
struct ReceiveLimits {
  uint64_t max_state_bytes = 256ull << 20;
  uint64_t max_layer_bytes = 256ull << 30;
  size_t max_layers = 256;
  uint64_t max_volume_bytes = 64ull << 30;  // a volume copy or a carried file (a volume's limit)
  size_t max_carried = 4 * 17;              // 4 volume slots, each volume with 16 snapshots
};

// Where a received snapshot keeps the files carried along with it (by their names).
inline std::filesystem::path carried_dir(const Snapshot& snap) { return snap.disks() / "carried"; }

class SnapshotReceiver {
 public:
  // Stages `offer` at `dir` (its disk layers in `disk_dir`, which may be `dir`), linking the
  // layers `layer_cache` (a folder of layers named by hash, on `disk_dir`'s file system) holds.
  // `memory_mib`: this host's guest RAM size (a RAM file may not be larger).
  static Result<std::unique_ptr<SnapshotReceiver>> open(
      const SnapshotOffer& offer, std::filesystem::path dir, std::filesystem::path disk_dir,
      std::filesystem::path layer_cache, unsigned memory_mib, const ReceiveLimits& limits = {});
  ~SnapshotReceiver();  // not committed: the staging folders are removed
  SnapshotReceiver(const SnapshotReceiver&) = delete;
  SnapshotReceiver& operator=(const SnapshotReceiver&) = delete;

  // Indexes (into the offer's files) of the files the sender must send.
  const std::vector<uint32_t>& missing() const { return missing_; }
  // Where the carried files are once committed (by their names): carried_dir(the snapshot).
  std::filesystem::path carried_dir() const { return vmm::carried_dir(snap_); }
  // `n` bytes of file `file` at `offset` (within its size; only a missing file).
  Status write(uint32_t file, uint64_t offset, const void* data, size_t n);
  // Every missing file sent: checks the layers' hashes, adds them to the layer cache, writes
  // meta.json. The snapshot is this host's from now on (remove_snapshot removes it).
  Result<Snapshot> commit();
  uint64_t bytes_received() const { return received_; }

 private:
  SnapshotReceiver() = default;
  Snapshot snap_;
  std::vector<TransferFile> files_;
  std::vector<std::filesystem::path> paths_;  // where each offered file goes
  std::vector<int> fds_;                      // open while missing, -1 otherwise
  std::vector<uint32_t> missing_;
  std::filesystem::path cache_;
  uint64_t received_ = 0;
  bool committed_ = false;
};

// The SHA-256 of a file's content (hex).
Result<std::string> sha256_file(const std::filesystem::path& path);

}  // namespace pandastack::vmm
