// Preview URLs, the runtime's part: recording a sandbox's previews (events of its stream) and the
// proxy's connection to a guest port. The tokens and the HTTP proxy are the gateway's
// (gateway/previews.h).
#include <fcntl.h>
#include <unistd.h>

#include <shared_mutex>

#include "actors/runtime_impl.h"
#include "vmm-driver/network.h"
#include "vmm-driver/port_forward.h"
#include "vmm-driver/vm.h"

namespace pandastack::actors {

Reply<Preview> Runtime::open_preview(const std::string& tenant, const std::string& id,
                                     uint32_t port, bool is_public, uint32_t ttl_seconds) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  // The nonce is chosen here, not in decide(): decisions stay pure.
  Answer a = impl_->ask(
      route(tenant, id, cmd::OpenPreview{port, is_public, ttl_seconds, random_base32(26)}));
  if (!a.ok) return a.error;
  auto it = a.info.previews.find(port);
  if (it == a.info.previews.end())
    return Rejection{Code::internal, "the preview was recorded but is not in the answer"};
  return it->second;
}

Reply<std::vector<Preview>> Runtime::previews(const std::string& tenant, const std::string& id) {
  auto info = get(tenant, id);
  if (!info) return info.error();
  std::vector<Preview> out;
  for (auto& [port, p] : info->previews) out.push_back(p);
  return out;
}

Reply<SandboxInfo> Runtime::close_preview(const std::string& tenant, const std::string& id,
                                          uint32_t port) {
  if (auto no = impl_->refuse_database_sandbox(tenant, id)) return *no;
  return to_reply<SandboxInfo>(impl_->ask(route(tenant, id, cmd::ClosePreview{port})),
                               [](const Answer& a) { return a.info; });
}

Reply<SandboxInfo> Runtime::preview_target(const std::string& id) {
  return to_reply<SandboxInfo>(impl_->ask(caf::make_message(get_atom::value, id)),
                               [](const Answer& a) { return a.info; });
}

Reply<int> Runtime::connect_guest(const std::string& tenant, const std::string& id, uint32_t port,
                                  std::chrono::milliseconds timeout) {
  if (port == 0 || port > 65535)
    return Rejection{Code::invalid_argument, "port must be within 1..65535"};
  // The lease wakes a hibernated sandbox with auto_wake (and refuses any other not running).
  Answer a = impl_->ask(caf::make_message(lease_atom::value, tenant, id));
  if (!a.ok) return a.error;
  int ns = -1;
  {
    std::shared_lock l(a.vm->mu);
    if (!a.vm->vm || !a.vm->vm->config().network)
      return Rejection{Code::network_disabled, "sandbox " + id + " has no network"};
    // A copy of the namespace's handle: the connect does not hold the VM's lock.
    ns = ::fcntl(a.vm->vm->config().network->netns_fd(), F_DUPFD_CLOEXEC, 0);
  }
  if (ns < 0) return Rejection{Code::internal, "cannot copy the sandbox's namespace handle"};
  auto fd = vmm::connect_guest(ns, uint16_t(port), timeout);
  ::close(ns);
  a.vm->last_call_ms = now_ms();  // (use, for the idle timeout)
  if (!fd)
    return Rejection{Code::upstream_unreachable, "nothing accepts connections on port " +
                                                     std::to_string(port) + " in sandbox " + id +
                                                     ": " + fd.error().message};
  return *fd;
}

}  // namespace pandastack::actors
