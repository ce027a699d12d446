#include "vmm-driver/memory_base.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pandastack::vmm {
namespace {

namespace fs = std::filesystem;
constexpr size_t kPage = 4096;
constexpr size_t kPages = 64;

// A sparse "RAM file" of kPages pages: page i (for even i) holds the byte 'a' + i % 26.
fs::path make_ram_file() {
  auto p = fs::temp_directory_path() / ("pst-membase-" + std::to_string(::getpid()) + ".ram");
  int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, kPages * kPage), 0);
  std::string page(kPage, '\0');
  for (size_t i = 0; i < kPages; i += 2) {
    page.assign(kPage, char('a' + i % 26));
    EXPECT_EQ(::pwrite(fd, page.data(), kPage, off_t(i * kPage)), ssize_t(kPage));
  }
  ::close(fd);
  return p;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(MemoryBase, IsACopyNothingCanWriteGrowOrShrink) {
  auto file = make_ram_file();
  auto base = MemoryBase::make(file);
  ASSERT_TRUE(base) << base.error().message;
  EXPECT_EQ((*base)->size(), kPages * kPage);
  EXPECT_EQ((*base)->source(), fs::absolute(file));
  EXPECT_EQ(read_all("/proc/self/fd/" + std::to_string((*base)->fd())), read_all(file));
  int fd = (*base)->fd();
  // No hole a fault through a VM's mapping would allocate (and charge to that VM).
  struct stat sb {};
  ASSERT_EQ(::fstat(fd, &sb), 0);
  EXPECT_EQ(uint64_t(sb.st_blocks) * 512, kPages * kPage);
  // Every way a process holding the descriptor (a QEMU) could change it is refused.
  char x = 'x';
  EXPECT_EQ(::pwrite(fd, &x, 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kPage), 0);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  EXPECT_NE(::ftruncate(fd, 2 * kPages * kPage), 0);
  EXPECT_EQ(::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
  int rw = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR);
  ASSERT_GE(rw, 0);  // (QEMU opens its memory file read-write: allowed, and still sealed)
  EXPECT_EQ(::write(rw, &x, 1), -1);
  ::close(rw);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1) << "the seals are sealed";
  int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
            F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
  EXPECT_EQ(read_all("/proc/self/fd/" + std::to_string(fd)), read_all(file));
  fs::remove(file);
}

// A private mapping of the base, as a QEMU's guest RAM is (this process stands in for QEMU).
char* map_privately(const MemoryBase& base) {
  void* p = ::mmap(nullptr, base.size(), PROT_READ | PROT_WRITE, MAP_PRIVATE, base.fd(), 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// A save as a Vm makes one: the base's copy, then the private pages over it.
Status save(pid_t pid, const std::string& memfd_name, uint64_t size, const fs::path& base_file,
            const fs::path& to, const MemoryBase* base = nullptr) {
  auto copied = copy_memory_base(pid, memfd_name, size, base_file, to, base);
  return copied ? write_private_pages(pid, memfd_name, size, to) : copied;
}

// A RAM file, its base and a private mapping of it (unmapped at the end; the files are the
// test's to remove).
struct OverABase {
  fs::path file = make_ram_file();
  Result<std::shared_ptr<const MemoryBase>> base = MemoryBase::make(file);
  uint64_t size = base ? (*base)->size() : 0;
  char* ram = base ? map_privately(**base) : nullptr;
  bool ready() const { return ram != nullptr; }
  ~OverABase() {
    if (ram) ::munmap(ram, size);
  }
};

// The pages a private mapping of the base wrote are counted and saved over the base's file, as
// a QEMU's guest RAM is (this process stands in for QEMU).
TEST(MemoryBase, APrivateMappingsOwnPagesAreCountedAndSavedOverTheBase) {
  OverABase m;
  ASSERT_TRUE(m.ready());
  auto& [file, base, size, ram] = m;
  auto none = private_memory(::getpid(), (*base)->memfd_name(), size);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none->pages, 0u);
  // Read everything (shared pages, not its own), write three pages, zero a fourth.
  size_t sum = 0;
  for (size_t i = 0; i < size; i += kPage) sum += size_t(ram[i]);
  EXPECT_GT(sum, 0u);
  std::memset(ram + 3 * kPage, 'X', kPage);  // over a hole
  std::memset(ram + 4 * kPage, 'Y', kPage);  // over data
  std::memset(ram + 5 * kPage, 'Z', 10);     // partly
  std::memset(ram + 8 * kPage, 0, kPage);    // data zeroed: a hole in the saved file
  auto own = private_memory(::getpid(), (*base)->memfd_name(), size);
  ASSERT_TRUE(own) << own.error().message;
  EXPECT_EQ(own->pages, 4u);
  auto saved = fs::path(file.string() + ".saved");
  auto st = save(::getpid(), (*base)->memfd_name(), size, file, saved);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_all(saved), std::string(ram, size)) << "the saved file is the mapping";
  EXPECT_EQ(read_all(file).substr(3 * kPage, kPage), std::string(kPage, '\0'))
      << "the base's file is unchanged";
  // Saved sparse: the base's 32 data pages (the even ones), plus pages 3 and 5, minus page 8.
  struct stat sb {};
  ASSERT_EQ(::stat(saved.c_str(), &sb), 0);
  EXPECT_EQ(uint64_t(sb.st_blocks) * 512, 33u * kPage);
  // Its base's file gone: the memfd the process maps is copied instead (the same bytes).
  auto moved = fs::path(file.string() + ".moved");
  fs::rename(file, moved);
  auto again = fs::path(file.string() + ".again");
  st = save(::getpid(), (*base)->memfd_name(), size, file, again);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_all(again), std::string(ram, size));
  fs::rename(moved, file);
  fs::remove(again);
  // A size that is not the base's is refused.
  EXPECT_FALSE(save(::getpid(), (*base)->memfd_name(), size * 2, file, again));
  EXPECT_FALSE(fs::exists(again));
  // A name no mapping has.
  auto missing = private_memory(::getpid(), "pst-base-0-0", size);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::not_found);
  fs::remove(saved);
  fs::remove(file);
}

// The files in `dir`; `complete`: not those a copy is being made into.
std::vector<std::string> files_in(const fs::path& dir, bool complete = true) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    if (!complete || e.path().extension() != ".part") out.push_back(e.path().filename().string());
  return out;
}

// Whether `done` holds within 10 s.
bool eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 200; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

// A save in two halves: the base copied while the guest runs, its own pages once paused. A page
// it writes in between (after the copy) is in the saved file all the same.
TEST(MemoryBase, PagesWrittenAfterTheBasesCopyAreSavedAtThePause) {
  OverABase m;
  ASSERT_TRUE(m.ready());
  auto& [file, base, size, ram] = m;
  std::memset(ram + 1 * kPage, 'A', kPage);  // own before the copy
  auto saved = fs::path(file.string() + ".halves");
  auto st = copy_memory_base(::getpid(), (*base)->memfd_name(), size, file, saved);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_all(saved), read_all(file)) << "the first half is the base";
  std::memset(ram + 6 * kPage, 'B', kPage);  // own after the copy, over data
  std::memset(ram + 7 * kPage, 'C', kPage);  // over a hole
  std::memset(ram + 1 * kPage, 'D', 5);      // written again
  st = write_private_pages(::getpid(), (*base)->memfd_name(), size, saved);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_all(saved), std::string(ram, size)) << "the saved file is the mapping";
  // Over a file that is not a copy of the base (its size) nothing is written.
  auto other = fs::path(file.string() + ".other");
  std::ofstream(other) << "x";
  EXPECT_FALSE(write_private_pages(::getpid(), (*base)->memfd_name(), size, other));
  for (auto& p : {saved, other, file}) fs::remove(p);
}

TEST(MemoryBase, ASavesCopyOfTheBaseIsMadeAheadAndRemovedWhenSavesStop) {
  auto file = make_ram_file();
  auto dir = fs::temp_directory_path() / ("pst-membase-copies-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A copy a process that is gone left is removed; what is not a copy stays.
  std::ofstream(dir / "pst-base-999999999-1-1") << "x";
  std::ofstream(dir / "other") << "x";
  auto made = MemoryBase::make(file, dir, std::chrono::seconds(2));
  ASSERT_TRUE(made) << made.error().message;
  std::shared_ptr<const MemoryBase> base = std::move(*made);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{"other"});
  fs::remove(dir / "other");
  // The first save copies the file (none is ready) and has the next copy made.
  auto first = fs::path(file.string() + ".1");
  auto st = base->copy_file_to(first);
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(read_all(first), read_all(file));
  ASSERT_TRUE(eventually([&] { return files_in(dir).size() == 1; }));
  struct stat ready {};
  ASSERT_EQ(::stat((dir / files_in(dir)[0]).c_str(), &ready), 0);
  // A save of a VM over the base takes it: that very file, renamed, then its own pages over it.
  auto size = base->size();
  char* ram = map_privately(*base);
  ASSERT_NE(ram, nullptr);
  std::memset(ram + 3 * kPage, 'X', kPage);
  auto second = fs::path(file.string() + ".2");
  st = save(::getpid(), base->memfd_name(), size, file, second, base.get());
  ASSERT_TRUE(st) << st.error().message;
  struct stat saved {};
  ASSERT_EQ(::stat(second.c_str(), &saved), 0);
  EXPECT_EQ(saved.st_ino, ready.st_ino) << "the copy made ahead, renamed";
  EXPECT_EQ(read_all(second), std::string(ram, size));
  EXPECT_EQ(uint64_t(saved.st_blocks) * 512, 33u * kPage) << "sparse: the 32 data pages and one";
  ::munmap(ram, size);
  // The next copy is made; no save comes within the idle time: it is removed, its maker ends.
  ASSERT_TRUE(eventually([&] { return files_in(dir).size() == 1; }));
  ASSERT_TRUE(eventually([&] { return files_in(dir, false).empty(); }));
  // A save after that copies again, and the copy made meanwhile goes with the base.
  auto third = fs::path(file.string() + ".3");
  ASSERT_TRUE(base->copy_file_to(third));
  EXPECT_EQ(read_all(third), read_all(file));
  ASSERT_TRUE(eventually([&] { return files_in(dir).size() == 1; }));
  base.reset();
  EXPECT_TRUE(eventually([&] { return files_in(dir, false).empty(); }));
  for (auto& p : {first, second, third, file}) fs::remove(p);
  fs::remove_all(dir);
}

TEST(MemoryBase, CopiesThatCouldNeverBeTakenAreNotMade) {
  auto file = make_ram_file();
  // A copies folder that cannot be made: the base goes on without copies, its saves copy.
  auto blocker = fs::path(file.string() + ".not-a-folder");
  std::ofstream(blocker) << "x";
  auto made = MemoryBase::make(file, blocker / "copies", std::chrono::seconds(30));
  ASSERT_TRUE(made) << made.error().message;
  auto first = fs::path(file.string() + ".1");
  ASSERT_TRUE((*made)->copy_file_to(first));
  EXPECT_EQ(read_all(first), read_all(file));
  made->reset();
  // Copies on another file system than the saves (a copy would have to be copied): the first
  // save that finds one ready removes it and no more are made.
  auto dir = fs::path("/dev/shm") / ("pst-membase-xdev-" + std::to_string(::getpid()));
  struct stat shm {
  }, saves{};
  if (::stat("/dev/shm", &shm) != 0 || ::stat(file.parent_path().c_str(), &saves) != 0 ||
      shm.st_dev == saves.st_dev) {
    for (auto& p : {first, blocker, file}) fs::remove(p);
    GTEST_SKIP() << "/dev/shm and " << file.parent_path() << " are one file system here";
  }
  made = MemoryBase::make(file, dir, std::chrono::seconds(30));
  ASSERT_TRUE(made) << made.error().message;
  std::shared_ptr<const MemoryBase> base = std::move(*made);
  ASSERT_TRUE(base->copy_file_to(first.string() + ".a"));
  ASSERT_TRUE(eventually([&] { return files_in(dir).size() == 1; }));
  auto second = fs::path(file.string() + ".2");
  ASSERT_TRUE(base->copy_file_to(second));
  EXPECT_EQ(read_all(second), read_all(file));
  std::this_thread::sleep_for(std::chrono::seconds(2));  // (past the delay a next copy waits)
  EXPECT_TRUE(files_in(dir, false).empty());
  base.reset();
  for (auto& p : {first, fs::path(first.string() + ".a"), second, blocker, file}) fs::remove(p);
  fs::remove_all(dir);
}

TEST(MemoryBase, ADeviceStateBecomesAStreamIncomingLoads) {
  std::string devices("QEVM\0\0\0\3", 8);
  devices += std::string("\x04\x00\x00\x00\x00\x05timer", 11) + std::string(1, '\x08');
  auto s = incoming_state_of_devices(devices, "microvm");
  ASSERT_TRUE(s) << s.error().message;
  std::string config("\x07\x00\x00\x00\x07microvm\x05\x1a", 14);
  config += "configuration/capabilities";
  config += std::string("\x00\x00\x00\x01\x00\x00\x00\x01\x0f", 9) + "x-ignore-shared";
  EXPECT_EQ(*s, devices.substr(0, 8) + config + devices.substr(8) +
                    std::string("\x06\x00\x00\x00\x02{}", 7));
  EXPECT_FALSE(incoming_state_of_devices("QEVM", "microvm"));
  EXPECT_FALSE(incoming_state_of_devices(std::string("QEVM\0\0\0\2", 8), "microvm"));
  EXPECT_FALSE(incoming_state_of_devices(devices, ""));
}

}  // namespace
}  // namespace pandastack::vmm
