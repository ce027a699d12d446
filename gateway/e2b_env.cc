// A sandbox's create-time envVars (E2B's `envs`), kept in its guest and this host's memory, never
// as metadata (see e2b.h).
#include <spdlog/spdlog.h>

#include <mutex>
#include <unordered_map>

#include "gateway/e2b.h"

namespace pandastack::gateway::e2b {

namespace {

// The file as the guest holds it, at most: kMaxEnvVars of the largest, JSON-escaped (\u00XX).
constexpr uint64_t kMaxEnvFileBytes = 8 << 20;
// What this host remembers, at most: past it, forgotten (read again from the guests).
constexpr size_t kMaxCachedBytes = 16 << 20;

struct EnvCache {
  std::mutex mu;
  std::unordered_map<std::string, EnvVars> by_sandbox;  // tenant/id
  size_t bytes = 0;
};

EnvCache& cache() {
  static EnvCache c;
  return c;
}

size_t size_of(const EnvVars& env) {
  size_t n = 0;
  for (auto& [k, v] : env) n += k.size() + v.size() + 64;
  return n;
}

void remember(const std::string& key, const EnvVars& env) {
  auto& c = cache();
  std::lock_guard lock(c.mu);
  if (c.by_sandbox.count(key)) return;
  if (c.bytes + size_of(env) > kMaxCachedBytes) {
    c.by_sandbox.clear();
    c.bytes = 0;
  }
  c.bytes += size_of(env);
  c.by_sandbox.emplace(key, env);
}

std::optional<EnvVars> remembered(const std::string& key) {
  auto& c = cache();
  std::lock_guard lock(c.mu);
  auto it = c.by_sandbox.find(key);
  if (it == c.by_sandbox.end()) return std::nullopt;
  return it->second;
}

// What is wrong with these envVars, or "".
std::string check(const EnvVars& env) {
  if (env.size() > kMaxEnvVars) return "at most " + std::to_string(kMaxEnvVars) + " envVars";
  for (auto& [k, v] : env) {
    if (k.empty() || k.size() > 128 || k.find_first_of(std::string_view("=\0", 2)) != k.npos)
      return "an envVars name is 1..128 bytes without '=' or NUL";
    if (v.size() > kMaxEnvValue || v.find('\0') != v.npos)
      return "an envVars value is at most " + std::to_string(kMaxEnvValue) + " bytes, without NUL";
  }
  return "";
}

}  // namespace

EnvVars env_vars(const Json& j) {
  EnvVars out = string_object(j, "envVars");
  if (auto bad = check(out); !bad.empty()) throw ApiError{Code::invalid_argument, bad};
  return out;
}

std::string encode_env(const EnvVars& env) {
  Json j = Json::object();
  for (auto& [k, v] : env) j.set(k, v);
  return j.dump();
}

std::optional<EnvVars> decode_env(std::string_view text) {
  auto j = Json::parse(text);
  if (!j || !j->is_object()) return std::nullopt;
  try {
    return env_vars(*j);  // (checked as a request's envVars are)
  } catch (const ApiError&) {
    return std::nullopt;
  }
}

void keep_env(Server& gw, const std::string& tenant, const std::string& id, const EnvVars& env) {
  unwrap(gw.rt.write_file(tenant, id, kEnvFile, encode_env(env), 0600));
  remember(tenant + "/" + id, env);
}

EnvVars sandbox_env(Server& gw, const actors::SandboxInfo& s) {
  EnvVars env;
  for (auto& [k, v] : s.metadata)
    if (k.rfind(kEnvPrefix, 0) == 0) env[k.substr(std::string(kEnvPrefix).size())] = v;
  std::string key = s.tenant + "/" + s.id;
  auto kept = remembered(key);
  if (!kept) {
    auto text = gw.rt.read_file(s.tenant, s.id, kEnvFile, kMaxEnvFileBytes);
    if (text) {
      kept = decode_env(*text);
      if (!kept) {
        // The guest changed it into something else: its processes start without it.
        spdlog::warn("e2b env: sandbox={} {} is not an envVars file; ignored", s.id, kEnvFile);
        kept = EnvVars{};
      }
    } else if (text.error().code == Code::file_not_found) {
      kept = EnvVars{};  // created without envVars
    } else {
      unwrap(std::move(text));  // the sandbox cannot answer: neither could its process
    }
    remember(key, *kept);
  }
  for (auto& [k, v] : *kept) env[k] = v;
  return env;
}

}  // namespace pandastack::gateway::e2b
