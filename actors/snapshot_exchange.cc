#include "actors/snapshot_exchange.h"

#include <fcntl.h>
#include <unistd.h>

namespace pandastack::actors {

Reply<std::unique_ptr<OfferedFile>> OfferedFile::open(const SnapshotOffer& offer, uint32_t index) {
  if (index >= offer.files.size() || index >= offer.paths.size())
    return Rejection{Code::peer_error, "a file the offer does not have: " + std::to_string(index)};
  std::unique_ptr<OfferedFile> f(new OfferedFile);
  f->path_ = offer.paths[index];
  f->fd_ = ::open(f->path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) return Rejection{Code::internal, "cannot open " + f->path_.string()};
  auto extents = vmm::data_extents(f->fd_, offer.files[index].size);
  if (!extents) return Rejection{Code::internal, extents.error().message};
  f->extents_ = std::move(*extents);
  return f;
}

OfferedFile::~OfferedFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool OfferedFile::read(uint64_t offset, void* dest, size_t n) const {
  return ::pread(fd_, dest, n, off_t(offset)) == ssize_t(n);
}

SnapshotIntake::SnapshotIntake(std::string id, std::unique_ptr<vmm::SnapshotReceiver> receiver)
    : id_(std::move(id)), receiver_(std::move(receiver)) {}

SnapshotIntake::~SnapshotIntake() = default;

const std::vector<uint32_t>& SnapshotIntake::missing() const { return receiver_->missing(); }

Reply<Ok> SnapshotIntake::write(uint32_t file, uint64_t offset, const void* data, size_t n) {
  if (auto st = receiver_->write(file, offset, data, n); !st)
    return Rejection{Code::peer_error, st.error().message};
  return Ok{};
}

Reply<Ok> SnapshotIntake::commit() {
  if (auto c = receiver_->commit(); !c) return Rejection{Code::peer_error, c.error().message};
  return Ok{};
}

uint64_t SnapshotIntake::bytes_received() const { return receiver_->bytes_received(); }

}  // namespace pandastack::actors
