// OverLimitCache: answers requests for keys known to be denied, locally, until
// their retry time, so an abusive client costs the shared store almost nothing.
//
// After a denial of a request whose every limit costs 1, no such request for
// the same key and the same limits can be allowed before now + retry_after
// (a denied request changes no state, and time must pass for any limit to
// make room). Until then the cached CheckResult is returned with its times
// counted down. Only denials with retry_after >= `min_retry` are cached.
//
// An allowed cost-1 request that took the last unit of a token bucket or a
// fixed window also tells when the next one can be allowed
// (DenialAfterLastUnit): RedisStore caches that denial at once, so a flood
// costs one script call per unit that comes free and none for its denials.
//
// Exactness: on this instance a cached denial is exactly what the store would
// answer. What it cannot see is a change of the state made elsewhere: a
// reset of the key through the admin API of another instance (announced to
// every instance, which then clears its cache: Store::ForgetCached), a reset
// whose announcement was lost, a FLUSHALL, or (time_source local) a step
// forward of the wall clock Redis then decides by. So no entry is kept
// longer than `max_age` (5 s) whatever its retry time (a calendar quota's
// denial may wait weeks): at worst a client stays denied here that long
// after such a change, and a flood of one key costs one store call per
// `max_age` once its denial is longer.
//
// Times (`now`, `submitted`, `replied`) are microseconds of a monotonic clock
// (RedisStore's steady_clock): a step back of the wall clock must not keep a
// denial past its retry time, nor stop its retry time counting down.
//
// Thread-safety: thread-safe (sharded locks). Bounded: at most `max_entries`;
// when full, expired entries are dropped and otherwise nothing new is cached.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "ratelimit/store.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::store {

class OverLimitCache {
 public:
  struct Options {
    size_t max_entries = 100'000;
    std::chrono::microseconds min_retry{0};
    // The longest an entry answers without asking the store (see Exactness).
    std::chrono::microseconds max_age{kMaxAge};
  };
  static constexpr std::chrono::seconds kMaxAge{5};

  explicit OverLimitCache(Options options);

  // A fingerprint of (key, limits), or nullopt when the request cannot be
  // cached (a cost other than 1).
  std::optional<uint64_t> Fingerprint(const CheckRequest& request) const;

  // The cached denial with times counted down to `now`, if still valid.
  std::optional<CheckResult> Lookup(uint64_t fp, int64_t now);
  // The denial Redis would give a cost-1 request right after `allowed` (one
  // limit, cost 1, remaining 0), for a token bucket or a fixed window; nullopt
  // for other algorithms or when room is left. `window_micros` and
  // `interval_micros` are the Limit's.
  static std::optional<Decision> DenialAfterLastUnit(Algorithm algorithm, int64_t window_micros,
                                                     int64_t interval_micros,
                                                     const Decision& allowed);

  // Remembers `result` if it is a denial worth caching. `submitted` is a time
  // no later than the one the store decided at (so the entry never outlives
  // the denial), `replied` one no earlier (so counted-down retry times are
  // never too early).
  void Remember(uint64_t fp, const CheckResult& result, int64_t submitted, int64_t replied);
  // `result` as it stands `elapsed` later: its wait times counted down.
  static CheckResult CountDown(CheckResult result, std::chrono::microseconds elapsed);
  void Forget(uint64_t fp);
  // Forgets everything (after an admin reset: entries are not indexed by key).
  void Clear();

  size_t size() const;

 private:
  struct Entry {
    CheckResult result;
    int64_t at = 0;     // when the result was current (at the latest)
    int64_t until = 0;  // when a request may be allowed again
  };
  struct Shard {
    mutable Mutex mu;
    std::unordered_map<uint64_t, Entry> entries RL_GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 16;

  Options opts_;
  uint64_t seed_;
  Shard shards_[kShards];
};

}  // namespace ratelimit::store
