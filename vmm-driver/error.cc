#include "vmm-driver/error.h"

namespace pandastack::vmm {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::spawn_failed:
      return "spawn_failed";
    case ErrorCode::boot_failed:
      return "boot_failed";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::qmp_error:
      return "qmp_error";
    case ErrorCode::agent_error:
      return "agent_error";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::guest_error:
      return "guest_error";
    case ErrorCode::io_error:
      return "io_error";
    case ErrorCode::cancelled:
      return "cancelled";
    case ErrorCode::too_large:
      return "too_large";
    case ErrorCode::too_many:
      return "too_many";
  }
  return "unknown";
}

}  // namespace pandastack::vmm
