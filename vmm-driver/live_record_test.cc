// The live record (vm.json) is read with every field checked: what it names gets killed and
// removed by recovery.
#include "vmm-driver/live_record.h"

#include <gtest/gtest.h>

#include "wire/json.h"

namespace pandastack::vmm {
namespace {

using wire::Json;

Json good() {
  auto j = Json::parse(R"({"format":1,"pid":4242,"start_ticks":123456,"name":"sbx_a.1",
    "hostname":"h","kernel":"/i/kernel","initramfs":"/i/initramfs","rootfs":"/i/base/rootfs.qcow2",
    "vcpus":1,"memory_mib":256,"accel":"tcg","cpu_model":"","tsc_khz":0,"qemu_binary":"qemu",
    "jail":true,"qemu_version":"7.2","layers":["l0.qcow2","l1.qcow2"],"overlay_seq":2,
    "active_overlay":"overlay-2.qcow2","disk_dir":"/var/lib/ps/disks/sbx_a.1","jail_uid":900001,
    "cgroup_v2":true,"cgroups":["/sys/fs/cgroup/pandastack/sbx_a.1"]})");
  return *j;
}

TEST(LiveRecord, AGoodRecordParses) {
  auto r = parse_live_record(good().dump());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->pid, 4242);
  EXPECT_EQ(r->start_ticks, 123456u);
  EXPECT_EQ(r->layers, (std::vector<std::string>{"l0.qcow2", "l1.qcow2"}));
  EXPECT_EQ(r->active_overlay, "overlay-2.qcow2");
  EXPECT_EQ(r->disk_dir, "/var/lib/ps/disks/sbx_a.1");
  EXPECT_EQ(r->cgroups, (std::vector<std::string>{"/sys/fs/cgroup/pandastack/sbx_a.1"}));
  EXPECT_EQ(r->jail_uid, 900001u);
  EXPECT_EQ(r->machine, 0u);  // a VM started before machine revisions were recorded
  auto j = good();
  j.set("machine", 1);
  EXPECT_EQ(parse_live_record(j.dump())->machine, 1u);
}

TEST(LiveRecord, AMemoryBaseIsAFileAndAMemfdNameOrNeither) {
  auto r = parse_live_record(good().dump());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->memory_base_file, "");  // (a VM of its own RAM file, or recorded before them)
  auto j = good();
  j.set("memory_base_file", "/dev/shm/ps/templates/base-1/mem");
  j.set("memory_base_memfd", "pst-base-4242-3");
  r = parse_live_record(j.dump());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->memory_base_file, "/dev/shm/ps/templates/base-1/mem");
  EXPECT_EQ(r->memory_base_memfd, "pst-base-4242-3");
  for (auto [file, memfd] : std::vector<std::pair<std::string, std::string>>{
           {"/dev/shm/ps/mem", ""},
           {"", "pst-base-1-1"},
           {"relative/mem", "pst-base-1-1"},
           {"/dev/shm/../etc/mem", "pst-base-1-1"},
           {"/dev/shm/ps/mem", "pst-base-1"},
           {"/dev/shm/ps/mem", "pst-base--1"},
           {"/dev/shm/ps/mem", "pst-base-1-1 (deleted)"},
           {"/dev/shm/ps/mem", "other-1-1"}}) {
    j.set("memory_base_file", file);
    j.set("memory_base_memfd", memfd);
    EXPECT_FALSE(parse_live_record(j.dump())) << file << " " << memfd;
  }
}

TEST(LiveRecord, PathsThatWouldRemoveOrKillTheWrongThingAreRefused) {
  auto with = [](const char* key, Json v) {
    Json j = good();
    j.set(key, std::move(v));
    return parse_live_record(j.dump());
  };
  for (const char* d :
       {"/", "/var", "relative/disks", "/var/lib/../../etc", "/var//lib", "/var/lib/."})
    EXPECT_FALSE(with("disk_dir", d)) << d;
  EXPECT_TRUE(with("disk_dir", ""));
  for (const char* g : {"/sys/fs/cgroup", "/sys/fs/cgroup/pandastack", "/etc/pandastack/x",
                        "/sys/fs/cgroup/pandastack/../../x", "/sys/fs/cgroup/other/x"}) {
    Json list = Json::array();
    list.push(g);
    EXPECT_FALSE(with("cgroups", list)) << g;
  }
  for (const char* l : {"", ".", "..", "../l0", "/abs", "a/b"}) {
    Json list = Json::array();
    list.push(l);
    EXPECT_FALSE(with("layers", list)) << l;
    if (*l) {  // "" = no overlay yet
      EXPECT_FALSE(with("active_overlay", l)) << l;
    }
  }
  EXPECT_FALSE(with("pid", 0));
  EXPECT_FALSE(with("pid", -1));
  EXPECT_FALSE(with("pid", "42"));
  EXPECT_FALSE(with("format", 2));
  EXPECT_FALSE(with("vcpus", 0));
  EXPECT_FALSE(parse_live_record("not json"));
  EXPECT_FALSE(parse_live_record("[]"));
  EXPECT_FALSE(parse_live_record(std::string(2 << 20, ' ')));
}

// An adopted VM's volumes come from its record (exploratory test 3 #3: without them its forks
// and snapshots left the volumes out).
TEST(LiveRecord, VolumeBindingsRoundTripAndBadOnesAreRefused) {
  auto with_volume = [](Json v) {
    Json j = good();
    Json list = Json::array();
    list.push(std::move(v));
    j.set("volumes", list);
    return parse_live_record(j.dump());
  };
  auto vol = [](Json slot, Json file, bool ro) {
    Json v = Json::object();
    v.set("slot", std::move(slot));
    v.set("file", std::move(file));
    v.set("read_only", ro);
    return v;
  };
  auto r = with_volume(vol(2, "/var/lib/ps/volumes/vol_a/data.img", true));
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_EQ(r->volumes.size(), 1u);
  EXPECT_EQ(r->volumes[0].slot, 2u);
  EXPECT_EQ(r->volumes[0].file, "/var/lib/ps/volumes/vol_a/data.img");
  EXPECT_TRUE(r->volumes[0].read_only);
  EXPECT_TRUE(parse_live_record(good().dump())->volumes.empty());  // older records: none
  for (const char* f : {"", "relative/v.img", "/v", "/var/../etc/shadow"})
    EXPECT_FALSE(with_volume(vol(0, f, false))) << f;
  EXPECT_FALSE(with_volume(vol(-1, "/a/b", false)));
  EXPECT_FALSE(with_volume(vol(64, "/a/b", false)));
  EXPECT_FALSE(with_volume(vol("0", "/a/b", false)));
  EXPECT_FALSE(with_volume(Json("/a/b")));
}

}  // namespace
}  // namespace pandastack::vmm
