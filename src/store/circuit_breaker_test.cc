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
