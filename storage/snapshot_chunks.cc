#include "storage/snapshot_chunks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "wire/json.h"
#include "wire/sha256.h"

namespace pandastack::storage {

namespace fs = std::filesystem;

namespace {
bool hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool file_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s == "." || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum((unsigned char)c) || c == '.' || c == '_' || c == '-';
  });
}

bool all_zero(const std::string& b) {
  return b.empty() || (b[0] == 0 && std::memcmp(b.data(), b.data() + 1, b.size() - 1) == 0);
}

Error io(const std::string& what) {
  return make_error(ErrorCode::io_error, what + ": " + std::strerror(errno));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads up to n bytes at `off` (fewer only at the end of the file).
bool read_at(int fd, uint64_t off, size_t n, std::string& out) {
  out.resize(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, out.data() + got, n - got, off_t(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) break;
    got += size_t(r);
  }
  out.resize(got);
  return true;
}

uint64_t ms_since(std::chrono::steady_clock::time_point t0) {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
}
}  // namespace

bool manifest_key(const std::string& key) {
  return key.rfind("manifests/", 0) == 0 && hex64(key.substr(10));
}

Result<std::string> upload_folder(ObjectStore& store, const fs::path& dir, ChunkStats* stats,
                                  KnownChunks* known) {
  auto t0 = std::chrono::steady_clock::now();
  ChunkStats local;
  ChunkStats& st = stats ? *stats : local;
  std::vector<std::string> names;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && !e.is_symlink(ec)) names.push_back(e.path().filename().string());
  if (ec)
    return make_error(ErrorCode::io_error, "cannot list " + dir.string() + ": " + ec.message());
  std::sort(names.begin(), names.end());
  if (names.size() > kMaxManifestFiles)
    return make_error(
        ErrorCode::invalid_argument,
        dir.string() + " has more than " + std::to_string(kMaxManifestFiles) + " files");
  wire::Json files = wire::Json::array();
  std::map<std::pair<dev_t, ino_t>, std::string> seen;  // hard links: one upload
  KnownChunks local_known;
  KnownChunks& present = known ? *known : local_known;  // chunks known to be in the store
  std::string buf;
  for (auto& name : names) {
    if (!file_name(name))
      return make_error(ErrorCode::invalid_argument, "file name " + name + " is not uploaded");
    Fd f;
    f.fd = ::open((dir / name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (f.fd < 0) return io("open " + (dir / name).string());
    struct stat sb {};
    if (::fstat(f.fd, &sb) != 0) return io("stat " + name);
    wire::Json entry = wire::Json::object();
    entry.set("name", name);
    auto inode = std::make_pair(sb.st_dev, sb.st_ino);
    if (auto it = seen.find(inode); it != seen.end()) {
      entry.set("link", it->second);
      files.push(std::move(entry));
      continue;
    }
    seen[inode] = name;
    ++st.files;
    st.bytes += uint64_t(sb.st_size);
    entry.set("size", int64_t(sb.st_size));
    entry.set("mode", int64_t(sb.st_mode & 0777));
    wire::Json chunks = wire::Json::array();
    for (uint64_t off = 0; off < uint64_t(sb.st_size); off += kChunkBytes) {
      size_t n = size_t(std::min<uint64_t>(kChunkBytes, uint64_t(sb.st_size) - off));
      if (!read_at(f.fd, off, n, buf) || buf.size() != n) return io("read " + name);
      ++st.chunks;
      if (all_zero(buf)) {
        ++st.zero_chunks;
        chunks.push(std::string());
        continue;
      }
      std::string hash = wire::sha256_hex(buf);
      chunks.push(hash);
      if (present.count(hash)) continue;
      auto there = store.exists("chunks/" + hash);
      if (!there) return there.error();
      if (!*there) {
        auto put = store.put("chunks/" + hash, buf);
        if (!put) return put.error();
        ++st.sent_chunks;
        st.sent_bytes += n;
      }
      if (present.size() >= kMaxKnownChunks) present.clear();
      present.insert(hash);
    }
    entry.set("chunks", std::move(chunks));
    files.push(std::move(entry));
  }
  wire::Json manifest = wire::Json::object();
  manifest.set("format", int64_t(1));
  manifest.set("chunk_bytes", int64_t(kChunkBytes));
  manifest.set("files", std::move(files));
  std::string text = manifest.dump();
  std::string key = "manifests/" + wire::sha256_hex(text);
  auto put = store.put(key, text);  // last: it names only chunks that are there
  if (!put) return put.error();
  st.ms = ms_since(t0);
  return key;
}

Result<GcStats> collect_garbage(ObjectStore& store, KnownChunks* known) {
  GcStats st;
  auto manifests = store.list("manifests/");
  if (!manifests) return manifests.error();
  std::set<std::string> named;
  for (auto& key : *manifests) {
    if (!manifest_key(key)) continue;
    auto text = store.get(key, kMaxManifestBytes);
    if (!text) return text.error();
    auto m = wire::Json::parse(*text);
    if (!m || !(*m)["files"].is_array())
      return make_error(ErrorCode::corrupt,
                        "manifest " + key + " is unreadable: nothing collected");
    ++st.manifests;
    for (auto& f : (*m)["files"].as_array())
      if (f["chunks"].is_array())
        for (auto& c : f["chunks"].as_array())
          if (c.is_string() && !c.as_string().empty()) named.insert(c.as_string());
  }
  auto chunks = store.list("chunks/");
  if (!chunks) return chunks.error();
  for (auto& key : *chunks) {
    ++st.chunks;
    if (named.count(key.substr(7))) continue;
    if (known) known->erase(key.substr(7));  // (first: a failed delete may have deleted it)
    auto r = store.remove(key);
    if (!r) return r.error();
    ++st.deleted;
  }
  return st;
}

Status download_folder(ObjectStore& store, const std::string& key, const fs::path& dir,
                       ChunkStats* stats, uint64_t max_bytes) {
  auto t0 = std::chrono::steady_clock::now();
  ChunkStats local;
  ChunkStats& st = stats ? *stats : local;
  if (!manifest_key(key))
    return make_error(ErrorCode::invalid_argument, "not a manifest key: " + key);
  std::error_code ec;
  if (fs::exists(dir, ec)) return make_error(ErrorCode::invalid_argument, dir.string() + " exists");
  auto text = store.get(key, kMaxManifestBytes);
  if (!text) return text.error();
  if (wire::sha256_hex(*text) != key.substr(10))
    return make_error(ErrorCode::corrupt, "manifest " + key + " does not match its hash");
  auto m = wire::Json::parse(*text);
  if (!m || (*m)["format"].as_int() != 1 || !(*m)["files"].is_array() ||
      (*m)["chunk_bytes"].as_int() <= 0 || (*m)["chunk_bytes"].as_int() > int64_t(64 << 20) ||
      (*m)["files"].size() > kMaxManifestFiles)
    return make_error(ErrorCode::corrupt, "manifest " + key + " is not one this host reads");
  const uint64_t chunk_bytes = uint64_t((*m)["chunk_bytes"].as_int());
  uint64_t total = 0;
  for (auto& f : (*m)["files"].as_array())
    if (!f["link"].is_string() && f["size"].is_integer() && f["size"].as_int() > 0)
      total += std::min<uint64_t>(uint64_t(f["size"].as_int()), uint64_t(kMaxFileBytes));
  if (total > max_bytes)
    return make_error(ErrorCode::invalid_argument,
                      "manifest " + key + " names " + std::to_string(total >> 20) +
                          " MiB, more than the " + std::to_string(max_bytes >> 20) +
                          " MiB this fetch takes (refused)");
  fs::create_directories(dir.parent_path(), ec);
  fs::path tmp = dir;
  tmp += ".download";
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec))
    return make_error(ErrorCode::io_error, "cannot create " + tmp.string() + ": " + ec.message());
  auto fail = [&](Error e) -> Status {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return e;
  };
  std::set<std::string> written;
  for (auto& f : (*m)["files"].as_array()) {
    std::string name = f["name"].is_string() ? f["name"].as_string() : "";
    if (!file_name(name) || written.count(name))
      return fail(
          make_error(ErrorCode::corrupt, "manifest " + key + " names a bad file '" + name + "'"));
    if (f["link"].is_string()) {
      auto target = f["link"].as_string();
      if (!written.count(target) || ::link((tmp / target).c_str(), (tmp / name).c_str()) != 0)
        return fail(make_error(ErrorCode::corrupt, "manifest " + key + ": bad link " + name));
      written.insert(name);
      continue;
    }
    int64_t size = f["size"].as_int();
    const auto& chunks = f["chunks"];
    if (size < 0 || size > kMaxFileBytes || !chunks.is_array() ||
        chunks.size() != size_t((uint64_t(size) + chunk_bytes - 1) / chunk_bytes))
      return fail(make_error(ErrorCode::corrupt, "manifest " + key + ": bad entry for " + name));
    Fd out;
    out.fd = ::open((tmp / name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    mode_t(f["mode"].as_int() & 0644) | 0600);
    if (out.fd < 0) return fail(io("create " + name));
    if (::fchmod(out.fd, mode_t(f["mode"].as_int() & 0644) | 0600) != 0)  // (whatever the umask)
      return fail(io("chmod " + name));
    if (::ftruncate(out.fd, off_t(size)) != 0) return fail(io("size " + name));
    ++st.files;
    st.bytes += uint64_t(size);
    uint64_t off = 0;
    for (auto& c : chunks.as_array()) {
      uint64_t n = std::min<uint64_t>(chunk_bytes, uint64_t(size) - off);
      ++st.chunks;
      std::string hash = c.is_string() ? c.as_string() : "-";
      if (hash.empty()) {  // zeros: the hole ftruncate left
        ++st.zero_chunks;
        off += n;
        continue;
      }
      if (!hex64(hash))
        return fail(
            make_error(ErrorCode::corrupt, "manifest " + key + ": bad chunk name in " + name));
      auto bytes = store.get("chunks/" + hash, n);
      if (!bytes) {
        auto e = bytes.error();
        e.message = name + " (chunk " + hash + "): " + e.message;
        return fail(e);
      }
      if (bytes->size() != n || wire::sha256_hex(*bytes) != hash)
        return fail(make_error(ErrorCode::corrupt, "chunk " + hash + " of " + name +
                                                       " does not match its hash (refused)"));
      ++st.sent_chunks;
      st.sent_bytes += n;
      for (size_t done = 0; done < n;) {
        ssize_t w = ::pwrite(out.fd, bytes->data() + done, n - done, off_t(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return fail(io("write " + name));
        done += size_t(w);
      }
      off += n;
    }
    if (::fsync(out.fd) != 0) return fail(io("sync " + name));
    written.insert(name);
  }
  {
    Fd d;
    d.fd = ::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd >= 0) ::fsync(d.fd);
  }
  fs::rename(tmp, dir, ec);
  if (ec)
    return fail(
        make_error(ErrorCode::io_error, "cannot rename " + tmp.string() + ": " + ec.message()));
  {
    Fd parent;
    parent.fd = ::open(dir.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent.fd >= 0) ::fsync(parent.fd);
  }
  st.ms = ms_since(t0);
  return Ok{};
}

}  // namespace pandastack::storage
