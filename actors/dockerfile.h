// A Dockerfile as a custom template's build (issue 37): the instructions a template build can
// honour translated into its spec (actors/custom_template.h), everything else refused with the
// line that asked for it. Pure: text in, a TemplateSpec or a rejection out; the build itself runs
// in a builder microVM as every template build does (actors/template_builder.h), so nothing of
// the Dockerfile or its context is run, unpacked or resolved on the host.
//
// What each instruction becomes (in order, one build command each, with Docker's semantics):
//   FROM T          the shipped template T (`base`, `code-interpreter`, ...) or a ready template
//                   of the tenant's own (an imported image's included), or an image reference
//                   (one with a '/', ':' or '@': pulled by the build, kFromImagePrefix);
//                   `scratch` is 501; one stage only
//   RUN             `sh -c` (shell form) or the program itself (exec form), in the WORKDIR, as the
//                   USER, with the ARGs and the ENVs declared so far (and not those declared later)
//   COPY, ADD       files of the build context (`context`: relative path -> text) into the guest,
//                   staged by the agent and copied at that point (so a later RUN sees them and an
//                   earlier one does not); `--chown`, `--chmod`; globs; a directory's files;
//                   ADD of a URL or an archive is 501
//   ENV             the template's environment (every process of its sandboxes gets it)
//   ARG             a build argument (`build_args` overrides its default): substituted in later
//                   instructions and in RUN's environment, never kept in the template
//   WORKDIR, USER   where and as whom later RUN/COPY and the start command run (WORKDIR is
//                   made); not applied to the sandboxes' other processes
//   CMD, ENTRYPOINT the template's start command (TemplateSpec::start, Docker's rules for the
//                   two together), run in the final WORKDIR as the final USER: started in the
//                   bake's guest, so every sandbox of the template restores with it running
//   EXPOSE          its first TCP port is the start command's readiness check (the bake waits
//                   for it to listen); otherwise no effect (a sandbox's ports are reached through
//                   previews and exposed ports, whatever the image says)
//   LABEL, MAINTAINER   accepted: no effect
//   HEALTHCHECK, VOLUME, SHELL, ONBUILD, STOPSIGNAL: 400 naming the line
// $VAR, ${VAR}, ${VAR:-default} and ${VAR:+alt} are substituted as Docker does (not in RUN, whose
// shell expands them from its environment). Heredocs (`<<EOF`) are 501.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "actors/custom_template.h"

namespace pandastack::actors {

struct DockerfileLimits {
  size_t max_bytes = 64 * 1024;   // the Dockerfile's text
  size_t max_instructions = 200;  // its instructions (RUN, COPY and WORKDIR each become one
                                  // build command: TemplateLimits::max_run bounds them)
  size_t max_context_files = 64;  // the context's files (each a build file)
  size_t max_build_args = 64;
};

// A FROM that names an image ("python:3.12-slim", "ghcr.io/org/app@sha256:..."): its spec's
// `from` is this prefix and the reference; the build pulls the image (actors/image_pull.h) and
// imports it into its own folder first, then runs the steps on it (its Env and start command
// carried over, as a Docker image's ENV and CMD are).
inline constexpr const char* kFromImagePrefix = "docker://";

// Where COPY and ADD stage the context's files in the guest (removed by the build's last step).
inline constexpr const char* kBuildContextDir = "/var/lib/pandastack/build-context";

struct TemplateFromDockerfile {
  TemplateSpec spec;
  // The final WORKDIR and USER ("" = none given): recorded, not applied to sandboxes.
  std::string workdir, user;
  std::vector<std::string> exposed;  // EXPOSE's ports, as written
};

// The spec of `dockerfile`'s build with its context files (`context`: relative path -> text)
// and build arguments. invalid_argument (naming the line) for what is malformed or refused,
// not_implemented for what is not served yet.
// `archived`: the context is in archives (TemplateSpec::contexts, actors/build_context.h),
// unpacked by the build and mounted at kBuildContextDir; `context` is empty. COPY and ADD are
// then matched there by the build's guest (kBuildCopyScript: Docker's rules for directories,
// globs and a destination ending in /): a source that matches nothing fails the build, naming
// its line.
Reply<TemplateFromDockerfile> template_from_dockerfile(
    const std::string& dockerfile, const std::map<std::string, std::string>& context,
    const std::map<std::string, std::string>& build_args, const DockerfileLimits& limits = {},
    bool archived = false);

// Where the copy script of an archived context's build is staged, and the static busybox it
// runs with (the host's, as an imported image without a shell gets: a FROM image needs no cp,
// chown or chmod of its own); both removed by the build's last step.
inline constexpr const char* kBuildCopyPath = "/var/lib/pandastack/build-copy";
inline constexpr const char* kBuildBusyboxPath = "/var/lib/pandastack/busybox";
// The script: LINE DEST DIR OWNER MODE SOURCE..., run by kBuildBusyboxPath's sh.
extern const char* const kBuildCopyScript;

}  // namespace pandastack::actors
