// What the open-loop drivers (http_load, grpc_h2_load) share: a timerfd
// armed at absolute steady-clock times on their epoll set, the latency
// record clamped to 32 bits, and the percentile of it.
//
//   bench::PaceTimer timer(ep);          // in the epoll set, tagged kTimerTag
//   timer.ArmAt(start + interval * i);   // the next call's due time
//   if (event.data.u64 == bench::PaceTimer::kTimerTag) timer.Drain();
//   bench::Record(latency_ns, now - due);
//   double p99_ns = bench::Percentile(latency_ns, 0.99);
//
// Thread-safety: one thread (the driver's event loop).
#pragma once

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace bench {

class PaceTimer {
 public:
  static constexpr uint64_t kTimerTag = UINT64_MAX;  // epoll_event.data.u64

  explicit PaceTimer(int epoll_fd) : fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kTimerTag;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd_, &ev);
  }
  ~PaceTimer() { ::close(fd_); }
  PaceTimer(const PaceTimer&) = delete;
  PaceTimer& operator=(const PaceTimer&) = delete;

  // Fires at `at` (steady_clock is CLOCK_MONOTONIC on Linux); a time already
  // past fires at once.
  void ArmAt(std::chrono::steady_clock::time_point at) {
    itimerspec its{};
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
    its.it_value.tv_sec = ns / 1'000'000'000;
    its.it_value.tv_nsec = ns % 1'000'000'000;
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
    ::timerfd_settime(fd_, TFD_TIMER_ABSTIME, &its, nullptr);
  }
  void Drain() {
    uint64_t expirations;
    (void)!::read(fd_, &expirations, sizeof expirations);
  }

 private:
  int fd_;
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
