// A tenant's Dockerfile (actors/dockerfile.h template_from_dockerfile): the host translates its
// text into a template build's spec (the lexer, variables, every instruction). Any bytes give a
// spec or a refusal (invalid_argument or not_implemented); a spec's environment names are shell
// names (the build writes them unquoted: `export K=...`) and its commands within the template
// limits. The first byte picks the context's form (files or archives) and two build arguments.
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "actors/dockerfile.h"

namespace {

bool shell_name(const std::string& k) {
  if (k.empty() || !(std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_')) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pandastack::actors;
  using pandastack::Code;
  if (size == 0) return 0;
  bool archived = data[0] & 1;
  std::map<std::string, std::string> context;
  if (!archived) context = {{"app.py", "print(1)\n"}, {"dir/a.txt", "a"}, {"dir/sub/b", "b"}};
  std::map<std::string, std::string> args;
  if (data[0] & 2) args = {{"VERSION", "1.2"}, {"NAME", "x y"}};
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto r = template_from_dockerfile(text, context, args, DockerfileLimits{}, archived);
  if (!r) {
    auto code = r.error().code;
    if (code != Code::invalid_argument && code != Code::not_implemented) std::abort();
    return 0;
  }
  TemplateLimits limits;
  for (auto& [k, v] : r->spec.env)
    if (!shell_name(k)) std::abort();
  if (r->spec.from.empty()) std::abort();
  for (auto& cmd : r->spec.run)
    if (cmd.size() > limits.max_command_bytes) std::abort();
  return 0;
}
