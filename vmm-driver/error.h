// Errors of the VMM driver, as values. One code enum for the folder; every error carries a
// message a person can act on (for boot failures: the tail of the guest console).
#pragma once

#include <string>
#include <utility>

#include "wire/result.h"

namespace pandastack::vmm {

enum class ErrorCode {
  invalid_argument,  // bad config or request
  spawn_failed,      // QEMU could not be started
  boot_failed,       // the guest did not come up (message has the console tail)
  timeout,           // a deadline passed
  qmp_error,         // QEMU refused a QMP command
  agent_error,       // the agent channel failed (disconnect, protocol error)
  not_found,         // guest file or process does not exist
  guest_error,       // a guest operation failed for another reason (message says which)
  io_error,          // host-side file or socket error
  cancelled,         // the caller cancelled the operation (its stop token fired)
  too_large,         // a file is larger than the caller's limit
  too_many,          // a count limit of the caller's was reached
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::io_error;
  std::string message;
  std::string guest_code;  // for guest file errors: the agent's code ("not_found", "exists", ...)
};

// The result of an operation that can fail: a value or an Error (wire/result.h).
template <typename T>
using Result = pandastack::Result<T, Error>;
using Ok = pandastack::Ok;
using Status = Result<Ok>;

inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message), {}};
}

}  // namespace pandastack::vmm
