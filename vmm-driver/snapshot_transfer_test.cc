#include "vmm-driver/snapshot_transfer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "vmm-driver/qcow2.h"

namespace pandastack::vmm {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SnapshotTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("transfer-test-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "src");
    // A snapshot: a sparse RAM file with data at two places, a device state, two qcow2 layers
    // (the oldest based on an image by its absolute path, as a template's is).
    fs::create_directories(dir_ / "images" / "base");
    ASSERT_EQ(sh("qemu-img create -q -f raw " + rootfs().string() + " 16M"), 0);
    ASSERT_EQ(sh("qemu-img create -q -f qcow2 -F raw -b " + rootfs().string() + " " +
                 (dir_ / "src" / "layer-a.qcow2").string()),
              0);
    ASSERT_EQ(sh("cd " + (dir_ / "src").string() +
                 " && qemu-img create -q -f qcow2 -F qcow2 -b layer-a.qcow2 layer-b.qcow2"),
              0);
    int fd = ::open((dir_ / "src" / "mem").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 32 << 20), 0);
    ASSERT_EQ(::pwrite(fd, "hello", 5, 4096), 5);
    ASSERT_EQ(::pwrite(fd, "world", 5, 20 << 20), 5);
    ::close(fd);
    std::ofstream(dir_ / "src" / "state") << "device state";
    fs::create_hard_link(dir_ / "src" / "layer-b.qcow2", dir_ / "src" / "disk.qcow2");
    Snapshot s;
    s.dir = dir_ / "src";
    s.qemu_version = "test";
    s.memory_mib = 32;
    s.vcpus = 1;
    s.kernel = rootfs().string();
    s.origin = "snapshot:test";
    s.layers = {"layer-a.qcow2", "layer-b.qcow2"};
    ASSERT_TRUE(s.write_meta());
    src_ = *Snapshot::load(s.dir);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The template's root file system the oldest layer is based on (a raw image here).
  fs::path rootfs() const { return dir_ / "images" / "base" / "rootfs.qcow2"; }
  int sh(const std::string& cmd) { return std::system(cmd.c_str()); }

  // Sends what `r` is missing, as the gateway does: data extents only.
  void send(const SnapshotOffer& o, SnapshotReceiver& r, uint64_t* sent = nullptr) {
    for (auto i : r.missing()) {
      auto path = o.paths[i];
      int fd = ::open(path.c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      auto extents = data_extents(fd, o.files[i].size);
      ASSERT_TRUE(extents);
      for (auto& e : *extents) {
        std::string buf(e.length, '\0');
        ASSERT_EQ(::pread(fd, buf.data(), e.length, off_t(e.offset)), ssize_t(e.length));
        ASSERT_TRUE(r.write(i, e.offset, buf.data(), buf.size()));
        if (sent) *sent += e.length;
      }
      ::close(fd);
    }
  }
  fs::path dir_;
  Snapshot src_;
};

TEST_F(SnapshotTransferTest, DroppingTheMemoryLeavesADiskOnlySnapshot) {
  ASSERT_TRUE(src_.memory);
  ASSERT_TRUE(drop_memory(src_.dir));
  EXPECT_FALSE(fs::exists(src_.mem()));
  EXPECT_FALSE(fs::exists(src_.state()));
  auto back = Snapshot::load(src_.dir);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_FALSE(back->memory);
  EXPECT_EQ(back->layers, src_.layers);
  // A snapshot with memory whose RAM file is missing is still refused.
  ASSERT_TRUE(src_.write_meta());
  EXPECT_FALSE(Snapshot::load(src_.dir));
}

TEST_F(SnapshotTransferTest, ArrivesWholeAndASecondTransferTakesTheLayersFromTheCache) {
  auto offer = offer_of(src_);
  ASSERT_TRUE(offer) << offer.error().message;
  ASSERT_EQ(offer->files.size(), 4u);
  EXPECT_EQ(offer->files[2].sha256, *sha256_file(src_.layer("layer-a.qcow2")));
  auto r = SnapshotReceiver::open(*offer, dir_ / "dst", dir_ / "dst-disk", dir_ / "cache", 32);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ((*r)->missing().size(), 4u);
  uint64_t sent = 0;
  send(*offer, **r, &sent);
  EXPECT_LT(sent, 8u << 20);  // the RAM file's holes are not sent
  auto got = (*r)->commit();
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(read_all(got->mem()), read_all(src_.mem()));
  EXPECT_EQ(read_all(got->state()), "device state");
  EXPECT_EQ(got->disk_dir, dir_ / "dst-disk");
  EXPECT_EQ(read_all(got->disk()), read_all(src_.disk()));
  EXPECT_EQ(got->memory_mib, 32u);

  // The same snapshot again: only mem and state travel.
  auto again =
      SnapshotReceiver::open(*offer, dir_ / "dst2", dir_ / "dst2-disk", dir_ / "cache", 32);
  ASSERT_TRUE(again);
  EXPECT_EQ((*again)->missing(), (std::vector<uint32_t>{0, 1}));
  send(*offer, **again);
  ASSERT_TRUE((*again)->commit());
  EXPECT_TRUE(Snapshot::load(dir_ / "dst2"));
}

TEST_F(SnapshotTransferTest, ADamagedLayerOrAnUnfinishedTransferLeavesNothing) {
  auto offer = offer_of(src_);
  ASSERT_TRUE(offer);
  offer->files[3].sha256 = std::string(64, '0');
  {
    auto r = SnapshotReceiver::open(*offer, dir_ / "dst", dir_ / "dst-disk", dir_ / "cache", 32);
    ASSERT_TRUE(r);
    send(*offer, **r);
    auto got = (*r)->commit();
    ASSERT_FALSE(got);
    EXPECT_NE(got.error().message.find("damaged"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(dir_ / "dst"));
  EXPECT_FALSE(fs::exists(dir_ / "dst-disk"));
  {
    auto r = SnapshotReceiver::open(*offer, dir_ / "dst", dir_ / "dst-disk", dir_ / "cache", 32);
    ASSERT_TRUE(r);
    EXPECT_FALSE((*r)->write(0, 32 << 20, "x", 1));  // past the end
    EXPECT_FALSE((*r)->write(9, 0, "x", 1));         // no such file
  }
  EXPECT_FALSE(fs::exists(dir_ / "dst"));
}

TEST_F(SnapshotTransferTest, RefusesOffersBeyondItsBounds) {
  auto offer = offer_of(src_);
  ASSERT_TRUE(offer);
  // A RAM file larger than this host's guests.
  EXPECT_FALSE(SnapshotReceiver::open(*offer, dir_ / "d1", dir_ / "d1", dir_ / "cache", 16));
  auto renamed = *offer;
  renamed.files[2].name = "../evil";
  EXPECT_FALSE(SnapshotReceiver::open(renamed, dir_ / "d2", dir_ / "d2", dir_ / "cache", 32));
  auto no_hash = *offer;
  no_hash.files[3].sha256 = "abc";
  EXPECT_FALSE(SnapshotReceiver::open(no_hash, dir_ / "d4", dir_ / "d4", dir_ / "cache", 32));
  // (last: the metadata object is shared by the copies)
  auto path_layer = *offer;
  auto meta = path_layer.meta;
  wire::Json layers = wire::Json::array();
  layers.push("../../etc/passwd");
  layers.push("layer-b.qcow2");
  meta.set("layers", layers);
  path_layer.meta = meta;
  path_layer.files[2].name = "../../etc/passwd";
  EXPECT_FALSE(SnapshotReceiver::open(path_layer, dir_ / "d3", dir_ / "d3", dir_ / "cache", 32));
  EXPECT_FALSE(fs::exists(dir_ / "d3"));
}

// Security review 3, M2: a layer's header is the sender's (or a QEMU's) to write. A snapshot
// whose oldest layer names anything but a template's root file system, or whose later layer
// names anything but the layer before it, is refused at commit and at restore
// (check_layer_chain); nothing named by such a header is opened.
TEST_F(SnapshotTransferTest, LayersThatNameOtherBackingFilesAreRefused) {
  auto fifo = dir_ / "a-fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (auto [layer, backing] : std::vector<std::pair<std::string, std::string>>{
           {"layer-a.qcow2", fifo.string()},                    // not a template's
           {"layer-a.qcow2", "/etc/../etc/base/rootfs.qcow2"},  // not normal
           {"layer-a.qcow2", "base/rootfs.qcow2"},              // relative
           {"layer-b.qcow2", "/etc/passwd"},                    // not the layer before
           {"layer-b.qcow2", "layer-b.qcow2"}}) {
    SCOPED_TRACE(layer + " -> " + backing);
    fs::remove_all(dir_ / "bad");
    ASSERT_EQ(sh("cp -a " + src_.dir.string() + " " + (dir_ / "bad").string()), 0);
    ASSERT_TRUE(qcow2::set_backing_file(dir_ / "bad" / layer, backing));
    auto bad = src_;
    bad.dir = dir_ / "bad";
    EXPECT_FALSE(check_layer_chain(bad));
    EXPECT_FALSE(check_layer_chain(bad, rootfs()));
    auto offer = offer_of(bad);
    ASSERT_TRUE(offer);
    fs::remove_all(dir_ / "cache");
    auto r = SnapshotReceiver::open(*offer, dir_ / "dst", dir_ / "dst-disk", dir_ / "cache", 32);
    ASSERT_TRUE(r);
    send(*offer, **r);
    auto got = (*r)->commit();
    ASSERT_FALSE(got);
    EXPECT_NE(got.error().message.find(layer), std::string::npos) << got.error().message;
  }
  EXPECT_FALSE(fs::exists(dir_ / "dst"));
  // The good chain passes, against its template's root file system and no other.
  EXPECT_TRUE(check_layer_chain(src_));
  EXPECT_TRUE(check_layer_chain(src_, rootfs()));
  fs::create_directories(dir_ / "images" / "other");
  std::ofstream(dir_ / "images" / "other" / "rootfs.qcow2") << "x";
  EXPECT_FALSE(check_layer_chain(src_, dir_ / "images" / "other" / "rootfs.qcow2"));
}

TEST_F(SnapshotTransferTest, VolumeCopiesAndVolumesCarriedAlongArriveAndNamesAreChecked) {
  // A snapshot with a copy of the volume in slot 1, and a volume's file carried along.
  auto copy = src_.volume(1);
  {
    std::ofstream(copy) << "volume copy";
    std::ofstream(dir_ / "vol_abc.img") << "a volume";
  }
  auto s = src_;
  s.volume_slots = {1};
  s.volume_copies = {1};
  ASSERT_TRUE(s.write_meta());
  auto offer = offer_of(s, {dir_ / "vol_abc.img"});
  ASSERT_TRUE(offer) << offer.error().message;
  ASSERT_EQ(offer->files.size(), 6u);
  EXPECT_EQ(offer->files[4].name, "volume-1.img");
  EXPECT_EQ(offer->files[5].name, "vol_abc.img");
  EXPECT_FALSE(offer_of(s, {dir_ / "src" / "state"}));  // only volume files are carried
  auto r = SnapshotReceiver::open(*offer, dir_ / "dst", dir_ / "dst-disk", dir_ / "cache", 32);
  ASSERT_TRUE(r) << r.error().message;
  send(*offer, **r);
  auto carried = (*r)->carried_dir();
  auto got = (*r)->commit();
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(read_all(got->volume(1)), "volume copy");
  EXPECT_EQ(got->volume_copies, (std::vector<uint32_t>{1}));
  EXPECT_EQ(read_all(carried / "vol_abc.img"), "a volume");
  EXPECT_EQ(carried, dir_ / "dst-disk" / "carried");
  // A carried name is a volume's file name, never a path; a copy is the snapshot's.
  for (std::string bad : {"../vol_abc.img", "vol_ABC.img", "vol_.img", "abc.img", "vol_a/b.img"}) {
    auto o = *offer;
    o.files[5].name = bad;
    EXPECT_FALSE(SnapshotReceiver::open(o, dir_ / "d5", dir_ / "d5", dir_ / "cache", 32)) << bad;
  }
  auto o = *offer;
  o.files[4].name = "volume-2.img";
  EXPECT_FALSE(SnapshotReceiver::open(o, dir_ / "d6", dir_ / "d6", dir_ / "cache", 32));
  o = *offer;
  o.files.push_back(o.files[5]);  // twice
  EXPECT_FALSE(SnapshotReceiver::open(o, dir_ / "d7", dir_ / "d7", dir_ / "cache", 32));
  o = *offer;
  o.files.pop_back();
  o.files.pop_back();  // the copy its metadata names is not offered
  EXPECT_FALSE(SnapshotReceiver::open(o, dir_ / "d8", dir_ / "d8", dir_ / "cache", 32));
  EXPECT_FALSE(fs::exists(dir_ / "d5"));
}

}  // namespace
}  // namespace pandastack::vmm
