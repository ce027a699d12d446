// runtime_host DATA STATE IMAGES [N]: a minimal host process for crash tests. Starts the actor
// runtime, creates N (default 1) sandboxes for tenant "acme", writes /tmp/mark ("adopted") in
// each, prints their ids (one per line) and waits to be killed.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "actors/runtime.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 2;
  int n = argc == 5 ? std::atoi(argv[4]) : 1;
  spdlog::set_default_logger(spdlog::stderr_logger_mt("runtime_host"));  // stdout carries the id
  pandastack::actors::RuntimeConfig c;
  c.data_dir = argv[1];
  c.state_dir = argv[2];
  c.images_dir = argv[3];
  auto rt = pandastack::actors::Runtime::start(c);
  if (!rt) return 1;
  for (int i = 0; i < n; ++i) {
    pandastack::actors::CreateRequest req;
    req.tenant = "acme";
    auto s = (*rt)->create(req);
    if (!s) {
      std::fprintf(stderr, "create: %s\n", s.error().message.c_str());
      return 1;
    }
    pandastack::vmm::ExecRequest mark;
    mark.shell = "echo adopted > /tmp/mark";
    auto m = (*rt)->exec("acme", s->id, mark);
    if (!m) return 1;
    std::printf("%s\n", s->id.c_str());
  }
  std::fflush(stdout);
  for (;;) ::pause();
}
