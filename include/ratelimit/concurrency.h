// ConcurrencyStore: at most N requests of a key in flight at once.
//
// A rate limit counts requests per unit of time; a concurrency limit counts
// requests that have started and not yet finished. Acquire takes a lease (an
// id) when fewer than `max_in_flight` leases of the (key, name) are held;
// Release gives it back. Every lease expires `lease_ttl` after it was taken,
// so an instance that crashes while holding leases cannot leak capacity
// forever: its leases are dropped by the next Acquire after they expire.
// A holder whose request runs longer Renews its lease (moves its expiry)
// while it runs: lease_ttl then bounds how long a crashed holder's leases
// outlive it, not how long a request may take.
// Implementations: MemoryConcurrencyStore (one process, a manual clock for
// tests) and RedisConcurrencyStore (shared by every instance: a sorted set per
// key scored by expiry, one Lua script call per acquire, Redis TIME).
//
//   AcquireResult r = *store.AcquireSync({.key = "user:ada", .name = "upload",
//                                         .max_in_flight = 3, .lease_ttl = 30s});
//   if (r.acquired) { ...; store.ReleaseSync("user:ada", "upload", r.lease_id); }
//
// A non-OK status means the store could not decide (unreachable, deadline,
// breaker open, full) or the request was malformed (kInvalidArgument); the
// caller applies its failure mode to the former.
//
// Thread-safety: every method may be called from any thread concurrently.
// `done` is called exactly once, before the call returns (memory) or later on
// a store thread (Redis); it must not block.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/clock.h"
#include "ratelimit/redis_store.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"

namespace ratelimit {

struct AcquireRequest {
  std::string_view key;   // the client (or "~all" for a whole route), e.g. "user:ada"
  std::string_view name;  // which concurrency limit (a route name): a limit name
  int64_t max_in_flight = 1;
  std::chrono::microseconds lease_ttl{30'000'000};
  OnFailure on_failure;  // read by a ResilientConcurrencyStore only
  // A configured route's `per: route` limit (its key "~all"), the one cap
  // protecting its upstream: a MemoryConcurrencyStore takes it even when
  // max_keys leases are held, so that ad-hoc leases filling the store cannot
  // turn it into "admitted without a lease". Never set for a key a caller
  // chooses: these leases are bounded only by the config (routes x
  // max_in_flight).
  bool route_wide = false;
};

struct AcquireResult {
  bool acquired = false;
  std::string lease_id;   // set when acquired
  int64_t in_flight = 0;  // leases held after the call (this one included)
  int64_t max_in_flight = 0;
  // Denied: when the oldest held lease expires at the latest (it may be
  // released much sooner). 0 when acquired.
  std::chrono::microseconds retry_after{0};
  // Set by a ResilientConcurrencyStore when the failure mode decided: open
  // admits without a lease, closed refuses (failed_closed), local leases from
  // a process-local store (lease ids starting with kLocalLeasePrefix).
  bool degraded = false;
  bool failed_closed = false;
};

using AcquireCallback = std::function<void(StatusOr<AcquireResult>)>;
// true: the lease was held and is now freed; false: it was not held (already
// released, expired, or never existed).
using ReleaseCallback = std::function<void(StatusOr<bool>)>;
// true: the lease is held and now expires `ttl` after the store's now;
// false: it is not held any more (released, expired, or never existed) and
// was not taken again.
using RenewCallback = std::function<void(StatusOr<bool>)>;

class ConcurrencyStore {
 public:
  virtual ~ConcurrencyStore() = default;

  virtual void Acquire(const AcquireRequest& request, AcquireCallback done) = 0;
  virtual void Release(std::string_view key, std::string_view name, std::string_view lease_id,
                       ReleaseCallback done) = 0;
  // Keeps a held lease: its expiry moves to now + `ttl` (1 ms..kMaxLeaseTtl).
  // A lease already expired is not revived, even before an acquire dropped
  // it: its place may have been counted free.
  virtual void Renew(std::string_view key, std::string_view name, std::string_view lease_id,
                     std::chrono::microseconds ttl, RenewCallback done) = 0;
  // Drops expired leases; returns how many.
  virtual size_t Sweep() { return 0; }
  // What SweepSome did: `more` when expired leases are left (call again).
  struct SweepProgress {
    size_t dropped = 0;
    bool more = false;
  };
  // Drops at most `max_leases` (at least 1) expired leases, earliest first.
  // The daemon calls it periodically, and again at once (after whatever else
  // its I/O thread has to do) while `more`: a mass expiry is dropped over
  // many short turns. The default: Sweep().
  virtual SweepProgress SweepSome(size_t /*max_leases*/) { return {.dropped = Sweep()}; }
  // True when the store applies the request's on_failure itself.
  virtual bool decides_failures() const { return false; }

  // Blocking conveniences for tools and tests. REQUIRES: not called on a
  // thread that the store needs to complete the call.
  StatusOr<AcquireResult> AcquireSync(const AcquireRequest& request);
  StatusOr<bool> ReleaseSync(std::string_view key, std::string_view name,
                             std::string_view lease_id);
  StatusOr<bool> RenewSync(std::string_view key, std::string_view name, std::string_view lease_id,
                           std::chrono::microseconds ttl);
};

// Checks a request before it reaches a store: key length, a valid limit name,
// max_in_flight in [1, kMaxInFlight], lease_ttl in [1 ms, kMaxLeaseTtl].
Status ValidateAcquire(const AcquireRequest& request, size_t max_key_length);
// A lease id: 1..64 characters of [A-Za-z0-9_-].
Status ValidateLeaseId(std::string_view lease_id);
// 32 random hex digits (128 bits), unique in practice across instances.
std::string NewLeaseId();

inline constexpr int64_t kMaxInFlight = 1'000'000;
inline constexpr std::chrono::hours kMaxLeaseTtl{24};

// One process. Bounded by leases: at most `max_keys` leases are held at once,
// whatever keys they belong to (one key with max_in_flight 1,000,000 takes a
// million places, not one); beyond it an Acquire fails with
// kResourceExhausted (the caller's failure mode decides), except for a
// route_wide request, which is admitted over the bound. Expired leases are
// dropped in expiry order: a few by every Acquire (and the key's own), the
// rest by Sweep in chunks; no call walks the whole table under the lock, and
// a key's count, earliest expiry and release by id cost O(log leases).
class MemoryConcurrencyStore final : public ConcurrencyStore {
 public:
  struct Options {
    size_t max_keys = 1'000'000;  // leases held at once (route_wide ones over it)
    size_t max_key_length = kDefaultMaxKeyLength;
    const Clock* clock = nullptr;  // nullptr: Clock::System()
  };
  MemoryConcurrencyStore();
  explicit MemoryConcurrencyStore(Options options);
  ~MemoryConcurrencyStore() override;

  void Acquire(const AcquireRequest& request, AcquireCallback done) override;
  void Release(std::string_view key, std::string_view name, std::string_view lease_id,
               ReleaseCallback done) override;
  void Renew(std::string_view key, std::string_view name, std::string_view lease_id,
             std::chrono::microseconds ttl, RenewCallback done) override;

  // Unexpired leases of (key, name) now.
  int64_t InFlight(std::string_view key, std::string_view name);
  // Drops every expired lease (and emptied keys), a chunk at a time with the
  // lock released between chunks; returns how many leases.
  size_t Sweep() override;
  // One lock hold, O(max_leases log leases): `more` is exact (an expired
  // lease is left), so N expired leases take ceil(N / max_leases) calls.
  SweepProgress SweepSome(size_t max_leases) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Shared by every instance. The leases of (key, name) are a sorted set at
// KeyFor(key, name) = `<prefix>{<client>}~c:<name>`, member = lease id, score
// = expiry (microseconds of Redis time). Acquire is one script call:
// ZREMRANGEBYSCORE the expired, ZCARD < max then ZADD, PEXPIRE the key until
// its last lease expires. Release and Renew are the script's other modes
// (ZREM; ZADD XX of the new expiry and PEXPIRE, only while the lease's score
// is after now). The client part is escaped like
// RedisStore's keys (EncodeClientKey), and the braces make it the hash tag,
// so a client's rate limit and concurrency keys share a Redis Cluster slot.
// A call that fails is never replayed (a timed-out acquire may have taken a
// lease: it expires after lease_ttl).
class RedisConcurrencyStore final : public ConcurrencyStore {
 public:
  // The options RedisStore takes too (include/ratelimit/redis_store.h); its
  // batching and cache fields are ignored here. The daemon uses one
  // connection per node (acquire/release are rare next to checks).
  using TimeSource = RedisTimeSource;
  using Options = RedisConnectionOptions;
  static StatusOr<std::unique_ptr<RedisConcurrencyStore>> Create(Options options);
  ~RedisConcurrencyStore() override;

  void Acquire(const AcquireRequest& request, AcquireCallback done) override;
  void Release(std::string_view key, std::string_view name, std::string_view lease_id,
               ReleaseCallback done) override;
  void Renew(std::string_view key, std::string_view name, std::string_view lease_id,
             std::chrono::microseconds ttl, RenewCallback done) override;

  std::string KeyFor(std::string_view key, std::string_view name) const;
  CircuitBreaker::State breaker_state() const;

  struct Impl;

 private:
  explicit RedisConcurrencyStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ratelimit
