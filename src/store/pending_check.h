// PendingCheck: one RedisStore check between Submit and its answer, as the
// admission (store/check_admission.h), the batcher (store/check_batcher.h)
// and the codec (store/lua/check_codec.h) see it.
//
// Thread-safety: a plain value, owned by one of them at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/limit.h"
#include "ratelimit/store.h"
#include "store/lua/check_codec.h"

namespace ratelimit::store {

struct PendingCheck {
  std::chrono::steady_clock::time_point deadline;
  std::chrono::steady_clock::time_point queued_at;  // when the batcher took it
  std::optional<uint64_t> cache_fp;  // set when the over-limit cache may keep its denial
  int64_t submitted_at = 0;          // steady clock micros, before Redis evaluated it
  bool leader = false;               // other checks of cache_fp wait for its reply (CheckAdmission)
  uint64_t generation = 0;  // CheckAdmission's, when admitted: a Clear since voids its lessons
  // The first limit's shape, to tell when the unit it took was the last one.
  Algorithm algorithm = Algorithm::kTokenBucket;
  int64_t window_micros = 0, interval_micros = 0;
  // Token prefetch: the limit's prefetch size (0: none), its table entry, and
  // the tokens asked for (> 1: a 'T' evaluation that may take several).
  uint64_t prefetch_fp = 0;
  int64_t prefetch = 0, want = 1;
  uint16_t slot = 0;  // the slot of every key of the check
  // The node it may share a call with checks of other slots (a Cluster's
  // node calls, RedisStore), or -1: its call holds its slot's checks only.
  int node = -1;
  CircuitBreaker* breaker = nullptr;  // the breaker that let it through
  uint64_t probe = 0;                 // that breaker's probe it carries, or 0
  lua::CheckCall call;
  CheckCallback done;
};

// The bound on checks queued, in flight or waiting for a duplicate's answer
// (RedisStore::Options::max_pending).
class PendingBound {
 public:
  explicit PendingBound(size_t max) : max_(max) {}
  // Counts one more, unless the bound is reached.
  bool TryAdd() {
    if (n_.fetch_add(1, std::memory_order_relaxed) < max_) return true;
    n_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  void Sub(size_t k) { n_.fetch_sub(k, std::memory_order_relaxed); }
  size_t count() const { return n_.load(std::memory_order_relaxed); }
  Status Overloaded() const {
    return ResourceExhausted("redis store overloaded: " + std::to_string(max_) +
                             " calls already queued or in flight");
  }

 private:
  const size_t max_;
  std::atomic<size_t> n_{0};
};

}  // namespace ratelimit::store
