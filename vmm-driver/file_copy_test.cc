#include "vmm-driver/file_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

namespace pandastack::vmm {
namespace {

namespace fs = std::filesystem;

constexpr off_t kPage = 4096;

// Where `file` has data and where holes, page by page ('d' / '.').
std::string layout(const fs::path& file, int pages) {
  int fd = ::open(file.c_str(), O_RDONLY);
  std::string out;
  for (int i = 0; i < pages; ++i) {
    off_t data = ::lseek(fd, i * kPage, SEEK_DATA);
    out += data == i * kPage ? 'd' : '.';
  }
  ::close(fd);
  return out;
}

TEST(FileCopy, ZeroPagesBecomeHolesAndTheContentStays) {
  fs::path dir = fs::temp_directory_path() / ("file-copy-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path file = dir / "mem";
  // Pages: data, zero, zero, data, hole, zero, data (the last one partly zero), zero.
  const std::string plan = "dzzdhzdz";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t(plan.size()) * kPage), 0);
  std::vector<char> page(kPage);
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i] == 'h') continue;
    std::fill(page.begin(), page.end(), 0);
    if (plan[i] == 'd') page[i == 6 ? kPage - 1 : 7] = char(i + 1);
    ASSERT_EQ(::pwrite(fd, page.data(), kPage, off_t(i) * kPage), kPage);
  }
  ::fsync(fd);
  ::close(fd);
  ASSERT_EQ(layout(file, int(plan.size())), "dddd.ddd");

  ASSERT_TRUE(punch_zero_pages(file));
  EXPECT_EQ(layout(file, int(plan.size())), "d..d..d.");
  EXPECT_EQ(fs::file_size(file), plan.size() * kPage);
  fd = ::open(file.c_str(), O_RDONLY);
  for (size_t i = 0; i < plan.size(); ++i) {
    ASSERT_EQ(::pread(fd, page.data(), kPage, off_t(i) * kPage), kPage);
    for (off_t b = 0; b < kPage; ++b) {
      char want = plan[i] == 'd' && b == (i == 6 ? kPage - 1 : 7) ? char(i + 1) : 0;
      ASSERT_EQ(page[b], want) << "page " << i << " byte " << b;
    }
  }
  ::close(fd);
  EXPECT_FALSE(punch_zero_pages(dir / "missing"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pandastack::vmm
