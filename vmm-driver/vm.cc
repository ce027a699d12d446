#include "vmm-driver/vm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "vmm-driver/io_thread.h"

namespace pandastack::vmm {

namespace fs = std::filesystem;
using namespace std::chrono;

const char* to_string(Accel a) { return a == Accel::kvm ? "kvm" : "tcg"; }

unsigned host_tsc_khz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return unsigned(std::stod(line.substr(colon + 1)) * 1000.0);
    }
  }
  return 0;
}

std::vector<std::string> qemu_boot_args(const VmConfig& c) {
  const std::string run = c.run_dir.string();
  const std::string mem = std::to_string(c.memory_mib) + "M";
  // mitigations=off: the guest kernel only isolates the sandbox's own processes from each other;
  // the security boundary is the VMM. Under TCG, PTI's CR3 switches flush the soft TLB on every
  // syscall and make fork+exec several times slower.
  std::string append = "console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1 random.trust_cpu=on mitigations=off";
  if (c.accel == Accel::tcg) {
    // Without a known TSC frequency about one TCG boot in five hangs calibrating the timer.
    unsigned khz = c.tsc_khz != 0 ? c.tsc_khz : host_tsc_khz();
    if (khz != 0) append += " tsc_early_khz=" + std::to_string(khz) + " tsc=reliable";
  }
  // The KVM and TCG paths differ only in these two flags.
  const std::string accel = c.accel == Accel::kvm ? "kvm" : "tcg";
  std::string cpu = c.cpu_model;
  if (cpu.empty()) {
    if (const char* e = std::getenv("PANDASTACK_CPU")) cpu = e;
  }
  if (cpu.empty()) cpu = c.accel == Accel::kvm ? "host" : "max";
  return {
      c.qemu_binary,
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
      "-machine", "microvm,accel=" + accel + ",memory-backend=mem",
      "-cpu", cpu,
      "-smp", std::to_string(c.vcpus),
      "-m", mem,
      // Guest RAM in a file: the snapshot path keeps it there and maps it copy-on-write.
      "-object", "memory-backend-file,id=mem,size=" + mem + ",mem-path=" + run + "/mem,share=on",
      "-kernel", c.kernel.string(),
      "-initrd", c.initramfs.string(),
      "-append", append,
      "-drive", "id=root,file=" + run + "/disk.qcow2,format=qcow2,if=none,discard=unmap",
      "-device", "virtio-blk-device,drive=root",
      "-device", "virtio-serial-device",
      "-chardev", "socket,id=agent,path=" + run + "/agent.sock,server=on,wait=off",
      "-device", "virtserialport,chardev=agent,name=agent,id=agent",
      "-chardev", "file,id=console,path=" + run + "/console.log",
      "-serial", "chardev:console",
      "-qmp", "unix:" + run + "/qmp.sock,server=on,wait=off",
  };
}

namespace {

std::string tail_of(const fs::path& p, size_t bytes) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  auto size = size_t(in.tellg());
  size_t start = size > bytes ? size - bytes : 0;
  in.seekg(std::streamoff(start));
  std::string s(size - start, '\0');
  in.read(s.data(), std::streamsize(s.size()));
  return s;
}

// Runs a short helper (qemu-img) to completion; returns its combined output on failure.
Status run_tool(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return make_error(ErrorCode::io_error, strerror(errno));
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, size_t(n));
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(ErrorCode::spawn_failed, argv[0] + " failed: " + out);
  return Ok{};
}

}  // namespace

Result<std::unique_ptr<Vm>> Vm::boot(IoThread& io, VmConfig config) {
  for (auto* p : {&config.kernel, &config.initramfs, &config.rootfs}) {
    if (!fs::exists(*p)) return make_error(ErrorCode::invalid_argument, "missing guest image file: " + p->string());
  }
  if ((config.run_dir / "agent.sock").string().size() >= 108)
    return make_error(ErrorCode::invalid_argument, "run dir path too long for unix sockets: " + config.run_dir.string());
  std::error_code ec;
  fs::remove_all(config.run_dir, ec);
  fs::create_directories(config.run_dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create " + config.run_dir.string() + ": " + ec.message());

  std::unique_ptr<Vm> vm(new Vm(io, std::move(config)));
  const VmConfig& c = vm->config_;
  auto overlay = run_tool({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                           fs::absolute(c.rootfs).string(), (c.run_dir / "disk.qcow2").string()});
  if (!overlay) return overlay.error();  // ~Vm removes the run dir

  auto args = qemu_boot_args(c);
  auto started = steady_clock::now();
  int log_fd = ::open((c.run_dir / "qemu.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    if (c.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
    }
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) return make_error(ErrorCode::spawn_failed, std::string("fork: ") + strerror(errno));
  vm->pid_ = pid;
  spdlog::debug("vm {}: spawned qemu pid {} accel={}", c.name, pid, to_string(c.accel));

  auto fail = [&](ErrorCode code, const std::string& what) -> Error {
    std::string msg = what;
    std::string qlog = tail_of(c.run_dir / "qemu.log", 2048);
    if (!qlog.empty()) msg += "\n--- qemu ---\n" + qlog;
    msg += "\n--- guest console (tail) ---\n" + vm->console_tail(3000);
    spdlog::warn("vm {}: boot failed: {}", c.name, what);
    return make_error(code, msg);
  };

  auto deadline = started + c.boot_timeout;
  auto left = [&] { return duration_cast<milliseconds>(deadline - steady_clock::now()); };
  auto qmp = QmpClient::connect((c.run_dir / "qmp.sock").string(), std::min(left(), milliseconds(10000)));
  if (!qmp) {
    if (!vm->alive()) return fail(ErrorCode::spawn_failed, "QEMU exited at start: " + qmp.error().message);
    return fail(ErrorCode::boot_failed, "QEMU did not answer QMP within " +
                                            std::to_string(c.boot_timeout.count()) + " ms: " + qmp.error().message);
  }
  vm->qmp_ = std::move(*qmp);
  auto agent = AgentClient::connect(io, (c.run_dir / "agent.sock").string(), std::min(left(), milliseconds(5000)));
  if (!agent) return fail(ErrorCode::boot_failed, agent.error().message);
  vm->agent_ = std::move(*agent);

  // Wait for the agent, watching that QEMU is still there (a panicking guest makes it exit).
  for (;;) {
    auto h = vm->agent_->health(milliseconds(50));
    if (h) break;
    if (h.error().code != ErrorCode::timeout) return fail(ErrorCode::boot_failed, h.error().message);
    if (!vm->alive()) return fail(ErrorCode::boot_failed, "QEMU exited during boot");
    if (left().count() <= 0)
      return fail(ErrorCode::boot_failed,
                  "guest agent did not answer within " + std::to_string(c.boot_timeout.count()) + " ms");
  }
  vm->boot_time_ = duration_cast<microseconds>(steady_clock::now() - started);
  spdlog::info("vm {}: booted in {} ms (accel={}, pid={})", c.name, vm->boot_time_.count() / 1000,
               to_string(c.accel), pid);
  return vm;
}

Vm::~Vm() { kill_and_clean(); }

void Vm::kill_and_clean() {
  agent_.reset();
  qmp_.reset();
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  std::error_code ec;
  fs::remove_all(config_.run_dir, ec);
  if (ec) spdlog::warn("vm {}: cannot remove {}: {}", config_.name, config_.run_dir.string(), ec.message());
}

bool Vm::alive() {
  if (pid_ <= 0) return false;
  if (exit_status_ >= 0) return false;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = status;
    pid_ = -1;
    return false;
  }
  return true;
}

std::string Vm::console_tail(size_t bytes) const { return tail_of(config_.run_dir / "console.log", bytes); }

Status Vm::reconnect_agent(milliseconds timeout) {
  if (agent_) {
    auto ended = agent_->end_session(timeout);
    if (!ended) return ended.error();
  }
  agent_.reset();
  auto a = AgentClient::connect(io_, (config_.run_dir / "agent.sock").string(), timeout);
  if (!a) return a.error();
  agent_ = std::move(*a);
  auto h = agent_->health(timeout);
  if (!h) return h.error();
  return Ok{};
}

Accel detect_accel(IoThread& io, const VmConfig& probe, milliseconds deadline, const std::string& override_accel) {
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
  c.run_dir = probe.run_dir.parent_path() / "kvm-probe";
  auto vm = Vm::boot(io, c);
  if (vm) {
    spdlog::info("accelerator: kvm (probe boot reached the agent in {} ms)", (*vm)->boot_time().count() / 1000);
    return Accel::kvm;
  }
  spdlog::info("accelerator: tcg (a probe boot under KVM failed: {})",
               vm.error().message.substr(0, vm.error().message.find('\n')));
  return Accel::tcg;
}

}  // namespace pandastack::vmm
