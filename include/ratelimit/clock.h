// Clock: where ratelimit reads the time. Time is injected, never read directly.
//
// Every algorithm takes `now` as an argument; stores ask their Clock for it.
// Production code uses Clock::System() (Unix time in microseconds, the same
// base as Redis TIME). Tests use ManualClock and advance it by hand:
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
  // Microseconds since the Unix epoch.
  virtual int64_t NowMicros() const = 0;

  // The process-wide wall clock (CLOCK_REALTIME). Never destroyed.
  static const Clock& System();
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
