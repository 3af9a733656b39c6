// TscClock (src/core/tsc_clock.h) with its counter and reference driven by
// hand, Clock::System() against Clock::Kernel() and SteadyClock against
// std::chrono::steady_clock on this machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "core/steady_clock.h"
#include "core/tsc_clock.h"
#include "ratelimit/clock.h"

namespace ratelimit::core {
namespace {

constexpr int64_t kStart = 1'700'000'000'000'000'000;  // ns
constexpr double kHz = 3e9;                            // 3 ticks per ns

struct Fake {
  std::atomic<uint64_t> ticks{1'000'000};
  std::atomic<int64_t> ref{kStart};
  // Run (once) when the reference is read: a re-anchor is under way.
  std::function<void()> during_reanchor;
  bool ran = false;
};
struct FakeSources {
  Fake* f;
  uint64_t Ticks() const { return f->ticks.load(std::memory_order_relaxed); }
  int64_t ReferenceNanos() const {
    if (f->during_reanchor && !f->ran) {
      f->ran = true;
      f->during_reanchor();
    }
    return f->ref.load(std::memory_order_relaxed);
  }
};
using Clock = TscClock<FakeSources>;
constexpr Clock::Options kOpts{.period_ns = 10'000'000, .max_slew_back_ns = 50'000'000};

// Advances the counter by `ns` of its time, and the reference by `ns` scaled
// by (1 + ppm / 1e6).
void Elapse(Fake& f, int64_t ns, double ppm) {
  f.ticks.fetch_add(static_cast<uint64_t>(static_cast<double>(ns) * kHz / 1e9));
  f.ref.fetch_add(static_cast<int64_t>(static_cast<double>(ns) * (1 + ppm / 1e6)));
}

TEST(TscClock, StaysWithinMicrosecondsOfTheReferenceThatDrifts) {
  Fake f;
  // Calibrated 300 ppm off, and the reference runs 150 ppm fast (NTP slewing).
  Clock c(FakeSources{&f}, kHz * (1 + 300e-6), kOpts);
  int64_t last = c.NowNanos();
  int64_t worst = 0;
  for (int i = 0; i < 200'000; ++i) {  // 10 s in steps of 50 us
    Elapse(f, 50'000, 150);
    const int64_t now = c.NowNanos();
    ASSERT_GE(now, last);
    last = now;
    if (i > 10'000) worst = std::max(worst, std::abs(now - f.ref.load()));  // after 0.5 s
  }
  // The rate is learned: what is left is one period of the rate's error.
  EXPECT_LE(worst, 3'000) << "ns off the reference";
}

TEST(TscClock, AForwardJumpOfTheReferenceIsFollowedAtTheNextReanchor) {
  Fake f;
  Clock c(FakeSources{&f}, kHz, kOpts);
  Elapse(f, 1'000'000, 0);
  const int64_t before = c.NowNanos();
  f.ref.fetch_add(5'000'000'000);  // the system clock set 5 s forward
  EXPECT_LT(c.NowNanos() - before, 10'000'000) << "not before the re-anchor";
  Elapse(f, 10'000'000, 0);
  EXPECT_EQ(c.NowNanos(), f.ref.load());
}

TEST(TscClock, ASmallStepBackIsSlewedWithoutGoingBack) {
  Fake f;
  Clock c(FakeSources{&f}, kHz, kOpts);
  Elapse(f, 11'000'000, 0);
  c.NowNanos();                // re-anchored
  f.ref.fetch_sub(5'000'000);  // 5 ms back: held and slewed
  int64_t last = c.NowNanos();
  for (int i = 0; i < 100'000; ++i) {  // 1 s in steps of 10 us
    Elapse(f, 10'000, 0);
    const int64_t now = c.NowNanos();
    ASSERT_GE(now, last) << "step " << i;
    last = now;
  }
  EXPECT_LE(std::abs(last - f.ref.load()), 1'000) << "caught up within a second";
}

TEST(TscClock, ALargeStepBackIsFollowed) {
  Fake f;
  Clock c(FakeSources{&f}, kHz, kOpts);
  Elapse(f, 11'000'000, 0);
  c.NowNanos();
  f.ref.fetch_sub(10'000'000'000);  // 10 s back: holding would stop every refill
  Elapse(f, 10'000'001, 0);
  EXPECT_EQ(c.NowNanos(), f.ref.load());
}

// A counter that went back (reset by a resume from suspend; a CPU whose
// counter lags far behind) re-anchors at once. The counter behind the
// anchor read as the anchor itself, with no re-anchor, so the clock stood
// still until the counter passed the old anchor: here 1000 s of uptime,
// the minute asleep never seen.
TEST(TscClock, ACounterThatWentBackIsFollowedAtOnce) {
  Fake f;
  f.ticks = 3'000'000'000'000;  // 1000 s of uptime
  Clock c(FakeSources{&f}, kHz, kOpts);
  Elapse(f, 11'000'000, 0);
  int64_t last = c.NowNanos();      // re-anchored
  f.ticks = 1000;                   // reset while suspended
  f.ref.fetch_add(60'000'000'000);  // a minute asleep
  for (int i = 0; i < 600; ++i) {   // 6 s in steps of 10 ms
    Elapse(f, 10'000'000, 0);
    const int64_t now = c.NowNanos();
    ASSERT_GE(now, last) << "step " << i;
    ASSERT_LE(std::abs(now - f.ref.load()), kOpts.period_ns) << "step " << i;
    last = now;
  }
  // A counter a little behind the anchor (another CPU's, a few ticks late)
  // reads as the anchor: no re-anchor, no step.
  f.ticks.fetch_sub(3'000);
  EXPECT_EQ(c.NowNanos(), last);
}

// A reader that finds the anchor old while another thread re-anchors goes on
// from the old anchor, but at most a period on: a counter that ran an hour
// ahead of the reference gave that reader a time an hour ahead, and every
// reading after the re-anchor (the reference's) went back from it.
TEST(TscClock, AReaderDuringAReanchorReadsAtMostAPeriodOn) {
  Fake f;
  Clock c(FakeSources{&f}, kHz, kOpts);
  const int64_t start = c.NowNanos();
  f.ticks.fetch_add(uint64_t{3600} * 3'000'000'000);  // the counter jumped an hour
  f.ref.fetch_add(11'000'000);                        // 11 ms went by
  int64_t during = 0;
  f.during_reanchor = [&] { during = c.NowNanos(); };  // busy_ is held meanwhile
  const int64_t after = c.NowNanos();
  ASSERT_TRUE(f.ran);
  EXPECT_GE(during, start);
  EXPECT_LE(during, start + kOpts.period_ns + 1);
  EXPECT_EQ(after, f.ref.load());  // a step back of an hour less 11 ms: the reference's
  EXPECT_GE(after, during);
}

TEST(TscClock, NeverDecreasesWithinAThreadWhileAnotherDrivesAndSteps) {
  Fake f;
  // Re-anchored every 5 steps of 4 us.
  Clock c(FakeSources{&f}, kHz * (1 - 500e-6),
          {.period_ns = 20'000, .max_slew_back_ns = 50'000'000});
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  std::atomic<int> violations{0};
  std::atomic<int64_t> reads{0};
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      int64_t last = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const int64_t now = c.NowNanos();
        if (now < last) violations.fetch_add(1);
        last = now;
        reads.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 3'000; ++i) {
    Elapse(f, 4'000, 200);
    if (i % 1'000 == 999) f.ref.fetch_sub(2'000'000);  // small steps back: slewed
    // Both readers see each step.
    const int64_t seen = reads.load();
    while (reads.load() < seen + 4) std::this_thread::yield();
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(violations.load(), 0);
}

// The real thing: Clock::System() between two reads of CLOCK_REALTIME, over
// 50 ms of spinning on this machine (several re-anchors).
TEST(SystemClock, AgreesWithClockRealtime) {
  const ratelimit::Clock& sys = ratelimit::Clock::System();
  const ratelimit::Clock& kernel = ratelimit::Clock::Kernel();
  const int64_t end = kernel.NowMicros() + 50'000;
  int64_t worst = 0, last = 0, n = 0;
  for (int64_t k0 = kernel.NowMicros(); k0 < end; k0 = kernel.NowMicros(), ++n) {
    const int64_t s = sys.NowMicros();
    const int64_t k1 = kernel.NowMicros();
    ASSERT_GE(s, last);
    last = s;
    worst = std::max({worst, k0 - s, s - k1});
  }
  EXPECT_LE(worst, 50) << "us outside [CLOCK_REALTIME before, after], " << n << " reads";
}

// SteadyClock between two reads of std::chrono::steady_clock, the same way:
// its time points are steady_clock's (timers and deadlines mix them).
TEST(SteadyClock, AgreesWithSteadyClock) {
  using std::chrono::steady_clock;
  const auto end = steady_clock::now() + std::chrono::milliseconds(50);
  steady_clock::duration worst{0};
  SteadyClock::time_point last{};
  int64_t n = 0;
  for (auto k0 = steady_clock::now(); k0 < end; k0 = steady_clock::now(), ++n) {
    const SteadyClock::time_point s = SteadyClock::now();
    const auto k1 = steady_clock::now();
    ASSERT_GE(s, last);
    last = s;
    worst = std::max({worst, k0 - s, s - k1});
  }
  EXPECT_LE(worst, std::chrono::microseconds(50))
      << "outside [steady_clock before, after], " << n << " reads";
}

// Clock::Steady() is SteadyClock in microseconds: monotonic, not Unix time.
TEST(SteadyClock, ClockSteadyIsItsMicroseconds) {
  const ratelimit::Clock& steady = ratelimit::Clock::Steady();
  const int64_t before = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  const int64_t s = steady.NowMicros();
  const int64_t after = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
  EXPECT_GE(s, before - 50);
  EXPECT_LE(s, after + 50);
  EXPECT_GE(steady.NowMicros(), s);
}

}  // namespace
}  // namespace ratelimit::core
