// An OCI image made a custom template (issue 37): `PUT /v1/templates/{name}/image` with a
// `docker save` archive or an OCI image layout tar. The host never opens the archive: it is a
// read-only disk of a builder microVM (a guest of the shipped `base` template, no network,
// jailed like every sandbox) whose importer (guest/image_import.py, carried by the daemon)
// checks every digest, unpacks the layers into a second, empty disk it formats itself (whiteouts
// honoured, no entry reaching outside it) and answers what the image's config says. That disk,
// converted from raw bytes to qcow2 by the host (qemu-img reads it as raw: nothing of the guest's
// file system is parsed here), becomes the template's root file system; the guest's init and
// agent come from our initramfs, so any Linux image with a /bin/sh runs commands (one without
// gets a static busybox as its shell). Then the bake, as for any custom template.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "actors/custom_template.h"
#include "actors/runtime.h"

namespace pandastack::actors {

struct Env;

// The importer (guest/image_import.py), built into the daemon (actors/CMakeLists.txt).
extern const char* const kImageImportScript;

struct ImportJob {
  std::string id;                  // the template's id (names the builder's run folder)
  TemplateSpec spec;               // its shape filled in
  std::filesystem::path archive;   // the upload (ours: padded here to whole sectors)
  std::filesystem::path work_dir;  // on a real disk: the new root disk is made here
  std::filesystem::path out_dir;   // the template's folder: rootfs.qcow2 and its overlay go here
  uint64_t disk_bytes = 0;         // the new root disk's size
  std::filesystem::path busybox;   // a static busybox, the shell of an image with none
  bool start = true;               // the image's Entrypoint/Cmd may become the start command
  std::chrono::steady_clock::time_point deadline;
  std::stop_token stop;
  std::function<void(const std::string&)> log;
  std::function<void(int percent)> at;  // progress within the stage (0..100)
};

// What the importer found in the image's config.
struct ImportedImage {
  ImageFacts facts;  // ref, env, and the start command made of the rest
  std::vector<std::string> entrypoint, cmd, exposed;
  std::string workdir, user;
  uint32_t uid = 0, gid = 0;
  std::string format;  // docker-archive | oci-layout
  uint64_t layers = 0, entries = 0, bytes = 0;
  uint64_t disk_bytes = 0;
};

// The importer's answer (JSON it wrote in the guest) read and checked: every field typed and
// bounded (it comes from the tenant's image, through a guest). `start`: whether the image's
// Entrypoint/Cmd becomes the template's start command (only for an image that exposes a port:
// a base image's `bash` or `python3` would end at once with no terminal).
Reply<ImportedImage> imported_image(const std::string& json, bool start);

// The shell command that runs `argv` as the image's user in its working directory (the start
// command of an imported template; the agent drops to a non-root user: guest/agent/users.cc).
std::string image_start_command(const std::vector<std::string>& argv, const std::string& workdir,
                                uint32_t uid, uint32_t gid);

// One run of the importer (guest/image_import.py) in a `base` builder microVM: `archive` bound
// read-only as its first disk (the importer reads `archive_bytes` of it), `disk` (of
// `disk_bytes`) as its second, `files` written into the guest first (path -> bytes, 0755),
// `args` added to its command line. Shared by image imports and build contexts.
struct ImporterRun {
  std::string run_name;   // the builder's run folder name
  std::string boot_note;  // the end of the boot's log line
  std::string what;       // the step, as a failure names it ("importing the image")
  uint32_t memory_mib = 0, vcpus = 0;
  std::chrono::steady_clock::time_point deadline;
  std::function<void(const std::string&)> log;
  std::function<void(int)> progress;  // 10 once booted, 15 once the importer is in the guest
  std::stop_token stop;
  std::filesystem::path archive, disk;
  uint64_t archive_bytes = 0, disk_bytes = 0;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> files;
};

// Runs it to its end: the importer's answer (the JSON it wrote, at most 1 MiB, unchecked: see
// imported_image). The builder is gone on return. build_failed (with the importer's reason),
// timeout, unavailable (`stop`).
Reply<std::string> run_importer_in_vm(Env& env, const ImporterRun& run);

// Runs the import in a builder VM and writes out_dir/rootfs.qcow2 (and its empty overlay).
// Fails with the importer's reason (a digest mismatch, an escaping entry, ...), the deadline or
// a guest that died, and leaves no rootfs behind.
Reply<ImportedImage> import_in_vm(Env& env, const ImportJob& job);

}  // namespace pandastack::actors
