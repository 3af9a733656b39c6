#include "store/resilient_store.h"

#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

namespace ratelimit {

bool IsStoreFailure(const Status& s) { return !s.ok() && s.code() != StatusCode::kInvalidArgument; }

// ---- Rate limits -----------------------------------------------------------

ResilientStore::ResilientStore(std::shared_ptr<Store> inner, Options options)
    : inner_(std::move(inner)),
      local_(MemoryStore::Options{.max_keys = options.local_max_keys,
                                  .max_key_length = options.local_max_key_length,
                                  .clock = options.clock}),
      on_failure_(std::move(options.on_failure)) {}

ResilientStore::~ResilientStore() = default;

Limit ResilientStore::Scaled(const Limit& limit, int instances) {
  if (instances <= 1) return limit;
  const int64_t n = instances;
  LimitSpec spec = SpecOf(limit);
  spec.count = std::max<int64_t>(1, (spec.count + n - 1) / n);
  if (TakesRate(spec.algorithm)) spec.per_second /= static_cast<double>(n);
  StatusOr<Limit> out = MakeLimit(std::move(spec));
  if (out.ok()) out = out->WithBlockFor(limit.block_for());  // blocks hold locally too
  return out.ok() ? *out : limit;  // a refill too slow to express: keep the full limit
}

void ResilientStore::Check(const CheckRequest& request, CheckCallback done) {
  if ((request.on_failure.mode == FailureMode::kError && !on_failure_) ||
      request.checks.size() > kMaxChecksPerRequest) {
    return inner_->Check(request, std::move(done));  // nothing to add, or refused as invalid
  }
  // The request's views stay valid only during this call; copy what the
  // fallback needs (the key, the checks, in place: no allocation of their
  // own; the limits themselves are the caller's, alive until `done` runs, as
  // for any store).
  struct Saved {
    std::string key;
    std::array<LimitCheck, kMaxChecksPerRequest> checks;
    size_t n;
    OnFailure on_failure;
  };
  Saved saved{std::string(request.key), {}, request.checks.size(), request.on_failure};
  std::copy(request.checks.begin(), request.checks.end(), saved.checks.begin());
  inner_->Check(request, [this, saved = std::move(saved),
                          done = std::move(done)](StatusOr<CheckResult> r) mutable {
    if (r.ok() || !IsStoreFailure(r.status())) return done(std::move(r));
    Fallback({.key = saved.key,
              .checks = std::span<const LimitCheck>(saved.checks.data(), saved.n),
              .on_failure = saved.on_failure},
             r.status(), done);
  });
}

void ResilientStore::Fallback(const CheckRequest& request, const Status& failure,
                              CheckCallback& done) {
  if (on_failure_) on_failure_(failure, request.on_failure.mode);
  const std::span<const LimitCheck> checks = request.checks;
  CheckResult out;
  out.degraded = true;
  switch (request.on_failure.mode) {
    case FailureMode::kError: return done(failure);
    case FailureMode::kLocal: {
      const int instances = request.on_failure.expected_instances;
      std::vector<Limit> scaled;
      scaled.reserve(checks.size());
      for (const LimitCheck& c : checks) scaled.push_back(Scaled(*c.limit, instances));
      // A cost above this instance's share of a limit (the scaled limit):
      // on a bucket, the share is taken now and the rest booked as a debt
      // (Settle), which the share's refill pays off, so that the instances
      // together take no more than the limit's rate; a window's count cannot
      // carry a debt past its window, so there the request is refused
      // (nothing taken) until the store answers again.
      std::vector<LimitCheck> local_checks;
      std::vector<LimitSettle> debts;
      std::vector<size_t> indebted;  // the check of each debt
      bool unfit = false;
      local_checks.reserve(checks.size());
      for (size_t i = 0; i < checks.size(); ++i) {
        int64_t cost = checks[i].cost;
        const int64_t share = scaled[i].limit();
        if (cost > share && scaled[i].is_gcra()) {
          debts.push_back({&scaled[i], cost - share});
          indebted.push_back(i);
          cost = share;
        } else if (cost > share) {
          unfit = true;
        }
        local_checks.push_back({&scaled[i], cost});
      }
      if (unfit) {
        for (LimitCheck& c : local_checks) c.cost = 0;
        StatusOr<CheckResult> standing = local_.PeekSync({request.key, local_checks});
        out.decisions.resize(checks.size());
        for (size_t i = 0; i < checks.size(); ++i) {
          Decision& d = out.decisions[i];
          if (standing.ok()) {
            d = standing->decisions[i];
          } else {  // the local store is full: this client's state is unknown
            d.allowed = true;
            d.remaining = scaled[i].limit();
          }
          d.limit = scaled[i].limit();
          d.delay = std::chrono::microseconds(0);
          if (checks[i].cost > scaled[i].limit() && !scaled[i].is_gcra()) {
            d.allowed = false;
            d.retry_after = std::chrono::seconds(1);  // the store may answer again by then
          }
        }
        out.overall = Combine(out.decisions);
        return done(std::move(out));
      }
      StatusOr<CheckResult> r = local_.Decide({request.key, local_checks});
      if (r.ok()) {
        out.decisions = std::move(r->decisions);
        if (r->overall.allowed && !debts.empty()) {
          StatusOr<CheckResult> owed =
              local_.SettleSync({.key = request.key, .settlements = debts});
          for (size_t j = 0; owed.ok() && j < indebted.size(); ++j) {
            Decision& d = out.decisions[indebted[j]];
            d.remaining = owed->decisions[j].remaining;
            d.reset_after = owed->decisions[j].reset_after;
          }
        }
        out.overall = Combine(out.decisions);
        return done(std::move(out));
      }
      // The local store is full too: nothing left to decide with; let it through.
      [[fallthrough]];
    }
    case FailureMode::kOpen:
    case FailureMode::kClosed: {
      out.failed_closed = request.on_failure.mode == FailureMode::kClosed;
      out.decisions.resize(checks.size());
      for (size_t i = 0; i < checks.size(); ++i) {
        Decision& d = out.decisions[i];
        d.limit = checks[i].limit->limit();
        d.allowed = !out.failed_closed;
        d.remaining = out.failed_closed ? 0 : d.limit;  // unknown: the store could not say
        if (out.failed_closed) d.retry_after = std::chrono::seconds(1);
      }
      out.overall = Combine(out.decisions);
      return done(std::move(out));
    }
  }
}

void ResilientStore::Peek(const CheckRequest& request, CheckCallback done) {
  inner_->Peek(request, std::move(done));
}

void ResilientStore::Reset(std::string_view key, std::span<const Limit* const> limits,
                           ResetCallback done) {
  // The local fallback's state too (limits scaled or not share a name and
  // algorithm, so the same key): a reset client starts full everywhere.
  (void)local_.ResetSync(key, limits);
  inner_->Reset(key, limits, std::move(done));
}

// A settlement decides nothing, so a failure mode has no answer to give for
// it; what it decides is where the difference goes when the store fails:
//   local   the local fallback, on the scaled limits (where this instance's
//           checks are decided while the store is down): degraded
//   open, closed, error   nowhere: the failure (the caller counts it; the
//           reservation stands as charged)
// A settlement made once (`once`: a decision-API reservation) goes nowhere
// but the store, whatever the mode: its once-mark must live where every
// instance and the store's return see it (a local one let the same
// reservation settle again on Redis once it was back), and it corrects what
// the check took from the store, which the fallback never held. The caller
// gets the failure and retries.
// The call is never replayed: a failed call may have applied.
void ResilientStore::Settle(const SettleRequest& request, CheckCallback done) {
  if (request.settlements.size() > kMaxChecksPerRequest)
    return inner_->Settle(request, std::move(done));
  struct Saved {
    std::string key;
    std::vector<LimitSettle> settlements;
    OnFailure on_failure;
    bool once;
  };
  Saved saved{std::string(request.key),
              {request.settlements.begin(), request.settlements.end()},
              request.on_failure,
              !request.once.empty()};
  inner_->Settle(request, [this, saved = std::move(saved),
                           done = std::move(done)](StatusOr<CheckResult> r) mutable {
    if (r.ok() || !IsStoreFailure(r.status())) return done(std::move(r));
    if (on_failure_) on_failure_(r.status(), saved.on_failure.mode);
    if (saved.on_failure.mode != FailureMode::kLocal || saved.once) return done(std::move(r));
    std::vector<Limit> scaled;
    for (const LimitSettle& l : saved.settlements) {
      scaled.push_back(Scaled(*l.limit, saved.on_failure.expected_instances));
    }
    std::vector<LimitSettle> local;
    for (size_t i = 0; i < scaled.size(); ++i)
      local.push_back({&scaled[i], saved.settlements[i].delta});
    StatusOr<CheckResult> l = local_.SettleSync({.key = saved.key, .settlements = local});
    if (!l.ok()) return done(std::move(r));  // the local store is full too: the failure
    l->degraded = true;
    done(std::move(l));
  });
}

void ResilientStore::Unblock(std::string_view key, std::span<const Limit* const> limits,
                             ResetCallback done) {
  local_.Unblock(key, limits, [](const Status&) {});  // in memory: cannot fail
  inner_->Unblock(key, limits, std::move(done));
}

size_t ResilientStore::SweepPart(size_t part, size_t parts) {
  return inner_->SweepPart(part, parts) + local_.SweepPart(part, parts);
}

// ---- Concurrency limits ----------------------------------------------------

ResilientConcurrencyStore::ResilientConcurrencyStore(ConcurrencyStore* inner, Options options)
    : inner_(inner),
      local_(MemoryConcurrencyStore::Options{.max_keys = options.local_max_keys,
                                             .max_key_length = options.local_max_key_length,
                                             .clock = options.clock}),
      on_failure_(std::move(options.on_failure)) {}

ResilientConcurrencyStore::~ResilientConcurrencyStore() = default;

size_t ResilientConcurrencyStore::Sweep() { return local_.Sweep(); }

ConcurrencyStore::SweepProgress ResilientConcurrencyStore::SweepSome(size_t max_leases) {
  return local_.SweepSome(max_leases);
}

void ResilientConcurrencyStore::Acquire(const AcquireRequest& request, AcquireCallback done) {
  ConcurrencyStore* inner = inner_.load();
  if (inner == nullptr) return OnResult(request, Unavailable("shutting down"), done);
  struct Copy {
    std::string key, name;
    AcquireRequest request;
  };
  auto copy =
      std::make_shared<Copy>(Copy{std::string(request.key), std::string(request.name), request});
  copy->request.key = copy->key;
  copy->request.name = copy->name;
  inner->Acquire(request, [this, copy, done = std::move(done)](StatusOr<AcquireResult> r) mutable {
    OnResult(copy->request, std::move(r), done);
  });
}

void ResilientConcurrencyStore::OnResult(const AcquireRequest& request, StatusOr<AcquireResult> r,
                                         AcquireCallback& done) {
  if (r.ok() || !IsStoreFailure(r.status())) return done(std::move(r));
  const FailureMode mode = request.on_failure.mode;
  if (on_failure_) on_failure_(r.status(), mode);
  AcquireResult out;
  out.degraded = true;
  switch (mode) {
    case FailureMode::kError: return done(std::move(r));
    case FailureMode::kOpen:
      out.acquired = true;
      out.max_in_flight = request.max_in_flight;
      return done(std::move(out));
    case FailureMode::kClosed:
      out.failed_closed = true;
      out.max_in_flight = request.max_in_flight;
      return done(std::move(out));
    case FailureMode::kLocal: {
      const int64_t n = std::max(1, request.on_failure.expected_instances);
      const int64_t max = std::max<int64_t>(1, (request.max_in_flight + n - 1) / n);
      StatusOr<AcquireResult> l = local_.AcquireSync({.key = request.key,
                                                      .name = request.name,
                                                      .max_in_flight = max,
                                                      .lease_ttl = request.lease_ttl,
                                                      .route_wide = request.route_wide});
      if (!l.ok()) {  // the local store is full too: let it through
        out.acquired = true;
        out.max_in_flight = max;
        return done(std::move(out));
      }
      out = *std::move(l);
      out.degraded = true;
      if (out.acquired) out.lease_id = std::string(kLocalLeasePrefix) + out.lease_id;
      return done(std::move(out));
    }
  }
}

ConcurrencyStore* ResilientConcurrencyStore::StoreOf(std::string_view& lease_id) {
  if (lease_id.starts_with(kLocalLeasePrefix)) {
    lease_id.remove_prefix(kLocalLeasePrefix.size());
    return &local_;
  }
  return inner_.load();
}

void ResilientConcurrencyStore::Release(std::string_view key, std::string_view name,
                                        std::string_view lease_id, ReleaseCallback done) {
  ConcurrencyStore* store = StoreOf(lease_id);
  if (store == nullptr) return done(Unavailable("shutting down"));
  store->Release(key, name, lease_id, std::move(done));
}

void ResilientConcurrencyStore::Renew(std::string_view key, std::string_view name,
                                      std::string_view lease_id, std::chrono::microseconds ttl,
                                      RenewCallback done) {
  ConcurrencyStore* store = StoreOf(lease_id);
  if (store == nullptr) return done(Unavailable("shutting down"));
  store->Renew(key, name, lease_id, ttl, std::move(done));
}

}  // namespace ratelimit
