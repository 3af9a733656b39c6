// ConcurrencyLimiter: the server's side of concurrency limits (issue #10):
// the failure mode, waiting for a lease, metrics, and the RAII lease guard.
//
//   limiter.Acquire({.key = plan.key, .name = route, .config = *plan.config,
//                    .failure_mode = plan.failure_mode},
//                   [](ConcurrencyOutcome o) {
//                     if (o.status != 200) ...;  // 429 (or closed_status)
//                     // keep o.lease alive until the upstream answer ended:
//                     // destroying it releases the lease, on every path.
//                   });
//
// When the store cannot decide (Redis down, breaker open, overloaded), the
// failure mode decides, as for rate limits:
//   open    admitted without a lease, degraded
//   closed  refused with store.closed_status, degraded
//   local   a process-local MemoryConcurrencyStore with max_in_flight divided
//           by store.expected_instances (rounded up), degraded; its lease ids
//           start with "l-" (the decision API's release and renew find them
//           by that)
//
// on_limit: wait holds a denied request without a thread: it retries after
// 10 ms, doubling up to 200 ms (other instances' releases are only seen by
// asking), and at once when a lease of the same (key, name) is released on
// this instance (each release wakes one more waiter, oldest first); after max_wait it is refused
// (429). At most max_waiting requests of a route wait at once on this instance; beyond, 429 at
// once.
//
// Thread-safety: all methods may be called from any thread; `done` runs on
// a store thread or a timer's strand, possibly inside the call.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "policy/config.h"
#include "ratelimit/concurrency.h"

namespace ratelimit::server {

class ConcurrencyLimiter;

// A held lease. Destroying it (or Release()) gives it back, exactly once.
// A release the store failed is retried (the release is idempotent), 100 ms
// later, doubling up to 2 s, until the store takes it or the lease would have
// expired anyway; at most Options::max_release_retries wait at once (beyond,
// the lease is left to expire: logged).
//
// While it is held, the guard renews the lease (ConcurrencyStore::Renew, a
// timer on the limiter's executor) every RenewInterval(lease_ttl), so that a
// request that runs longer than lease_ttl (a streamed answer) keeps its
// place: lease_ttl bounds how long the leases of a crashed instance outlive
// it, not a request's length. A renewal the store fails is tried again at the
// next tick, until the lease would have expired; a lease the store says is
// no longer held (or that expired meanwhile) is lost: the guard stops
// renewing, counts ratelimit_concurrency_lease_lost_total{route} and logs
// (sampled). Release, Detach and destruction stop the renewals.
class LeaseGuard {
 public:
  ~LeaseGuard();
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

  void Release() { Release(nullptr); }
  // Releases, and runs `then` once the store has answered (or failed; or at
  // once when already released). The gateway answers the client only then,
  // so a client that sends its next request after the answer never finds
  // its own previous lease still held.
  void Release(std::function<void()> then);
  // Hands the lease to someone else (the decision API's caller, who renews
  // and releases it with POST /v1/renew and /v1/release): the guard forgets
  // it without releasing.
  std::string Detach();
  const std::string& id() const;  // "l-..." for a local-fallback lease

  struct State;  // the limiter's, shared with its leases
  LeaseGuard(std::shared_ptr<State> state, std::string key, std::string name, std::string id,
             std::string route, std::chrono::milliseconds lease_ttl);

 private:
  // The lease and its renewal timer, shared with the timer's wait and the
  // renewal's store call.
  struct Held;

  std::shared_ptr<Held> held_;
  bool released_ = false;
};

// How often a lease of `lease_ttl` is renewed: every third of it (two
// renewals in a row may fail before it expires), but no more often than
// every 10 ms unless lease_ttl is under 20 ms (then every half of it).
std::chrono::milliseconds RenewInterval(std::chrono::milliseconds lease_ttl);

struct ConcurrencyOutcome {
  enum class Denial { kNone, kLimit, kWaitTimeout, kQueueFull };
  unsigned status = 200;  // 200 admitted; 429 denied; closed_status (store down, closed)
  // Why a 429 was refused: the limit (kNone when admitted, for a 400, and
  // when failing closed, even with store.closed_status 429).
  Denial denial = Denial::kNone;
  bool failed_closed = false;  // the store could not decide, failure mode closed
  AcquireResult result;        // the store's answer (the last one, after waiting)
  bool degraded = false;       // the failure mode decided
  std::string error;           // set for a closed failure and for 400 (bad request)
  std::chrono::microseconds waited{0};
  std::unique_ptr<LeaseGuard> lease;  // admitted with a lease (none when failing open)
};

struct ConcurrencyRequest {
  std::string key;
  std::string name;   // the limit's name: the route class
  std::string route;  // the metrics label ("" for the decision API)
  policy::ConcurrencyConfig config;
  policy::FailureMode failure_mode = policy::FailureMode::kOpen;
  // The policy's store.expected_instances and store.closed_status, as the
  // request's policy has them (a reload changes them for the next request).
  int expected_instances = 1;
  int closed_status = 503;
  // A shadow route's limit: a denial is counted as {reason="shadow"}, not as
  // a refusal (the caller forwards the request anyway, without a lease).
  bool shadow = false;
};

class ConcurrencyLimiter {
 public:
  struct Options {
    // The longest key of the local fallback (failure mode local), the
    // store's (StoreKeyLength).
    size_t max_key_length = kDefaultMaxKeyLength;
    // The most leases the local fallback holds (store.local_max_keys, as the
    // rate limits' fallback); beyond, it admits without a lease, but for a
    // per: route limit (AcquireRequest::route_wide).
    size_t local_max_keys = 100'000;
    // A waiter asks again after first_retry, doubling up to max_retry (and
    // at once when a lease of its (key, name) is released here).
    std::chrono::milliseconds first_retry{10};
    std::chrono::milliseconds max_retry{200};
    // A failed release is retried first after release_retry, doubling up to
    // max_release_retry; at most max_release_retries wait at once.
    std::chrono::milliseconds release_retry{100};
    std::chrono::milliseconds max_release_retry{2000};
    size_t max_release_retries = 10'000;
  };
  // `executor` runs the wait timers. `store` (shared by every instance) is
  // not owned: it must outlive the limiter and every lease (the server
  // destroys it after its io_context, where leases may still be held).
  ConcurrencyLimiter(boost::asio::any_io_executor executor, ConcurrencyStore& store,
                     Options options);
  ConcurrencyLimiter(boost::asio::any_io_executor executor, ConcurrencyStore& store)
      : ConcurrencyLimiter(std::move(executor), store, Options{}) {}
  ~ConcurrencyLimiter();

  void Acquire(ConcurrencyRequest request, std::function<void(ConcurrencyOutcome)> done);
  // Gives back a lease taken by the decision API (a "l-" id: the local store's).
  void Release(std::string_view key, std::string_view name, std::string_view lease_id,
               ReleaseCallback done);
  // Keeps a lease taken by the decision API for `ttl` from now (a "l-" id:
  // in the local store). A store failure is the caller's, as for Release: no
  // failure mode decides whether a lease is held.
  void Renew(std::string_view key, std::string_view name, std::string_view lease_id,
             std::chrono::milliseconds ttl, RenewCallback done);

  // Drops at most `max_leases` of the local fallback's expired leases (the
  // server's sweep timer: ConcurrencyStore::SweepSome).
  ConcurrencyStore::SweepProgress SweepSome(size_t max_leases);
  // No more wake-ups on the executor (it is about to go away).
  void Stop();

  // Shutdown, before the store goes: later releases and acquires no longer
  // reach it (releases are left to expire; acquires fail by the failure mode).
  void DetachStore();

  struct Waiter;

 private:
  std::shared_ptr<LeaseGuard::State> state_;
};

// The RFC 9457 body of a concurrency 429:
// {"type": ".../http-problem-types#quota-exceeded", "title": "Too Many Requests",
//  "status": 429, "detail": "concurrency limit 'upload' reached: 3 of 3 requests in flight",
//  "instance": "/upload", "limit": "concurrency:upload", "max_in_flight": 3, "in_flight": 3,
//  "retry_after_seconds": 1, "violated-policies": ["concurrency:upload"]}
std::string ConcurrencyExceededBody(const ConcurrencyOutcome& o, std::string_view name,
                                    std::string_view instance);

}  // namespace ratelimit::server
