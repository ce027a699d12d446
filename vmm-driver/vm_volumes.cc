// Volume slots (VmConfig::volumes): binding a volume file to one of the VM's placeholder disks.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "vmm-driver/qmp.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/vm.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

Status Vm::bind_volumes(const std::vector<VolumeBinding>& volumes) {
  using wire::Json;
  auto t0 = steady_clock::now();
  size_t before = bound_.size();
  for (auto& v : volumes) {
    if (v.slot >= kVolumeSlots)
      return make_error(ErrorCode::invalid_argument, "no volume slot " + std::to_string(v.slot));
    auto same =
        std::find_if(bound_.begin(), bound_.end(), [&](auto& b) { return b.slot == v.slot; });
    if (same != bound_.end()) {
      if (*same == v) continue;
      return make_error(ErrorCode::invalid_argument,
                        "volume slot " + std::to_string(v.slot) + " is bound already");
    }
    std::string n = "vol" + std::to_string(v.slot);
    // Opened by the daemon (root) and passed: QEMU sees a descriptor, never the path.
    auto pass = [&](const fs::path& file, bool writable, int64_t fdset) -> Status {
      int fd = ::open(file.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0)
        return make_error(ErrorCode::io_error,
                          "cannot open " + file.string() + ": " + strerror(errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return make_error(ErrorCode::io_error, file.string() + " is not a regular file");
      }
      Json args = Json::object();
      args.set("fdset-id", fdset);
      auto r = qmp_->execute("add-fd", args, seconds(10), fd);
      ::close(fd);
      if (!r) return failure(ErrorCode::qmp_error, "passing " + n + ": " + r.error().message);
      return Ok{};
    };
    auto file_node = [](int64_t fdset, bool read_only) {
      Json f = Json::object();
      f.set("driver", "file");
      f.set("filename", "/dev/fdset/" + std::to_string(fdset));
      f.set("locking", "off");
      if (read_only) f.set("read-only", true);
      return f;
    };
    struct stat st {};
    if (::stat(v.file.c_str(), &st) != 0)
      return make_error(ErrorCode::io_error,
                        "cannot stat " + v.file.string() + ": " + strerror(errno));
    const int64_t size = int64_t(st.st_size);
    const int64_t data_set = 100 + 2 * int64_t(v.slot), overlay_set = data_set + 1;
    auto passed = pass(v.file, !v.read_only, data_set);
    if (!passed) return passed;
    Json node;
    if (!v.read_only) {
      node = file_node(data_set, false);
    } else {
      // The guest's writes (it mounts read-only, but it is not trusted to) land in a throwaway
      // overlay of the VM's own, on its disk folder.
      auto overlay = disks() / (n + "-ro.qcow2");
      std::error_code ec;
      fs::remove(overlay, ec);
      auto made = run_tool(
          {"qemu-img", "create", "-q", "-f", "qcow2", overlay.string(), std::to_string(size)});
      if (!made) return made;
      passed = pass(overlay, true, overlay_set);
      if (!passed) return passed;
      Json base = Json::object();
      base.set("driver", "raw");
      base.set("read-only", true);
      base.set("file", file_node(data_set, true));
      node = Json::object();
      node.set("driver", "qcow2");
      node.set("file", file_node(overlay_set, false));
      node.set("backing", base);
    }
    node.set("node-name", n + "-data");
    auto added = qmp_->execute("blockdev-add", node);
    if (!added) return failure(ErrorCode::qmp_error, "adding " + n + ": " + added.error().message);
    Json slot = Json::object();
    slot.set("driver", "raw");
    slot.set("node-name", n);
    slot.set("file", n + "-data");
    Json options = Json::array();
    options.push(slot);
    Json reopen = Json::object();
    reopen.set("options", options);
    auto reopened = qmp_->execute("blockdev-reopen", reopen);
    if (!reopened)
      return failure(ErrorCode::qmp_error, "binding " + n + ": " + reopened.error().message);
    Json del = Json::object();
    del.set("node-name", n + "-empty");
    (void)qmp_->execute("blockdev-del", del);
    // The slot's new size reaches the guest (a virtio config change): its disk grows from 4 KiB.
    Json resize = Json::object();
    resize.set("node-name", n);
    resize.set("size", size);
    auto resized = qmp_->execute("block_resize", resize);
    if (!resized)
      return failure(ErrorCode::qmp_error, "sizing " + n + ": " + resized.error().message);
    bound_.push_back(v);
    spdlog::debug("vm {}: volume slot {} bound in {} us", config_.name, v.slot,
                  duration_cast<microseconds>(steady_clock::now() - t0).count());
  }
  // An adopting host must know them (snapshots and forks copy them): on record at once.
  if (bound_.size() != before && !config_.die_with_parent) return save_record();
  return Ok{};
}

Status Vm::sync_volumes(std::chrono::milliseconds timeout) {
  bool writable = std::any_of(bound_.begin(), bound_.end(), [](auto& v) { return !v.read_only; });
  if (!writable || !agent_ || !alive()) return Ok{};
  ExecRequest sync;
  sync.argv = {"sync"};
  sync.timeout_ms = uint32_t(timeout.count());
  auto t0 = steady_clock::now();
  auto r = agent_->exec(sync);
  if (!r) return make_error(r.error().code, "sync in the guest: " + r.error().message);
  if (r->timed_out || r->exit_code != 0)
    return make_error(ErrorCode::timeout, "sync in the guest did not finish within " +
                                              std::to_string(timeout.count()) + " ms");
  spdlog::debug("vm {}: guest sync for its volumes in {} us", config_.name,
                duration_cast<microseconds>(steady_clock::now() - t0).count());
  return Ok{};
}

}  // namespace pandastack::vmm
