#include "vmm-driver/snapshot_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <tuple>

#include "vmm-driver/qcow2.h"
#include "vmm-driver/vm_internal.h"
#include "wire/sha256.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;

namespace {

Error io(const std::string& what) {
  return make_error(ErrorCode::io_error, what + ": " + std::strerror(errno));
}

bool is_hash(const std::string& h) {
  if (h.size() != 64) return false;
  for (char c : h)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Layer hashes by file identity: layers are never written once they are layers.
using FileKey = std::tuple<dev_t, ino_t, off_t, int64_t>;
std::mutex hashes_mu;
std::map<FileKey, std::string> hashes;
constexpr size_t kMaxCachedHashes = 4096;

Result<std::string> layer_hash(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return io("cannot stat " + p.string());
  FileKey key{st.st_dev, st.st_ino, st.st_size,
              int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  {
    std::lock_guard l(hashes_mu);
    if (auto it = hashes.find(key); it != hashes.end()) return it->second;
  }
  auto h = sha256_file(p);
  if (!h) return h;
  std::lock_guard l(hashes_mu);
  if (hashes.size() >= kMaxCachedHashes) hashes.clear();
  hashes[key] = *h;
  return h;
}

}  // namespace

Result<std::string> sha256_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io("cannot open " + path.string());
  wire::Sha256 h;
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) h.add({buf.data(), size_t(n)});
  int err = errno;
  ::close(fd);
  if (n < 0) {
    errno = err;
    return io("cannot read " + path.string());
  }
  return h.hex();
}

namespace {

// A carried file's name: a volume's or a volume snapshot's id, ".img" (never a path).
bool is_carried_name(const std::string& n) {
  std::string_view v(n);
  if (!v.ends_with(".img")) return false;
  v.remove_suffix(4);
  size_t us = v.find('_');
  if (us == std::string_view::npos || (v.substr(0, us) != "vol" && v.substr(0, us) != "vsnap"))
    return false;
  auto rest = v.substr(us + 1);
  if (rest.empty() || rest.size() > 40) return false;
  for (char c : rest)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

std::string copy_name(uint32_t slot) { return "volume-" + std::to_string(slot) + ".img"; }

}  // namespace

Result<SnapshotOffer> offer_of(const Snapshot& snap, const std::vector<fs::path>& carried) {
  SnapshotOffer o;
  Snapshot bare = snap;
  bare.disk_dir.clear();
  o.meta = bare.to_json();
  auto add = [&](const std::string& name, const fs::path& path, std::string sha) -> Status {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return io("cannot stat " + path.string());
    if (!S_ISREG(st.st_mode)) return io(path.string() + " is not a regular file");
    o.files.push_back({name, uint64_t(st.st_size), std::move(sha)});
    o.paths.push_back(path);
    return Ok{};
  };
  for (const char* name : {"mem", "state"})
    if (auto a = add(name, snap.dir / name, ""); !a) return a.error();
  for (auto& l : snap.layers) {
    auto h = layer_hash(snap.layer(l));
    if (!h) return h.error();
    if (auto a = add(l, snap.layer(l), *h); !a) return a.error();
  }
  for (auto slot : snap.volume_copies)
    if (auto a = add(copy_name(slot), snap.volume(slot), ""); !a) return a.error();
  for (auto& c : carried) {
    if (!is_carried_name(c.filename().string()))
      return make_error(ErrorCode::invalid_argument, "not a volume file: " + c.string());
    if (auto a = add(c.filename().string(), c, ""); !a) return a.error();
  }
  return o;
}

Result<std::vector<Extent>> data_extents(int fd, uint64_t size) {
  std::vector<Extent> out;
  off_t at = 0;
  while (uint64_t(at) < size) {
    off_t data = ::lseek(fd, at, SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) break;                                              // only a hole is left
      if (errno == EINVAL && at == 0) return std::vector<Extent>{{0, size}};  // no hole support
      return io("SEEK_DATA");
    }
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) return io("SEEK_HOLE");
    if (uint64_t(hole) > size) hole = off_t(size);
    if (hole > data) out.push_back({uint64_t(data), uint64_t(hole - data)});
    at = hole;
  }
  return out;
}

Result<std::unique_ptr<SnapshotReceiver>> SnapshotReceiver::open(const SnapshotOffer& offer,
                                                                 fs::path dir, fs::path disk_dir,
                                                                 fs::path layer_cache,
                                                                 unsigned memory_mib,
                                                                 const ReceiveLimits& limits) {
  auto snap = Snapshot::from_json(offer.meta, dir);
  if (!snap) return snap.error();
  auto bad = [](const std::string& why) {
    return make_error(ErrorCode::invalid_argument, "snapshot offer refused: " + why);
  };
  if (snap->layers.empty()) return bad("no disk layers");
  if (snap->layers.size() > limits.max_layers) return bad("too many disk layers");
  const size_t copies = snap->volume_copies.size(), fixed = 2 + snap->layers.size() + copies;
  if (copies > kVolumeSlots) return bad("more volume copies than volume slots");
  if (offer.files.size() < fixed || offer.files[0].name != "mem" || offer.files[1].name != "state")
    return bad("the files are not the snapshot's (mem, state, its layers, its volume copies)");
  if (offer.files.size() - fixed > limits.max_carried) return bad("too many files carried along");
  if (snap->memory_mib != memory_mib)
    return bad("its guest has " + std::to_string(snap->memory_mib) + " MiB, this host's " +
               std::to_string(memory_mib) + " MiB");
  if (offer.files[0].size > (uint64_t(memory_mib) << 20) + (64ull << 20))
    return bad("a RAM file larger than this host's guests");
  if (offer.files[1].size > limits.max_state_bytes) return bad("a device state too large");
  for (size_t i = 0; i < snap->layers.size(); ++i) {
    auto& f = offer.files[2 + i];
    if (f.name != snap->layers[i]) return bad("layer " + f.name + " is not the snapshot's");
    if (!is_hash(f.sha256)) return bad("layer " + f.name + " has no SHA-256");
    if (f.size > limits.max_layer_bytes) return bad("layer " + f.name + " too large");
  }
  std::set<std::string> names;
  for (size_t i = 2 + snap->layers.size(); i < offer.files.size(); ++i) {
    auto& f = offer.files[i];
    size_t k = i - 2 - snap->layers.size();
    if (k < copies ? f.name != copy_name(snap->volume_copies[k]) : !is_carried_name(f.name))
      return bad("file " + f.name + " is not a volume copy or a volume's file");
    if (!f.sha256.empty()) return bad("a volume's file offered by hash");
    if (f.size > limits.max_volume_bytes) return bad("file " + f.name + " too large");
    if (!names.insert(f.name).second) return bad("file " + f.name + " offered twice");
  }
  snap->disk_dir = disk_dir == dir ? fs::path() : disk_dir;
  std::unique_ptr<SnapshotReceiver> r(new SnapshotReceiver());
  r->files_ = offer.files;
  r->cache_ = layer_cache;
  for (size_t i = 0; i < offer.files.size(); ++i) {
    auto& n = offer.files[i].name;
    r->paths_.push_back(i < 2                         ? dir / n
                        : i < 2 + snap->layers.size() ? snap->layer(n)
                        : i < fixed                   ? snap->disks() / n
                                                      : vmm::carried_dir(*snap) / n);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::create_directories(snap->disks(), ec);
  if (!ec && offer.files.size() > fixed) fs::create_directories(vmm::carried_dir(*snap), ec);
  if (!ec) fs::create_directories(layer_cache, ec);
  if (ec)
    return make_error(ErrorCode::io_error, "cannot make " + dir.string() + ": " + ec.message());
  r->snap_ = *snap;  // (from here on, the destructor removes the folders)
  // Cached layers nothing else holds any more (one link: the cache's) go: the cache keeps the
  // layers of snapshots and sandboxes that exist, not every layer ever received.
  for (auto& e : fs::directory_iterator(layer_cache, ec)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1)
      fs::remove(e.path(), ec);
  }
  r->fds_.assign(offer.files.size(), -1);
  for (uint32_t i = 0; i < offer.files.size(); ++i) {
    auto& f = offer.files[i];
    auto& path = r->paths_[i];
    if (!f.sha256.empty() && ::link((layer_cache / f.sha256).c_str(), path.c_str()) == 0) continue;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return io("cannot create " + path.string());
    r->fds_[i] = fd;
    if (::ftruncate(fd, off_t(f.size)) != 0) return io("cannot size " + path.string());
    r->missing_.push_back(i);
  }
  return r;
}

SnapshotReceiver::~SnapshotReceiver() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  if (!committed_ && !snap_.dir.empty()) remove_snapshot(snap_.dir, snap_.disk_dir);
}

Status SnapshotReceiver::write(uint32_t file, uint64_t offset, const void* data, size_t n) {
  if (committed_ || file >= fds_.size() || fds_[file] < 0)
    return make_error(ErrorCode::invalid_argument, "a write to a file not being received");
  if (offset > files_[file].size || n > files_[file].size - offset)
    return make_error(ErrorCode::invalid_argument, "a write past the end of " + files_[file].name);
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fds_[file], p, n, off_t(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io("cannot write " + files_[file].name);
    }
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
    received_ += uint64_t(w);
  }
  return Ok{};
}

Result<Snapshot> SnapshotReceiver::commit() {
  for (uint32_t i : missing_) {
    auto& f = files_[i];
    auto& path = paths_[i];
    if (::close(fds_[i]) != 0) {
      fds_[i] = -1;
      return io("cannot write " + path.string());
    }
    fds_[i] = -1;
    if (f.sha256.empty()) continue;
    auto h = sha256_file(path);
    if (!h) return h.error();
    if (*h != f.sha256)
      return make_error(ErrorCode::io_error, "layer " + f.name + " arrived damaged (its SHA-256 " +
                                                 *h + " is not the " + f.sha256 + " offered)");
    // Root's and read-only, as the sender's layers are (QEMU's jailed users read it).
    if (::chmod(path.c_str(), 0644) != 0) return io("cannot chmod " + path.string());
    (void)::link(path.c_str(), (cache_ / f.sha256).c_str());  // (a concurrent receive has it)
  }
  // The layers' headers are the sender's: each must name the layer before it, the oldest a
  // template's root file system (start checks it is the template it names), which must exist.
  auto chain = check_layer_chain(snap_);
  if (!chain) return chain.error();
  auto base = qcow2::backing_file(snap_.layer(snap_.layers.front()));
  if (!base) return base.error();
  if (!fs::exists(*base))
    return make_error(ErrorCode::invalid_argument,
                      "this host lacks the image the snapshot's disk is based on: " + *base);
  auto linked = detail::link_or_copy(snap_.layer(snap_.layers.back()), snap_.disk());
  if (!linked) return linked.error();
  for (auto& f : {snap_.kernel, snap_.initramfs})
    if (!f.empty() && !fs::exists(f))
      return make_error(ErrorCode::invalid_argument,
                        "this host lacks the guest image the snapshot was booted with: " + f);
  auto meta = snap_.write_meta();
  if (!meta) return meta.error();
  auto loaded = Snapshot::load(snap_.dir);
  if (!loaded) return loaded;
  committed_ = true;
  return loaded;
}

}  // namespace pandastack::vmm
