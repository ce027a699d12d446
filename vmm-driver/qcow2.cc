#include "vmm-driver/qcow2.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace pandastack::vmm::qcow2 {

namespace {

uint64_t be64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}
uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

constexpr uint32_t kMaxBackingName = 1023;  // the qcow2 spec's limit

struct Header {
  uint64_t backing_offset;
  uint32_t backing_size;
  uint32_t cluster_bits;
};

Result<Header> read_header(int fd, const std::string& name) {
  unsigned char h[24];
  if (::pread(fd, h, sizeof h, 0) != ssize_t(sizeof h))
    return make_error(ErrorCode::io_error, "cannot read qcow2 header of " + name);
  if (std::memcmp(h, "QFI\xfb", 4) != 0)
    return make_error(ErrorCode::invalid_argument, name + " is not a qcow2 image");
  uint32_t version = be32(h + 4);
  if (version != 2 && version != 3)
    return make_error(ErrorCode::invalid_argument,
                      name + ": unsupported qcow2 version " + std::to_string(version));
  Header out{be64(h + 8), be32(h + 16), be32(h + 20)};
  // The spec's bounds (QEMU refuses the rest too). The header may come from a QEMU we do not trust
  // (a VM's overlay becomes a snapshot layer): a 4 GiB name size must not become a 4 GiB string,
  // nor a cluster_bits of 64 an undefined shift.
  if (out.cluster_bits < 9 || out.cluster_bits > 21)
    return make_error(
        ErrorCode::invalid_argument,
        name + ": qcow2 cluster_bits " + std::to_string(out.cluster_bits) + " out of 9..21");
  const uint64_t header_size = version == 2 ? 72 : 104;  // the name follows the header
  if (out.backing_offset != 0 &&
      (out.backing_size > kMaxBackingName || out.backing_offset < header_size ||
       out.backing_offset >= (uint64_t(1) << out.cluster_bits)))
    return make_error(
        ErrorCode::invalid_argument,
        name + ": qcow2 backing file name out of the header cluster or over 1023 bytes");
  return out;
}

}  // namespace

Result<uint64_t> virtual_size(const std::filesystem::path& image) {
  int fd = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "cannot open " + image.string() + ": " + strerror(errno));
  auto header = read_header(fd, image.string());
  unsigned char size[8];
  bool read = ::pread(fd, size, sizeof size, 24) == ssize_t(sizeof size);
  ::close(fd);
  if (!header) return header.error();
  if (!read) return make_error(ErrorCode::io_error, "cannot read the size of " + image.string());
  return be64(size);
}

Result<std::string> backing_file(const std::filesystem::path& image) {
  int fd = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "cannot open " + image.string() + ": " + strerror(errno));
  auto h = read_header(fd, image.string());
  if (!h) {
    ::close(fd);
    return h.error();
  }
  if (h->backing_offset == 0) {  // no backing file (the size field means nothing then)
    ::close(fd);
    return std::string();
  }
  std::string name(h->backing_size, '\0');  // at most kMaxBackingName: read_header checked
  bool ok = ::pread(fd, name.data(), name.size(), off_t(h->backing_offset)) == ssize_t(name.size());
  ::close(fd);
  if (!ok)
    return make_error(ErrorCode::io_error, "cannot read backing file name of " + image.string());
  return name;
}

Status set_backing_file(const std::filesystem::path& image, const std::string& backing) {
  int fd = ::open(image.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return make_error(ErrorCode::io_error,
                      "cannot open " + image.string() + ": " + strerror(errno));
  auto h = read_header(fd, image.string());
  Status st = Ok{};
  if (!h) {
    st = h.error();
  } else if (h->backing_offset == 0) {
    st =
        make_error(ErrorCode::invalid_argument, image.string() + " has no backing file to replace");
  } else if (h->backing_offset + backing.size() > (uint64_t(1) << h->cluster_bits) ||
             backing.size() > kMaxBackingName) {
    st =
        make_error(ErrorCode::invalid_argument, "backing file name too long for " + image.string());
  } else {
    unsigned char size_be[4] = {uint8_t(backing.size() >> 24), uint8_t(backing.size() >> 16),
                                uint8_t(backing.size() >> 8), uint8_t(backing.size())};
    if (::pwrite(fd, backing.data(), backing.size(), off_t(h->backing_offset)) !=
            ssize_t(backing.size()) ||
        ::pwrite(fd, size_be, 4, 16) != 4)
      st = make_error(ErrorCode::io_error,
                      "cannot write qcow2 header of " + image.string() + ": " + strerror(errno));
  }
  ::close(fd);
  return st;
}

}  // namespace pandastack::vmm::qcow2
