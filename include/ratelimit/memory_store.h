// MemoryStore: limit state in this process's memory.
//
// For a single instance, for tests, and as the local fallback when Redis is
// down. State is sharded by key hash; each shard is an open-addressing table
// of 32-byte slots (a 64-bit fingerprint of the key and limit; the expiry time
// and two counters, 16 bytes changed by one compare-and-swap: 8 for a bucket
// on x86-64, whose counters stay 0), about 40-56 bytes per key. Idle keys
// expire: a key whose state equals the fresh state is dropped by Sweep() and
// whenever a shard would otherwise grow.
//
//   ratelimit::MemoryStore store({.max_keys = 1'000'000});
//   Limit burst = *Limit::TokenBucket("burst", 10, 5);
//   LimitCheck checks[] = {{&burst, 1}};
//   StatusOr<CheckResult> r = store.CheckSync({"user:ada", checks});
//
// Bounded: at most `max_keys` live entries: a (key, limit)'s state, a
// block period in force (Limit::block_for, which outlives the state that
// started it), and a settlement remembered once (SettleRequest::once, until
// its once_ttl). When full (after dropping expired ones), requests for NEW
// keys fail with kResourceExhausted (the caller's failure policy decides),
// and so does a settlement with a new `once` (nothing applied);
// a denial that would start a block denies without it; existing keys are
// never evicted, so a flood of unique keys cannot reset a real client's limit.
//
// Keys are identified by a 64-bit keyed hash (random seed per store) of the
// client key and the limit's identity (its name and algorithm, and a window
// limit's windows: SharesState, include/ratelimit/limit.h); two distinct (key, limit)
// pairs share state only on a hash collision (about 1 in 3.7e7 at 1,000,000
// keys) and the seed makes collisions impossible to aim at.
//
// Thread-safety: all methods are thread-safe. Check calls `done` before returning.
// A check of one bucket or window limit without a block period, on a key that
// has state, takes no lock (load, evaluate, compare-and-swap); new keys, table
// growth, several limits at once, settlements, sliding logs and blocks take the
// shard locks, and stay atomic against the lock-free path (src/store/memory_store.cc).
#pragma once

#include <cstddef>
#include <memory>

#include "ratelimit/clock.h"
#include "ratelimit/store.h"

namespace ratelimit {

class MemoryStore final : public Store {
 public:
  struct Options {
    size_t shards = 64;  // rounded up to a power of two
    size_t max_keys = 10'000'000;
    size_t max_key_length = kDefaultMaxKeyLength;
    const Clock* clock = nullptr;  // nullptr: Clock::System()
  };

  MemoryStore();
  explicit MemoryStore(Options options);
  ~MemoryStore() override;

  void Check(const CheckRequest& request, CheckCallback done) override;
  void Peek(const CheckRequest& request, CheckCallback done) override;
  void Reset(std::string_view key, std::span<const Limit* const> limits,
             ResetCallback done) override;
  void Settle(const SettleRequest& request, CheckCallback done) override;
  void Blocks(std::string_view key, std::span<const Limit* const> limits,
              BlocksCallback done) override;
  void Unblock(std::string_view key, std::span<const Limit* const> limits,
               ResetCallback done) override;

  // The same as Check, returning directly.
  StatusOr<CheckResult> Decide(const CheckRequest& request);
  // The fast path for one limit: no allocation.
  StatusOr<Decision> DecideOne(std::string_view key, const Limit& limit, int64_t cost);

  // Drops expired keys; returns how many (Store::Sweep: the whole store).
  // Part `part` of `parts` is the shards whose index is `part` modulo `parts`.
  size_t SweepPart(size_t part, size_t parts) override;
  // Live entries: keys' states, blocks and once marks (including expired
  // ones not yet swept).
  size_t size() const;
  // Bytes held by the tables, logs, blocks and settlements remembered once
  // (not counting this object).
  size_t MemoryUsage() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ratelimit
