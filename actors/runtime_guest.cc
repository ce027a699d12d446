// The runtime's guest operations: exec (blocking and streamed), background processes, files and
// watches. Each takes a lease of the sandbox's VM from its actor (tenant check, a wake if it
// sleeps and auto_wake is set), then calls the guest agent on the caller's thread; the driver's
// errors become the API's codes in one place (rejection_of).
#include <spdlog/spdlog.h>

#include <caf/all.hpp>
#include <mutex>
#include <shared_mutex>
#include <stop_token>

#include "actors/egress_proxies.h"
#include "actors/env.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/runtime_impl.h"

namespace pandastack::actors {

namespace {

// A command the guest could not start: a missing working folder or program is the caller's
// mistake (400, the same code for exec, streams, processes and WebSockets); anything else (the
// guest out of processes) is exec_failed (503, try again).
std::optional<Rejection> start_error(const std::string& error) {
  if (error.empty()) return std::nullopt;
  if (error.rfind("cwd ", 0) == 0) return Rejection{Code::invalid_cwd, error};
  if (error.rfind("no user '", 0) == 0) return Rejection{Code::unknown_user, error};
  if (error.rfind("exec ", 0) == 0 && (error.find("No such file") != std::string::npos ||
                                       error.find("Permission denied") != std::string::npos ||
                                       error.find("Not a directory") != std::string::npos))
    return Rejection{Code::command_not_found, error};
  if (error.rfind("exec ", 0) == 0) return Rejection{Code::exec_failed, error};
  return std::nullopt;
}

Rejection rejection_of(const vmm::Error& e) {
  if (e.code == vmm::ErrorCode::cancelled) return {Code::cancelled, "the command was cancelled"};
  // The guest's file error codes: the caller's mistakes are 4xx with their own codes.
  static const std::map<std::string, Code> guest = {{"not_found", Code::file_not_found},
                                                    {"is_a_directory", Code::is_a_directory},
                                                    {"not_a_directory", Code::not_a_directory},
                                                    {"exists", Code::file_exists},
                                                    {"not_empty", Code::directory_not_empty},
                                                    {"permission_denied", Code::permission_denied},
                                                    {"no_space", Code::no_space},
                                                    {"invalid_argument", Code::invalid_argument},
                                                    {"io_error", Code::io_error},
                                                    {"too_many", Code::too_many_directories}};
  if (auto it = guest.find(e.guest_code); it != guest.end()) return {it->second, e.message};
  if (auto start = start_error(e.message)) return *start;
  switch (e.code) {
    case vmm::ErrorCode::not_found:
      return {Code::file_not_found, e.message};
    case vmm::ErrorCode::invalid_argument:
      return {Code::invalid_argument, e.message};
    case vmm::ErrorCode::timeout:
      return {Code::timeout, e.message};
    case vmm::ErrorCode::too_large:
      return {Code::file_too_large, e.message};
    case vmm::ErrorCode::too_many:
      return {Code::too_many_processes, e.message};
    default:
      return {Code::agent_error, e.message};
  }
}

// Runs `f(agent, stop)` against the leased VM under its shared lock. `stop` fires when the caller
// asks (`user`) or when the sandbox is hibernated or killed.
template <typename T, typename F>
Reply<T> with_vm(VmHandle& h, std::stop_token user, F&& f) {
  std::stop_source mine;
  auto calls = h.calls_stop();
  std::stop_callback on_user(user, [&] { mine.request_stop(); });
  std::stop_callback on_sandbox(calls->get_token(), [&] { mine.request_stop(); });
  // In flight until it returns: the idle timeout does not count while a call runs.
  struct InFlight {
    VmHandle& h;
    explicit InFlight(VmHandle& handle) : h(handle) { ++h.calls_in_flight; }
    ~InFlight() {
      h.last_call_ms = now_ms();
      --h.calls_in_flight;
    }
  } in_flight(h);
  std::shared_lock l(h.mu);
  if (!h.vm) return Rejection{Code::sandbox_not_running, "the sandbox's VM is gone"};
  if (!h.vm->has_agent() || h.vm->agent().disconnected()) {
    // The connection to the guest agent broke (every call on it fails): connect again, alone
    // with the VM (calls on the broken connection end at once).
    l.unlock();
    {
      std::unique_lock x(h.mu);
      if (h.vm && h.vm->alive() && (!h.vm->has_agent() || h.vm->agent().disconnected())) {
        auto again = h.vm->reconnect_agent();
        if (again)
          spdlog::warn("vm {}: the guest agent's connection broke; connected again",
                       h.vm->config().name);
        else
          spdlog::warn("vm {}: the guest agent's connection broke and connecting again failed: {}",
                       h.vm->config().name, again.error().message);
      }
    }
    l.lock();
    if (!h.vm) return Rejection{Code::sandbox_not_running, "the sandbox's VM is gone"};
    if (!h.vm->has_agent())
      return Rejection{Code::agent_error, "the guest agent does not answer a new connection"};
  }
  auto r = f(h.vm->agent(), mine.get_token());
  if (!r) {
    if (calls->stop_requested() && !user.stop_requested())
      return Rejection{Code::sandbox_stopped,
                       "the sandbox was stopped or hibernated during the call"};
    return rejection_of(r.error());
  }
  return T(std::move(*r));
}

std::string describe_command(const vmm::ExecRequest& r) {
  std::string c;
  if (r.argv.empty()) {
    c = r.shell;
  } else {
    for (auto& a : r.argv) c += (c.empty() ? "" : " ") + a;
  }
  constexpr size_t kMax = 1024;  // the audit log keeps the start of long commands
  if (c.size() > kMax) c = c.substr(0, kMax) + "...";
  return c;
}

}  // namespace

template <typename T, typename F>
Reply<T> leased(Runtime::Impl& impl, const std::string& tenant, const std::string& id,
                std::stop_token stop, F&& f) {
  Answer a = impl.ask(caf::make_message(lease_atom::value, tenant, id));
  if (!a.ok) return a.error;
  return with_vm<T>(*a.vm, stop, std::forward<F>(f));
}

namespace {
// A slot of the tenant's execs quota for as long as it lives (none when refused).
class ExecSlot {
 public:
  ExecSlot(Env& env, const std::string& tenant) : env_(env), tenant_(tenant) {
    uint32_t limit = env.quotas_of(tenant).execs;
    std::lock_guard l(env.quotas_mu);
    auto& n = env.execs_running[tenant];
    if (n >= limit)
      refused_ = quota_exceeded("execs", limit, n, 1);
    else
      ++n;
  }
  ~ExecSlot() {
    if (refused_) return;
    std::lock_guard l(env_.quotas_mu);
    if (--env_.execs_running[tenant_] == 0) env_.execs_running.erase(tenant_);
  }
  const std::optional<Rejection>& refused() const { return refused_; }

 private:
  Env& env_;
  std::string tenant_;
  std::optional<Rejection> refused_;
};

// `req` with the sandbox's secret placeholders (and trust store paths) in its environment; what
// the caller set itself wins.
vmm::ExecRequest with_secret_env(Env& env, const std::string& id, vmm::ExecRequest req) {
  for (auto& [k, v] : secret_env(env, id)) req.env.emplace(k, v);
  return req;
}

Reply<vmm::ExecResult> run_exec(Runtime::Impl& impl, const std::string& tenant,
                                const std::string& id, const vmm::ExecRequest& given,
                                vmm::OutputCallback cb, std::stop_token stop) {
  ExecSlot slot(*impl.env, tenant);
  if (slot.refused()) return *slot.refused();
  Answer a = impl.ask(caf::make_message(exec_atom::value, tenant, id, describe_command(given)));
  if (!a.ok) return a.error;
  auto req = with_secret_env(*impl.env, id, given);
  auto t0 = std::chrono::steady_clock::now();
  auto r = with_vm<vmm::ExecResult>(*a.vm, stop, [&](vmm::AgentClient& agent, std::stop_token t) {
    return cb ? agent.exec_stream(req, cb, t) : agent.exec(req, t);
  });
  // A command that ended without a result (cancelled, the sandbox stopped) ran until now.
  auto ran_ms = uint32_t(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  cmd::ExecFinished f{a.exec_id, -1, ran_ms, false};
  if (r) f = {a.exec_id, r->exit_code, uint32_t(r->duration_us / 1000), r->timed_out};
  // Recorded before the answer; a sandbox killed meanwhile refuses it (its execs ended with it).
  impl.ask(route(tenant, id, f));
  if (r && !r->error.empty())
    return start_error(r->error).value_or(Rejection{Code::exec_failed, r->error});
  return r;
}
}  // namespace

namespace {
template <typename F>
vmm::Result<bool> as_bool(F&& f) {
  auto s = f();
  if (!s) return s.error();
  return true;
}
}  // namespace

Reply<vmm::ExecResult> Runtime::exec(const std::string& tenant, const std::string& id,
                                     const vmm::ExecRequest& req, std::stop_token stop) {
  return run_exec(*impl_, tenant, id, req, nullptr, stop);
}

Reply<vmm::ExecResult> Runtime::exec_stream(const std::string& tenant, const std::string& id,
                                            const vmm::ExecRequest& req,
                                            vmm::OutputCallback on_output, std::stop_token stop) {
  return run_exec(*impl_, tenant, id, req, std::move(on_output), stop);
}

// An audit record of what the API did in the guest (after it happened; recorded by its sandbox,
// in its event stream and the audit log).
void record(Runtime::Impl& impl, const std::string& tenant, const std::string& id, Command c) {
  Answer a = impl.ask(route(tenant, id, std::move(c)));
  if (!a.ok) spdlog::warn("sandbox {}: audit record not written: {}", id, a.error.message);
}

Reply<uint32_t> Runtime::start_process(const std::string& tenant, const std::string& id,
                                       const vmm::ExecRequest& req) {
  uint32_t limit = impl_->env->config.limits.max_processes;
  auto pid = leased<uint32_t>(
      *impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) -> vmm::Result<uint32_t> {
        // Counted in the guest (the processes that still run), before another starts.
        auto running = ag.list_processes();
        if (!running) return running.error();
        uint32_t n = 0;
        for (auto& p : *running) n += p.running;
        if (n >= limit)
          return vmm::make_error(
              vmm::ErrorCode::too_many,
              "a sandbox runs at most " + std::to_string(limit) + " background processes at once");
        return ag.start_process(with_secret_env(*impl_->env, id, req));
      });
  if (pid) record(*impl_, tenant, id, cmd::RecordProcess{*pid, describe_command(req)});
  return pid;
}

Reply<std::vector<vmm::ProcessInfo>> Runtime::list_processes(const std::string& tenant,
                                                             const std::string& id) {
  return leased<std::vector<vmm::ProcessInfo>>(
      *impl_, tenant, id, {},
      [&](vmm::AgentClient& ag, std::stop_token) { return ag.list_processes(); });
}

Reply<bool> Runtime::kill_process(const std::string& tenant, const std::string& id, uint32_t pid,
                                  int signal) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.kill_process(pid, signal); });
  });
}

Reply<bool> Runtime::write_stdin(const std::string& tenant, const std::string& id, uint32_t pid,
                                 std::string_view data, bool close) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.write_stdin(pid, data, close); });
  });
}

Reply<vmm::ExecResult> Runtime::stream_process(const std::string& tenant, const std::string& id,
                                               uint32_t pid, vmm::OutputCallback on_output,
                                               std::stop_token stop) {
  ExecSlot slot(*impl_->env, tenant);  // a stream holds a worker as long as a command does
  if (slot.refused()) return *slot.refused();
  return leased<vmm::ExecResult>(*impl_, tenant, id, stop,
                                 [&](vmm::AgentClient& ag, std::stop_token t) {
                                   return ag.stream_process(pid, on_output, t);
                                 });
}

Reply<bool> Runtime::resize_pty(const std::string& tenant, const std::string& id, uint32_t pid,
                                uint16_t cols, uint16_t rows) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.resize_pty(pid, cols, rows); });
  });
}

Reply<bool> Runtime::watch(const std::string& tenant, const std::string& id,
                           const std::string& path, bool recursive, std::function<void()> on_ready,
                           vmm::WatchCallback on_events, std::stop_token stop, bool include_entry) {
  ExecSlot slot(*impl_->env, tenant);  // a watch holds a worker as long as a stream does
  if (slot.refused()) return *slot.refused();
  return leased<bool>(*impl_, tenant, id, stop, [&](vmm::AgentClient& ag, std::stop_token t) {
    return as_bool(
        [&] { return ag.watch(path, recursive, on_ready, on_events, t, include_entry); });
  });
}

Reply<std::string> Runtime::read_file(const std::string& tenant, const std::string& id,
                                      const std::string& path, uint64_t max_bytes) {
  auto r = leased<std::string>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return ag.read_file(path, max_bytes);
  });
  return r;
}

Reply<vmm::FileRange> Runtime::read_file_range(const std::string& tenant, const std::string& id,
                                               const std::string& path, uint64_t offset,
                                               uint64_t length) {
  return leased<vmm::FileRange>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return ag.read_range(path, offset, length);
  });
}

Reply<bool> Runtime::write_file(const std::string& tenant, const std::string& id,
                                const std::string& path, std::string_view data, uint32_t mode,
                                uint64_t offset, const std::string& owner,
                                const std::optional<std::map<std::string, std::string>>& metadata) {
  if (metadata && offset != 0)
    return Rejection{Code::invalid_argument, "metadata is set by a write at offset 0"};
  std::optional<uint64_t> found;  // a part's file of another size
  auto r = leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&]() -> vmm::Status {
      if (offset == 0) return ag.write_file(path, data, mode, true, false, owner, metadata);
      auto st = ag.stat(path);
      if (!st) return st.error();
      if (st->size != offset) {
        found = st->size;
        return vmm::Ok{};
      }
      return ag.write_file(path, data, mode, false, /*append=*/true, owner);
    });
  });
  if (r && found)
    return Rejection{Code::offset_mismatch, path + " is " + std::to_string(*found) +
                                                " bytes: its next part goes at offset " +
                                                std::to_string(*found)};
  if (r) record(*impl_, tenant, id, cmd::RecordFile{path, offset + data.size(), false});
  return r;
}

Reply<std::vector<vmm::FileStat>> Runtime::list_dir(const std::string& tenant,
                                                    const std::string& id,
                                                    const std::string& path) {
  return leased<std::vector<vmm::FileStat>>(
      *impl_, tenant, id, {},
      [&](vmm::AgentClient& ag, std::stop_token) { return ag.list_dir(path); });
}

Reply<vmm::FileStat> Runtime::stat(const std::string& tenant, const std::string& id,
                                   const std::string& path) {
  return leased<vmm::FileStat>(
      *impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) { return ag.stat(path); });
}

Reply<bool> Runtime::remove(const std::string& tenant, const std::string& id,
                            const std::string& path, bool recursive) {
  auto r = leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.remove(path, recursive); });
  });
  if (r) record(*impl_, tenant, id, cmd::RecordFile{path, 0, true});
  return r;
}

Reply<bool> Runtime::rename(const std::string& tenant, const std::string& id,
                            const std::string& from, const std::string& to) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.rename(from, to); });
  });
}

Reply<bool> Runtime::mkdir(const std::string& tenant, const std::string& id,
                           const std::string& path, bool parents, const std::string& owner) {
  return leased<bool>(*impl_, tenant, id, {}, [&](vmm::AgentClient& ag, std::stop_token) {
    return as_bool([&] { return ag.mkdir(path, parents, 0, owner); });
  });
}

}  // namespace pandastack::actors
