// TokenPrefetch: tokens taken ahead for hot keys of token-bucket limits that
// opt in (`prefetch: n`, Limit::prefetch()). A RedisStore instance that asks
// Redis about the same (key, limit) twice within a prefetch lifetime takes up
// to n tokens in one script call (the "T" evaluator of check.lua), answers
// the request with one of them and keeps the rest here, spending them on the
// next cost-1 requests of that key without a call. (Nothing to do with
// concurrency leases, include/ratelimit/concurrency.h.)
//
// Bounds (docs/architecture.md, "Token prefetch"): an instance holds at most
// n - 1 unspent tokens of a key, so over any interval all instances together
// allow at most the limit's own count plus N x (n - 1) (N instances). A prefetch
// lives n refill intervals, but at least 100 ms and at most 1 s; unspent
// tokens then lapse, which only ever makes the limit stricter.
//
// Times (`now`, `submitted`, `replied`) are microseconds of a monotonic clock
// (RedisStore's steady_clock), so a step back of the wall clock cannot keep
// tokens past their lifetime.
//
// Thread-safety: thread-safe (one mutex; prefetch is only for a few hot keys).
// Bounded: at most `max_entries` keys; when full, lapsed entries are dropped
// and otherwise new keys get no prefetch (their checks go to Redis as usual).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "ratelimit/limit.h"
#include "ratelimit/store.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::store {

class TokenPrefetch {
 public:
  static constexpr std::chrono::microseconds kMinLifetime{100'000};
  static constexpr std::chrono::microseconds kMaxLifetime{1'000'000};

  explicit TokenPrefetch(size_t max_entries = 100'000) : max_entries_(max_entries) {}

  // How long tokens prefetched for `limit` live, and the window within which
  // a second ask makes its key hot: prefetch x interval, clamped to [100 ms, 1 s].
  static int64_t LifetimeMicros(const Limit& limit);

  // Spends one prefetched token of `fp` at `now`: the answer (allowed), or
  // nullopt when there is none (none left, lapsed, or no prefetch).
  std::optional<CheckResult> Spend(uint64_t fp, int64_t now);
  // How many tokens to ask Redis for: limit.prefetch() if the key was asked
  // within a prefetch lifetime before `now` (hot), else 1. Records the ask.
  int64_t Want(uint64_t fp, int64_t now, const Limit& limit);
  // Keeps `granted - 1` tokens (at most `prefetch` - 1 in all) from the call
  // submitted at `submitted` whose answer `answer` came at `replied`.
  void Grant(uint64_t fp, int64_t prefetch, int64_t granted, const Decision& answer,
             int64_t submitted, int64_t replied);
  void Clear();
  size_t size() const;

 private:
  struct Entry {
    int64_t tokens = 0;    // unspent
    int64_t lapses = 0;    // when they lapse
    int64_t asked = 0;     // the last call to Redis for this key
    int64_t lifetime = 0;  // LifetimeMicros of its limit
    Decision base;         // the grant's answer: remaining in Redis then
    int64_t base_at = 0;
  };

  size_t max_entries_;
  mutable Mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_ RL_GUARDED_BY(mu_);
};

}  // namespace ratelimit::store
