// The one result type of every folder: a value or an error, the error type the folder's own
// (storage::Error, vmm::Error, actors::Rejection). std::expected is C++23; this is its subset.
// [[nodiscard]]: a result dropped on purpose is cast to void, as RocksDB's PermitUncheckedError.
#pragma once

#include <optional>
#include <utility>

namespace pandastack {

template <typename T, typename E>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}
  Result(E error) : error_(std::move(error)) {}
  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& value() & { return *value_; }
  T&& value() && { return std::move(*value_); }
  const T& value() const& { return *value_; }
  T& operator*() & { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  const E& error() const { return error_; }

 private:
  std::optional<T> value_;
  E error_{};
};

// The value of a result that has none but success.
struct Ok {};

}  // namespace pandastack
