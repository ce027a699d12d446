// A folder (a hibernation: meta.json, mem, state, disk layers) in an object store as
// content-addressed chunks and a manifest (issue 39).
//
//   chunks/<sha256 hex>      up to kChunkBytes of one file, named by its hash: a chunk two files,
//                            two snapshots or two forks share is stored once (an upload asks
//                            whether each chunk is there before it sends it, unless it knows);
//                            a chunk of zeros is not stored at all (RAM files are mostly holes).
//                            256 KiB: measured over 10 hibernated forks of one sandbox here, 4 MiB
//                            chunks stored 1.6x less than the manifests named, 1 MiB 2.8x, 256 KiB
//                            4.3x, 64 KiB 6.8x (a guest dirties pages all over its RAM); 256 KiB
//                            keeps a hibernation to ~400 requests.
//   manifests/<sha256 hex>   JSON {format, chunk_bytes, files: [{name, size, mode, chunks: [hex
//                            or "" for zeros]} | {name, link}]}, named by its own hash; written
//                            last, so a manifest that exists names only chunks that do
//
// A download verifies every chunk and the manifest by their hashes (a corrupted or missing one
// fails it, naming it), writes into a temporary folder beside the target and renames it: nothing
// half-written is ever at the target. Files keep their read permissions (at most 0644: the jailed
// QEMU reads disk layers by them); they are opened without following links and named
// only [A-Za-z0-9._-] (a manifest from the store is not trusted to name paths).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_set>

#include "storage/error.h"
#include "storage/object_store.h"

namespace pandastack::storage {

constexpr uint64_t kChunkBytes = 256 << 10;
// What a folder may hold (a guest's RAM and disk layers): files and their sizes are bounded.
constexpr size_t kMaxManifestFiles = 256;
constexpr uint64_t kMaxManifestBytes = 16 << 20;
constexpr int64_t kMaxFileBytes = int64_t(1) << 40;  // a file a manifest may describe

struct ChunkStats {
  uint64_t files = 0, bytes = 0;             // the folder's
  uint64_t chunks = 0, zero_chunks = 0;      // chunks of it (zero ones are not stored)
  uint64_t sent_chunks = 0, sent_bytes = 0;  // what the store did not have yet
  uint64_t ms = 0;
};

// Chunks known to be in a store (asked or sent before), so that they are not asked again: at
// most kMaxKnownChunks (then it starts afresh). Whoever deletes chunks must forget them here.
constexpr size_t kMaxKnownChunks = 1 << 18;
using KnownChunks = std::unordered_set<std::string>;

// Uploads the regular files of `dir` (not its sub-folders); a file that is a hard link of an
// earlier one is recorded as a link. Returns the manifest's key ("manifests/<hex>").
Result<std::string> upload_folder(ObjectStore& store, const std::filesystem::path& dir,
                                  ChunkStats* stats = nullptr, KnownChunks* known = nullptr);

// Writes the folder `manifest_key` names at `dir` (which must not exist), each file fsynced.
// A manifest whose files add up to more than `max_bytes` is refused (invalid_argument) before
// anything is written.
Status download_folder(ObjectStore& store, const std::string& manifest_key,
                       const std::filesystem::path& dir, ChunkStats* stats = nullptr,
                       uint64_t max_bytes = uint64_t(kMaxFileBytes));

// Whether `key` is a manifest key as upload_folder returns them.
bool manifest_key(const std::string& key);

struct GcStats {
  uint64_t manifests = 0, chunks = 0, deleted = 0;
};
// Deletes every chunk no manifest names (by references: every manifest is read first; any that
// cannot be read stops the collection, deleting nothing). Safe against a crash at any point:
// a manifest is written after its chunks and deleted before them, so what a crash leaves is
// unreferenced chunks, which the next collection takes. NOT safe against an upload running at the
// same time into the same prefix (its chunks have no manifest yet): one collector per prefix,
// serial with that prefix's uploads (actors/snapshot_uploader.h: one host per prefix).
Result<GcStats> collect_garbage(ObjectStore& store, KnownChunks* known = nullptr);

}  // namespace pandastack::storage
