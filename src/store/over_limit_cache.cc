#include "store/over_limit_cache.h"

#include <algorithm>
#include <random>

#include "store/hash.h"

namespace ratelimit::store {

using std::chrono::microseconds;

OverLimitCache::OverLimitCache(Options options)
    : opts_(options), seed_(std::random_device{}() * 0x9E3779B97F4A7C15ULL) {}

std::optional<uint64_t> OverLimitCache::Fingerprint(const CheckRequest& request) const {
  uint64_t h = Hash64(request.key, seed_);
  for (const LimitCheck& c : request.checks) {
    // A limit with a block period is always asked: the denial that starts a
    // block must reach the store (it could not start one from here).
    if (c.cost != 1 || c.limit->block_for().count() > 0) return std::nullopt;
    const Limit& l = *c.limit;
    // (identity_hash: a calendar quota's time zone, which the numbers miss.)
    h = Mix(h ^ Hash64(l.name(), seed_),
            static_cast<uint64_t>(l.window_micros()) * 31 + static_cast<uint64_t>(l.limit()) +
                static_cast<uint64_t>(l.algorithm()) + l.identity_hash());
  }
  return h;
}

std::optional<CheckResult> OverLimitCache::Lookup(uint64_t fp, int64_t now) {
  Shard& s = shards_[fp % kShards];
  LockGuard lock(s.mu);
  auto it = s.entries.find(fp);
  if (it == s.entries.end()) return std::nullopt;
  if (now >= it->second.until) {
    s.entries.erase(it);
    return std::nullopt;
  }
  return CountDown(it->second.result, microseconds(std::max<int64_t>(0, now - it->second.at)));
}

CheckResult OverLimitCache::CountDown(CheckResult result, microseconds elapsed) {
  auto count_down = [&](Decision& d) {
    d.retry_after = std::max(microseconds(0), d.retry_after - elapsed);
    d.reset_after = std::max(microseconds(0), d.reset_after - elapsed);
  };
  count_down(result.overall);
  for (Decision& d : result.decisions) count_down(d);
  return result;
}

std::optional<Decision> OverLimitCache::DenialAfterLastUnit(Algorithm algorithm,
                                                            int64_t window_micros,
                                                            int64_t interval_micros,
                                                            const Decision& allowed) {
  if (!allowed.allowed || allowed.remaining != 0) return std::nullopt;
  Decision d = allowed;
  d.allowed = false;
  switch (algorithm) {
    case Algorithm::kTokenBucket:
      // GCRA (src/core/algorithms.cc): after the allowance TAT = now +
      // reset_after; the next unit is allowed at TAT + interval - tau, and a
      // denial leaves TAT (so reset_after) as it is.
      d.retry_after = allowed.reset_after + microseconds(interval_micros - window_micros);
      break;
    case Algorithm::kFixedWindow:
      // The window is full until it ends, which is when it resets.
      d.retry_after = allowed.reset_after;
      break;
    default: return std::nullopt;
  }
  if (d.retry_after <= microseconds(0)) return std::nullopt;
  return d;
}

void OverLimitCache::Remember(uint64_t fp, const CheckResult& result, int64_t submitted,
                              int64_t replied) {
  const int64_t now = replied;
  if (result.overall.allowed || result.overall.retry_after < opts_.min_retry) return;
  Shard& s = shards_[fp % kShards];
  LockGuard lock(s.mu);
  if (s.entries.size() >= opts_.max_entries / kShards) {
    std::erase_if(s.entries, [now](const auto& kv) { return kv.second.until <= now; });
    if (s.entries.size() >= opts_.max_entries / kShards) return;
  }
  const int64_t lasts = std::min(result.overall.retry_after, opts_.max_age).count();
  s.entries[fp] = Entry{result, replied, submitted + lasts};
}

void OverLimitCache::Forget(uint64_t fp) {
  Shard& s = shards_[fp % kShards];
  LockGuard lock(s.mu);
  s.entries.erase(fp);
}

void OverLimitCache::Clear() {
  for (Shard& s : shards_) {
    LockGuard lock(s.mu);
    s.entries.clear();
  }
}

size_t OverLimitCache::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    LockGuard lock(s.mu);
    n += s.entries.size();
  }
  return n;
}

}  // namespace ratelimit::store
