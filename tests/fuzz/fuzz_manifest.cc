// A manifest from the object store (storage/snapshot_chunks.h download_folder): the bucket is not
// trusted. Any bytes (stored under their own hash, so they pass the manifest's hash check) give a
// folder or an error; what is written stays inside the target folder, under plain names, and a
// failure leaves nothing (no target, no temporary folder).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "storage/snapshot_chunks.h"
#include "wire/sha256.h"

namespace {
using namespace pandastack::storage;

// The store in memory, with two chunks the seed manifests name.
class MemoryStore : public ObjectStore {
 public:
  std::map<std::string, std::string> objects;
  Status put(const std::string& key, const std::string& bytes) override {
    objects[key] = bytes;
    return Ok{};
  }
  Result<std::string> get(const std::string& key, uint64_t max_bytes) override {
    auto it = objects.find(key);
    if (it == objects.end()) return make_error(ErrorCode::not_found, key);
    if (it->second.size() > max_bytes) return make_error(ErrorCode::invalid_argument, key);
    return it->second;
  }
  Result<bool> exists(const std::string& key) override { return objects.count(key) > 0; }
  Status remove(const std::string& key) override {
    objects.erase(key);
    return Ok{};
  }
  Result<std::vector<std::string>> list(const std::string&) override {
    return std::vector<std::string>{};
  }
  std::string describe() const override { return "memory"; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const fs::path root = [] {
    char d[] = "/tmp/fuzz-manifest-XXXXXX";
    if (::mkdtemp(d) == nullptr) std::abort();
    return fs::path(d);
  }();
  static MemoryStore store = [] {
    MemoryStore s;
    for (std::string chunk : {std::string("hello"), std::string(1000, 'x')})
      s.objects["chunks/" + pandastack::wire::sha256_hex(chunk)] = chunk;
    return s;
  }();
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string key = "manifests/" + pandastack::wire::sha256_hex(text);
  store.objects[key] = text;
  auto r = download_folder(store, key, root / "back");
  store.objects.erase(key);
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename() != "back") std::abort();  // nothing beside the target
  if (!r && fs::exists(root / "back")) std::abort();  // a failure leaves nothing
  if (r)
    for (auto& e : fs::directory_iterator(root / "back", ec)) {
      auto name = e.path().filename().string();
      if (name.empty() || name == "." || name == ".." || !e.is_regular_file()) std::abort();
    }
  fs::remove_all(root / "back", ec);
  return 0;
}
