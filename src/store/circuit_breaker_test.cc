#include "ratelimit/circuit_breaker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ratelimit {
namespace {

using std::chrono::milliseconds;
using State = CircuitBreaker::State;

TEST(CircuitBreaker, OpensAfterConsecutiveFailuresAndProbesAfterBackoff) {
  ManualClock clock;
  std::vector<std::pair<State, State>> changes;
  CircuitBreaker b({.failure_threshold = 3,
                    .open_for = milliseconds(100),
                    .max_open_for = milliseconds(300),
                    .clock = &clock,
                    .on_change = [&](State f, State t) { changes.emplace_back(f, t); }});
  b.OnFailure();
  b.OnFailure();
  b.OnSuccess();  // the streak is broken
  b.OnFailure();
  b.OnFailure();
  EXPECT_EQ(b.state(), State::kClosed);
  b.OnFailure();
  EXPECT_EQ(b.state(), State::kOpen);
  EXPECT_FALSE(b.Allow());
  clock.Advance(milliseconds(99));
  EXPECT_FALSE(b.Allow());
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(b.Allow());  // the probe
  EXPECT_EQ(b.state(), State::kHalfOpen);
  EXPECT_FALSE(b.Allow());  // only one probe at a time
  b.OnFailure();            // probe failed: open for twice as long
  EXPECT_EQ(b.state(), State::kOpen);
  clock.Advance(milliseconds(199));
  EXPECT_FALSE(b.Allow());
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(b.Allow());
  b.OnFailure();
  clock.Advance(milliseconds(300));  // capped at max_open_for
  EXPECT_TRUE(b.Allow());
  b.OnSuccess();
  EXPECT_EQ(b.state(), State::kClosed);
  EXPECT_TRUE(b.Allow());
  EXPECT_EQ(changes.front(), std::make_pair(State::kClosed, State::kOpen));
  EXPECT_EQ(changes.back(), std::make_pair(State::kHalfOpen, State::kClosed));
  // After closing, the backoff starts again from open_for.
  for (int i = 0; i < 3; ++i) b.OnFailure();
  clock.Advance(milliseconds(100));
  EXPECT_TRUE(b.Allow());
}

// A probe that gets no verdict (never sent, refused by a bound of ours, lost
// on some path) must not leave the breaker half-open with its one probe out
// for good: given back, the next caller probes; forgotten, it lapses.
TEST(CircuitBreaker, ProbeWithoutVerdictDoesNotWedgeTheBreaker) {
  ManualClock clock;
  CircuitBreaker b({.failure_threshold = 1,
                    .open_for = milliseconds(100),
                    .probe_timeout = milliseconds(500),
                    .clock = &clock});
  b.OnFailure();
  clock.Advance(milliseconds(100));
  uint64_t first = 0;
  ASSERT_TRUE(b.Allow(&first));
  EXPECT_NE(first, 0u);
  uint64_t other = 7;
  EXPECT_FALSE(b.Allow(&other));
  EXPECT_EQ(other, 0u);
  b.GiveBack(first);  // not sent after all
  EXPECT_EQ(b.state(), State::kHalfOpen);
  uint64_t second = 0;
  ASSERT_TRUE(b.Allow(&second));  // at once: no wait for a lapse
  EXPECT_NE(second, first);
  b.GiveBack(first);  // a stale holder cannot free the probe out now
  EXPECT_FALSE(b.Allow());
  // `second` is never reported nor given back: it lapses after probe_timeout.
  clock.Advance(milliseconds(499));
  EXPECT_FALSE(b.Allow());
  clock.Advance(milliseconds(1));
  uint64_t third = 0;
  ASSERT_TRUE(b.Allow(&third));
  EXPECT_FALSE(b.Allow());
  b.OnSuccess();
  EXPECT_EQ(b.state(), State::kClosed);
  b.GiveBack(third);  // answered already: nothing to give back
  EXPECT_EQ(b.state(), State::kClosed);
  EXPECT_TRUE(b.Allow());
}

TEST(CircuitBreaker, ExactlyOneProbeUnderConcurrency) {
  ManualClock clock;
  CircuitBreaker b({.failure_threshold = 1, .open_for = milliseconds(10), .clock = &clock});
  b.OnFailure();
  clock.Advance(milliseconds(10));
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) allowed += b.Allow() ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 1);
}

}  // namespace
}  // namespace ratelimit
