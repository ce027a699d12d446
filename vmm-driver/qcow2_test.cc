#include "vmm-driver/qcow2.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace pandastack::vmm::qcow2 {
namespace {

namespace fs = std::filesystem;

class Qcow2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qcow2-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  int sh(const std::string& cmd) { return std::system(cmd.c_str()); }
  fs::path dir_;
};

TEST_F(Qcow2Test, RewritesTheBackingNameAndQemuImgAgrees) {
  ASSERT_EQ(sh("qemu-img create -q -f qcow2 " + (dir_ / "a.qcow2").string() + " 64M"), 0);
  ASSERT_EQ(sh("cp " + (dir_ / "a.qcow2").string() + " " + (dir_ / "b.qcow2").string()), 0);
  ASSERT_EQ(sh("qemu-img create -q -f qcow2 -F qcow2 -b " + (dir_ / "a.qcow2").string() + " " +
               (dir_ / "top.qcow2").string()),
            0);
  EXPECT_EQ(*backing_file(dir_ / "top.qcow2"), (dir_ / "a.qcow2").string());
  // A longer name than before.
  auto longer = (dir_ / "b.qcow2").string();
  fs::create_directories(dir_ / "a-much-longer-folder-name");
  fs::rename(dir_ / "b.qcow2", dir_ / "a-much-longer-folder-name" / "b.qcow2");
  longer = (dir_ / "a-much-longer-folder-name" / "b.qcow2").string();
  ASSERT_TRUE(set_backing_file(dir_ / "top.qcow2", longer));
  EXPECT_EQ(*backing_file(dir_ / "top.qcow2"), longer);
  EXPECT_EQ(sh("qemu-img check -q " + (dir_ / "top.qcow2").string()), 0);
  EXPECT_EQ(sh("qemu-img info " + (dir_ / "top.qcow2").string() +
               " | grep -q 'backing file: " + longer + "'"),
            0);
}

TEST_F(Qcow2Test, RejectsImagesWithoutBackingAndNonQcow2) {
  ASSERT_EQ(sh("qemu-img create -q -f qcow2 " + (dir_ / "a.qcow2").string() + " 64M"), 0);
  EXPECT_EQ(*backing_file(dir_ / "a.qcow2"), "");
  auto r = set_backing_file(dir_ / "a.qcow2", "/x");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  ASSERT_EQ(sh("head -c 4096 /dev/zero > " + (dir_ / "raw").string()), 0);
  EXPECT_EQ(backing_file(dir_ / "raw").error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(backing_file(dir_ / "missing").error().code, ErrorCode::io_error);
}

// Headers a hostile QEMU could write into its overlay (found by fuzz_qcow2: a 4 GiB name size
// became a 4 GiB allocation in the daemon).
TEST_F(Qcow2Test, RefusesOutOfSpecHeaderFields) {
  ASSERT_EQ(sh("qemu-img create -q -f qcow2 " + (dir_ / "a.qcow2").string() + " 64M"), 0);
  ASSERT_EQ(sh("qemu-img create -q -f qcow2 -F qcow2 -b " + (dir_ / "a.qcow2").string() + " " +
               (dir_ / "top.qcow2").string()),
            0);
  auto patch = [&](off_t at, std::initializer_list<unsigned char> bytes) {
    int fd = ::open((dir_ / "top.qcow2").c_str(), O_WRONLY);
    std::vector<unsigned char> b(bytes);
    ASSERT_EQ(::pwrite(fd, b.data(), b.size(), at), ssize_t(b.size()));
    ::close(fd);
  };
  patch(16, {0xff, 0xff, 0xff, 0xf0});  // backing name size ~4 GiB
  EXPECT_EQ(backing_file(dir_ / "top.qcow2").error().code, ErrorCode::invalid_argument);
  ASSERT_EQ(sh("cp " + (dir_ / "a.qcow2").string() + " " + (dir_ / "plain.qcow2").string()), 0);
  {
    int fd = ::open((dir_ / "plain.qcow2").c_str(), O_WRONLY);
    unsigned char big[4] = {0xff, 0xff, 0xff, 0xf0};  // no backing file, a huge size field
    ASSERT_EQ(::pwrite(fd, big, 4, 16), 4);
    ::close(fd);
  }
  EXPECT_EQ(*backing_file(dir_ / "plain.qcow2"), "");
  patch(16, {0, 0, 0, 5});
  patch(20, {0, 0, 0, 64});  // cluster_bits
  EXPECT_EQ(backing_file(dir_ / "top.qcow2").error().code, ErrorCode::invalid_argument);
  EXPECT_FALSE(set_backing_file(dir_ / "top.qcow2", "/x"));
  patch(20, {0, 0, 0, 16});
  patch(8, {0, 0, 0, 0, 0x7f, 0, 0, 0});  // backing name beyond the header cluster
  EXPECT_EQ(backing_file(dir_ / "top.qcow2").error().code, ErrorCode::invalid_argument);
  patch(8, {0, 0, 0, 0, 0, 0, 0, 10});  // backing name over the header itself
  EXPECT_EQ(backing_file(dir_ / "top.qcow2").error().code, ErrorCode::invalid_argument);
  EXPECT_FALSE(set_backing_file(dir_ / "top.qcow2", "/x"));
}

}  // namespace
}  // namespace pandastack::vmm::qcow2
