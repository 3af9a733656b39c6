// Status and StatusOr: how ratelimit reports failures without exceptions.
//
// A denied request is not a failure: it is a Decision with allowed == false.
// A Status says that something could not be decided at all (bad input, the
// store did not answer, the store is full). Callers turn a failed Status into
// a decision through their failure policy.
//
//   StatusOr<Limit> limit = Limit::TokenBucket("burst", 10, 5.0);
//   if (!limit.ok()) std::cerr << limit.status().ToString();
//
// Thread-safety: value types; a const object may be read from many threads.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace ratelimit {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller asked for something impossible or malformed
  kUnavailable,        // the store could not be reached (refused, closed, breaker open)
  kDeadlineExceeded,   // the store did not answer in time; outcome unknown
  kResourceExhausted,  // a bound was hit (queue full, memory store full)
  kInternal,           // the store answered something we cannot interpret
  kNotFound,           // nothing is stored under that key
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: cost 11 exceeds capacity 10"
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }

// Either a T or a non-OK Status. REQUIRES: constructed from a non-OK Status or a value.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT
  StatusOr(T value) : value_(std::move(value)) {}                                  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok()
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;  // OK when value_ is set
  std::optional<T> value_;
};

}  // namespace ratelimit
