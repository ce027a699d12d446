#include "actors/build_context.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "actors/dockerfile.h"
#include "actors/env.h"
#include "actors/image_import.h"
#include "actors/tenant_hash.h"
#include "vmm-driver/snapshot_transfer.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kHeaderBytes = 4096;  // (guest/image_import.py: BUNDLE_HEADER)

bool hex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

Rejection context_missing(const std::string& key) {
  return Rejection{Code::context_not_found,
                   "no build context sha256:" + key +
                       " (upload it: POST /v1/build-contexts; unused ones are dropped)"};
}

}  // namespace

std::optional<std::string> context_key(const std::string& s) {
  std::string k = s.rfind("sha256:", 0) == 0 ? s.substr(7) : s;
  if (!hex64(k)) return std::nullopt;
  return k;
}

BuildContexts::BuildContexts(fs::path dir, uint64_t max_bytes, uint32_t max_per_tenant)
    : dir_(std::move(dir)), max_bytes_(max_bytes), max_per_tenant_(max_per_tenant) {}

fs::path BuildContexts::tenant_dir(const std::string& tenant) const {
  return dir_ / tenant_hash(tenant);
}

void BuildContexts::evict(const fs::path& dir) {
  std::vector<std::pair<fs::file_time_type, fs::path>> kept;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".tar") kept.push_back({e.last_write_time(ec), e.path()});
  if (kept.size() <= max_per_tenant_) return;
  std::sort(kept.begin(), kept.end());
  for (size_t i = 0; i + max_per_tenant_ < kept.size(); ++i) {
    fs::remove(kept[i].second, ec);
    spdlog::info("build context {} dropped (the least recently used of more than {})",
                 kept[i].second.stem().string(), max_per_tenant_);
  }
}

Reply<BuildContextInfo> BuildContexts::put(const std::string& tenant, const fs::path& upload,
                                           const std::string& key) {
  std::error_code ec;
  auto drop = [&] { fs::remove(upload, ec); };
  auto bytes = fs::file_size(upload, ec);
  if (ec) return Rejection{Code::storage_error, "the upload: " + ec.message()};
  if (bytes == 0) {
    drop();
    return Rejection{Code::invalid_argument,
                     "the body is the build context: a tar archive, plain or gzip (it was "
                     "empty)"};
  }
  if (bytes > max_bytes_) {
    drop();
    return Rejection{Code::file_too_large, "a build context is at most " +
                                               std::to_string(max_bytes_ >> 20) +
                                               " MiB (--build-context-mib)"};
  }
  std::string k = key;
  if (k.empty()) {
    auto sum = vmm::sha256_file(upload);
    if (!sum) {
      drop();
      return Rejection{Code::storage_error, "the upload: " + sum.error().message};
    }
    k = *sum;
  } else if (!hex64(k)) {
    drop();
    return Rejection{Code::invalid_argument, "a build context's key is 64 hex digits"};
  }
  std::lock_guard l(mu_);
  auto dir = tenant_dir(tenant);
  fs::create_directories(dir, ec);
  auto to = dir / (k + ".tar");
  ::chmod(upload.c_str(), 0600);
  fs::rename(upload, to, ec);  // (a re-upload of the same key replaces it)
  if (ec) {
    drop();
    return Rejection{Code::storage_error, "keeping the build context: " + ec.message()};
  }
  evict(dir);
  spdlog::info("build context {} kept for a tenant: {} bytes", k, bytes);
  return BuildContextInfo{k, bytes, now_ms()};
}

Reply<BuildContextInfo> BuildContexts::get(const std::string& tenant, const std::string& key) {
  if (!hex64(key)) return context_missing(key);
  std::lock_guard l(mu_);
  auto path = tenant_dir(tenant) / (key + ".tar");
  std::error_code ec;
  auto bytes = fs::file_size(path, ec);
  if (ec) return context_missing(key);
  auto t = fs::last_write_time(path, ec);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::file_clock::to_sys(t).time_since_epoch())
                .count();
  return BuildContextInfo{key, bytes, ms};
}

std::optional<Rejection> BuildContexts::remove(const std::string& tenant, const std::string& key) {
  if (!hex64(key)) return context_missing(key);
  std::lock_guard l(mu_);
  std::error_code ec;
  if (!fs::remove(tenant_dir(tenant) / (key + ".tar"), ec)) return context_missing(key);
  return std::nullopt;
}

Reply<std::vector<fs::path>> BuildContexts::take(const std::string& tenant,
                                                 const std::vector<std::string>& keys,
                                                 const fs::path& into) {
  std::lock_guard l(mu_);
  std::error_code ec;
  fs::create_directories(into, ec);
  std::vector<fs::path> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!hex64(keys[i])) return context_missing(keys[i]);
    auto from = tenant_dir(tenant) / (keys[i] + ".tar");
    auto to = into / ("context-" + std::to_string(i) + ".tar");
    fs::remove(to, ec);
    fs::create_hard_link(from, to, ec);
    if (ec) return context_missing(keys[i]);
    fs::last_write_time(from, fs::file_time_type::clock::now(), ec);  // (recently used)
    out.push_back(to);
  }
  return out;
}

Reply<uint64_t> write_context_bundle(const std::vector<fs::path>& archives, const fs::path& out) {
  wire::Json list = wire::Json::array();
  uint64_t at = kHeaderBytes;
  std::vector<uint64_t> sizes;
  for (auto& a : archives) {
    std::error_code ec;
    auto n = fs::file_size(a, ec);
    if (ec) return Rejection{Code::storage_error, "a context archive: " + ec.message()};
    wire::Json e = wire::Json::object();
    e.set("offset", int64_t(at));
    e.set("bytes", int64_t(n));
    list.push(e);
    sizes.push_back(n);
    at += (n + 511) / 512 * 512;
  }
  wire::Json header = wire::Json::object();
  header.set("archives", list);
  auto head = header.dump();
  if (head.size() >= kHeaderBytes)
    return Rejection{Code::invalid_argument, "too many context archives for one build"};
  int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Rejection{Code::storage_error, "the context bundle: cannot create it"};
  bool ok = ::pwrite(fd, head.data(), head.size(), 0) == ssize_t(head.size());
  uint64_t offset = kHeaderBytes;
  for (size_t i = 0; ok && i < archives.size(); ++i) {
    int in = ::open(archives[i].c_str(), O_RDONLY | O_CLOEXEC);
    ok = in >= 0;
    loff_t src = 0, dst = loff_t(offset);
    uint64_t left = sizes[i];
    while (ok && left > 0) {  // (bytes copied as bytes: in the kernel, no parsing)
      auto n = ::copy_file_range(in, &src, fd, &dst, left, 0);
      ok = n > 0;
      if (ok) left -= uint64_t(n);
    }
    if (in >= 0) ::close(in);
    offset += (sizes[i] + 511) / 512 * 512;
  }
  ok = ok && ::ftruncate(fd, off_t(std::max(offset, kHeaderBytes))) == 0;
  ::close(fd);
  if (!ok) return Rejection{Code::storage_error, "the context bundle: cannot write it"};
  return std::max(offset, kHeaderBytes);
}

Reply<fs::path> unpack_context_in_vm(Env& env, const ContextJob& job) {
  auto log = [&](const std::string& l) {
    if (job.log) job.log(l);
  };
  std::error_code ec;
  if (!fs::exists(env.config.images_dir / "base" / "rootfs.qcow2", ec))
    return Rejection{Code::unavailable, "a build context needs the shipped template base"};
  fs::create_directories(job.work_dir, ec);
  auto bundle = job.work_dir / "context.bundle";
  auto written = write_context_bundle(job.archives, bundle);
  if (!written) return written.error();
  const uint64_t bundle_bytes = *written;
  auto disk = job.work_dir / "context.raw";
  fs::remove(disk, ec);
  { std::ofstream(disk, std::ios::binary); }
  fs::resize_file(disk, job.disk_bytes, ec);  // (sparse)
  if (ec) return Rejection{Code::storage_error, "the context disk: " + ec.message()};
  ImporterRun run;
  run.run_name = "context-" + job.id;
  run.boot_note = " to unpack the build context";
  run.what = "unpacking the build context";
  run.memory_mib = job.memory_mib;
  run.vcpus = job.vcpus;
  run.deadline = job.deadline;
  run.log = log;
  run.stop = job.stop;
  run.archive = bundle;
  run.archive_bytes = bundle_bytes;
  run.disk = disk;
  run.disk_bytes = job.disk_bytes;
  run.args = {"--context"};
  auto unpacked = run_importer_in_vm(env, run);
  if (!unpacked) return unpacked.error();
  fs::remove(bundle, ec);
  return disk;
}

}  // namespace pandastack::actors
