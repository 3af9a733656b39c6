// CheckAdmission: what RedisStore answers without a script call, and what it
// learns from each reply. Three sources (docs/architecture.md, "Over-limit
// cache" and "Token prefetch"):
//   - the over-limit cache: a denial of a cost-1 check holds until its retry
//     time, for every identical check (store/over_limit_cache.h);
//   - token prefetch: a hot key of a limit with `prefetch: n` spends tokens
//     taken earlier in one call (store/token_prefetch.h);
//   - waiting duplicates: while a cacheable check is in flight, identical
//     checks wait for its answer (its `leader`) rather than send their own,
//     and share its denial if it was in force when they arrived.
//
//   if (std::optional<CheckResult> a = admission.Answer(req, peek, now, p)) return done(*a);
//   switch (admission.Join(p, now, &answer)) { ... }   // lead, wait, or answered
//   ... reply: p.done(admission.Settle(p, answer, dispatch));
//
// Thread-safety: thread-safe (the waiters are sharded by fingerprint).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ratelimit/clock.h"
#include "ratelimit/store.h"
#include "ratelimit/thread_annotations.h"
#include "store/lua/check_codec.h"
#include "store/over_limit_cache.h"
#include "store/pending_check.h"
#include "store/token_prefetch.h"

namespace ratelimit::store {

class CheckAdmission {
 public:
  struct Options {
    size_t cache_entries = 100'000;  // 0: no over-limit cache
    std::chrono::milliseconds cache_min_retry{0};
    // A monotonic clock: every `now` given here and every time kept is its
    // (nullptr: Clock::Steady()).
    const Clock* clock = nullptr;
    PendingBound* bound = nullptr;  // waiters count against it
  };
  using Dispatch = std::function<void(PendingCheck)>;

  explicit CheckAdmission(Options options);

  // Before a call: the answer when none is needed (a cached denial, a
  // prefetched token), else nullopt with `p`'s cache_fp, prefetch_fp,
  // prefetch and want set.
  std::optional<CheckResult> Answer(const CheckRequest& req, bool peek, int64_t now,
                                    PendingCheck& p);

  enum class Turn {
    kLead,      // send it; identical checks will wait for its answer (if cacheable)
    kWaiting,   // `p` was moved: it waits for an identical check in flight
    kAnswered,  // `*answer` is its answer (cached meanwhile, or overloaded)
  };
  Turn Join(PendingCheck& p, int64_t now, StatusOr<CheckResult>* answer);

  // `leader` is answered: the checks that waited for it get `denial` if it
  // was still in force when they arrived (nothing they could see differs: a
  // denied request changes no state and time must pass for room to come), a
  // prefetched token, or are handed to `dispatch`, together.
  void Release(PendingCheck& leader, const CheckResult* denial, const Dispatch& dispatch);

  // The answer to `p` from the script's: a prefetch grant kept, a denial (or
  // the denial that follows the last unit) cached, the waiters released.
  CheckResult Settle(PendingCheck& p, lua::CheckAnswer answer, const Dispatch& dispatch);

  // Forgets cached denials and prefetched tokens (at a Reset, before and
  // after its DEL); the answers of checks admitted before it teach nothing.
  void Clear();

  uint64_t cache_hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t prefetch_hits() const { return prefetch_hits_.load(std::memory_order_relaxed); }

 private:
  struct WaiterShard {
    Mutex mu;
    std::unordered_map<uint64_t, std::vector<PendingCheck>> by_fp RL_GUARDED_BY(mu);
  };
  WaiterShard& WaitersOf(uint64_t fp) { return waiters_[fp % std::size(waiters_)]; }

  const Clock* clock_;
  PendingBound* bound_;
  std::unique_ptr<OverLimitCache> cache_;  // nullptr: off
  TokenPrefetch prefetched_;
  const uint64_t seed_;
  std::atomic<uint64_t> hits_{0}, prefetch_hits_{0};
  std::atomic<uint64_t> generation_{0};  // Clear()s so far
  WaiterShard waiters_[16];
};

}  // namespace ratelimit::store
