// FailureMode: what to answer when the store cannot decide.
//
// A store that is unreachable, late, overloaded or behind an open breaker
// fails with a status (see store.h); a ResilientStore (src/store/resilient_store.h)
// turns that status into a decision by the request's failure mode:
//   open    allowed, marked degraded
//   closed  denied, marked degraded and failed_closed (the face answers its
//           "unavailable" status, e.g. store.closed_status)
//   local   a process-local store decides on the limits divided by the number
//           of instances, marked degraded
//   error   the failure is reported to the caller as it is (the store's
//           status): the face says "unavailable" in its own protocol (the
//           gRPC face: UNAVAILABLE). What every plain store does.
//
//   StatusOr<FailureMode> m = ParseFailureMode("closed");  // FailureMode::kClosed
//   FailureModeName(*m);                                  // "closed"
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "ratelimit/status.h"

namespace ratelimit {

enum class FailureMode { kOpen, kClosed, kLocal, kError };

// "open", "closed", "local", "error".
std::string_view FailureModeName(FailureMode m);
// The inverse of FailureModeName; InvalidArgument naming the choices otherwise.
StatusOr<FailureMode> ParseFailureMode(std::string_view name);

// What a ResilientStore does when the store of a request cannot decide.
struct OnFailure {
  FailureMode mode = FailureMode::kError;  // the default: report the failure
  int expected_instances = 1;              // local: the limits are divided by this
};

}  // namespace ratelimit
