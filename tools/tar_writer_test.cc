#include "tools/tar_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace pandastack::tools {
namespace {

namespace fs = std::filesystem;

// What Python's tarfile (a reader we did not write) lists: name, type, size, link, one per line.
std::string listed(const std::string& archive, const fs::path& dir) {
  auto file = dir / "out.tar";
  std::ofstream(file, std::ios::binary) << archive;
  std::string cmd =
      "/usr/bin/python3 -c 'import sys, tarfile\n"
      "for m in tarfile.open(sys.argv[1]):\n"
      "    print(m.name, m.type.decode(), m.size, m.linkname, oct(m.mode), m.uid)' " +
      file.string();
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  if (p) ::pclose(p);
  return out;
}

TEST(TarWriter, AFolderReadsBackWithPythonsTarfile) {
  auto dir = fs::temp_directory_path() / ("tar-writer-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto src = dir / "src";
  fs::create_directories(src / "sub");
  std::ofstream(src / "a.txt") << "hello";
  std::ofstream(src / "sub" / "bin", std::ios::binary) << std::string("\0\1\2", 3);
  std::string long_name(150, 'n');
  std::ofstream(src / "sub" / long_name) << "long";
  fs::create_symlink("/etc/passwd", src / "link");
  fs::permissions(src / "a.txt", fs::perms(0755));
  auto tar = tar_of_folder(src);
  ASSERT_TRUE(tar) << tar.error().message;
  EXPECT_EQ(tar->size() % 512, 0u);
  auto l = listed(*tar, dir);
  EXPECT_NE(l.find("a.txt 0 5  0o755 0\n"), std::string::npos) << l;
  EXPECT_NE(l.find("link 2 0 /etc/passwd"), std::string::npos) << l;
  EXPECT_NE(l.find("sub 5 0"), std::string::npos) << l;
  EXPECT_NE(l.find("sub/bin 0 3 "), std::string::npos) << l;
  EXPECT_NE(l.find("sub/" + long_name + " 0 4 "), std::string::npos) << l;
  fs::remove_all(dir);
}

TEST(TarWriter, LimitsAndMissingFolders) {
  EXPECT_FALSE(tar_of_folder("/nonexistent-folder-of-the-test"));
  auto dir = fs::temp_directory_path() / ("tar-limit-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "big") << std::string(4096, 'x');
  TarLimits small;
  small.max_bytes = 1024;
  auto r = tar_of_folder(dir, small);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("larger than"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pandastack::tools
