#include "guest/agent/system.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "guest/agent/util.h"

namespace pandastack::agent {

// No udev in the guest to make the /dev/virtio-ports/NAME symlink: /sys is the map.
std::string find_port(const std::string& name) {
  DIR* d = ::opendir("/sys/class/virtio-ports");
  if (d == nullptr) return "";
  std::string found;
  while (auto* e = ::readdir(d)) {
    std::string dev = e->d_name;
    if (dev[0] == '.') continue;
    if (read_small(("/sys/class/virtio-ports/" + dev + "/name").c_str()) == name) {
      found = "/dev/" + dev;
      break;
    }
  }
  ::closedir(d);
  return found;
}

namespace {

constexpr char kRunEtc[] = "/run/pandastack/etc";

// /etc/NAME as a symlink to /run/pandastack/etc/NAME (tmpfs), holding `fallback` unless the disk's
// file has content of its own. The hostname files are rewritten after every restore (each sandbox
// has its own name): on tmpfs that costs nothing, on the root disk each rewrite started writeback
// (ext4's auto_da_alloc), ~40 ms of every create and fork under TCG. A file a user replaced with
// one of their own (`sed -i` renames over the link) stays theirs and is written in place.
void etc_on_tmpfs(const std::string& name, const std::string& fallback) {
  std::string disk = "/etc/" + name, run = std::string(kRunEtc) + "/" + name;
  struct stat st {};
  bool is_link = ::lstat(disk.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  std::string content;
  if (!is_link) {
    int f = ::open(disk.c_str(), O_RDONLY | O_CLOEXEC);
    if (f >= 0) {
      char buf[4096];
      ssize_t n = ::read(f, buf, sizeof buf);
      if (n > 0) content.assign(buf, size_t(n));
      ::close(f);
    }
  }
  write_small_file(run.c_str(), content.empty() ? fallback : content);
  if (is_link) return;  // the disk already links here (a template made from a sandbox)
  std::string tmp = disk + ".pandastack-link";
  ::unlink(tmp.c_str());
  if (::symlink(run.c_str(), tmp.c_str()) != 0 || ::rename(tmp.c_str(), disk.c_str()) != 0) {
    log_line("cannot link " + disk + " to " + run + ": " + strerror(errno));
    ::unlink(tmp.c_str());
  }
}

}  // namespace

void init_system() {
  ::mkdir("/tmp", 01777);
  ::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  ::mkdir("/dev/pts", 0755);
  ::mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=666");
  ::mkdir("/dev/shm", 01777);
  ::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  ::symlink("/proc/self/fd", "/dev/fd");
  ::sethostname("sandbox", 7);
  mkdir_p(kRunEtc, 0755);
  etc_on_tmpfs("hostname", "sandbox\n");
  etc_on_tmpfs("hosts", "127.0.0.1 localhost\n127.0.1.1 sandbox\n");
  // Loopback up, so servers inside the sandbox are reachable on localhost.
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s >= 0) {
    ifreq ifr{};
    strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
      ifr.ifr_flags |= IFF_UP;
      ::ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    ::close(s);
  }
  ::setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
  ::setenv("HOME", "/root", 1);
  ::setenv("LANG", "C.UTF-8", 1);
  ::setenv("TERM", "xterm", 1);
  ::chdir("/");
}

// The guest side of the sandbox network, the same in every sandbox (the host NATs at the
// namespace boundary, so restored and forked guests need no re-addressing): eth0 172.31.255.2/30,
// default route via 172.31.255.1 (vmm-driver/network.h). Without a sandbox network the NIC is
// attached to nothing and these packets go nowhere.
void configure_network() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  auto sin = [](const char* ip) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
  };
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  auto addr = sin("172.31.255.2");
  memcpy(&ifr.ifr_addr, &addr, sizeof addr);
  if (::ioctl(s, SIOCSIFADDR, &ifr) != 0) {
    log_line(std::string("eth0: no address: ") + strerror(errno));
    ::close(s);
    return;
  }
  auto mask = sin("255.255.255.252");
  memcpy(&ifr.ifr_netmask, &mask, sizeof mask);
  ::ioctl(s, SIOCSIFNETMASK, &ifr);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP;
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  rtentry rt{};
  auto any = sin("0.0.0.0"), gw = sin("172.31.255.1");
  memcpy(&rt.rt_dst, &any, sizeof any);
  memcpy(&rt.rt_genmask, &any, sizeof any);
  memcpy(&rt.rt_gateway, &gw, sizeof gw);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (::ioctl(s, SIOCADDRT, &rt) != 0 && errno != EEXIST)
    log_line(std::string("eth0: no default route: ") + strerror(errno));
  ::close(s);
  // Names are resolved by the platform's resolver for this sandbox, on the gateway: it answers
  // what the egress policy allows and refuses the rest at once.
  int f = ::open("/etc/resolv.conf", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f >= 0) {
    const char conf[] = "nameserver 172.31.255.1\noptions timeout:1 attempts:2\n";
    ssize_t w = ::write(f, conf, sizeof conf - 1);
    (void)w;
    ::close(f);
  }
}

// A sandbox without a network: eth0 down (the kernel drops its routes with it), so connects and
// name lookups fail at once instead of waiting on a NIC attached to nothing.
void take_network_down() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  ifreq ifr{};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP)) {
    ifr.ifr_flags &= ~IFF_UP;
    if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0)
      log_line(std::string("eth0: cannot take it down: ") + strerror(errno));
  }
  ::close(s);
}

bool host_connected(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & POLLHUP) == 0;
}

}  // namespace pandastack::agent
