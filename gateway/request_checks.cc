// What the API accepts of a request before it reaches a sandbox: guest paths and commands
// (argv/shell, environment, stdin, user, cwd, timeout) within the limits, each refusal a
// machine-readable code (invalid_path, invalid_argument, body_too_large).
#include <algorithm>
#include <cctype>

#include "gateway/rest.h"
#include "gateway/server.h"

namespace pandastack::gateway {

std::string Server::guest_path(const Request& r, const char* name) {
  auto p = r.q(name);
  if (!p)
    throw ApiError{Code::invalid_path, std::string("query parameter '") + name + "' is required"};
  if (auto e = check_guest_path(*p, limits.max_path_bytes)) throw ApiError{Code::invalid_path, *e};
  return *p;
}

std::string Server::checked_path(const std::string& p) {
  if (auto e = check_guest_path(p, limits.max_path_bytes)) throw ApiError{Code::invalid_path, *e};
  return p;
}

vmm::ExecRequest Server::exec_request(const Json& j, bool with_timeout) {
  Fields f(j, {"cmd", "argv", "env", "cwd", "stdin", "stdin_encoding", "timeout_seconds", "user"});
  vmm::ExecRequest e;
  e.shell = f.str("cmd");
  e.argv = f.string_list("argv");
  e.stdin_data = f.str("stdin");
  auto enc = f.str("stdin_encoding", "utf-8");
  if (enc == "base64") {
    auto raw = base64_decode(e.stdin_data);
    if (!raw) throw ApiError{Code::invalid_argument, "stdin is not valid base64"};
    e.stdin_data = std::move(*raw);
  } else if (enc != "utf-8") {
    throw ApiError{Code::invalid_argument, "stdin_encoding must be \"utf-8\" or \"base64\""};
  }
  e.env = f.string_map("env");
  e.cwd = f.str("cwd");
  e.user = f.str("user");
  if (auto refused = check_exec(e, limits)) throw ApiError{refused->code, refused->message};
  if (with_timeout) {
    e.timeout_ms = uint32_t(f.integer("timeout_seconds", limits.default_exec_timeout_s, 1,
                                      limits.max_exec_timeout_s)) *
                   1000;
  } else if (f.has("timeout_seconds")) {
    e.timeout_ms = uint32_t(f.integer("timeout_seconds", 0, 1, limits.max_exec_timeout_s)) * 1000;
  }
  return e;
}

void Server::observe_exec(Clock::time_point t0) {
  std::lock_guard l(metrics_mu);
  ++execs;
  exec_latency.observe(std::chrono::duration<double>(Clock::now() - t0).count());
}

bool valid_user_name(std::string_view name) {
  if (name.empty() || name.size() > 32) return false;
  if (!(std::islower((unsigned char)name[0]) || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::islower((unsigned char)c) || std::isdigit((unsigned char)c) || c == '_' || c == '-';
  });
}

std::optional<actors::Rejection> check_exec(vmm::ExecRequest& e, const Limits& limits) {
  if (e.shell.empty() == e.argv.empty())
    return actors::Rejection{Code::invalid_argument,
                             "give exactly one of cmd (a shell command) or argv"};
  // A NUL byte would cut the string short in the guest: refused, never truncated.
  auto has_nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
  if (has_nul(e.shell) || std::any_of(e.argv.begin(), e.argv.end(), has_nul))
    return actors::Rejection{Code::invalid_argument, "the command contains a NUL byte"};
  for (auto& [k, v] : e.env) {
    if (k.empty() || k.find('=') != std::string::npos || has_nul(k))
      return actors::Rejection{
          Code::invalid_argument,
          "environment variable names are non-empty, without '=' or NUL: '" + k + "'"};
    if (has_nul(v))
      return actors::Rejection{Code::invalid_argument,
                               "the value of " + k + " contains a NUL byte"};
  }
  size_t size = e.shell.size() + e.stdin_data.size();
  for (auto& a : e.argv) size += a.size() + 1;
  for (auto& [k, v] : e.env) size += k.size() + v.size() + 2;
  if (size > limits.max_command_bytes)
    return actors::Rejection{Code::body_too_large, "command, environment and stdin exceed " +
                                                       std::to_string(limits.max_command_bytes) +
                                                       " bytes"};
  if (!e.user.empty() && !valid_user_name(e.user))
    return actors::Rejection{Code::invalid_argument,
                             "user is an account name of the guest: 1 to 32 of a-z 0-9 _ - "
                             "(starting with a letter or _)"};
  if (!e.cwd.empty())
    if (auto err = check_guest_path(e.cwd, limits.max_path_bytes))
      return actors::Rejection{Code::invalid_path, *err};
  e.max_output_bytes = limits.max_exec_output_bytes;
  return std::nullopt;
}

}  // namespace pandastack::gateway
