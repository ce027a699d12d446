// The step cache's keys (actors/step_cache.h): what names a checkpoint, and what does not.
#include "actors/step_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace pandastack::actors {
namespace {

namespace fs = std::filesystem;

TEST(StepCache, AKeyNamesEverythingThatMadeTheDiskAndNothingElse) {
  auto rootfs = fs::temp_directory_path() / ("step-keys-" + std::to_string(::getpid()));
  std::ofstream(rootfs) << "a root file system";
  TemplateSpec spec;
  spec.packages = {"jq"};
  spec.files = {{"/var/lib/pandastack/build-copy", "script"}};
  spec.env = {{"MODE", "x"}};
  spec.run = {"sleep 3", "mkdir -p /app",
              "/var/lib/pandastack/busybox sh /var/lib/pandastack/build-copy 3 '/app' 1 '' '' '.'",
              "echo done"};
  spec.contexts = {std::string(64, 'a')};
  auto keys = step_keys("alice", rootfs, 1 << 30, spec);
  ASSERT_EQ(keys.size(), 5u);  // after the packages and files, then after each command
  EXPECT_EQ(keys, step_keys("alice", rootfs, 1 << 30, spec));  // (deterministic)
  for (auto& k : keys) EXPECT_EQ(k.size(), 64u);

  // Another tenant, disk size, package, file or environment: nothing shared.
  auto differs_from_start = [&](const std::vector<std::string>& other) {
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_NE(keys[i], other[i]) << i;
  };
  differs_from_start(step_keys("bob", rootfs, 1 << 30, spec));
  differs_from_start(step_keys("alice", rootfs, 2u << 30, spec));
  auto s2 = spec;
  s2.env["MODE"] = "y";
  differs_from_start(step_keys("alice", rootfs, 1 << 30, s2));
  // A changed command: its key and the later ones, not the earlier.
  s2 = spec;
  s2.run[1] = "mkdir -p /srv";
  auto k2 = step_keys("alice", rootfs, 1 << 30, s2);
  EXPECT_EQ(k2[0], keys[0]);
  EXPECT_EQ(k2[1], keys[1]);
  EXPECT_NE(k2[2], keys[2]);
  EXPECT_NE(k2[4], keys[4]);
  // A changed context: from the first command that reads it.
  s2 = spec;
  s2.contexts = {std::string(64, 'b')};
  k2 = step_keys("alice", rootfs, 1 << 30, s2);
  EXPECT_EQ(k2[2], keys[2]);
  EXPECT_NE(k2[3], keys[3]);
  EXPECT_NE(k2[4], keys[4]);
  // The root file system replaced (another file at the same path): nothing shared.
  fs::remove(rootfs);
  std::ofstream(rootfs) << "a new root file system";
  differs_from_start(step_keys("alice", rootfs, 1 << 30, spec));
  fs::remove(rootfs);
}

TEST(StepCache, NothingCachedIsNothingFound) {
  auto dir = fs::temp_directory_path() / ("step-cache-" + std::to_string(::getpid()));
  StepCache cache(dir);
  EXPECT_FALSE(cache.deepest({std::string(64, 'a')}));
  fs::create_directories(dir / std::string(64, 'a'));  // (no meta.json: an interrupted one)
  EXPECT_FALSE(cache.deepest({std::string(64, 'a')}));
  cache.trim();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pandastack::actors
