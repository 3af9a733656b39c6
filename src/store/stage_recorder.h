// StageRecorder: a StageLatency (ratelimit/store.h) kept with relaxed atomic
// adds, for a stage on a hot path: no allocation, no lock, one add per bucket
// and one for the sum.
//
//   StageRecorder queued;
//   queued.Observe(now - p.queued_at);     // any thread
//   StoreStats{.queued = queued.Snapshot()};
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "ratelimit/store.h"

namespace ratelimit::store {

class StageRecorder {
 public:
  void Observe(std::chrono::steady_clock::duration d) {
    const int64_t us =
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count());
    const auto& b = StageLatency::kBoundsMicros;
    const auto i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), us) - b.begin());
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sum_micros_.fetch_add(static_cast<uint64_t>(us), std::memory_order_relaxed);
  }
  StageLatency Snapshot() const {
    StageLatency s;
    for (size_t i = 0; i < counts_.size(); ++i) {
      s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    }
    s.sum_micros = sum_micros_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::atomic<uint64_t>, StageLatency::kBoundsMicros.size() + 1> counts_{};
  std::atomic<uint64_t> sum_micros_{0};
};

}  // namespace ratelimit::store
