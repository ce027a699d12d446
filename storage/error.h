// Errors of the storage folder, as values (RocksDB statuses are converted at this boundary).
#pragma once

#include <optional>
#include <string>
#include <utility>

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
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}
  Result(Error error) : error_(std::move(error)) {}
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& operator*() & { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  const Error& error() const { return error_; }

 private:
  std::optional<T> value_;
  Error error_{};
};

struct Ok {};
using Status = Result<Ok>;

inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

}  // namespace pandastack::storage
