#include "vmm-driver/accel.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "vmm-driver/io_thread.h"
#include "wire/json.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using namespace std::chrono;

Accel detect_accel(IoThread& io, const VmConfig& probe, milliseconds deadline,
                   const std::string& override_accel) {
  std::string forced = override_accel;
  if (forced.empty()) {
    if (const char* env = std::getenv("PANDASTACK_ACCEL")) forced = env;
  }
  if (forced == "kvm" || forced == "tcg") {
    spdlog::info("accelerator: {} (forced by configuration)", forced);
    return forced == "kvm" ? Accel::kvm : Accel::tcg;
  }
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    spdlog::info("accelerator: tcg (/dev/kvm: {})", strerror(errno));
    return Accel::tcg;
  }
  ::close(fd);
  VmConfig c = probe;
  c.accel = Accel::kvm;
  c.name = "kvm-probe";
  c.boot_timeout = deadline;
  auto vm = Vm::boot(io, c);
  if (vm) {
    spdlog::info("accelerator: kvm (probe boot reached the agent in {} ms)",
                 (*vm)->boot_time().count() / 1000);
    return Accel::kvm;
  }
  spdlog::info("accelerator: tcg (a probe boot under KVM failed: {})",
               vm.error().message.substr(0, vm.error().message.find('\n')));
  return Accel::tcg;
}

std::string accel_key(const std::string& qemu_binary) {
  std::ostringstream key;
  utsname u{};
  ::uname(&u);
  key << "kernel=" << u.release;
  std::string qemu = qemu_binary.find('/') == std::string::npos ? "/usr/bin/" + qemu_binary
                                                                 : qemu_binary;
  struct stat st {};
  if (::stat(qemu.c_str(), &st) == 0)
    key << ";qemu=" << st.st_size << "@" << st.st_mtim.tv_sec;
  if (::stat("/dev/kvm", &st) == 0)
    key << ";kvm=" << major(st.st_rdev) << ":" << minor(st.st_rdev) << ":" << (st.st_mode & 07777);
  else
    key << ";kvm=none";
  std::ifstream modules("/proc/modules");
  std::string line;
  while (std::getline(modules, line))
    if (line.rfind("kvm", 0) == 0) key << ";" << line.substr(0, line.find(' '));
  return key.str();
}

namespace {

void write_cache(const fs::path& file, const std::string& key, Accel a) {
  wire::Json j = wire::Json::object();
  j.set("key", key);
  j.set("accel", to_string(a));
  auto tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out) return;
  }
  std::error_code ec;
  fs::rename(tmp, file, ec);
}

}  // namespace

Accel detect_accel_cached(const VmConfig& probe, milliseconds deadline,
                          const std::string& override_accel, const fs::path& cache_file) {
  std::string forced = override_accel;
  if (forced.empty())
    if (const char* env = std::getenv("PANDASTACK_ACCEL")) forced = env;
  if (forced == "kvm" || forced == "tcg") {
    IoThread io;
    return detect_accel(io, probe, deadline, forced);
  }
  auto key = accel_key(probe.qemu_binary);
  std::ifstream in(cache_file);
  std::stringstream text;
  text << in.rdbuf();
  auto cached = wire::Json::parse(text.str());
  if (cached && cached->is_object() && (*cached)["key"].is_string() &&
      (*cached)["accel"].is_string()) {
    Accel a = (*cached)["accel"].as_string() == "kvm" ? Accel::kvm : Accel::tcg;
    if ((*cached)["key"].as_string() == key) {
      spdlog::info("accelerator: {} (the probe's answer for this host, cached in {})",
                   to_string(a), cache_file.string());
      return a;
    }
    // The host changed (kernel, QEMU, /dev/kvm): the old answer now, a new probe in the
    // background for the next start.
    spdlog::info("accelerator: {} (cached; the host changed since, probing again in the background "
                 "for the next start)",
                 to_string(a));
    std::thread([probe, deadline, key, cache_file] {
      IoThread io;
      write_cache(cache_file, key, detect_accel(io, probe, deadline));
    }).detach();
    return a;
  }
  IoThread io;  // the first start on this host: probe now
  Accel a = detect_accel(io, probe, deadline);
  write_cache(cache_file, key, a);
  return a;
}

}  // namespace pandastack::vmm
