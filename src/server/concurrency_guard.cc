#include "server/concurrency_guard.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/steady_clock.h"
#include "ratelimit/thread_annotations.h"
#include "server/headers.h"
#include "server/json_log.h"
#include "server/metrics.h"
#include "server/store_factory.h"
#include "store/resilient_store.h"

namespace ratelimit::server {

namespace net = boost::asio;
using policy::ConcurrencyConfig;
using std::chrono::milliseconds;

namespace {

std::string WaitKey(std::string_view key, std::string_view name) {
  std::string k(key);
  k.push_back('\0');
  k.append(name);
  return k;
}

}  // namespace

struct ConcurrencyLimiter::Waiter {
  ConcurrencyRequest req;
  std::function<void(ConcurrencyOutcome)> done;
  std::chrono::steady_clock::time_point started, deadline;
  milliseconds backoff;
  net::strand<net::any_io_executor> strand;
  net::steady_timer timer;
  bool queued = false;  // counted in `waiting` and listed in State::waiters
  bool woken = false;   // on the strand: a release asked for an early retry
  // Under State::mu: a release woke it and its retry has not been answered
  // yet; the next release wakes the next waiter, not this one again.
  bool wake_pending = false;
  bool retry_after_wake = false;  // this Try began after a wake-up (one Try at a time)
  ConcurrencyCells* cells = nullptr;

  Waiter(net::any_io_executor ex, milliseconds first_retry)
      : backoff(first_retry), strand(net::make_strand(ex)), timer(strand) {}
};

struct LeaseGuard::State : std::enable_shared_from_this<LeaseGuard::State> {
  using Waiter = ConcurrencyLimiter::Waiter;
  net::any_io_executor executor;
  milliseconds first_retry, max_retry;  // a waiter's polls (Options)
  milliseconds release_retry, max_release_retry;
  size_t max_release_retries = 0;
  // The server's store with the failure modes (the local fallback's leases
  // start with kLocalLeasePrefix). Detached at shutdown: leases of the
  // server's store are then left to expire.
  std::unique_ptr<ResilientConcurrencyStore> store;
  LogSampler error_log{10, "concurrency store errors suppressed"};
  LogSampler lost_log{10, "concurrency lease lost warnings suppressed"};
  Mutex mu;
  bool stopped RL_GUARDED_BY(mu) = false;
  size_t release_retries RL_GUARDED_BY(mu) = 0;  // failed releases waiting to be retried
  // (key, name) -> requests waiting for one of its leases, oldest first.
  std::unordered_map<std::string, std::deque<std::weak_ptr<ConcurrencyLimiter::Waiter>>> waiters
      RL_GUARDED_BY(mu);

  // A lease of (key, name) was given back here: the oldest waiter not woken
  // yet asks again now (two releases in a row wake two waiters).
  void Wake(const std::string& key, const std::string& name) {
    std::shared_ptr<ConcurrencyLimiter::Waiter> w;
    {
      LockGuard lock(mu);
      if (stopped) return;
      auto it = waiters.find(WaitKey(key, name));
      if (it == waiters.end()) return;
      std::erase_if(it->second, [](const std::weak_ptr<Waiter>& x) { return x.expired(); });
      for (const std::weak_ptr<Waiter>& x : it->second) {
        std::shared_ptr<Waiter> p = x.lock();
        if (p && !p->wake_pending) {
          w = std::move(p);
          break;
        }
      }
      if (it->second.empty()) waiters.erase(it);
      if (!w) return;
      w->wake_pending = true;
    }
    net::dispatch(w->strand, [w] {
      w->woken = true;
      w->timer.cancel();
    });
  }

  // The store failed to release lease `id`: ask again after `backoff`, unless
  // it expires by itself before (`expires`), or too many already wait.
  void RetryRelease(std::string key, std::string name, std::string id,
                    std::chrono::steady_clock::time_point expires, milliseconds backoff);

  void Try(std::shared_ptr<Waiter> w);
  void OnResult(std::shared_ptr<Waiter> w, StatusOr<AcquireResult> r);
  void Finish(std::shared_ptr<Waiter> w, ConcurrencyOutcome o);

  void LogError(std::string_view what, const Status& s) {
    if (!error_log.AdmitAndReport()) return;
    Log(Level::kWarn, what, {{"error", s.ToString()}});
  }
};

milliseconds RenewInterval(milliseconds lease_ttl) {
  return std::max({milliseconds(1), lease_ttl / 3, std::min(milliseconds(10), lease_ttl / 2)});
}

// A held lease: renewed every RenewInterval(ttl) until Stop() or until it is
// lost. The timer and the flags are under `mu` (the store answers on its own
// threads, the guard is released on any); a store call is never made under it
// (the memory store answers inside the call).
struct LeaseGuard::Held : std::enable_shared_from_this<LeaseGuard::Held> {
  Held(std::shared_ptr<State> st, std::string key, std::string name, std::string id,
       std::string route, milliseconds ttl)
      : st(std::move(st)),
        key(std::move(key)),
        name(std::move(name)),
        id(std::move(id)),
        route(std::move(route)),
        cells(Metrics::Global().Concurrency(this->route)),
        ttl(ttl),
        every(RenewInterval(ttl)),
        timer(this->st->executor),
        expires(core::SteadyClock::now() + ttl) {}

  const std::shared_ptr<State> st;
  const std::string key, name, id, route;
  ConcurrencyCells& cells;
  const milliseconds ttl, every;

  void Start() {
    cells.in_flight.Add(1);
    LockGuard lock(mu);
    Arm();
  }

  // No renewal after this one (an answer already on its way is ignored).
  // Returns about when the store drops the lease by itself.
  std::chrono::steady_clock::time_point Stop() {
    LockGuard lock(mu);
    stopped = true;
    timer.cancel();
    return expires;
  }

 private:
  void Arm() RL_REQUIRES(mu) {
    timer.expires_after(every);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code&) {
      self->Tick();  // cancelled only by Stop(): Tick sees `stopped`
    });
  }

  void Tick() {
    const auto now = core::SteadyClock::now();
    bool expired = false;
    {
      LockGuard lock(mu);
      if (stopped) return;
      expired = stopped = now >= expires;  // the renewals failed until it expired
    }
    if (expired) return Lost("renewals failed until it expired");
    {
      LockGuard lock(st->mu);
      if (st->stopped) return;  // the executor is going away
    }
    if (!id.starts_with(kLocalLeasePrefix) && st->store->detached()) return;  // shutting down
    st->store->Renew(key, name, id, ttl, [self = shared_from_this(), now](StatusOr<bool> r) {
      self->OnRenewed(now, std::move(r));
    });
  }

  void OnRenewed(std::chrono::steady_clock::time_point sent, StatusOr<bool> r) {
    {
      LockGuard lock(mu);
      if (stopped) return;  // released meanwhile: the answer says nothing
      if (r.ok() && *r) {
        expires = sent + ttl;  // the store's clock started no sooner
        return Arm();
      }
      if (IsStoreFailure(r.status())) {
        Arm();  // once more at the next tick, while it may still be held
      } else {
        stopped = true;
      }
    }
    if (!r.ok() && IsStoreFailure(r.status())) {
      return st->LogError("concurrency lease renewal failed: retrying", r.status());
    }
    Lost(r.ok() ? "the store no longer holds it" : r.status().ToString());
  }

  void Lost(std::string_view why) {
    cells.lease_lost.Inc();
    if (!st->lost_log.AdmitAndReport()) return;
    Log(Level::kWarn, "concurrency lease lost while its request runs: the place may be taken",
        {{"route", route}, {"name", name}, {"reason", why}});
  }

  Mutex mu;
  net::steady_timer timer RL_GUARDED_BY(mu);
  bool stopped RL_GUARDED_BY(mu) = false;
  // When the store drops the lease unless renewed: lease_ttl after the last
  // renewal that held it was sent (the guard's making, at first).
  std::chrono::steady_clock::time_point expires RL_GUARDED_BY(mu);
};

LeaseGuard::LeaseGuard(std::shared_ptr<State> state, std::string key, std::string name,
                       std::string id, std::string route, milliseconds lease_ttl)
    : held_(std::make_shared<Held>(std::move(state), std::move(key), std::move(name), std::move(id),
                                   std::move(route), lease_ttl)) {
  held_->Start();
}

LeaseGuard::~LeaseGuard() { Release(); }

const std::string& LeaseGuard::id() const { return held_->id; }

std::string LeaseGuard::Detach() {
  if (!std::exchange(released_, true)) {
    held_->Stop();  // the caller renews it, or lets it expire
    held_->cells.in_flight.Add(-1);
  }
  return held_->id;
}

void LeaseGuard::Release(std::function<void()> then) {
  if (std::exchange(released_, true)) {
    if (then) then();
    return;
  }
  const std::chrono::steady_clock::time_point expires = held_->Stop();
  held_->cells.in_flight.Add(-1);
  const Held& h = *held_;
  std::shared_ptr<State> st = h.st;
  if (!h.id.starts_with(kLocalLeasePrefix) && st->store->detached()) {
    // Shutting down: the lease expires after its lease_ttl.
    if (then) then();
    return;
  }
  st->store->Release(h.key, h.name, h.id,
                     [st, held = held_, expires, then = std::move(then)](StatusOr<bool> r) mutable {
                       if (!r.ok() && r.status().code() != StatusCode::kInvalidArgument) {
                         st->LogError("concurrency lease release failed: retrying", r.status());
                         st->RetryRelease(held->key, held->name, held->id, expires,
                                          st->release_retry);
                       }
                       st->Wake(held->key, held->name);
                       if (then) then();
                     });
}

void LeaseGuard::State::RetryRelease(std::string key, std::string name, std::string id,
                                     std::chrono::steady_clock::time_point expires,
                                     milliseconds backoff) {
  if (store->detached() || core::SteadyClock::now() + backoff >= expires) return;
  {
    LockGuard lock(mu);
    if (stopped) return;
    if (release_retries >= max_release_retries) {
      LogError("concurrency lease release retries full: the lease expires by itself",
               ResourceExhausted(std::to_string(max_release_retries) + " retries waiting"));
      return;
    }
    ++release_retries;
  }
  auto timer = std::make_shared<net::steady_timer>(executor, backoff);
  timer->async_wait([st = shared_from_this(), timer, key = std::move(key), name = std::move(name),
                     id = std::move(id), expires, backoff](const boost::system::error_code&) {
    {
      LockGuard lock(st->mu);
      --st->release_retries;
      if (st->stopped) return;
    }
    if (st->store->detached()) return;
    st->store->Release(key, name, id, [st, key, name, id, expires, backoff](StatusOr<bool> r) {
      if (r.ok()) return st->Wake(key, name);
      if (r.status().code() == StatusCode::kInvalidArgument) return;
      st->RetryRelease(key, name, id, expires, std::min(backoff * 2, st->max_release_retry));
    });
  });
}

ConcurrencyLimiter::ConcurrencyLimiter(net::any_io_executor executor, ConcurrencyStore& store,
                                       Options options)
    : state_(std::make_shared<LeaseGuard::State>()) {
  state_->executor = std::move(executor);
  state_->first_retry = options.first_retry;
  state_->release_retry = options.release_retry;
  state_->max_release_retry = std::max(options.release_retry, options.max_release_retry);
  state_->max_release_retries = options.max_release_retries;
  state_->max_retry = std::max(options.first_retry, options.max_retry);
  state_->store = std::make_unique<ResilientConcurrencyStore>(
      &store, ResilientConcurrencyStore::Options{.local_max_keys = options.local_max_keys,
                                                 .local_max_key_length = options.max_key_length,
                                                 .on_failure = ConcurrencyFailureReporter()});
}

ConcurrencyLimiter::~ConcurrencyLimiter() { Stop(); }

void ConcurrencyLimiter::Stop() {
  LockGuard lock(state_->mu);
  state_->stopped = true;
  state_->waiters.clear();
}

void ConcurrencyLimiter::DetachStore() { state_->store->Detach(); }

ConcurrencyStore::SweepProgress ConcurrencyLimiter::SweepSome(size_t max_leases) {
  return state_->store->SweepSome(max_leases);
}

void ConcurrencyLimiter::Acquire(ConcurrencyRequest request,
                                 std::function<void(ConcurrencyOutcome)> done) {
  auto w = std::make_shared<Waiter>(state_->executor, state_->first_retry);
  w->started = core::SteadyClock::now();
  w->deadline = w->started + request.config.max_wait;
  w->cells = &Metrics::Global().Concurrency(request.route);
  w->req = std::move(request);
  w->done = std::move(done);
  state_->Try(std::move(w));
}

void LeaseGuard::State::Try(std::shared_ptr<Waiter> w) {
  const AcquireRequest r{
      .key = w->req.key,
      .name = w->req.name,
      .max_in_flight = w->req.config.max_in_flight,
      .lease_ttl = w->req.config.lease_ttl,
      .on_failure = {.mode = w->req.failure_mode,
                     .expected_instances = std::max(1, w->req.expected_instances)},
      // The gateway's whole-route key: a full memory store still takes it.
      .route_wide = w->req.config.per == ConcurrencyConfig::Per::kRoute};
  store->Acquire(r, [st = shared_from_this(), w](StatusOr<AcquireResult> res) mutable {
    st->OnResult(std::move(w), std::move(res));
  });
}

void LeaseGuard::State::OnResult(std::shared_ptr<Waiter> w, StatusOr<AcquireResult> r) {
  ConcurrencyOutcome o;
  if (!r.ok()) {
    o.status = r.status().code() == StatusCode::kInvalidArgument
                   ? 400
                   : static_cast<unsigned>(w->req.closed_status);  // failure mode error
    o.degraded = o.failed_closed = o.status != 400;
    o.error = o.degraded ? "the concurrency limit store is unavailable" : r.status().message();
    return Finish(std::move(w), std::move(o));
  }
  o.degraded = r->degraded;
  if (r->failed_closed) {
    o.status = static_cast<unsigned>(w->req.closed_status);
    o.failed_closed = true;
    o.error = "the concurrency limit store is unavailable";
    o.result = *std::move(r);
    return Finish(std::move(w), std::move(o));
  }
  o.result = *std::move(r);
  if (o.result.acquired) {
    // Admitted without a lease when failing open.
    if (!o.result.lease_id.empty()) {
      o.lease =
          std::make_unique<LeaseGuard>(shared_from_this(), w->req.key, w->req.name,
                                       o.result.lease_id, w->req.route, w->req.config.lease_ttl);
    }
    return Finish(std::move(w), std::move(o));
  }
  // Denied.
  if (std::exchange(w->retry_after_wake, false)) {
    LockGuard lock(mu);
    w->wake_pending = false;  // the next release may wake it again
  }
  const auto now = core::SteadyClock::now();
  o.status = 429;
  if (w->req.config.on_limit == ConcurrencyConfig::OnLimit::kReject) {
    o.denial = ConcurrencyOutcome::Denial::kLimit;
    return Finish(std::move(w), std::move(o));
  }
  if (now >= w->deadline) {
    o.denial = ConcurrencyOutcome::Denial::kWaitTimeout;
    return Finish(std::move(w), std::move(o));
  }
  if (!w->queued) {
    LockGuard lock(mu);
    if (stopped || w->cells->waiting.value() >= static_cast<int64_t>(w->req.config.max_waiting)) {
      o.denial = ConcurrencyOutcome::Denial::kQueueFull;
    } else {
      w->queued = true;
      w->cells->waiting.Add(1);
      waiters[WaitKey(w->req.key, w->req.name)].push_back(w);
    }
  }
  if (o.denial == ConcurrencyOutcome::Denial::kQueueFull) return Finish(std::move(w), std::move(o));
  const auto delay = std::min<std::chrono::steady_clock::duration>(w->backoff, w->deadline - now);
  w->backoff = std::min(w->backoff * 2, max_retry);
  net::dispatch(w->strand, [st = shared_from_this(), w, delay] {
    if (std::exchange(w->woken, false)) {
      w->retry_after_wake = true;
      return st->Try(w);
    }
    w->timer.expires_after(delay);
    w->timer.async_wait([st, w](const boost::system::error_code&) {
      // A wake-up cancels the timer: retry either way.
      if (std::exchange(w->woken, false)) w->retry_after_wake = true;
      st->Try(w);
    });
  });
}

void LeaseGuard::State::Finish(std::shared_ptr<Waiter> w, ConcurrencyOutcome o) {
  if (w->queued) {
    w->cells->waiting.Add(-1);
    LockGuard lock(mu);
    auto it = waiters.find(WaitKey(w->req.key, w->req.name));
    if (it != waiters.end()) {
      std::erase_if(it->second, [&w](const std::weak_ptr<Waiter>& x) {
        auto p = x.lock();
        return !p || p == w;
      });
      if (it->second.empty()) waiters.erase(it);
    }
  }
  switch (o.denial) {
    case ConcurrencyOutcome::Denial::kNone: break;
    case ConcurrencyOutcome::Denial::kLimit:
      (w->req.shadow ? w->cells->denied_shadow : w->cells->denied_limit).Inc();
      break;
    case ConcurrencyOutcome::Denial::kWaitTimeout: w->cells->denied_timeout.Inc(); break;
    case ConcurrencyOutcome::Denial::kQueueFull: w->cells->denied_full.Inc(); break;
  }
  o.waited =
      std::chrono::duration_cast<std::chrono::microseconds>(core::SteadyClock::now() - w->started);
  auto done = std::move(w->done);
  done(std::move(o));
}

void ConcurrencyLimiter::Release(std::string_view key, std::string_view name,
                                 std::string_view lease_id, ReleaseCallback done) {
  std::shared_ptr<LeaseGuard::State> st = state_;
  auto wake = [st, k = std::string(key), n = std::string(name),
               done = std::move(done)](StatusOr<bool> r) {
    if (r.ok() && *r) st->Wake(k, n);
    done(std::move(r));
  };
  st->store->Release(key, name, lease_id, std::move(wake));
}

void ConcurrencyLimiter::Renew(std::string_view key, std::string_view name,
                               std::string_view lease_id, milliseconds ttl, RenewCallback done) {
  state_->store->Renew(key, name, lease_id, ttl, std::move(done));
}

std::string ConcurrencyExceededBody(const ConcurrencyOutcome& o, std::string_view name,
                                    std::string_view instance) {
  const std::string limit = "concurrency:" + std::string(name);
  std::string detail = "concurrency limit '" + std::string(name) +
                       "' reached: " + std::to_string(o.result.in_flight) + " of " +
                       std::to_string(o.result.max_in_flight) + " requests in flight";
  if (o.denial == ConcurrencyOutcome::Denial::kWaitTimeout) {
    detail += " after waiting " + std::to_string(CeilMillis(o.waited)) + " ms";
  } else if (o.denial == ConcurrencyOutcome::Denial::kQueueFull) {
    detail += ", and too many requests already waiting";
  }
  nlohmann::json j = {
      {"type", "https://iana.org/assignments/http-problem-types#quota-exceeded"},
      {"title", "Too Many Requests"},
      {"status", 429},
      {"detail", detail},
  };
  if (!instance.empty()) j["instance"] = instance;
  j["limit"] = limit;
  j["max_in_flight"] = o.result.max_in_flight;
  j["in_flight"] = o.result.in_flight;
  j["retry_after_seconds"] = 1;
  j["violated-policies"] = nlohmann::json::array({limit});
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ratelimit::server
