#include "actors/image_import.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "actors/env.h"
#include "actors/sh_quote.h"
#include "actors/template_builder.h"
#include "vmm-driver/run_tool.h"
#include "vmm-driver/vm.h"
#include "wire/json.h"

namespace pandastack::actors {

namespace fs = std::filesystem;
using std::chrono::steady_clock;

namespace {

constexpr const char* kScriptPath = "/run/pandastack-image-import.py";
constexpr const char* kBusyboxPath = "/run/pandastack-busybox";
constexpr const char* kResultPath = "/run/pandastack-image.json";
constexpr size_t kMaxResultBytes = 1 << 20;
constexpr size_t kMaxListItems = 256, kMaxItemBytes = 4096;

Rejection bad_answer(const std::string& why) {
  return Rejection{Code::build_failed, "the importer's answer: " + why};
}

bool printable(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return c >= 0x20 && c != 0x7f; });
}

// A list of strings in the answer, bounded.
std::optional<std::vector<std::string>> strings(const wire::Json& j) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  if (!j.is_array() || j.as_array().size() > kMaxListItems) return std::nullopt;
  for (auto& x : j.as_array()) {
    if (!x.is_string() || x.as_string().size() > kMaxItemBytes ||
        x.as_string().find('\0') != std::string::npos)
      return std::nullopt;
    out.push_back(x.as_string());
  }
  return out;
}

// The first TCP port of an image's ExposedPorts ("8080/tcp", "8080"), 0 for none.
uint16_t first_tcp_port(const std::vector<std::string>& exposed) {
  for (auto& e : exposed) {
    auto slash = e.find('/');
    auto num = e.substr(0, slash);
    auto proto = slash == std::string::npos ? "tcp" : e.substr(slash + 1);
    if (proto != "tcp" || num.empty() || num.size() > 5 ||
        !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    auto n = std::stoul(num);
    if (n >= 1 && n <= 65535) return uint16_t(n);
  }
  return 0;
}

}  // namespace

std::string image_start_command(const std::vector<std::string>& argv, const std::string& workdir,
                                uint32_t uid, uint32_t gid) {
  std::string words;
  for (auto& a : argv) words += " " + sh_quote(a);
  std::string s = "cd " + sh_quote(workdir.empty() ? "/" : workdir) + " && exec";
  if (uid == 0 && gid == 0) return s + words;
  // The agent (guest/agent/users.cc) drops to the user; a shell finds the program on PATH.
  return s + " /run/pandastack/agent --run-as " + std::to_string(uid) + " " + std::to_string(gid) +
         " - /bin/sh sh -c 'exec \"$@\"' sh" + words;
}

Reply<ImportedImage> imported_image(const std::string& text, bool start) {
  auto j = wire::Json::parse(text);
  if (!j || !j->is_object()) return bad_answer("not a JSON object");
  ImportedImage out;
  auto text_of = [&](const char* k, size_t max) -> std::optional<std::string> {
    auto& v = (*j)[k];
    if (v.is_null()) return std::string();
    if (!v.is_string() || v.as_string().size() > max || !printable(v.as_string()))
      return std::nullopt;
    return v.as_string();
  };
  auto number = [&](const char* k, uint64_t max) -> std::optional<uint64_t> {
    auto& v = (*j)[k];
    if (!v.is_integer() || v.as_int() < 0 || uint64_t(v.as_int()) > max) return std::nullopt;
    return uint64_t(v.as_int());
  };
  auto format = text_of("format", 32), workdir = text_of("workdir", kMaxItemBytes),
       user = text_of("user", 256), digest = text_of("config_digest", 71);
  if (!format || !workdir || !user || !digest) return bad_answer("a malformed field");
  if (digest->size() != 71 || !digest->starts_with("sha256:"))
    return bad_answer("no config digest");
  auto uid = number("uid", UINT32_MAX), gid = number("gid", UINT32_MAX);
  auto layers = number("layers", 1 << 20), entries = number("entries", UINT64_MAX >> 1),
       bytes = number("bytes", UINT64_MAX >> 1);
  if (!uid || !gid || !layers || !entries || !bytes) return bad_answer("a malformed number");
  auto entrypoint = strings((*j)["entrypoint"]), cmd = strings((*j)["cmd"]),
       exposed = strings((*j)["exposed"]), tags = strings((*j)["tags"]);
  if (!entrypoint || !cmd || !exposed || !tags) return bad_answer("a malformed list");
  auto& env = (*j)["env"];
  if (!env.is_null() && !env.is_object()) return bad_answer("env is not an object");
  if (env.is_object()) {
    if (env.as_object().size() > kMaxListItems) return bad_answer("too many env entries");
    for (auto& [k, v] : env.as_object()) {
      if (!v.is_string() || k.size() > 128 || v.as_string().size() > kMaxItemBytes)
        return bad_answer("a malformed env entry");
      out.facts.env[k] = v.as_string();
    }
  }
  out.format = *format;
  out.workdir = *workdir;
  out.user = *user;
  out.uid = uint32_t(*uid);
  out.gid = uint32_t(*gid);
  out.layers = *layers;
  out.entries = *entries;
  out.bytes = *bytes;
  out.entrypoint = *entrypoint;
  out.cmd = *cmd;
  out.exposed = *exposed;
  std::string tag = tags->empty() || tags->front().size() > 200 || !printable(tags->front())
                        ? std::string()
                        : tags->front();
  out.facts.ref = (tag.empty() ? "" : tag + "@") + *digest;
  // Docker's rule: the Entrypoint with the Cmd as its arguments, else the Cmd.
  std::vector<std::string> argv = out.entrypoint.empty() ? out.cmd : out.entrypoint;
  if (!out.entrypoint.empty()) argv.insert(argv.end(), out.cmd.begin(), out.cmd.end());
  out.facts.ready_port = 0;
  if (start && !argv.empty() && first_tcp_port(out.exposed) != 0) {
    out.facts.start = image_start_command(argv, out.workdir, out.uid, out.gid);
    out.facts.ready_port = first_tcp_port(out.exposed);
  }
  return out;
}

Reply<std::string> run_importer_in_vm(Env& env, const ImporterRun& run) {
  if (run.deadline <= steady_clock::now())
    return Rejection{Code::timeout, "the build's time ran out"};
  auto booted = boot_builder(env, "base", run.run_name, run.memory_mib, run.vcpus, run.deadline,
                             run.log, run.boot_note);
  if (!booted) return booted.error();
  auto& vm = **booted;
  if (run.progress) run.progress(10);
  auto bound = vm.bind_volumes(
      {vmm::VolumeBinding{0, run.archive, true}, vmm::VolumeBinding{1, run.disk, false}});
  if (!bound) return Rejection{Code::build_failed, "attaching the disks: " + bound.error().message};
  auto wrote = vm.agent().write_file(kScriptPath, kImageImportScript, 0755, true);
  for (auto& [path, bytes] : run.files)
    if (wrote) wrote = vm.agent().write_file(path, bytes, 0755, true);
  if (!wrote) return Rejection{Code::build_failed, "the importer: " + wrote.error().message};
  if (run.progress) run.progress(15);
  std::string script = std::string("exec python3 ") + kScriptPath;
  for (auto& a : run.args) script += " " + sh_quote(a);
  script += " --archive-serial pds-vol0 --archive-bytes " + std::to_string(run.archive_bytes) +
            " --disk-serial pds-vol1 --disk-bytes " + std::to_string(run.disk_bytes) + " --out " +
            kResultPath + "\n";
  if (auto no = run_builder_script(vm, run.what, script, run.deadline, run.log, run.stop))
    return *no;
  auto answer = vm.agent().read_file(kResultPath, kMaxResultBytes);
  (void)vm.qmp().execute("quit", {}, std::chrono::seconds(10));
  if (!answer) return bad_answer(answer.error().message);
  return *answer;
}

Reply<ImportedImage> import_in_vm(Env& env, const ImportJob& job) {
  auto log = [&](const std::string& l) {
    if (job.log) job.log(l);
  };
  auto at = [&](int p) {
    if (job.at) job.at(p);
  };
  std::error_code ec;
  // The builder is a guest of the shipped `base` template (python3, e2fsprogs: ours).
  if (!fs::exists(env.config.images_dir / "base" / "rootfs.qcow2", ec))
    return Rejection{Code::unavailable, "an image import needs the shipped template base"};
  // Whole sectors: the archive is a disk of the guest (the padding is zeros, the end of a tar).
  auto size = fs::file_size(job.archive, ec);
  if (ec) return Rejection{Code::storage_error, "the upload: " + ec.message()};
  if (size % 512 != 0) fs::resize_file(job.archive, (size + 511) / 512 * 512, ec);
  if (ec) return Rejection{Code::storage_error, "the upload: " + ec.message()};
  const uint64_t archive_bytes = (size + 511) / 512 * 512;
  fs::create_directories(job.work_dir, ec);
  auto disk = job.work_dir / "root.raw";
  fs::remove(disk, ec);
  { std::ofstream(disk, std::ios::binary); }
  fs::resize_file(disk, job.disk_bytes, ec);  // (sparse: only what the image fills is written)
  if (ec) return Rejection{Code::storage_error, "the new root disk: " + ec.message()};
  std::string busybox;
  if (std::ifstream f(job.busybox, std::ios::binary); f) {
    std::ostringstream s;
    s << f.rdbuf();
    busybox = s.str();
  }
  ImporterRun run;
  run.run_name = "import-" + job.id;
  run.boot_note = " with the image as a read-only disk";
  run.what = "importing the image";
  run.memory_mib = job.spec.memory_mib;
  run.vcpus = job.spec.vcpus;
  run.deadline = job.deadline;
  run.log = log;
  run.progress = at;
  run.stop = job.stop;
  run.archive = job.archive;
  run.archive_bytes = archive_bytes;
  run.disk = disk;
  run.disk_bytes = job.disk_bytes;
  if (!busybox.empty()) {
    run.files.emplace_back(kBusyboxPath, std::move(busybox));
    run.args = {"--busybox", kBusyboxPath};
  }
  auto answer = run_importer_in_vm(env, run);
  if (!answer) return answer.error();
  at(85);
  auto image = imported_image(*answer, job.start);
  if (!image) return image;
  image->disk_bytes = job.disk_bytes;
  // The disk as raw bytes into a qcow2 of the daemon's own making (-f raw: nothing probed).
  fs::create_directories(job.out_dir, ec);
  auto out = job.out_dir / "rootfs.qcow2";
  auto tmp = job.out_dir / "rootfs.qcow2.tmp";
  fs::remove(tmp, ec);
  auto converted = vmm::run_tool(
      {"qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", disk.string(), tmp.string()});
  fs::remove(disk, ec);
  if (!converted) {
    fs::remove(tmp, ec);
    return Rejection{Code::storage_error, "converting the root disk: " + converted.error().message};
  }
  fs::rename(tmp, out, ec);
  if (ec) return Rejection{Code::storage_error, "installing the root file system: " + ec.message()};
  if (auto no = make_template_overlay(out, job.disk_bytes)) return *no;
  at(100);
  return image;
}

}  // namespace pandastack::actors
