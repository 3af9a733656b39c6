// SteadyClock: std::chrono::steady_clock's time, read from the TSC.
//
// Why: a gateway request read the monotonic clock a dozen times (deadlines,
// the per-stage latency histograms, the store's latency) at 31 ns a read on
// the benchmark VM (vDSO clock_gettime); the TSC and a multiply cost a third
// of that. The same TscClock as Clock::System(), anchored to CLOCK_MONOTONIC
// instead of CLOCK_REALTIME (so it never steps back), where the kernel keeps
// its clocks on the TSC; elsewhere steady_clock itself.
//
// Its time points are steady_clock's, within microseconds: they can be
// compared with steady_clock::now() and given to an Asio steady_timer (which
// then fires within microseconds of the time asked; LazyDeadline waits again
// after an early firing). Never decreasing within a thread.
//
// Usage:
//   const auto started = core::SteadyClock::now();
//   ...
//   histogram.Observe(core::SteadyClock::now() - started);
#pragma once

#include <chrono>

namespace ratelimit::core {

struct SteadyClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::steady_clock::time_point;
  static constexpr bool is_steady = true;

  static time_point now() noexcept;
};

}  // namespace ratelimit::core
