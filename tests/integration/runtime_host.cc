// runtime_host DATA STATE IMAGES: a minimal host process for crash tests. Starts the actor
// runtime, creates one sandbox for tenant "acme", prints its id and waits to be killed.
#include <unistd.h>

#include <cstdio>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/runtime.h"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  spdlog::set_default_logger(spdlog::stderr_logger_mt("runtime_host"));  // stdout carries the id
  pandastack::actors::RuntimeConfig c;
  c.data_dir = argv[1];
  c.state_dir = argv[2];
  c.images_dir = argv[3];
  auto rt = pandastack::actors::Runtime::start(c);
  if (!rt) return 1;
  pandastack::actors::CreateRequest req;
  req.tenant = "acme";
  auto s = (*rt)->create(req);
  if (!s) {
    std::fprintf(stderr, "create: %s\n", s.error().message.c_str());
    return 1;
  }
  std::printf("%s\n", s->id.c_str());
  std::fflush(stdout);
  for (;;) ::pause();
}
