// Errors of the storage folder, as values (RocksDB statuses are converted at this boundary).
#pragma once

#include <string>
#include <utility>

#include "wire/result.h"

namespace pandastack::storage {

enum class ErrorCode {
  conflict,  // append with a stale expected version
  not_found,
  invalid_argument,
  corrupt,   // a record that does not decode
  io_error,  // RocksDB or file system failure
  no_space,  // the store's disk is full (appends fail until space is back)
  closed,    // the store is shutting down
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code = ErrorCode::io_error;
  std::string message;
};

template <typename T>
using Result = pandastack::Result<T, Error>;
using Ok = pandastack::Ok;
using Status = Result<Ok>;

inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

}  // namespace pandastack::storage
