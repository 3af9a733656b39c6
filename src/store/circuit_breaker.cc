#include "ratelimit/circuit_breaker.h"

#include <algorithm>

namespace ratelimit {

std::string_view BreakerStateName(CircuitBreaker::State s) {
  switch (s) {
    case CircuitBreaker::State::kClosed: return "closed";
    case CircuitBreaker::State::kOpen: return "open";
    case CircuitBreaker::State::kHalfOpen: return "half_open";
  }
  return "unknown";
}

CircuitBreaker::CircuitBreaker() : CircuitBreaker(Options{}) {}

CircuitBreaker::CircuitBreaker(Options options)
    : opts_(std::move(options)),
      clock_(opts_.clock != nullptr ? opts_.clock : &Clock::Steady()),
      backoff_(opts_.open_for) {}

bool CircuitBreaker::Allow(uint64_t* probe) {
  if (probe != nullptr) *probe = 0;
  if (state_.load(std::memory_order_acquire) == State::kClosed) return true;
  LockGuard lock(mu_);
  const int64_t now = clock_->NowMicros();
  switch (state_.load(std::memory_order_relaxed)) {
    case State::kClosed: return true;
    case State::kOpen:
      if (now < open_until_) return false;
      MoveTo(State::kHalfOpen);
      break;
    case State::kHalfOpen:
      // A probe nobody reported (a path that lost it) must not keep every
      // later call out for good: past probe_timeout it lapses.
      if (probe_out_ && now < probe_lapses_at_) return false;
      break;
  }
  probe_out_ = true;
  probe_lapses_at_ = now + std::chrono::microseconds(opts_.probe_timeout).count();
  if (probe != nullptr) *probe = ++probe_id_;
  return true;
}

void CircuitBreaker::GiveBack(uint64_t probe) {
  if (probe == 0) return;
  LockGuard lock(mu_);
  // Only the probe still out: an older one's holder must not free a newer one.
  if (state_.load(std::memory_order_relaxed) == State::kHalfOpen && probe_out_ &&
      probe == probe_id_) {
    probe_out_ = false;
  }
}

void CircuitBreaker::OnSuccess() {
  if (state_.load(std::memory_order_acquire) == State::kClosed &&
      consecutive_failures_.load(std::memory_order_relaxed) == 0) {
    return;  // the common case: nothing to reset, no lock
  }
  LockGuard lock(mu_);
  consecutive_failures_ = 0;
  probe_out_ = false;
  backoff_ = opts_.open_for;
  if (state_.load(std::memory_order_relaxed) != State::kClosed) MoveTo(State::kClosed);
}

void CircuitBreaker::OnFailure() {
  LockGuard lock(mu_);
  const State s = state_.load(std::memory_order_relaxed);
  if (s == State::kOpen) return;  // a late failure of a call sent before it opened
  if (s == State::kHalfOpen) {
    probe_out_ = false;
    backoff_ = std::min(backoff_ * 2, opts_.max_open_for);
  } else if (consecutive_failures_.fetch_add(1, std::memory_order_relaxed) + 1 <
             opts_.failure_threshold) {
    return;
  }
  open_until_ = clock_->NowMicros() + std::chrono::microseconds(backoff_).count();
  MoveTo(State::kOpen);
}

namespace {
constexpr std::string_view kBreakerOpen = "circuit breaker open";
}  // namespace

std::string_view FailureCauseName(FailureCause c) {
  switch (c) {
    case FailureCause::kTimeout: return "timeout";
    case FailureCause::kRefused: return "refused";
    case FailureCause::kBreakerOpen: return "breaker_open";
    case FailureCause::kOverload: return "overload";
    case FailureCause::kError: return "error";
  }
  return "error";
}

Status BreakerOpenStatus(std::string_view what) {
  return Unavailable(std::string(what) + ": " + std::string(kBreakerOpen) +
                     " (not waiting on a failing store)");
}

FailureCause CauseOf(const Status& failure) {
  switch (failure.code()) {
    case StatusCode::kDeadlineExceeded: return FailureCause::kTimeout;
    case StatusCode::kResourceExhausted: return FailureCause::kOverload;
    case StatusCode::kUnavailable:
      return failure.message().find(kBreakerOpen) != std::string::npos ? FailureCause::kBreakerOpen
                                                                       : FailureCause::kRefused;
    default: return FailureCause::kError;
  }
}

void CircuitBreaker::MoveTo(State next) {
  const State prev = state_.exchange(next, std::memory_order_acq_rel);
  if (prev != next && opts_.on_change) opts_.on_change(prev, next);
}

}  // namespace ratelimit
