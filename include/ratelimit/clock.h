// Clock: where ratelimit reads the time. Time is injected, never read directly.
//
// Every algorithm takes `now` as an argument; stores ask their Clock for it.
// Production code uses Clock::System() (Unix time in microseconds, the same
// base as Redis TIME) for decisions, and Clock::Steady() (a monotonic clock)
// for how long local state lasts: a cached denial, prefetched tokens, an open
// circuit breaker, which a step of the wall clock (NTP, a VM resumed) must
// not stretch. Tests use ManualClock, for either or both, and advance it by
// hand:
//
//   ratelimit::ManualClock clock(1'700'000'000'000'000);
//   clock.Advance(std::chrono::milliseconds(200));
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ratelimit {

class Clock {
 public:
  virtual ~Clock() = default;
  // Microseconds: since the Unix epoch for a wall clock (System, Kernel),
  // since an unspecified start for a monotonic one (Steady).
  virtual int64_t NowMicros() const = 0;

  // The process-wide wall clock. Never destroyed. Where the kernel keeps
  // CLOCK_REALTIME on the TSC (x86-64, clocksource "tsc"), it is read from
  // the TSC and re-anchored to CLOCK_REALTIME every 10 ms (src/core/tsc_clock.h):
  // a third of clock_gettime's cost, within microseconds of it, never
  // decreasing within a thread but for a step back of the system clock by
  // more than 50 ms. Elsewhere it is Kernel().
  static const Clock& System();
  // clock_gettime(CLOCK_REALTIME) on every read. Never destroyed.
  static const Clock& Kernel();
  // The process-wide monotonic clock: microseconds of CLOCK_MONOTONIC
  // (std::chrono::steady_clock's time, read from the TSC where the kernel's
  // clocks run on it: src/core/steady_clock.h). Never steps, never
  // decreases; not Unix time: for durations and expiry times only. Never
  // destroyed.
  static const Clock& Steady();
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_micros = 1'700'000'000'000'000) : now_(start_micros) {}

  int64_t NowMicros() const override { return now_.load(std::memory_order_acquire); }
  void Set(int64_t micros) { now_.store(micros, std::memory_order_release); }
  void Advance(std::chrono::microseconds d) {
    now_.fetch_add(d.count(), std::memory_order_acq_rel);
  }

 private:
  std::atomic<int64_t> now_;
};

// Whose clock a shared store decides by: Redis' (TIME in its scripts, one
// clock for every instance) or the caller's Clock (managed Redis that
// refuses TIME; tests with a ManualClock). The config's store.time_source,
// RedisStore's and RedisConcurrencyStore's Options::time_source.
enum class TimeSource { kRedis, kLocal };

}  // namespace ratelimit
