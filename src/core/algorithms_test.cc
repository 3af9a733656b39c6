// Arithmetic of the five algorithms, on a manual timeline (no clock, no sleeps).
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
Limit Leaky(int64_t depth, double rate) { return *Limit::LeakyBucket("k", depth, rate); }
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

// A bucket never admits noticeably more than its rate: over a second of a
// request every microsecond, a bucket of 1 admits at most 1% above the rate
// (its interval is whole microseconds, rounded), for every rate the factory
// takes; a rate whose interval would round further is refused. 700000/s and
// 450000/s ran at 1000000/s and 500000/s (intervals 1 and 2 us).
TEST(TokenBucket, NeverAdmitsMoreThanOnePercentAboveItsRate) {
  for (double rate :
       {1e6, 700'000.0, 450'000.0, 333'333.0, 30'303.0, 30'000.0, 20'202.0, 19'999.0, 1'234.5}) {
    for (bool leaky : {false, true}) {
      StatusOr<Limit> l =
          leaky ? Limit::LeakyBucket("k", 1, rate) : Limit::TokenBucket("b", 1, rate);
      if (!l.ok()) {
        EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
        continue;
      }
      Timeline tl(*l);
      int admitted = 0;
      for (int64_t t = 0; t < kS; ++t) admitted += tl.At(kT0 + t).allowed ? 1 : 0;
      EXPECT_LE(admitted, rate * 1.01 + 1) << l->ToString();
      EXPECT_GE(admitted, rate * 0.99) << l->ToString();
    }
  }
  EXPECT_FALSE(Limit::TokenBucket("b", 1, 700'000).ok());
  EXPECT_FALSE(Limit::LeakyBucket("k", 1, 450'000).ok());
}

// ---- leaky bucket ----------------------------------------------------------

TEST(LeakyBucket, BurstOfTenAtFivePerSecondDepthTenIsSpread200msApart) {
  Timeline tl(Leaky(10, 5));
  for (int i = 0; i < 10; ++i) {
    Decision d = tl.At(kT0);
    ASSERT_TRUE(d.allowed) << i;
    EXPECT_EQ(d.delay, milliseconds(200 * i)) << i;  // 0, 200, ..., 1800 ms
    EXPECT_EQ(d.remaining, 9 - i);
    EXPECT_EQ(d.limit, 10);
    EXPECT_EQ(d.reset_after, milliseconds(200 * (i + 1)));  // the queue is empty then
  }
  // The queue holds 10: the 11th is denied, with no delay, until one has left.
  Decision denied = tl.At(kT0);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.delay, microseconds(0));
  EXPECT_EQ(denied.retry_after, milliseconds(200));
  EXPECT_EQ(denied.reset_after, seconds(2));
  EXPECT_FALSE(tl.At(kT0 + 199 * kMs).allowed);
  // 200 ms later the first has left: one more joins the back, 1800 ms from then.
  Decision next = tl.At(kT0 + 200 * kMs);
  EXPECT_TRUE(next.allowed);
  EXPECT_EQ(next.delay, milliseconds(1800));
  EXPECT_EQ(next.remaining, 0);
  // Once the queue has drained, a request passes at once.
  Decision idle = tl.At(kT0 + 10 * kS);
  EXPECT_TRUE(idle.allowed);
  EXPECT_EQ(idle.delay, microseconds(0));
  EXPECT_EQ(idle.remaining, 9);
}

TEST(LeakyBucket, DelayIsTheTimeUntilTheRequestsTurnNotRoundedToSlots) {
  Timeline tl(Leaky(3, 10));  // 100 ms apart
  EXPECT_EQ(tl.At(kT0).delay, microseconds(0));
  EXPECT_EQ(tl.At(kT0 + 30 * kMs).delay, milliseconds(70));
  EXPECT_EQ(tl.At(kT0 + 50 * kMs).delay, milliseconds(150));
  // Three in the queue (the first leaves at 100 ms): the fourth waits for room.
  Decision d = tl.At(kT0 + 60 * kMs);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, milliseconds(40));
  EXPECT_TRUE(tl.At(kT0 + 100 * kMs).allowed);
}

TEST(LeakyBucket, CostTakesSeveralSlotsAndWaitsForTheFirst) {
  Timeline tl(Leaky(5, 2));  // 500 ms apart
  Decision a = tl.At(kT0, 2);
  EXPECT_EQ(a.delay, microseconds(0));
  EXPECT_EQ(a.remaining, 3);
  Decision b = tl.At(kT0, 3);
  EXPECT_TRUE(b.allowed);
  EXPECT_EQ(b.delay, seconds(1));  // after the two slots of `a`
  EXPECT_EQ(b.remaining, 0);
  EXPECT_FALSE(tl.At(kT0, 1).allowed);
  // Cost 0 asks without joining: the wait a request would have now.
  Decision ask = tl.At(kT0 + 500 * kMs, 0);
  EXPECT_TRUE(ask.allowed);
  EXPECT_EQ(ask.delay, seconds(2));
  EXPECT_EQ(LeakyDelay(500'000, microseconds(2'000'000), 0), seconds(2));
}

TEST(LeakyBucket, AdmitsExactlyLikeATokenBucketOfTheSameDepth) {
  Timeline leaky(Leaky(7, 3));
  Timeline bucket(Bucket(7, 3));
  int64_t now = kT0;
  uint64_t x = 12345;
  for (int i = 0; i < 500; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    now += static_cast<int64_t>((x >> 33) % 400'000);
    const int64_t cost = static_cast<int64_t>((x >> 13) % 4);
    Decision l = leaky.At(now, cost);
    Decision b = bucket.At(now, cost);
    ASSERT_EQ(l.allowed, b.allowed) << i;
    EXPECT_EQ(l.remaining, b.remaining) << i;
    EXPECT_EQ(l.retry_after, b.retry_after) << i;
    EXPECT_EQ(l.reset_after, b.reset_after) << i;
    EXPECT_EQ(b.delay, microseconds(0)) << "only the leaky bucket delays";
    if (l.allowed) {  // it fits: delay + cost * interval <= depth * interval
      EXPECT_LE(l.delay, microseconds((7 - cost) * leaky.limit().interval_micros())) << i;
    }
  }
  EXPECT_EQ(ExpiresAt(leaky.limit(), leaky.state()), leaky.state().t);
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

// A reading behind the state's window (a clock read before a slow path to the
// state, a clock stepped back, another instance's clock behind over a shared
// store) counts in the state's newer window: taken for a fresh window, it
// overwrote that window's count and the limit let the next window's requests
// through again.
TEST(WindowEdge, AReadingBehindTheStatesWindowCountsInThatWindow) {
  const int64_t w = 60 * kS;
  const int64_t t0 = kT0 - kT0 % w;  // a window's start
  Timeline fixed(Fixed(10, w));
  EXPECT_EQ(fixed.CountAllowed(t0 + w - 100 * kMs, 10), 10);  // window 0 full
  EXPECT_EQ(fixed.CountAllowed(t0 + w + 100 * kMs, 9), 9);    // window 1: 9 of 10
  const Decision late = fixed.At(t0 + w - 50 * kMs);          // a reading of window 0
  EXPECT_TRUE(late.allowed);                                  // the 10th of window 1
  EXPECT_EQ(late.remaining, 0);
  EXPECT_EQ(late.reset_after, microseconds(w + 50 * kMs));  // window 1's end, from the reading
  EXPECT_EQ(fixed.state().t, (t0 + w) / w);
  EXPECT_FALSE(fixed.At(t0 + w + 200 * kMs).allowed);  // window 1 is full

  Timeline sliding(Sliding(10, w));
  EXPECT_EQ(sliding.CountAllowed(t0 + w - 100 * kMs, 5), 5);
  EXPECT_EQ(sliding.CountAllowed(t0 + w + 100 * kMs, 5), 5);  // 4.99 weighted + 5
  const Decision behind = sliding.At(t0 + w - 50 * kMs);
  EXPECT_FALSE(behind.allowed);  // in window 1 at its start: 5 + 5 + 1 > 10
  EXPECT_GT(behind.retry_after, microseconds(0));
  EXPECT_FALSE(sliding.At(t0 + w + 200 * kMs).allowed);
  // Settling too counts in the newer window.
  const CompactState settled = SettleState(sliding.limit(), sliding.state(), t0 + w - 50 * kMs, -1);
  EXPECT_EQ(settled.t, sliding.state().t);
  EXPECT_EQ(settled.n1, 4);
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
