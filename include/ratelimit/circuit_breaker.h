// CircuitBreaker: stops waiting on a store node that keeps failing.
//
// Closed: calls go through; `failure_threshold` consecutive failures (errors
// or timeouts) open it. Open: calls are refused at once, so decisions are
// made by the failure mode in microseconds instead of waiting on a dead or
// frozen Redis. After `open_for` it lets exactly one probe through
// (half-open); the probe's success closes it, its failure opens it again for
// twice as long (up to `max_open_for`).
//
//   CircuitBreaker breaker({.failure_threshold = 5});
//   if (!breaker.Allow()) return Unavailable("circuit breaker open");
//   ... call ...; ok ? breaker.OnSuccess() : breaker.OnFailure();
//
// Thread-safety: all methods are thread-safe; Allow() on the closed path is
// one atomic load. `on_change` runs under the breaker's lock: keep it short.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string_view>

#include "ratelimit/clock.h"
#include "ratelimit/status.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit {

class CircuitBreaker {
 public:
  enum class State { kClosed = 0, kOpen = 1, kHalfOpen = 2 };

  struct Options {
    int failure_threshold = 5;
    std::chrono::milliseconds open_for{100};
    std::chrono::milliseconds max_open_for{500};
    const Clock* clock = nullptr;  // nullptr: Clock::System()
    std::function<void(State from, State to)> on_change;
  };

  CircuitBreaker();
  explicit CircuitBreaker(Options options);

  // True if a call may go out now. In half-open, true for exactly one caller
  // (the probe), who must then report OnSuccess or OnFailure.
  bool Allow();
  void OnSuccess();
  void OnFailure();

  State state() const { return state_.load(std::memory_order_acquire); }

 private:
  void MoveTo(State next) RL_REQUIRES(mu_);

  Options opts_;
  const Clock* clock_;
  std::atomic<State> state_{State::kClosed};
  Mutex mu_;
  std::atomic<int> consecutive_failures_{0};  // written under mu_
  int64_t open_until_ RL_GUARDED_BY(mu_) = 0;
  std::chrono::milliseconds backoff_ RL_GUARDED_BY(mu_){0};
  bool probe_out_ RL_GUARDED_BY(mu_) = false;
};

std::string_view BreakerStateName(CircuitBreaker::State s);

// Why a store could not decide, for metrics and logs.
enum class FailureCause { kTimeout, kRefused, kBreakerOpen, kOverload, kError };
std::string_view FailureCauseName(FailureCause c);  // "timeout", "refused", ...
FailureCause CauseOf(const Status& failure);        // REQUIRES: !failure.ok()

// The status a store returns while its breaker is open.
Status BreakerOpenStatus(std::string_view what);

}  // namespace ratelimit
