#include "store/token_prefetch.h"

#include <algorithm>

namespace ratelimit::store {

using std::chrono::microseconds;

int64_t TokenPrefetch::LifetimeMicros(const Limit& limit) {
  return std::clamp(limit.prefetch() * limit.interval_micros(), kMinLifetime.count(),
                    kMaxLifetime.count());
}

std::optional<CheckResult> TokenPrefetch::Spend(uint64_t fp, int64_t now) {
  LockGuard lock(mu_);
  auto it = entries_.find(fp);
  if (it == entries_.end() || it->second.tokens <= 0) return std::nullopt;
  Entry& e = it->second;
  if (now >= e.lapses) {
    e.tokens = 0;
    return std::nullopt;
  }
  --e.tokens;
  Decision d = e.base;
  d.allowed = true;
  d.retry_after = microseconds(0);
  // Redis' count at the grant plus what this instance still holds.
  d.remaining = e.base.remaining + e.tokens;
  d.reset_after = std::max(
      microseconds(0), e.base.reset_after - microseconds(std::max<int64_t>(0, now - e.base_at)));
  return CheckResult{.overall = d, .decisions = {d}};
}

int64_t TokenPrefetch::Want(uint64_t fp, int64_t now, const Limit& limit) {
  LockGuard lock(mu_);
  auto it = entries_.find(fp);
  if (it == entries_.end()) {
    if (entries_.size() >= max_entries_) {
      std::erase_if(entries_, [now](const auto& kv) {
        return kv.second.asked + kv.second.lifetime <= now && kv.second.lapses <= now;
      });
      if (entries_.size() >= max_entries_) return 1;
    }
    entries_.emplace(fp, Entry{.asked = now, .lifetime = LifetimeMicros(limit)});
    return 1;
  }
  Entry& e = it->second;
  const bool hot = now - e.asked < e.lifetime;
  e.asked = now;
  return hot ? limit.prefetch() : 1;
}

void TokenPrefetch::Grant(uint64_t fp, int64_t prefetch, int64_t granted, const Decision& answer,
                          int64_t submitted, int64_t replied) {
  if (granted <= 1) return;
  LockGuard lock(mu_);
  auto it = entries_.find(fp);
  if (it == entries_.end()) return;  // dropped meanwhile (Clear): the tokens lapse
  Entry& e = it->second;
  if (replied >= e.lapses) e.tokens = 0;
  e.tokens = std::min(prefetch - 1, e.tokens + granted - 1);
  e.lapses = submitted + e.lifetime;
  e.base = answer;
  e.base_at = replied;
}

void TokenPrefetch::Clear() {
  LockGuard lock(mu_);
  entries_.clear();
}

size_t TokenPrefetch::size() const {
  LockGuard lock(mu_);
  return entries_.size();
}

}  // namespace ratelimit::store
