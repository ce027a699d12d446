#include "actors/volume_file_worker.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <chrono>
#include <filesystem>

#include "vmm-driver/file_copy.h"

namespace pandastack::actors {

caf::behavior volume_file_worker(caf::event_based_actor* self) {
  (void)self;
  return {
      [](volclone_atom, std::vector<std::string> pairs, bool move) -> std::string {
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
      [](volremove_atom, std::vector<std::string> files) {
        std::error_code ec;
        for (auto& f : files) std::filesystem::remove(f, ec);
      },
  };
}

}  // namespace pandastack::actors
