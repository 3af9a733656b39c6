// ResilientStore: the one failure policy. A decorator that turns "the store
// could not decide" into a decision by the request's failure mode, for rate
// limits (ResilientStore, a Store) and concurrency limits
// (ResilientConcurrencyStore, a ConcurrencyStore) alike.
//
//   auto store = std::make_shared<ResilientStore>(redis, ResilientStore::Options{
//       .local_max_keys = 100'000, .on_failure = count_and_log});
//   store->Check({.key = "user:ada", .checks = checks,
//                 .on_failure = {FailureMode::kLocal, /*expected_instances=*/3}}, done);
//   // Redis down: done gets an OK result with degraded = true, decided by a
//   // process-local MemoryStore on the limits divided by 3.
//
// A failure is Unavailable, DeadlineExceeded, ResourceExhausted, Internal or
// an open breaker (kUnavailable): any non-OK status but InvalidArgument, which
// is the request's fault and always goes back to the caller. By the mode:
//   open    allowed (remaining = the limit: the store could not say), degraded
//   closed  denied with retry_after 1 s, degraded and failed_closed
//   local   a process-local store on the limits divided by expected_instances
//           (rounded up, at least 1; a token bucket's refill divided too;
//           Scaled); when that store is full too, allowed; degraded. A cost
//           above a limit's share: a bucket takes the share and books the
//           rest as a debt (as Settle does), a window refuses the request
//           (retry_after 1 s): either way the instances together stay
//           within the limit
//   error   the failure itself (the face reports "unavailable")
// Every failure, whatever the mode, is reported once to Options::on_failure
// (the daemon counts it by cause and logs it sampled). Peek and Reset pass
// failures through: they answer questions, they decide nothing. Reset
// forgets the local fallback's state of the key as well. Settle (a cost
// known afterwards) goes to the local fallback in mode local and fails in
// the others: a settlement decides nothing for a mode to answer. One made
// once (SettleRequest::once, a decision-API reservation) fails in every
// mode: its once-mark must live in the shared store.
//
// Concurrency: open admits without a lease, closed refuses (failed_closed),
// local takes a lease from a process-local MemoryConcurrencyStore with
// max_in_flight divided likewise (bounded by local_max_keys leases; a
// route_wide request keeps its flag and passes that bound); its lease ids
// start with kLocalLeasePrefix and Release and Renew send them back there.
//
// Thread-safety: as the stores it wraps: every method from any thread.
// Callbacks run where the inner store completes (possibly inside the call).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string_view>

#include "ratelimit/concurrency.h"
#include "ratelimit/failure_mode.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/store.h"

namespace ratelimit {

// Called once per failed store call (not for InvalidArgument), before the
// failure mode answers, on the thread the store failed on; must not block.
using FailureObserver = std::function<void(const Status& failure, FailureMode mode)>;

// True for the failures a failure mode decides (any non-OK but InvalidArgument).
bool IsStoreFailure(const Status& s);

class ResilientStore final : public Store {
 public:
  struct Options {
    size_t local_max_keys = 100'000;  // the local fallback's bound
    // The longest key the local fallback takes: the inner store's (a key the
    // inner store takes must not be let through unlimited when it fails).
    size_t local_max_key_length = kDefaultMaxKeyLength;
    const Clock* clock = nullptr;  // the local fallback's clock (nullptr: system)
    FailureObserver on_failure;    // may be empty
  };
  ResilientStore(std::shared_ptr<Store> inner, Options options);
  ~ResilientStore() override;

  void Check(const CheckRequest& request, CheckCallback done) override;
  void Peek(const CheckRequest& request, CheckCallback done) override;
  void Reset(std::string_view key, std::span<const Limit* const> limits,
             ResetCallback done) override;
  // The inner store's; on a failure, mode local applies it to the local
  // fallback (degraded), every other mode returns the failure (see the .cc).
  void Settle(const SettleRequest& request, CheckCallback done) override;
  // The inner store's blocks; Unblock lifts the local fallback's too.
  void Blocks(std::string_view key, std::span<const Limit* const> limits,
              BlocksCallback done) override {
    inner_->Blocks(key, limits, std::move(done));
  }
  void Unblock(std::string_view key, std::span<const Limit* const> limits,
               ResetCallback done) override;
  void SharedSecret(std::function<void(StatusOr<std::string>)> done) override {
    inner_->SharedSecret(std::move(done));
  }
  void SecretAccepting(std::function<bool(std::string_view)> accepts,
                       std::function<void(StatusOr<std::string>)> done) override {
    inner_->SecretAccepting(std::move(accepts), std::move(done));
  }

  void ForgetCached() override { inner_->ForgetCached(); }
  bool remote() const override { return inner_->remote(); }
  CircuitBreaker::State breaker_state() const override { return inner_->breaker_state(); }
  size_t pending() const override { return inner_->pending(); }
  StoreStats stats() const override { return inner_->stats(); }
  size_t SweepPart(size_t part, size_t parts) override;  // the inner store's and the fallback's
  void Shutdown(std::function<void()> done) override { inner_->Shutdown(std::move(done)); }
  bool decides_failures() const override { return true; }

  // The limit divided among `instances` (count rounded up, at least 1; a
  // token or leaky bucket's rate divided too). A rate too slow to express
  // keeps the limit whole.
  static Limit Scaled(const Limit& limit, int instances);

  Store& inner() { return *inner_; }
  MemoryStore& local_store() { return local_; }

 private:
  void Fallback(const CheckRequest& request, const Status& failure, CheckCallback& done);

  std::shared_ptr<Store> inner_;
  MemoryStore local_;
  FailureObserver on_failure_;
};

inline constexpr std::string_view kLocalLeasePrefix = "l-";

class ResilientConcurrencyStore final : public ConcurrencyStore {
 public:
  struct Options {
    size_t local_max_keys = 100'000;                     // store.local_max_keys
    size_t local_max_key_length = kDefaultMaxKeyLength;  // as ResilientStore's
    const Clock* clock = nullptr;
    FailureObserver on_failure;
  };
  // `inner` is not owned: it must outlive every call made before Detach().
  ResilientConcurrencyStore(ConcurrencyStore* inner, Options options);
  ~ResilientConcurrencyStore() override;

  void Acquire(const AcquireRequest& request, AcquireCallback done) override;
  // A kLocalLeasePrefix id goes to the local fallback, any other to `inner`.
  void Release(std::string_view key, std::string_view name, std::string_view lease_id,
               ReleaseCallback done) override;
  // Likewise; a failure is the caller's (no failure mode: the lease stands
  // until it expires, and the caller may ask again).
  void Renew(std::string_view key, std::string_view name, std::string_view lease_id,
             std::chrono::microseconds ttl, RenewCallback done) override;
  size_t Sweep() override;  // the local fallback's (the inner store is its owner's)
  SweepProgress SweepSome(size_t max_leases) override;  // the same
  bool decides_failures() const override { return true; }

  // Shutdown, before `inner` goes: later acquires fail ("shutting down") and
  // the failure mode decides; later releases of its leases answer Unavailable
  // (the leases expire after their lease_ttl).
  void Detach() { inner_.store(nullptr); }
  bool detached() const { return inner_.load() == nullptr; }

 private:
  void OnResult(const AcquireRequest& request, StatusOr<AcquireResult> r, AcquireCallback& done);
  // The store holding a lease: the local fallback for a kLocalLeasePrefix id
  // (the prefix dropped from `lease_id`), else `inner` (nullptr once detached).
  ConcurrencyStore* StoreOf(std::string_view& lease_id);

  std::atomic<ConcurrencyStore*> inner_;
  MemoryConcurrencyStore local_;
  FailureObserver on_failure_;
};

}  // namespace ratelimit
