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
// its housekeeping (SweepPart, Shutdown); the defaults fit a store in this
// process. A decorator forwards them, so nobody needs the concrete class.
//
// Thread-safety: every method may be called from any thread concurrently.
// `done` is called exactly once, either before Check returns (MemoryStore) or
// later on a store thread (RedisStore); it must not block.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
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
  // Settle only: the request's `once` was settled before; nothing applied,
  // no decisions.
  bool already_settled = false;
};

// The time one stage took, as a histogram since start (for metrics): counts[i]
// is how many took at most kBoundsMicros[i] and more than the bound before
// (not cumulative); counts.back() how many took longer than the last bound.
struct StageLatency {
  // 10us, 25us, 50us, 100us, 250us, 500us, 1ms, 2.5ms, 5ms, 10ms, 25ms, 100ms
  static constexpr std::array<int64_t, 12> kBoundsMicros = {
      10, 25, 50, 100, 250, 500, 1'000, 2'500, 5'000, 10'000, 25'000, 100'000};
  std::array<uint64_t, kBoundsMicros.size() + 1> counts{};
  uint64_t sum_micros = 0;
};

// Counters since start that a store keeps (0 for those it has not).
struct StoreStats {
  uint64_t checks = 0;         // Check() calls that reached the store
  uint64_t script_calls = 0;   // remote calls sent (Redis: EVALSHA)
  uint64_t cache_hits = 0;     // checks answered by the over-limit cache
  uint64_t prefetch_hits = 0;  // checks answered with a prefetched token (Limit::prefetch)
  uint64_t failures = 0;       // checks that completed with an error
  // Redis Cluster: checks of a node call sent again one slot per call (the
  // node no longer served one of the call's keys: a slot moved).
  uint64_t resent = 0;
  // Redis: each sent check's time queued before its call left (the batcher:
  // hold_back, max_calls_in_flight), and each script call's time from sending
  // to its reply (the wire, Redis' queue and the script).
  StageLatency queued;
  StageLatency call;
};

// Settlement: the difference between what a request reserved (the cost it
// was checked with) and what it turned out to cost, applied to the same
// limits of the same client after the fact (issue 21). `delta` > 0 debits
// (takes more), < 0 refunds (gives back), 0 only reports. Per algorithm:
//   token / leaky bucket  a debit may go below zero (a debt, at most one year
//                         of refill beyond the capacity): checks are denied
//                         until it is paid back, `remaining` 0 and
//                         `retry_after` when; a refund never fills the
//                         bucket above its capacity.
//   fixed / sliding window  added to or taken from the current window's
//                         counter, kept within [0, limit] (a window has no
//                         debt: a debit past the limit fills it until it
//                         ends). A refund for a request reserved in an
//                         earlier window is taken from the current one.
//   sliding log           not settled (kInvalidArgument): it keeps one
//                         entry per unit for small limits of requests
//                         (login: 5/15m), not metered costs, and removing
//                         "the reservation's" entries is not well defined
//                         once later requests have added theirs.
// A settlement always applies (it decides nothing) and is one atomic step
// over all its limits. Its decisions report the state afterwards as the
// next request of cost 1 would meet it (without taking anything):
// `allowed` whether it would pass, `retry_after` when it would, `remaining`
// and `reset_after` as a cost-0 check reports them.
struct LimitSettle {
  const Limit* limit = nullptr;  // not owned; read only during the call
  int64_t delta = 0;             // actual cost - reserved cost
};

struct SettleRequest {
  std::string_view key;                      // the client's identity, as checked
  std::span<const LimitSettle> settlements;  // at least one
  OnFailure on_failure;                      // read by a ResilientStore only
  // Settle at most once: with a non-empty `once`, a second settlement of the
  // same key and `once` within `once_ttl` applies nothing and answers
  // CheckResult::already_settled (decided in the same atomic step).
  std::string_view once;
  std::chrono::microseconds once_ttl{0};
};

using CheckCallback = std::function<void(StatusOr<CheckResult>)>;
using ResetCallback = std::function<void(Status)>;
// Per limit asked, how much longer its block lasts (0: none).
using BlocksCallback = std::function<void(StatusOr<std::vector<std::chrono::microseconds>>)>;

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

  // Applies a settlement (see SettleRequest) atomically; `done` gets the
  // state afterwards. A store without settlements answers kInvalidArgument.
  // A failed call is never replayed (it may have applied).
  // (The defaults spell their callbacks' std::function types: a sink by the
  // project's convention, .clang-tidy's AllowedTypes.)
  virtual void Settle(const SettleRequest& /*request*/,
                      std::function<void(StatusOr<CheckResult>)> done) {
    done(InvalidArgument("this store cannot settle costs"));
  }

  // Block periods (Limit::block_for): the blocks of `key` in force on these
  // limits, and lifting them. Reset lifts them too. The defaults: none, and
  // nothing to lift.
  virtual void Blocks(std::string_view /*key*/, std::span<const Limit* const> limits,
                      std::function<void(StatusOr<std::vector<std::chrono::microseconds>>)> done) {
    done(std::vector<std::chrono::microseconds>(limits.size()));
  }
  virtual void Unblock(std::string_view /*key*/, std::span<const Limit* const> /*limits*/,
                       std::function<void(Status)> done) {
    done(Status::Ok());
  }

  // A secret shared by every instance that shares this store's state (32+
  // bytes): it signs decision-API reservations (issue 21) so that any of
  // those instances can settle one. The default: random, made once per
  // process (the instances of a store in memory are one process).
  virtual void SharedSecret(std::function<void(StatusOr<std::string>)> done);
  // The secret under which `accepts` holds (a reservation's signature
  // verifies): SharedSecret's, or one it replaced less than
  // kSharedSecretOverlap ago, or, when none does, the store's current one
  // asked again (another instance may have set a new one since this one last
  // asked: the store lost it). When none accepts, the current one (the
  // caller's check then fails); a failure only when the store cannot be
  // asked. The default: SharedSecret's (it never changes).
  virtual void SecretAccepting(std::function<bool(std::string_view secret)> accepts,
                               std::function<void(StatusOr<std::string>)> done);

  // Forgets what this instance keeps of the state besides the store itself
  // (RedisStore: its cached denials and prefetched tokens), so that the next
  // check of every key asks the store: another instance reset a client's
  // state (the admin API's reset, announced through the override store's
  // channel, src/server/overrides.h). The default: nothing is kept.
  virtual void ForgetCached() {}

  // True when the state lives in another process (Redis): readiness probes it.
  virtual bool remote() const { return false; }
  // The worst state of the store's circuit breakers (kClosed: none).
  virtual CircuitBreaker::State breaker_state() const { return CircuitBreaker::State::kClosed; }
  // Checks queued or in flight now.
  virtual size_t pending() const { return 0; }
  virtual StoreStats stats() const { return {}; }
  // Drops expired state; returns how many entries. Sweep() is the whole
  // store; SweepPart(part, parts) one of `parts` disjoint parts (part <
  // parts), which together are the whole store: the daemon sweeps its store
  // a part at a time, spread over its sweep interval, so that no step holds
  // its I/O thread for long (a MemoryStore of 1,000,000 keys takes 7-19 ms
  // to sweep whole: BM_Sweep). The default sweeps nothing.
  size_t Sweep() { return SweepPart(0, 1); }
  virtual size_t SweepPart(size_t /*part*/, size_t /*parts*/) { return 0; }
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
  StatusOr<CheckResult> SettleSync(const SettleRequest& request);
};

// The one key validator: 1..max_key_length bytes. Messages name the key as
// `what`: "<what> must not be empty", "<what> is 600 bytes; the maximum is 512".
Status ValidateKey(std::string_view key, size_t max_key_length, std::string_view what = "key");

// Validates a request before it reaches any store: key length, at least one
// check, each cost in [0, limit]. Stores call it; callers may too.
Status ValidateRequest(const CheckRequest& request, size_t max_key_length);

// Validates a settlement as ValidateRequest does a check: key length, at
// least one limit, each named once and not a sliding log, |delta| <=
// kMaxSettleDelta.
Status ValidateSettle(const SettleRequest& request, size_t max_key_length);
inline constexpr int64_t kMaxSettleDelta = 2'147'483'647;

// The largest key accepted by default (bytes).
inline constexpr size_t kDefaultMaxKeyLength = 512;
// The largest number of limits in one request.
inline constexpr size_t kMaxChecksPerRequest = 16;
// How long a shared secret that was replaced (Store::SecretAccepting) is
// still accepted: the longest a reservation signed under it may be held.
inline constexpr std::chrono::hours kSharedSecretOverlap{1};

}  // namespace ratelimit
