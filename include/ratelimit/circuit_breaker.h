// CircuitBreaker: stops waiting on a store node that keeps failing.
//
// Closed: calls go through; `failure_threshold` consecutive failures (errors
// or timeouts; what counts as one is the caller's: RedisBackend::Report)
// open it. Open: calls are refused at once, so decisions are
// made by the failure mode in microseconds instead of waiting on a dead or
// frozen Redis. After `open_for` it lets exactly one probe through
// (half-open); the probe's success closes it, its failure opens it again for
// twice as long (up to `max_open_for`). A probe that gets no verdict (never
// sent, refused by our own bounds) must be given back; one that is neither
// reported nor given back within `probe_timeout` lapses, so that a lost
// probe cannot keep the breaker open for good. These times run on a
// monotonic clock (Options::clock, Clock::Steady() by default), so a step
// back of the wall clock cannot keep the breaker open past them.
//
//   CircuitBreaker breaker({.failure_threshold = 5});
//   uint64_t probe = 0;
//   if (!breaker.Allow(&probe)) return Unavailable("circuit breaker open");
//   ... call ...; ok ? breaker.OnSuccess() : breaker.OnFailure();
//   ... or, not sent after all: breaker.GiveBack(probe);
//
// Thread-safety: all methods are thread-safe; Allow() on the closed path is
// one atomic load. `on_change` runs under the breaker's lock: keep it short.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
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
    // A probe out longer than this lapses: the next caller probes. Longer than
    // any call may take (its own timeout answers it first).
    std::chrono::milliseconds probe_timeout{1000};
    // A monotonic clock for the open and probe times (a ManualClock in
    // tests). nullptr: Clock::Steady().
    const Clock* clock = nullptr;
    std::function<void(State from, State to)> on_change;
  };

  CircuitBreaker();
  explicit CircuitBreaker(Options options);

  // True if a call may go out now. In half-open, true for exactly one caller
  // (the probe: *probe, if given, is set non-zero for it and zero for anyone
  // else), who must then report OnSuccess or OnFailure, or GiveBack.
  bool Allow(uint64_t* probe = nullptr);
  void OnSuccess();
  void OnFailure();
  // The probe `probe` (from Allow) got no verdict from the node (not sent,
  // or refused by a bound of ours): the next caller may probe at once. A
  // no-op for 0 and for a probe that lapsed or was answered already.
  void GiveBack(uint64_t probe);

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
  uint64_t probe_id_ RL_GUARDED_BY(mu_) = 0;        // the newest probe's
  int64_t probe_lapses_at_ RL_GUARDED_BY(mu_) = 0;  // clock_ micros (monotonic)
};

std::string_view BreakerStateName(CircuitBreaker::State s);

// Why a store could not decide, for metrics and logs. kRefused: any other
// kUnavailable (a connection refused or lost; a Redis node that answered it
// cannot serve now: LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, READONLY, or
// that it refuses writes: OOM, MISCONF, NOREPLICAS).
enum class FailureCause { kTimeout, kRefused, kBreakerOpen, kOverload, kError };
std::string_view FailureCauseName(FailureCause c);  // "timeout", "refused", ...
FailureCause CauseOf(const Status& failure);        // REQUIRES: !failure.ok()

// The status a store returns while its breaker is open.
Status BreakerOpenStatus(std::string_view what);

}  // namespace ratelimit
