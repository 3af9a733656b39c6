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
    if (c.cost != 1) return std::nullopt;
    const Limit& l = *c.limit;
    h = Mix(h ^ Hash64(l.name(), seed_), static_cast<uint64_t>(l.window_micros()) * 31 +
                                             static_cast<uint64_t>(l.limit()) +
                                             static_cast<uint64_t>(l.algorithm()));
  }
  return h;
}

std::optional<CheckResult> OverLimitCache::Lookup(uint64_t fp, int64_t now) {
  Shard& s = shards_[fp % kShards];
  std::lock_guard lock(s.mu);
  auto it = s.entries.find(fp);
  if (it == s.entries.end()) return std::nullopt;
  if (now >= it->second.until) {
    s.entries.erase(it);
    return std::nullopt;
  }
  CheckResult r = it->second.result;
  const microseconds elapsed(now - it->second.at);
  auto count_down = [&](Decision& d) {
    d.retry_after = std::max(microseconds(0), d.retry_after - elapsed);
    d.reset_after = std::max(microseconds(0), d.reset_after - elapsed);
  };
  count_down(r.overall);
  for (Decision& d : r.decisions) count_down(d);
  return r;
}

void OverLimitCache::Remember(uint64_t fp, const CheckResult& result, int64_t now) {
  if (result.overall.allowed || result.overall.retry_after < opts_.min_retry) return;
  Shard& s = shards_[fp % kShards];
  std::lock_guard lock(s.mu);
  if (s.entries.size() >= opts_.max_entries / kShards) {
    std::erase_if(s.entries, [now](const auto& kv) { return kv.second.until <= now; });
    if (s.entries.size() >= opts_.max_entries / kShards) return;
  }
  s.entries[fp] = Entry{result, now, now + result.overall.retry_after.count()};
}

void OverLimitCache::Forget(uint64_t fp) {
  Shard& s = shards_[fp % kShards];
  std::lock_guard lock(s.mu);
  s.entries.erase(fp);
}

void OverLimitCache::Clear() {
  for (Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    s.entries.clear();
  }
}

size_t OverLimitCache::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    n += s.entries.size();
  }
  return n;
}

}  // namespace ratelimit::store
