// Arithmetic of the four algorithms, on a manual timeline (no clock, no sleeps).
#include "core/algorithms.h"

#include <gtest/gtest.h>

#include <vector>

namespace ratelimit::core {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int64_t kT0 =
    1'700'000'000'000'000;  // an arbitrary epoch-aligned start (divisible by 10 s)
constexpr int64_t kMs = 1000;
constexpr int64_t kS = 1'000'000;

// A single key's state driven through Evaluate, the way a store would.
class Timeline {
 public:
  explicit Timeline(Limit limit) : limit_(std::move(limit)) {}
  Decision At(int64_t now, int64_t cost = 1) {
    if (limit_.algorithm() == Algorithm::kSlidingLog) {
      Decision d = EvaluateLog(limit_, log_, now, cost);
      if (d.allowed) ApplyLog(limit_, log_, now, cost);
      return d;
    }
    Evaluation e = Evaluate(limit_, state_, now, cost);
    if (e.decision.allowed)
      state_ = e.next;
    else
      EXPECT_EQ(e.next, state_) << "a denied request must not change state";
    return e.decision;
  }
  int CountAllowed(int64_t now, int n, int64_t cost = 1) {
    int allowed = 0;
    for (int i = 0; i < n; ++i) allowed += At(now, cost).allowed ? 1 : 0;
    return allowed;
  }
  const CompactState& state() const { return state_; }
  const Limit& limit() const { return limit_; }

 private:
  Limit limit_;
  CompactState state_;
  std::vector<int64_t> log_;
};

Limit Bucket(int64_t capacity, double rate) { return *Limit::TokenBucket("b", capacity, rate); }
Limit Fixed(int64_t n, int64_t window_us) {
  return *Limit::FixedWindow("f", n, microseconds(window_us));
}
Limit Sliding(int64_t n, int64_t window_us) {
  return *Limit::SlidingWindow("s", n, microseconds(window_us));
}
Limit Log(int64_t n, int64_t window_us) {
  return *Limit::SlidingLog("l", n, microseconds(window_us));
}

// ---- token bucket ----------------------------------------------------------

TEST(TokenBucket, BurstThenRate) {
  Timeline tl(Bucket(10, 5));
  for (int i = 0; i < 10; ++i) {
    Decision d = tl.At(kT0);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.remaining, 9 - i);
    EXPECT_EQ(d.limit, 10);
  }
  Decision denied = tl.At(kT0);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.remaining, 0);
  EXPECT_EQ(denied.retry_after, milliseconds(200));  // one token at 5/s
  EXPECT_EQ(denied.reset_after, seconds(2));         // 10 tokens at 5/s
  // 199 ms later: still nothing; at 200 ms exactly one.
  EXPECT_FALSE(tl.At(kT0 + 199 * kMs).allowed);
  EXPECT_TRUE(tl.At(kT0 + 200 * kMs).allowed);
  EXPECT_FALSE(tl.At(kT0 + 200 * kMs).allowed);
  // After one more second: 5 tokens.
  EXPECT_EQ(tl.CountAllowed(kT0 + 1200 * kMs, 8), 5);
}

TEST(TokenBucket, RefillIsCappedAtCapacity) {
  Timeline tl(Bucket(10, 5));
  EXPECT_EQ(tl.CountAllowed(kT0, 10), 10);
  // An hour idle refills 18000 tokens' worth of time, but the bucket holds 10.
  EXPECT_EQ(tl.CountAllowed(kT0 + 3600 * kS, 20), 10);
}

TEST(TokenBucket, CostFiveWithFourLeftIsDeniedAndConsumesNothing) {
  Timeline tl(Bucket(10, 1));
  EXPECT_EQ(tl.CountAllowed(kT0, 6), 6);  // 4 left
  const CompactState before = tl.state();
  Decision d = tl.At(kT0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 4);
  EXPECT_EQ(d.retry_after, seconds(1));  // one token short at 1/s
  EXPECT_EQ(tl.state(), before);
  Decision four = tl.At(kT0, 4);
  EXPECT_TRUE(four.allowed);
  EXPECT_EQ(four.remaining, 0);
}

TEST(TokenBucket, CostZeroAsksWithoutConsuming) {
  Timeline tl(Bucket(3, 1));
  Decision d = tl.At(kT0, 0);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 3);
  EXPECT_EQ(d.reset_after, microseconds(0));
  EXPECT_EQ(tl.CountAllowed(kT0, 4), 3);
}

TEST(TokenBucket, PartialTokensRoundDown) {
  Timeline tl(Bucket(2, 1));
  EXPECT_EQ(tl.CountAllowed(kT0, 2), 2);
  Decision d = tl.At(kT0 + 500 * kMs);  // half a token
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, milliseconds(500));
  EXPECT_EQ(d.reset_after, milliseconds(1500));
}

TEST(TokenBucket, ExpiresWhenFull) {
  Timeline tl(Bucket(10, 5));
  tl.At(kT0, 3);
  EXPECT_EQ(ExpiresAt(tl.limit(), tl.state()), kT0 + 600 * kMs);
  // At that time the stored state decides exactly like a fresh one.
  Evaluation stored = Evaluate(tl.limit(), tl.state(), kT0 + 600 * kMs, 10);
  Evaluation fresh = Evaluate(tl.limit(), {}, kT0 + 600 * kMs, 10);
  EXPECT_EQ(stored.decision, fresh.decision);
}

// ---- fixed window ----------------------------------------------------------

TEST(FixedWindow, CountsPerWindowAndResetsAtTheEdge) {
  Timeline tl(Fixed(5, 10 * kS));
  EXPECT_EQ(tl.CountAllowed(kT0 + 2 * kS, 5), 5);
  Decision d = tl.At(kT0 + 2 * kS);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, seconds(8));
  EXPECT_EQ(d.reset_after, seconds(8));
  EXPECT_EQ(tl.CountAllowed(kT0 + 10 * kS, 6), 5);
}

TEST(FixedWindow, CostAndIsolationOfWindows) {
  Timeline tl(Fixed(10, kS));
  EXPECT_TRUE(tl.At(kT0, 6).allowed);
  Decision d = tl.At(kT0, 5);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 4);
  EXPECT_TRUE(tl.At(kT0, 4).allowed);
  EXPECT_EQ(ExpiresAt(tl.limit(), tl.state()), kT0 + kS);
}

// The edge case from the issue: 5 per 10 s; 5 requests at t=9 s and 5 at t=10 s.
TEST(WindowEdge, FixedWindowAllowsTenSlidingWindowAllowsFive) {
  Timeline fixed(Fixed(5, 10 * kS));
  Timeline sliding(Sliding(5, 10 * kS));
  int fixed_allowed = fixed.CountAllowed(kT0 + 9 * kS, 5) + fixed.CountAllowed(kT0 + 10 * kS, 5);
  int sliding_allowed =
      sliding.CountAllowed(kT0 + 9 * kS, 5) + sliding.CountAllowed(kT0 + 10 * kS, 5);
  EXPECT_EQ(fixed_allowed, 10);
  EXPECT_EQ(sliding_allowed, 5);
}

// ---- sliding window counter -----------------------------------------------

TEST(SlidingWindow, PreviousWindowIsWeightedByOverlap) {
  Timeline tl(Sliding(10, 10 * kS));
  EXPECT_EQ(tl.CountAllowed(kT0 + 5 * kS, 10), 10);
  // 3 s into the next window, 70% of the previous 10 still count: 7, room for 3.
  Decision first = tl.At(kT0 + 13 * kS);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 2);
  EXPECT_EQ(tl.CountAllowed(kT0 + 13 * kS, 5), 2);
  // Now cur = 3, prev = 10 weighted 0.7 -> 10: denied. Room for one more when
  // 10 * (10 - e) / 10 + 3 + 1 <= 10, i.e. e >= 4 s: retry after 1 s.
  Decision d = tl.At(kT0 + 13 * kS);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, seconds(1));
  EXPECT_EQ(d.reset_after, seconds(17));  // cur counts until the end of the next window
  EXPECT_TRUE(tl.At(kT0 + 14 * kS).allowed);
}

TEST(SlidingWindow, RetryAfterCanFallInTheNextWindow) {
  Timeline tl(Sliding(4, 10 * kS));
  EXPECT_EQ(tl.CountAllowed(kT0 + 1 * kS, 4), 4);
  // cur = 4 = limit: the next window starts with prev = 4 weighted fully; room
  // for one when 4 * (10 - e) / 10 <= 3, i.e. e >= 2.5 s into the next window.
  Decision d = tl.At(kT0 + 1 * kS);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, microseconds(9 * kS + 2500 * kMs));
  EXPECT_FALSE(tl.At(kT0 + 12499 * kMs).allowed);
  EXPECT_TRUE(tl.At(kT0 + 12500 * kMs).allowed);
}

TEST(SlidingWindow, OldStateIsForgotten) {
  Timeline tl(Sliding(3, kS));
  EXPECT_EQ(tl.CountAllowed(kT0, 3), 3);
  EXPECT_EQ(ExpiresAt(tl.limit(), tl.state()), kT0 + 2 * kS);
  EXPECT_EQ(tl.CountAllowed(kT0 + 2 * kS, 4), 3);
}

TEST(SlidingWindow, CostLargerThanRoomIsDeniedAndConsumesNothing) {
  Timeline tl(Sliding(10, kS));
  EXPECT_TRUE(tl.At(kT0, 6).allowed);
  const CompactState before = tl.state();
  EXPECT_FALSE(tl.At(kT0, 5).allowed);
  EXPECT_EQ(tl.state(), before);
  EXPECT_TRUE(tl.At(kT0, 4).allowed);
}

// ---- sliding log -----------------------------------------------------------

TEST(SlidingLog, ExactWindow) {
  Timeline tl(Log(5, 15 * 60 * kS));  // login: 5 per 15 minutes
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(tl.At(kT0 + i * 60 * kS).allowed);
  Decision d = tl.At(kT0 + 5 * 60 * kS);
  EXPECT_FALSE(d.allowed);
  // The first attempt leaves the window 15 minutes after it was made.
  EXPECT_EQ(d.retry_after, std::chrono::minutes(10));
  EXPECT_EQ(d.reset_after, std::chrono::minutes(14));
  EXPECT_FALSE(tl.At(kT0 + 15 * 60 * kS - 1).allowed);
  EXPECT_TRUE(tl.At(kT0 + 15 * 60 * kS).allowed);
  EXPECT_FALSE(tl.At(kT0 + 15 * 60 * kS).allowed);
}

TEST(SlidingLog, CostTakesSeveralEntries) {
  Timeline tl(Log(5, 10 * kS));
  EXPECT_TRUE(tl.At(kT0, 2).allowed);
  EXPECT_TRUE(tl.At(kT0 + kS, 2).allowed);
  Decision d = tl.At(kT0 + 2 * kS, 3);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 1);
  EXPECT_EQ(d.retry_after, seconds(8));  // two entries from t=0 must leave
  EXPECT_TRUE(tl.At(kT0 + 2 * kS, 1).allowed);
}

TEST(SlidingLog, PruneForgetsEverythingAfterTheWindow) {
  Limit l = Log(3, kS);
  std::vector<int64_t> log;
  ApplyLog(l, log, kT0, 2);
  EXPECT_FALSE(PruneLog(l, log, kT0 + kS - 1));
  EXPECT_TRUE(PruneLog(l, log, kT0 + kS));
}

}  // namespace
}  // namespace ratelimit::core
