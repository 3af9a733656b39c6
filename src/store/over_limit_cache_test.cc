// OverLimitCache and TokenPrefetch on their own (no Redis): the denial derived
// from an allowance that took the last unit must be exactly the one the
// algorithm gives, at every later instant until its retry time.
#include "store/over_limit_cache.h"

#include <gtest/gtest.h>

#include <random>

#include "core/algorithms.h"
#include "store/token_prefetch.h"

namespace ratelimit::store {
namespace {

using std::chrono::microseconds;

TEST(OverLimitCache, DenialAfterLastUnitMatchesTheAlgorithm) {
  std::mt19937_64 rng(7);
  const Limit limits[] = {*Limit::TokenBucket("tb", 1, 3), *Limit::TokenBucket("tb", 10, 5),
                          *Limit::TokenBucket("tb", 7, 0.3),
                          *Limit::FixedWindow("fw", 1, std::chrono::seconds(1)),
                          *Limit::FixedWindow("fw", 5, std::chrono::milliseconds(250))};
  int derived = 0;
  for (const Limit& l : limits) {
    core::CompactState state{};
    int64_t now = 1'700'000'000'000'000;
    for (int step = 0; step < 5000; ++step) {
      now += static_cast<int64_t>(rng() % 400'000);
      core::Evaluation e = core::Evaluate(l, state, now, 1);
      if (!e.decision.allowed) continue;
      state = e.next;
      std::optional<Decision> next = OverLimitCache::DenialAfterLastUnit(
          l.algorithm(), l.window_micros(), l.interval_micros(), e.decision);
      if (e.decision.remaining > 0) {
        EXPECT_FALSE(next.has_value());
        continue;
      }
      ASSERT_TRUE(next.has_value()) << l.ToString();
      ++derived;
      // Right after: exactly the algorithm's denial.
      core::Evaluation after = core::Evaluate(l, state, now, 1);
      ASSERT_FALSE(after.decision.allowed);
      EXPECT_EQ(next->retry_after, after.decision.retry_after) << l.ToString();
      EXPECT_EQ(next->reset_after, after.decision.reset_after) << l.ToString();
      EXPECT_EQ(next->remaining, after.decision.remaining);
      // Denied until just before the retry time, allowed at it.
      const int64_t at = now + next->retry_after.count();
      EXPECT_FALSE(core::Evaluate(l, state, at - 1, 1).decision.allowed) << l.ToString();
      EXPECT_TRUE(core::Evaluate(l, state, at, 1).decision.allowed) << l.ToString();
    }
  }
  EXPECT_GT(derived, 100);
  // Other algorithms are not derived.
  Limit sw = *Limit::SlidingWindow("sw", 1, std::chrono::seconds(1));
  Decision d{.allowed = true, .limit = 1, .remaining = 0, .reset_after = microseconds(5)};
  EXPECT_FALSE(OverLimitCache::DenialAfterLastUnit(sw.algorithm(), sw.window_micros(), 0, d));
}

// A cached denial answers only for the limit's own state (SharesState): a
// calendar quota moved to another time zone (an override) has other
// windows, which a denial cached for the old zone (until the end of its
// window, up to a year) must not answer for.
TEST(OverLimitCache, ACalendarQuotaOfAnotherZoneIsAnotherEntry) {
  OverLimitCache cache({});
  const Limit utc = *Limit::CalendarQuota("monthly", 5, CalendarUnit::kMonth, "UTC");
  const Limit berlin = *Limit::CalendarQuota("monthly", 5, CalendarUnit::kMonth, "Europe/Berlin");
  LimitCheck a[] = {{&utc, 1}};
  LimitCheck b[] = {{&berlin, 1}};
  EXPECT_NE(cache.Fingerprint({"k", a}), cache.Fingerprint({"k", b}));
  EXPECT_EQ(cache.Fingerprint({"k", a}), cache.Fingerprint({"k", a}));
}

TEST(TokenPrefetch, HotKeysGetLeasesThatLapse) {
  Limit l = *Limit::TokenBucket("hot", 100, 10)->WithPrefetch(5);  // lifetime 500 ms
  EXPECT_EQ(TokenPrefetch::LifetimeMicros(l), 500'000);
  TokenPrefetch t;
  EXPECT_EQ(t.Want(1, 0, l), 1) << "cold: one token";
  EXPECT_EQ(t.Want(1, 100'000, l), 5) << "asked again within the lifetime: hot";
  EXPECT_FALSE(t.Spend(1, 100'000).has_value());
  Decision grant{
      .allowed = true, .limit = 100, .remaining = 90, .reset_after = microseconds(1'000'000)};
  t.Grant(1, 5, 5, grant, 100'000, 101'000);
  for (int i = 0; i < 4; ++i) {
    std::optional<CheckResult> r = t.Spend(1, 200'000);
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_TRUE(r->overall.allowed);
    EXPECT_EQ(r->overall.remaining, 90 + 3 - i);
  }
  EXPECT_FALSE(t.Spend(1, 200'000).has_value()) << "four kept: one answered the grant";
  // Never more than lease - 1 held, however many grants overlap.
  t.Grant(1, 5, 5, grant, 300'000, 301'000);
  t.Grant(1, 5, 5, grant, 300'000, 301'000);
  int spent = 0;
  while (t.Spend(1, 310'000)) ++spent;
  EXPECT_EQ(spent, 4);
  // Unspent tokens lapse after the lifetime (counted from the submission).
  t.Grant(1, 5, 3, grant, 400'000, 401'000);
  EXPECT_TRUE(t.Spend(1, 899'999).has_value());
  EXPECT_FALSE(t.Spend(1, 900'000).has_value());
  // Bounded: a full table gives new keys no lease.
  TokenPrefetch small(1);
  EXPECT_EQ(small.Want(1, 0, l), 1);
  EXPECT_EQ(small.Want(2, 0, l), 1);
  EXPECT_EQ(small.Want(2, 1, l), 1) << "not tracked: never hot";
  EXPECT_EQ(small.size(), 1u);
}

TEST(Limit, LeaseValidation) {
  Limit tb = *Limit::TokenBucket("tb", 50, 1);
  EXPECT_EQ(tb.WithPrefetch(10)->prefetch(), 10);
  EXPECT_EQ(tb.WithPrefetch(0)->prefetch(), 0);
  EXPECT_FALSE(tb.WithPrefetch(1).ok());
  EXPECT_FALSE(tb.WithPrefetch(51).ok());
  EXPECT_FALSE(tb.WithPrefetch(-2).ok());
  EXPECT_FALSE(Limit::FixedWindow("fw", 50, std::chrono::seconds(1))->WithPrefetch(5).ok());
  EXPECT_EQ(tb.WithPrefetch(10)->ToString(),
            "token_bucket(capacity=50, refill_per_second=1, prefetch=10)");
}

}  // namespace
}  // namespace ratelimit::store
