// The four rate limiting algorithms as pure arithmetic on compact state.
//
// No clock, no locks, no I/O: each function takes the stored state (or the
// fresh state when nothing is stored), `now` in microseconds since the epoch
// and the cost, and returns the Decision and, when allowed, the next state.
// RedisStore's Lua scripts implement exactly the same arithmetic; the
// conformance suite (tests/conformance_test.cc) keeps the two in step.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "ratelimit/decision.h"
#include "ratelimit/limit.h"

namespace ratelimit::core {

// 16 bytes per (client, limit):
//   token bucket:   t = theoretical arrival time (us); n0, n1 unused
//   leaky bucket:   the same (the time at which the queue is empty)
//   fixed window:   t = window index; n1 = count in that window
//                   (a calendar quota: t = the window's start in us, n0 =
//                   its length in seconds, n1 = the count)
//   sliding window: t = index of the current window; n0 = count of the
//                   previous window, n1 = count of the current one
// The all-zero state is "fresh" (never seen, or expired).
struct CompactState {
  int64_t t = 0;
  int32_t n0 = 0;
  int32_t n1 = 0;
  friend bool operator==(const CompactState&, const CompactState&) = default;
};

struct Evaluation {
  Decision decision;
  CompactState next;  // the state to store when decision.allowed (equal to the input otherwise)
};

// Token bucket as GCRA. T is the interval per token, tau = capacity * T the
// burst tolerance. The state is the theoretical arrival time (TAT): the time
// at which the bucket would be full again. A request of cost n is allowed iff
// max(TAT, now) + n*T - tau <= now.
inline Evaluation TokenBucket(const Limit& l, CompactState s, int64_t now, int64_t cost) {
  const int64_t interval = l.interval_micros();
  const int64_t tau = l.window_micros();
  const int64_t tat = std::max(s.t, now);
  const int64_t new_tat = tat + cost * interval;
  const int64_t allow_at = new_tat - tau;
  Evaluation e{.decision = {.limit = l.limit()}, .next = s};
  if (allow_at <= now) {
    e.decision.allowed = true;
    e.decision.remaining = l.IntervalsIn(std::max<int64_t>(0, tau - (new_tat - now)));
    e.decision.reset_after = std::chrono::microseconds(new_tat - now);
    e.next.t = new_tat;
  } else {
    e.decision.remaining = l.IntervalsIn(std::max<int64_t>(0, tau - (tat - now)));
    e.decision.retry_after = std::chrono::microseconds(allow_at - now);
    e.decision.reset_after = std::chrono::microseconds(tat - now);
  }
  return e;
}

// Every algorithm but the token bucket (Evaluate's out-of-line part).
Evaluation EvaluateOther(const Limit& limit, CompactState state, int64_t now, int64_t cost);

// REQUIRES: limit.algorithm() != kSlidingLog; 0 <= cost <= limit.limit(); now >= 0.
// The token bucket, the default, is inline: the memory store's lock-free
// path decides without a call, its state and decision kept in registers
// (docs/performance.md, benchmark 5d).
inline Evaluation Evaluate(const Limit& limit, CompactState state, int64_t now, int64_t cost) {
  assert(cost >= 0 && cost <= limit.limit());
  if (limit.algorithm() == Algorithm::kTokenBucket) return TokenBucket(limit, state, now, cost);
  return EvaluateOther(limit, state, now, cost);
}

// A check of several limits takes from all of them or from none. When one
// denies, nothing is taken, and every limit that would have allowed answers
// for its state as it stands: Evaluate at cost 0 (remaining and reset_after
// unchanged), with no delay, since no request is admitted. Both stores build a
// denied answer this way; check.lua does the same.
// REQUIRES: as Evaluate.
Decision Standing(const Limit& limit, CompactState state, int64_t now);

// Leaky bucket (interval_us per request): the delay of an allowed request from its reset_after (the
// time until the queue is empty, this request's `cost` slots included). The
// Redis script returns only reset_after; both stores derive the delay here.
std::chrono::microseconds LeakyDelay(int64_t interval_us, std::chrono::microseconds reset_after,
                                     int64_t cost);

// The time (us since the epoch) from which `state` is equivalent to the fresh
// state and may be forgotten. REQUIRES: not sliding log.
int64_t ExpiresAt(const Limit& limit, CompactState state);

// Settlement (include/ratelimit/store.h, SettleRequest): the state after
// adding `delta` (< 0: a refund) to what the state holds. A bucket may go
// into debt, at most kMaxDebtMicros of refill beyond its capacity; a refund
// stops at a full bucket. A window's current counter stays in [0, limit].
// REQUIRES: not sliding log; |delta| <= kMaxSettleDelta; now >= 0.
inline constexpr int64_t kMaxDebtMicros = Limit::kMaxWindowMicros;
CompactState SettleState(const Limit& limit, CompactState state, int64_t now, int64_t delta);
// The state as the next request of cost 1 meets it, taking nothing: allowed
// and retry_after of a cost-1 Evaluate, remaining and reset_after of Standing.
Decision Probe(const Limit& limit, CompactState state, int64_t now);

// Sliding log. `log` holds one timestamp per unit of cost, ascending. Entries
// at or before now - window are no longer counted. When allowed, the caller
// prunes and appends `cost` copies of `now` (see ApplyLog).
// REQUIRES: limit.algorithm() == kSlidingLog; 0 <= cost <= limit.limit().
Decision EvaluateLog(const Limit& limit, std::span<const int64_t> log, int64_t now, int64_t cost);
void ApplyLog(const Limit& limit, std::vector<int64_t>& log, int64_t now, int64_t cost);
// The sliding log's Standing: EvaluateLog at cost 0.
Decision StandingLog(const Limit& limit, std::span<const int64_t> log, int64_t now);
// Drops entries that no longer count. Returns true when the log is empty.
bool PruneLog(const Limit& limit, std::vector<int64_t>& log, int64_t now);

}  // namespace ratelimit::core
