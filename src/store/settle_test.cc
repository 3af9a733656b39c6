// Settlement (issue 21) in the MemoryStore, on a manual clock: a bucket's
// debt and its repayment, refunds that stop at a full bucket, windows kept
// within [0, limit], all limits of a settlement at once, and what is refused.
// The same numbers in Redis and Redis Cluster: tests/conformance (Settle).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "ratelimit/memory_store.h"

namespace ratelimit {
namespace {

using std::chrono::milliseconds, std::chrono::seconds;

// A token bucket of 10 at 5/s (200 ms a token, 2 s to refill) and a fixed
// window of 10 per 10 s, on a clock at a window's start.
class SettleTest : public ::testing::Test {
 protected:
  Limit tokens_ = *Limit::TokenBucket("tokens", 10, 5);
  Limit window_ = *Limit::FixedWindow("window", 10, seconds(10));
  ManualClock clock_{1'700'000'000'000'000};
  MemoryStore store_{{.clock = &clock_}};

  Decision Check(const Limit& l, int64_t cost) {
    LimitCheck c[] = {{&l, cost}};
    StatusOr<CheckResult> r = store_.CheckSync({"ada", c});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->overall : Decision{};
  }
  Decision Settle(const Limit& l, int64_t delta) {
    LimitSettle s[] = {{&l, delta}};
    StatusOr<CheckResult> r = store_.SettleSync({"ada", s});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->overall : Decision{};
  }
};

TEST_F(SettleTest, ADebitPastTheBucketIsADebtTheNextRequestsWaitFor) {
  EXPECT_TRUE(Check(tokens_, 4).allowed);  // reserved 4 of 10
  Decision after = Settle(tokens_, 10);    // it cost 14: 4 tokens of debt
  EXPECT_FALSE(after.allowed);             // the next request would wait ...
  EXPECT_EQ(after.remaining, 0);
  EXPECT_EQ(after.retry_after, seconds(1));  // ... for the debt (800 ms) and its own token
  EXPECT_EQ(after.reset_after, milliseconds(2800));
  Decision denied = Check(tokens_, 1);
  EXPECT_FALSE(denied.allowed);
  EXPECT_EQ(denied.retry_after, seconds(1));
  clock_.Advance(milliseconds(999));
  EXPECT_FALSE(Check(tokens_, 1).allowed);
  clock_.Advance(milliseconds(1));
  Decision paid = Check(tokens_, 1);
  EXPECT_TRUE(paid.allowed);
  EXPECT_EQ(paid.remaining, 0);
}

TEST_F(SettleTest, ARefundNeverFillsTheBucketPastItsCapacity) {
  EXPECT_TRUE(Check(tokens_, 10).allowed);
  Decision r = Settle(tokens_, -3);
  EXPECT_TRUE(r.allowed);
  EXPECT_EQ(r.remaining, 3);
  EXPECT_EQ(r.reset_after, milliseconds(1400));
  r = Settle(tokens_, -1000);
  EXPECT_EQ(r.remaining, 10);  // full, not 1000 over
  EXPECT_EQ(r.reset_after, seconds(0));
  EXPECT_TRUE(Check(tokens_, 10).allowed);
  EXPECT_FALSE(Check(tokens_, 1).allowed);
  EXPECT_EQ(store_.size(), 1u);
  Settle(tokens_, -10);  // back to the fresh state: nothing kept
  EXPECT_EQ(store_.size(), 0u);
}

TEST_F(SettleTest, ADebtIsCappedAtAYearOfRefill) {
  Limit slow = *Limit::TokenBucket("slow", 1000, 1);
  Decision r = Settle(slow, kMaxSettleDelta);  // 68 years of refill
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.reset_after.count(), slow.window_micros() + Limit::kMaxWindowMicros);
}

TEST_F(SettleTest, AWindowCounterStaysWithinZeroAndItsLimit) {
  EXPECT_TRUE(Check(window_, 3).allowed);
  Decision full = Settle(window_, 20);  // fills the window; the rest is forgiven
  EXPECT_FALSE(full.allowed);
  EXPECT_EQ(full.remaining, 0);
  EXPECT_EQ(full.retry_after, seconds(10));
  clock_.Advance(seconds(1));
  EXPECT_EQ(Settle(window_, -4).remaining, 4);
  Decision empty = Settle(window_, -100);
  EXPECT_TRUE(empty.allowed);
  EXPECT_EQ(empty.remaining, 10);
  clock_.Advance(seconds(9));  // a new window: a refund finds nothing to take from
  EXPECT_EQ(Settle(window_, -1).remaining, 10);
  EXPECT_TRUE(Check(window_, 10).allowed);
}

TEST_F(SettleTest, EveryLimitOfASettlementChangesTogether) {
  LimitSettle s[] = {{&tokens_, 12}, {&window_, 2}};
  StatusOr<CheckResult> r = store_.SettleSync({"ada", s});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->decisions.size(), 2u);
  EXPECT_FALSE(r->decisions[0].allowed);  // 2 tokens of debt
  EXPECT_EQ(r->decisions[0].retry_after, milliseconds(600));
  EXPECT_TRUE(r->decisions[1].allowed);
  EXPECT_EQ(r->decisions[1].remaining, 8);
  EXPECT_FALSE(r->overall.allowed);
  EXPECT_EQ(r->overall.retry_after, milliseconds(600));
}

TEST_F(SettleTest, BadSettlementsAreRefusedAndChangeNothing) {
  Limit log = *Limit::SlidingLog("login", 5, seconds(900));
  LimitSettle on_log[] = {{&log, 1}};
  StatusOr<CheckResult> r = store_.SettleSync({"ada", on_log});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sliding log"), std::string::npos);

  LimitSettle twice[] = {{&tokens_, 1}, {&tokens_, 1}};
  EXPECT_FALSE(store_.SettleSync({"ada", twice}).ok());
  LimitSettle huge[] = {{&tokens_, kMaxSettleDelta + 1}};
  EXPECT_FALSE(store_.SettleSync({"ada", huge}).ok());
  EXPECT_FALSE(store_.SettleSync({"", std::span<const LimitSettle>(huge, 0)}).ok());
  EXPECT_FALSE(store_.SettleSync({"ada", std::span<const LimitSettle>(huge, 0)}).ok());
  EXPECT_EQ(store_.size(), 0u);
}

// Reserve 1, settle the real cost, from 8 threads: the bucket ends exactly
// where the sum of the real costs puts it.
TEST_F(SettleTest, ConcurrentSettlementsAddUpExactly) {
  Limit big = *Limit::TokenBucket("big", 1'000'000, 1);  // the clock stands: no refill
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        LimitCheck c[] = {{&big, 1}};
        ASSERT_TRUE(store_.CheckSync({"ada", c})->overall.allowed);
        LimitSettle s[] = {{&big, (t + i) % 5 - 1}};  // costs 0..4
        ASSERT_TRUE(store_.SettleSync({"ada", s}).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  int64_t total = 0;
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < 500; ++i) total += (t + i) % 5;
  LimitCheck peek[] = {{&big, 0}};
  EXPECT_EQ(store_.PeekSync({"ada", peek})->overall.remaining, 1'000'000 - total);
}

}  // namespace
}  // namespace ratelimit
