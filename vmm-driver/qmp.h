// A synchronous client for QEMU's QMP control socket. Not thread-safe: one owner (the Vm).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vmm-driver/error.h"
#include "wire/json.h"

namespace pandastack::vmm {

class QmpClient {
 public:
  // Connects to `socket_path` (retrying until it exists or `deadline` passes), reads the greeting
  // and negotiates capabilities. `alive`, when given, is asked between retries: a QEMU that
  // exited is reported at once, not at the deadline. `peer_uid` >= 0: the socket must be served
  // by that uid (a jailed QEMU's own): a socket replaced by a link to another VM's, or to the
  // daemon's, is refused.
  static Result<std::unique_ptr<QmpClient>> connect(const std::string& socket_path,
                                                    std::chrono::milliseconds deadline,
                                                    const std::function<bool()>& alive = nullptr,
                                                    int64_t peer_uid = -1);
  ~QmpClient();
  QmpClient(const QmpClient&) = delete;
  QmpClient& operator=(const QmpClient&) = delete;

  // Runs one command and returns its "return" value; a QMP "error" becomes ErrorCode::qmp_error.
  // With `fd` >= 0 the descriptor is passed along (SCM_RIGHTS), as `getfd` expects.
  Result<wire::Json> execute(const std::string& command, const wire::Json& arguments = {},
                             std::chrono::milliseconds timeout = std::chrono::seconds(10), int fd = -1);

  // Waits for an event named `name` whose "data" satisfies `match` (events already received
  // count; the matching one is consumed).
  Result<wire::Json> wait_event(const std::string& name, const std::function<bool(const wire::Json&)>& match,
                                std::chrono::milliseconds timeout);

  // QEMU's version from the greeting ("7.2.22").
  const std::string& qemu_version() const { return version_; }

  // Asynchronous events received while waiting for replies, oldest first.
  std::vector<wire::Json> take_events();

 private:
  explicit QmpClient(int fd) : fd_(fd) {}
  Result<wire::Json> read_message(std::chrono::steady_clock::time_point deadline);

  int fd_;
  std::string version_;
  std::string buffer_;
  std::vector<wire::Json> events_;
  static constexpr size_t kMaxLine = 1 << 20;  // bytes of one message
  static constexpr size_t kMaxEvents = 1024;   // unclaimed events kept
};

}  // namespace pandastack::vmm
