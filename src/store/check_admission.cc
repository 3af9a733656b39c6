#include "store/check_admission.h"

#include <random>

#include "store/hash.h"

namespace ratelimit::store {

CheckAdmission::CheckAdmission(Options options)
    : clock_(options.clock != nullptr ? options.clock : &Clock::Steady()),
      bound_(options.bound),
      seed_(std::random_device{}()) {
  if (options.cache_entries > 0) {
    cache_ = std::make_unique<OverLimitCache>(OverLimitCache::Options{
        .max_entries = options.cache_entries, .min_retry = options.cache_min_retry});
  }
}

std::optional<CheckResult> CheckAdmission::Answer(const CheckRequest& req, bool peek, int64_t now,
                                                  PendingCheck& p) {
  p.generation = generation_.load(std::memory_order_acquire);
  if (cache_ != nullptr && !peek) {
    p.cache_fp = cache_->Fingerprint(req);
    if (p.cache_fp) {
      if (std::optional<CheckResult> hit = cache_->Lookup(*p.cache_fp, now)) {
        hits_.fetch_add(1, std::memory_order_relaxed);
        return hit;
      }
    }
  }
  // A hot key of a limit with token prefetch: spend a token taken earlier,
  // or ask for several.
  const LimitCheck& only = req.checks.front();
  if (!peek && req.checks.size() == 1 && only.cost == 1 && only.limit->prefetch() > 1) {
    p.prefetch_fp =
        Mix(Hash64(req.key, seed_) ^ only.limit->identity_hash(), 0x9E3779B97F4A7C15ULL);
    if (std::optional<CheckResult> spent = prefetched_.Spend(p.prefetch_fp, now)) {
      prefetch_hits_.fetch_add(1, std::memory_order_relaxed);
      return spent;
    }
    p.prefetch = only.limit->prefetch();
    p.want = prefetched_.Want(p.prefetch_fp, now, *only.limit);
  }
  return std::nullopt;
}

CheckAdmission::Turn CheckAdmission::Join(PendingCheck& p, int64_t now,
                                          StatusOr<CheckResult>* answer) {
  if (!p.cache_fp) return Turn::kLead;
  WaiterShard& shard = WaitersOf(*p.cache_fp);
  LockGuard lock(shard.mu);
  auto [it, first_of_key] = shard.by_fp.try_emplace(*p.cache_fp);
  if (!first_of_key) {
    // Same key and limits already in flight: its answer may serve this one.
    if (bound_->TryAdd()) {
      it->second.push_back(std::move(p));
      return Turn::kWaiting;
    }
    *answer = bound_->Overloaded();
    return Turn::kAnswered;
  }
  if (std::optional<CheckResult> hit = cache_->Lookup(*p.cache_fp, now)) {
    // A leader answered between the first look and now (it fills the cache
    // before it lets go of its waiters): no call needed.
    shard.by_fp.erase(it);
    hits_.fetch_add(1, std::memory_order_relaxed);
    *answer = *std::move(hit);
    return Turn::kAnswered;
  }
  p.leader = true;
  return Turn::kLead;
}

void CheckAdmission::Release(PendingCheck& leader, const CheckResult* denial,
                             const Dispatch& dispatch) {
  if (!leader.leader) return;
  leader.leader = false;
  std::vector<PendingCheck> released;
  {
    WaiterShard& shard = WaitersOf(*leader.cache_fp);
    LockGuard lock(shard.mu);
    auto it = shard.by_fp.find(*leader.cache_fp);
    if (it == shard.by_fp.end()) return;
    released = std::move(it->second);
    shard.by_fp.erase(it);
  }
  for (PendingCheck& w : released) {
    bound_->Sub(1);
    if (denial != nullptr &&
        w.submitted_at < leader.submitted_at + denial->overall.retry_after.count()) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      w.done(*denial);
    } else if (std::optional<CheckResult> spent =
                   w.prefetch_fp != 0 ? prefetched_.Spend(w.prefetch_fp, clock_->NowMicros())
                                      : std::nullopt) {
      prefetch_hits_.fetch_add(1, std::memory_order_relaxed);
      w.done(*std::move(spent));
    } else {
      if (w.want > 1) {  // the leader asked for the prefetch: this one takes one token
        w.want = 1;
        w.call.SetPrefetch(1);
      }
      dispatch(std::move(w));
    }
  }
}

CheckResult CheckAdmission::Settle(PendingCheck& p, lua::CheckAnswer answer,
                                   const Dispatch& dispatch) {
  CheckResult r = std::move(answer.result);
  // A Clear (a Reset) since the check was admitted: its answer may be of the
  // state the reset removed. It is answered, but neither its denial nor its
  // prefetched tokens are kept; its waiters send their own.
  if (p.generation != generation_.load(std::memory_order_acquire)) {
    Release(p, nullptr, dispatch);
    return r;
  }
  int64_t granted = 0;
  if (p.want > 1) {
    granted = answer.tokens_taken;
    prefetched_.Grant(p.prefetch_fp, p.prefetch, granted, r.decisions[0], p.submitted_at,
                      clock_->NowMicros());
    if (granted > 1) r.decisions[0].remaining += granted - 1;
    r.overall = Combine(r.decisions);
  }
  if (!p.cache_fp) return r;
  // A denial, or the denial that follows taking the last unit.
  std::optional<CheckResult> denial;
  if (!r.overall.allowed) {
    denial = r;
  } else if (r.decisions.size() == 1 && granted <= 1) {
    if (std::optional<Decision> next = OverLimitCache::DenialAfterLastUnit(
            p.algorithm, p.window_micros, p.interval_micros, r.decisions[0])) {
      denial = CheckResult{.overall = *next, .decisions = {*next}};
    }
  }
  if (denial && p.prefetch > 1) {
    // A limit with token prefetch: hold the key back until a whole prefetch
    // has come free, so that the next call takes n tokens rather than one (a
    // flood then costs about 2 calls per n tokens). Tokens left in the bucket
    // meanwhile are taken by that call: only the timing moves.
    const std::chrono::microseconds hold((p.prefetch - 1) * p.interval_micros);
    denial->overall.retry_after += hold;
    for (Decision& d : denial->decisions) {
      if (!d.allowed) d.retry_after += hold;
    }
    if (!r.overall.allowed) r = *denial;
  }
  if (denial) cache_->Remember(*p.cache_fp, *denial, p.submitted_at, clock_->NowMicros());
  Release(p, denial ? &*denial : nullptr, dispatch);
  return r;
}

void CheckAdmission::Clear() {
  generation_.fetch_add(1, std::memory_order_acq_rel);
  if (cache_ != nullptr) cache_->Clear();
  prefetched_.Clear();
}

}  // namespace ratelimit::store
