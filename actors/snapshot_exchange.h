// What the runtime hands the cluster's transport (gateway/peer_snapshots.h) to move a snapshot
// between hosts: the sender's offer and its files' data, and the receiver's intake. The transport
// moves bytes; which folders, caches and limits apply is decided here, on the actors' side of
// the line (the gateway never touches the VMM driver).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "actors/sandbox.h"
#include "vmm-driver/snapshot_transfer.h"

namespace pandastack::actors {

// A snapshot as its sender offers it: metadata, each file's name, size and (for a disk layer)
// content hash, and where the sender keeps it (not sent).
using SnapshotOffer = vmm::SnapshotOffer;

// One offered file, open for reading its data (a RAM file is mostly holes: only its data
// extents are sent).
class OfferedFile {
 public:
  // File `index` of `offer`: opened, its data extents found.
  static Reply<std::unique_ptr<OfferedFile>> open(const SnapshotOffer& offer, uint32_t index);
  ~OfferedFile();
  OfferedFile(const OfferedFile&) = delete;
  OfferedFile& operator=(const OfferedFile&) = delete;

  using Extent = vmm::Extent;
  const std::vector<Extent>& extents() const { return extents_; }
  // Reads `n` bytes at `offset` into `dest`: false when the file is shorter or unreadable.
  bool read(uint64_t offset, void* dest, size_t n) const;
  const std::filesystem::path& path() const { return path_; }

 private:
  OfferedFile() = default;
  int fd_ = -1;
  std::filesystem::path path_;
  std::vector<Extent> extents_;
};

// A snapshot being received from another host for one tenant (Runtime::receive_snapshot):
// staged in a folder of its own, nothing of it used until commit() checked every file. Dropped
// before commit: the staging is removed.
class SnapshotIntake {
 public:
  explicit SnapshotIntake(std::string id, std::unique_ptr<vmm::SnapshotReceiver> receiver);
  ~SnapshotIntake();
  // The received snapshot's id here ("imp_..."): what a start names.
  const std::string& id() const { return id_; }
  // Indexes (into the offer's files) of the files the sender must send.
  const std::vector<uint32_t>& missing() const;
  // `n` bytes of missing file `file` at `offset`.
  Reply<Ok> write(uint32_t file, uint64_t offset, const void* data, size_t n);
  // Every missing file sent: checks the layers' hashes. From now on the snapshot is this
  // host's (Runtime::start_imported starts it, Runtime::discard_import removes it).
  Reply<Ok> commit();
  uint64_t bytes_received() const;

 private:
  std::string id_;
  std::unique_ptr<vmm::SnapshotReceiver> receiver_;
};

}  // namespace pandastack::actors
