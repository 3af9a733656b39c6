#include "server/admin_denials.h"

#include <algorithm>

namespace ratelimit::server {

void AdminDenials::Record(DenialEntry e) {
  const int64_t minute = e.unix_ms / 60'000;
  LockGuard lock(mu_);
  if (!e.shadow) {
    Minute& m = minutes_[static_cast<size_t>(minute % kMinutes)];
    if (m.minute != minute) {
      m.minute = minute;
      m.counts.clear();
      m.others = 0;
    }
    auto it = m.counts.find(e.key);
    if (it != m.counts.end()) {
      ++it->second;
    } else if (m.counts.size() < kMaxClientsPerMinute) {
      m.counts.emplace(e.key, 1);
    } else {
      ++m.others;
    }
  }
  if (ring_.size() < kRingSize) {
    ring_.push_back(std::move(e));
  } else {
    ring_[next_] = std::move(e);
    next_ = (next_ + 1) % kRingSize;
  }
}

std::vector<DenialEntry> AdminDenials::ForClient(std::string_view key) const {
  std::vector<DenialEntry> out;
  LockGuard lock(mu_);
  const size_t n = ring_.size();
  // Newest first: the entry before next_ (full ring) or the last pushed.
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (n < kRingSize ? n - 1 - i : (next_ + kRingSize - 1 - i) % kRingSize);
    if (ring_[idx].key == key) out.push_back(ring_[idx]);
  }
  return out;
}

std::vector<TopEntry> AdminDenials::Top(size_t n, int minutes, int64_t now_ms,
                                        uint64_t* others) const {
  const int64_t now_minute = now_ms / 60'000;
  std::unordered_map<std::string, uint64_t> sum;
  uint64_t other = 0;
  {
    LockGuard lock(mu_);
    for (const Minute& m : minutes_) {
      if (m.minute < 0 || m.minute > now_minute || m.minute <= now_minute - minutes) continue;
      for (const auto& [k, c] : m.counts) sum[k] += c;
      other += m.others;
    }
  }
  std::vector<TopEntry> out;
  out.reserve(sum.size());
  for (auto& [k, c] : sum) out.push_back({k, c});
  std::sort(out.begin(), out.end(), [](const TopEntry& a, const TopEntry& b) {
    return a.denials != b.denials ? a.denials > b.denials : a.key < b.key;
  });
  if (out.size() > n) out.resize(n);
  if (others != nullptr) *others = other;
  return out;
}

std::vector<std::string> AdminDenials::Keys() const {
  std::vector<std::string> out;
  {
    LockGuard lock(mu_);
    for (const DenialEntry& e : ring_) out.push_back(e.key);
    for (const Minute& m : minutes_) {
      for (const auto& [k, c] : m.counts) out.push_back(k);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace ratelimit::server
