#include "vmm-driver/vm.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "vmm-driver/accel.h"
#include "vmm-driver/io_thread.h"
#include "vmm-driver/snapshot.h"

namespace pandastack::vmm {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string arg_after(const std::vector<std::string>& v, const std::string& flag, int nth = 0) {
  for (size_t i = 0; i + 1 < v.size(); ++i)
    if (v[i] == flag && nth-- == 0) return v[i + 1];
  return "";
}

VmConfig sample(Accel a) {
  VmConfig c;
  c.run_dir = "/run/x";
  c.kernel = "/k";
  c.initramfs = "/i";
  c.rootfs = "/r";
  c.accel = a;
  c.tsc_khz = 2000000;
  return c;
}

TEST(QemuArgs, TcgAddsTscWorkaroundAndFileBackedRam) {
  auto args = qemu_boot_args(sample(Accel::tcg));
  EXPECT_EQ(arg_after(args, "-machine"), "microvm,memory-backend=mem,pit=off");
  EXPECT_EQ(arg_after(args, "-accel"), "tcg,tb-size=128");
  EXPECT_NE(arg_after(args, "-append").find("tsc_early_khz=2000000 tsc=reliable"),
            std::string::npos);
  EXPECT_EQ(arg_after(args, "-object"),
            "memory-backend-file,id=mem,size=256M,mem-path=/run/x/mem,share=on");
  EXPECT_TRUE(contains(args, "virtserialport,chardev=agent,name=agent,id=agent"));
  EXPECT_TRUE(contains(args, "-no-reboot"));
}

TEST(QemuArgs, KvmDiffersOnlyInAcceleratorFlags) {
  auto tcg = qemu_boot_args(sample(Accel::tcg));
  auto kvm = qemu_boot_args(sample(Accel::kvm));
  ASSERT_EQ(tcg.size(), kvm.size());
  std::vector<std::string> differing;
  for (size_t i = 0; i < tcg.size(); ++i)
    if (tcg[i] != kvm[i]) differing.push_back(kvm[i]);
  // accelerator, cpu model, and the kernel command line (no TSC workaround under KVM).
  ASSERT_EQ(differing.size(), 3u);
  EXPECT_EQ(differing[0], "kvm");
  EXPECT_EQ(differing[1], "host");
  EXPECT_EQ(arg_after(kvm, "-append").find("tsc_early_khz"), std::string::npos);
}

TEST(QemuArgs, EachMachineRevisionKeepsItsDevices) {
  // Revision 1 (today's): no PIT, and a free-page-reporting balloon after every other device, so
  // the others keep the virtio-mmio slots they had in revision 0.
  auto today = qemu_boot_args(sample(Accel::tcg));
  EXPECT_EQ(today.end()[-1], "virtio-balloon-device,free-page-reporting=on");
  VmConfig legacy = sample(Accel::tcg);
  legacy.machine = 0;
  auto old = qemu_boot_args(legacy);
  EXPECT_EQ(arg_after(old, "-machine"), "microvm,memory-backend=mem");
  EXPECT_FALSE(contains(old, "virtio-balloon-device,free-page-reporting=on"));
  ASSERT_EQ(old.size() + 2, today.size());
  for (size_t i = 0; i < old.size(); ++i) {
    if (old[i] != "microvm,memory-backend=mem") {
      EXPECT_EQ(old[i], today[i]) << i;
    }
  }
}

TEST(Snapshot, ItsMachineRevisionIsRecordedAndChecked) {
  Snapshot s;
  s.memory_mib = 256;
  s.vcpus = 1;
  s.machine = kMachineRevision;
  s.layers = {"disk.qcow2"};
  VmConfig c = sample(Accel::tcg);
  s.kernel = std::filesystem::absolute(c.kernel).string();
  s.initramfs = std::filesystem::absolute(c.initramfs).string();
  auto back = Snapshot::from_json(s.to_json(), "/x");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->machine, kMachineRevision);
  EXPECT_TRUE(back->check_compatible(c, ""));
  // A snapshot from before revisions were recorded ran revision 0: today's machine cannot load
  // it, a VM of its own revision can.
  auto j = s.to_json();
  j.mutable_object().erase("machine");
  auto old = Snapshot::from_json(j, "/x");
  ASSERT_TRUE(old);
  EXPECT_EQ(old->machine, 0u);
  auto refused = old->check_compatible(c, "");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("machine revision 0"), std::string::npos);
  c.machine = 0;
  EXPECT_TRUE(old->check_compatible(c, ""));
}

TEST(Accel, ForcedByOverride) {
  IoThread io;
  EXPECT_EQ(detect_accel(io, sample(Accel::tcg), std::chrono::milliseconds(10), "tcg"), Accel::tcg);
  EXPECT_EQ(detect_accel(io, sample(Accel::tcg), std::chrono::milliseconds(10), "kvm"), Accel::kvm);
}

TEST(Vm, MissingImageIsAClearErrorAndCreatesNothing) {
  IoThread io;
  VmConfig c = sample(Accel::tcg);
  c.run_dir = std::filesystem::temp_directory_path() / "pandastack-vm-test-missing";
  auto vm = Vm::boot(io, c);
  ASSERT_FALSE(vm);
  EXPECT_EQ(vm.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(vm.error().message.find("/k"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(c.run_dir));
}

TEST(HostTsc, ReadsCpuinfo) { EXPECT_GT(host_tsc_khz(), 100000u); }

}  // namespace
}  // namespace pandastack::vmm
