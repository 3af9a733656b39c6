// Store: where limit state lives and where decisions are made atomically.
//
// A store decides all the limits of one request for one client key at once,
// all or nothing: the request is allowed only if every limit allows it, and a
// denied request consumes from none of them. Implementations: MemoryStore
// (one process), RedisStore (shared by every instance; one Lua script call).
//
//   LimitCheck checks[] = {{&burst, 1}, {&daily, 1}};
//   store.Check({"user:ada", checks}, [](StatusOr<CheckResult> r) { ... });
//
// A non-OK status means the store could not decide (unreachable, deadline,
// full, bad request); a ResilientStore (src/store/resilient_store.h) turns it
// into a decision by the request's `on_failure` (plain stores ignore it and
// report the failure, which is FailureMode::kError).
//
// Beyond deciding, a store answers a few questions the daemon asks of any
// store (is it remote, its breaker, its pending calls and counters) and does
// its housekeeping (Sweep, Shutdown); the defaults fit a store in this
// process. A decorator forwards them, so nobody needs the concrete class.
//
// Thread-safety: every method may be called from any thread concurrently.
// `done` is called exactly once, either before Check returns (MemoryStore) or
// later on a store thread (RedisStore); it must not block.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/decision.h"
#include "ratelimit/failure_mode.h"
#include "ratelimit/limit.h"
#include "ratelimit/status.h"

namespace ratelimit {

struct LimitCheck {
  const Limit* limit = nullptr;  // not owned; read only during the call
  int64_t cost = 1;              // 0 asks without consuming
};

struct CheckRequest {
  std::string_view key;                // the client's identity, e.g. "user:ada"
  std::span<const LimitCheck> checks;  // at least one
  OnFailure on_failure;                // read by a ResilientStore only
};

struct CheckResult {
  Decision overall;                 // Combine(decisions)
  std::vector<Decision> decisions;  // one per check, in request order
  // Set by a ResilientStore when the failure mode decided instead of the
  // store: `degraded` always, `failed_closed` for FailureMode::kClosed (every
  // decision is then a denial with retry_after 1 s).
  bool degraded = false;
  bool failed_closed = false;
};

// Counters since start that a store keeps (0 for those it has not).
struct StoreStats {
  uint64_t checks = 0;         // Check() calls that reached the store
  uint64_t script_calls = 0;   // remote calls sent (Redis: EVALSHA)
  uint64_t cache_hits = 0;     // checks answered by the over-limit cache
  uint64_t prefetch_hits = 0;  // checks answered with a prefetched token (Limit::prefetch)
  uint64_t failures = 0;       // checks that completed with an error
};

using CheckCallback = std::function<void(StatusOr<CheckResult>)>;
using ResetCallback = std::function<void(Status)>;

class Store {
 public:
  virtual ~Store() = default;

  // Decides and, when allowed, consumes. The request is read only during the call.
  virtual void Check(const CheckRequest& request, CheckCallback done) = 0;
  // The current state as a cost-0 check would report it; never creates state.
  virtual void Peek(const CheckRequest& request, CheckCallback done) = 0;
  // Forgets the state of `key` for these limits (a full bucket afterwards).
  virtual void Reset(std::string_view key, std::span<const Limit* const> limits,
                     ResetCallback done) = 0;

  // True when the state lives in another process (Redis): readiness probes it.
  virtual bool remote() const { return false; }
  // The worst state of the store's circuit breakers (kClosed: none).
  virtual CircuitBreaker::State breaker_state() const { return CircuitBreaker::State::kClosed; }
  // Checks queued or in flight now.
  virtual size_t pending() const { return 0; }
  virtual StoreStats stats() const { return {}; }
  // Drops expired state; returns how many entries. The daemon calls it periodically.
  virtual size_t Sweep() { return 0; }
  // Closes the store's connections before its caller's io_context stops:
  // the calls in flight fail; `done` runs once none is left (at once here).
  virtual void Shutdown(std::function<void()> done) { done(); }
  // True when the store applies the request's on_failure itself (a
  // ResilientStore): a caller need not wrap it again.
  virtual bool decides_failures() const { return false; }

  // Blocking conveniences for tools and tests. REQUIRES: not called on a
  // thread that the store needs to complete the call (e.g. its I/O thread).
  StatusOr<CheckResult> CheckSync(const CheckRequest& request);
  StatusOr<CheckResult> PeekSync(const CheckRequest& request);
  Status ResetSync(std::string_view key, std::span<const Limit* const> limits);
};

// The one key validator: 1..max_key_length bytes. Messages name the key as
// `what`: "<what> must not be empty", "<what> is 600 bytes; the maximum is 512".
Status ValidateKey(std::string_view key, size_t max_key_length, std::string_view what = "key");

// Validates a request before it reaches any store: key length, at least one
// check, each cost in [0, limit]. Stores call it; callers may too.
Status ValidateRequest(const CheckRequest& request, size_t max_key_length);

// The largest key accepted by default (bytes).
inline constexpr size_t kDefaultMaxKeyLength = 512;
// The largest number of limits in one request.
inline constexpr size_t kMaxChecksPerRequest = 16;

}  // namespace ratelimit
