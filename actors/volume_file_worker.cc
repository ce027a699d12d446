#include "actors/volume_file_worker.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "vmm-driver/file_copy.h"

namespace pandastack::actors {

namespace {
// Whether `p` is below `dir` (lexically: the paths are the daemon's own, never a guest's).
bool below(const std::filesystem::path& p, const std::filesystem::path& dir) {
  auto rel = p.lexically_normal().lexically_relative(dir.lexically_normal());
  return !rel.empty() && *rel.begin() != ".." && rel.is_relative();
}
}  // namespace

// (An argument it uses, too: CAF 0.17 dereferences the empty argument tuple of an actor spawned
// without any, which UBSan reports.)
caf::behavior volume_file_worker(caf::event_based_actor* self, Env* env) {
  (void)self;
  auto dir = env->volumes_dir();
  return {
      [dir](volclone_atom, std::vector<std::string> pairs, bool move) -> std::string {
        for (size_t i = 1; i < pairs.size(); i += 2)
          if (!below(pairs[i], dir)) return "refused to write " + pairs[i];
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::string> made;
        for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
          std::error_code dir_ec;
          auto parent = std::filesystem::path(pairs[i + 1]).parent_path();
          if (std::filesystem::create_directories(parent, dir_ec))
            std::filesystem::permissions(parent, std::filesystem::perms::owner_all, dir_ec);
          // The last user of a copy nobody needs after it (a fork's last child) takes the file.
          if (move && ::rename(pairs[i].c_str(), pairs[i + 1].c_str()) == 0) {
            made.push_back(pairs[i + 1]);
            continue;
          }
          auto cloned = vmm::clone_file(pairs[i], pairs[i + 1]);
          if (!cloned) {
            std::error_code ec;
            for (auto& f : made) std::filesystem::remove(f, ec);
            return cloned.error().message;
          }
          made.push_back(pairs[i + 1]);
          spdlog::debug("volume file {} copied from {} ({})", pairs[i + 1], pairs[i],
                        *cloned ? "reflink" : "sparse copy");
        }
        spdlog::debug("{} volume file(s) copied in {} us", made.size(),
                      std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count());
        return std::string();
      },
      [dir](volremove_atom, std::vector<std::string> files) {
        std::error_code ec;
        for (auto& f : files)
          if (below(f, dir)) std::filesystem::remove(f, ec);
      },
  };
}

}  // namespace pandastack::actors
