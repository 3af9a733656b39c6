#include "ratelimit/clock.h"

#include <time.h>

#include <chrono>
#include <fstream>
#include <string>
#include <utility>

#include "core/steady_clock.h"
#include "core/tsc_clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace ratelimit {
namespace {

int64_t KernelNanos(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
int64_t RealtimeNanos() { return KernelNanos(CLOCK_REALTIME); }

class KernelClock final : public Clock {
 public:
  int64_t NowMicros() const override { return RealtimeNanos() / 1000; }
};

class SteadyMicrosClock final : public Clock {
 public:
  int64_t NowMicros() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               core::SteadyClock::now().time_since_epoch())
        .count();
  }
};

#if defined(__x86_64__)
struct HardwareSources {
  uint64_t Ticks() const { return __rdtsc(); }
  int64_t ReferenceNanos() const { return RealtimeNanos(); }
};
// The same counter against CLOCK_MONOTONIC (steady_clock's, in libstdc++).
struct MonotonicSources {
  uint64_t Ticks() const { return __rdtsc(); }
  int64_t ReferenceNanos() const { return KernelNanos(CLOCK_MONOTONIC); }
};

// The kernel keeps CLOCK_REALTIME on the TSC only when it found the TSC
// invariant and synchronized across CPUs: then a clock derived from it is as
// good as the kernel's. Otherwise (kvm-clock, hpet, ...) the kernel clock.
bool KernelTrustsTsc() {
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(f >> name) && name == "tsc";
}

// A (ticks, CLOCK_REALTIME) pair: of 5 tries the one whose reference read
// took the fewest ticks (not split by a preemption).
std::pair<uint64_t, int64_t> Pair() {
  std::pair<uint64_t, int64_t> best{0, 0};
  uint64_t best_span = ~uint64_t{0};
  for (int i = 0; i < 5; ++i) {
    const uint64_t a = __rdtsc();
    const int64_t r = RealtimeNanos();
    const uint64_t b = __rdtsc();
    if (b - a < best_span) {
      best_span = b - a;
      best = {a + (b - a) / 2, r};
    }
  }
  return best;
}

// The TSC's rate over 2 ms of CLOCK_REALTIME, once at start (refined at each
// re-anchor).
double MeasureTicksPerSecond() {
  const auto [t0, r0] = Pair();
  while (RealtimeNanos() - r0 < 2'000'000) {
  }
  const auto [t1, r1] = Pair();
  return static_cast<double>(t1 - t0) * 1e9 / static_cast<double>(r1 - r0);
}

class FastClock final : public Clock {
 public:
  explicit FastClock(double ticks_per_second) : clock_(HardwareSources{}, ticks_per_second, {}) {}
  int64_t NowMicros() const override { return clock_.NowNanos() / 1000; }

 private:
  mutable core::TscClock<HardwareSources> clock_;
};

// The TSC's rate where the kernel's clocks run on it, else 0: measured once
// for both clocks.
double TscRate() {
  static const double rate = [] {
    const double r = KernelTrustsTsc() ? MeasureTicksPerSecond() : 0;
    return r > 1e6 ? r : 0;
  }();
  return rate;
}
#endif

const Clock* MakeSystemClock() {
#if defined(__x86_64__)
  if (const double rate = TscRate(); rate > 0) return new FastClock(rate);
#endif
  return &Clock::Kernel();
}

}  // namespace

const Clock& Clock::System() {
  static const Clock* const clock = MakeSystemClock();
  return *clock;
}

namespace core {

#if defined(__x86_64__)
namespace {
using SteadyTsc = TscClock<MonotonicSources>;
SteadyTsc* MakeSteadyTsc() {
  return TscRate() > 0 ? new SteadyTsc(MonotonicSources{}, TscRate(), {}) : nullptr;
}
}  // namespace
#endif

SteadyClock::time_point SteadyClock::now() noexcept {
#if defined(__x86_64__)
  static SteadyTsc* const tsc = MakeSteadyTsc();  // never destroyed
  if (tsc != nullptr) return time_point(std::chrono::nanoseconds(tsc->NowNanos()));
#endif
  return std::chrono::steady_clock::now();
}

}  // namespace core

const Clock& Clock::Kernel() {
  static const KernelClock* const clock = new KernelClock();
  return *clock;
}

const Clock& Clock::Steady() {
  static const SteadyMicrosClock* const clock = new SteadyMicrosClock();
  return *clock;
}

}  // namespace ratelimit
