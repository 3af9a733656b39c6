// What the open-loop drivers (http_load, grpc_h2_load) share: a wait on
// their epoll set until the next call's due time, the latency record clamped
// to 32 bits, and the percentile of it.
//
//   bench::Pacer pacer;
//   pacer.WakeAt(start + interval * i);              // the next call's due time
//   int n = pacer.Wait(ep, events);                  // events, or 0 at that time
//   bench::Record(latency_ns, now - due);
//   double p99_ns = bench::Percentile(latency_ns, 0.99);
//
// The wait is epoll_pwait2(2) with a nanosecond timeout, not a timerfd in the
// epoll set: a timerfd cost two system calls a round (timerfd_settime each
// time the due time was recomputed, read to drain it), 14% of http_load's CPU
// at 22,000 requests/s (perf), and the load generator shares the machine's
// two cores with the servers it measures (docs/performance.md).
//
// Thread-safety: one thread (the driver's event loop).
#pragma once

#include <sys/epoll.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace bench {

class Pacer {
 public:
  // The next wake-up: at `at` (steady_clock is CLOCK_MONOTONIC on Linux); a
  // time already past returns from Wait at once.
  void WakeAt(std::chrono::steady_clock::time_point at) { at_ = at; }

  // epoll_pwait2 until an event, the wake-up time, or 100 ms at most.
  // Returns what epoll_pwait2 does.
  int Wait(int epoll_fd, std::vector<epoll_event>& events) const {
    const auto left = std::clamp<std::chrono::nanoseconds>(at_ - std::chrono::steady_clock::now(),
                                                           std::chrono::nanoseconds(0),
                                                           std::chrono::milliseconds(100));
    const timespec timeout{.tv_sec = 0, .tv_nsec = static_cast<long>(left.count())};
    return ::epoll_pwait2(epoll_fd, events.data(), static_cast<int>(events.size()), &timeout,
                          nullptr);
  }

 private:
  std::chrono::steady_clock::time_point at_ = std::chrono::steady_clock::now();
};

inline void Record(std::vector<uint32_t>& latency_ns, std::chrono::nanoseconds waited) {
  latency_ns.push_back(static_cast<uint32_t>(std::min<int64_t>(waited.count(), UINT32_MAX)));
}

// The q-quantile of `v` in nanoseconds (0 when empty); reorders v.
inline double Percentile(std::vector<uint32_t>& v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  return v[i];
}

}  // namespace bench
