#include "vmm-driver/private_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace pandastack::vmm {
namespace {

namespace fs = std::filesystem;

class PrivateDir : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("pst-private-" + std::to_string(::getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_);
    ::chmod(base_.c_str(), 0755);
  }
  void TearDown() override { fs::remove_all(base_); }
  mode_t mode(const fs::path& p) {
    struct stat st {};
    ::lstat(p.c_str(), &st);
    return st.st_mode & 07777;
  }
  fs::path base_;
};

TEST_F(PrivateDir, MakesMissingFoldersPrivateAndTightensLooseOnes) {
  auto d = base_ / "a" / "b";
  ASSERT_TRUE(private_dir(d));
  EXPECT_EQ(mode(d), 0700u);
  fs::create_directories(base_ / "loose");
  ::chmod((base_ / "loose").c_str(), 0777);
  ASSERT_TRUE(private_dir(base_ / "loose"));
  EXPECT_EQ(mode(base_ / "loose"), 0700u);
  EXPECT_TRUE(private_dir(d)) << "a folder already ours is fine";
}

TEST_F(PrivateDir, RefusesSymlinksFilesAndOtherUsersFolders) {
  fs::create_directories(base_ / "real");
  fs::create_directory_symlink(base_ / "real", base_ / "link");
  auto r = private_dir(base_ / "link");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("symlink"), std::string::npos) << r.error().message;
  { std::ofstream(base_ / "file") << "x"; }
  EXPECT_FALSE(private_dir(base_ / "file"));
  if (::geteuid() == 0) {
    fs::create_directories(base_ / "theirs");
    ASSERT_EQ(::chown((base_ / "theirs").c_str(), 65534, 65534), 0);
    auto t = private_dir(base_ / "theirs");
    ASSERT_FALSE(t);
    EXPECT_NE(t.error().message.find("uid 65534"), std::string::npos) << t.error().message;
  }
}

TEST_F(PrivateDir, RefusesAParentEveryoneCanWriteUnlessItIsSticky) {
  auto open = base_ / "open";
  fs::create_directories(open);
  ::chmod(open.c_str(), 0777);
  EXPECT_FALSE(private_dir(open / "mine"));
  ::chmod(open.c_str(), 01777);  // like /tmp and /dev/shm: others cannot replace what is ours
  EXPECT_TRUE(private_dir(open / "mine2"));
}

}  // namespace
}  // namespace pandastack::vmm
