#include "vmm-driver/jail.h"

#include <gtest/gtest.h>
#include <sched.h>

namespace pandastack::vmm {
namespace {

TEST(JailPolicy, BuiltinPolicyParsesAndIsComplete) {
  auto p = JailPolicy::parse(JailPolicy::builtin_text());
  ASSERT_TRUE(p) << p.error().message;
  for (int ns : {CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET})
    EXPECT_NE(p->clone_flags & ns, 0) << "namespace flag " << ns << " missing";
  EXPECT_GT(p->uid_base, 0u);
  EXPECT_TRUE(p->no_new_privs);
  EXPECT_NE(p->seccomp.find("elevateprivileges=deny"), std::string::npos);
  EXPECT_NE(p->seccomp.find("spawn=deny"), std::string::npos);
  EXPECT_GT(p->memory_overhead_bytes, 0u);
  EXPECT_GT(p->pids_max, 0u);
  bool run_rw = false, images_ro = false;
  for (auto& e : p->entries) {
    run_rw |= e.kind == JailPolicy::Entry::Kind::bind_rw && e.path == "$RUN";
    images_ro |= e.kind == JailPolicy::Entry::Kind::bind_ro && e.path == "$IMAGES";
    // Nothing else is writable than the VM's own run and disk folders.
    if (e.kind == JailPolicy::Entry::Kind::bind_rw) {
      EXPECT_TRUE(e.path == "$RUN" || e.path == "$DISK") << e.path;
    }
  }
  EXPECT_TRUE(run_rw);
  EXPECT_TRUE(images_ro);
}

TEST(JailPolicy, EveryAllowanceNeedsAReason) {
  auto p = JailPolicy::parse("root-tmpfs 4m # r\nuser 1000 10 # r\nbind-ro /usr\n");
  ASSERT_FALSE(p);
  EXPECT_NE(p.error().message.find("line 3"), std::string::npos) << p.error().message;
  EXPECT_NE(p.error().message.find("without a reason"), std::string::npos);
  p = JailPolicy::parse("root-tmpfs 4m # r\nuser 1000 10 # r\nbind-ro /usr   #   \n");
  EXPECT_FALSE(p);
}

TEST(JailPolicy, RejectsUnknownKindsAndRootUser) {
  EXPECT_FALSE(JailPolicy::parse("root-tmpfs 4m # r\nuser 1000 10 # r\nbind-everything / # because\n"));
  EXPECT_FALSE(JailPolicy::parse("root-tmpfs 4m # r\nuser 0 10 # root is not a jail\n"));
  EXPECT_FALSE(JailPolicy::parse("root-tmpfs 4m # r\nnamespace time # r\nuser 1 1 # r\n"));
  EXPECT_FALSE(JailPolicy::parse("user 1 1 # no root tmpfs\n"));
  auto ok = JailPolicy::parse("# comment only\n\nroot-tmpfs 1m # r\nuser 5 5 # r\nnamespace pid # r\n");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->clone_flags, CLONE_NEWPID);
}

TEST(JailUids, EachLiveVmHasItsOwnAndSubordinateRangesThatOverlapAreFound) {
  uint32_t a = JailUids::acquire(5000, 3), b = JailUids::acquire(5000, 3);
  JailUids::claim(5002);  // an adopted VM's
  EXPECT_NE(a, b);
  EXPECT_EQ(JailUids::acquire(5000, 3), 0u) << "the range is used up";
  JailUids::release(a);
  EXPECT_EQ(JailUids::acquire(5000, 3), a);
  for (auto u : {5000u, 5001u, 5002u}) JailUids::release(u);
  std::string subuid = "alice:100000:65536\nbob:165536:65536\nbad line\ncarol:999990000:20000\n";
  EXPECT_EQ(subid_overlaps(subuid, 1000000000, 60000),
            (std::vector<std::string>{"carol:999990000:20000"}));
  EXPECT_EQ(subid_overlaps(subuid, 200000, 60000), (std::vector<std::string>{"bob:165536:65536"}));
  EXPECT_TRUE(subid_overlaps(subuid, 2000000000, 60000).empty());
  EXPECT_GE(JailPolicy::builtin().uid_base, 600100000u) << "inside Debian's subordinate ids";
}

}  // namespace
}  // namespace pandastack::vmm
