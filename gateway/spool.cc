// A file_body route's body written to a file of the daemon's as it arrives (image archives for
// PUT /v1/templates/{name}/image): never held in memory, bounded, cut off when it pauses.
#include <fcntl.h>
#include <kj/debug.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "gateway/server.h"

namespace pandastack::gateway {

actors::Reply<std::pair<std::string, int>> Server::spool_file() {
  auto dir = rt.template_upload_dir();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  unsigned char r[12];
  if (RAND_bytes(r, sizeof r) != 1) return actors::Rejection{Code::internal, "no randomness"};
  std::string name;
  for (auto b : r) name += "0123456789abcdef"[b >> 4], name += "0123456789abcdef"[b & 15];
  auto path = (dir / (name + ".part")).string();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return actors::Rejection{Code::storage_error,
                             std::string("cannot store the upload: ") + strerror(errno)};
  return std::pair{path, fd};
}

kj::Promise<uint64_t> Server::spool(kj::AsyncInputStream& in, int fd, uint64_t limit,
                                    uint64_t so_far) {
  auto buf = kj::heapArray<kj::byte>(1 << 20);
  auto read = in.tryRead(buf.begin(), 1, buf.size());
  auto paused =
      timer.afterDelay(limits.body_timeout.count() * kj::MILLISECONDS).then([this]() -> size_t {
        KJ_FAIL_REQUIRE("request_timeout: the upload paused longer than",
                        limits.body_timeout.count());
      });
  return read.exclusiveJoin(kj::mv(paused))
      .then([this, &in, fd, limit, so_far, buf = kj::mv(buf)](size_t got) -> kj::Promise<uint64_t> {
        if (got == 0) return so_far;
        if (so_far + got > limit)
          KJ_FAIL_REQUIRE(
              kj::str("file_too_large: the upload is larger than ", limit, " bytes").cStr());
        for (size_t off = 0; off < got;) {
          auto w = ::write(fd, buf.begin() + off, got - off);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) KJ_FAIL_REQUIRE("storing the upload failed", strerror(errno));
          off += size_t(w);
        }
        return spool(in, fd, limit, so_far + got);
      });
}

}  // namespace pandastack::gateway
