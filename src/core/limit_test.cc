// Building limits: invalid ones are rejected with a clear error, never clamped.
#include "ratelimit/limit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

namespace ratelimit {
namespace {

using std::chrono::microseconds;
using std::chrono::seconds;

void ExpectInvalid(const StatusOr<Limit>& l, std::string_view fragment) {
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find(fragment), std::string::npos) << l.status().message();
}

TEST(Limit, TokenBucketRejectsBadParameters) {
  ExpectInvalid(Limit::TokenBucket("b", 0, 5), "capacity must be positive");
  ExpectInvalid(Limit::TokenBucket("b", -3, 5), "capacity must be positive");
  ExpectInvalid(Limit::TokenBucket("b", 10, 0), "refill_per_second must be a positive");
  ExpectInvalid(Limit::TokenBucket("b", 10, -1), "refill_per_second must be a positive");
  ExpectInvalid(Limit::TokenBucket("b", 10, std::nan("")), "refill_per_second must be a positive");
  ExpectInvalid(Limit::TokenBucket("b", 10, std::numeric_limits<double>::infinity()),
                "refill_per_second must be a positive");
  ExpectInvalid(Limit::TokenBucket("b", 10, 2e6), "at most 1000000");
  ExpectInvalid(Limit::TokenBucket("b", int64_t{1} << 40, 5), "capacity must be at most");
  ExpectInvalid(Limit::TokenBucket("b", 1000, 1e-6), "longer than 366 days");
}

// A rate is kept as a whole number of microseconds per token: one that
// cannot be kept to within 1% is refused, naming the nearest that can
// (Bucket(1, 700000) ran with an interval of 1 us: 1000000/s).
TEST(Limit, ARateItsWholeMicrosecondIntervalCannotKeepIsRefused) {
  ExpectInvalid(Limit::TokenBucket("b", 1, 700'000),
                "limit 'b': refill_per_second 700000 cannot be kept to within 1%: a token every "
                "whole number of microseconds is the resolution; the nearest rates that can are "
                "500000 (a token every 2 us) and 1000000 (every 1 us)");
  ExpectInvalid(Limit::TokenBucket("b", 10, 450'000), "333333.33 (a token every 3 us) and 500000");
  ExpectInvalid(Limit::TokenBucket("b", 10, 30'000), "29411.76 (a token every 34 us) and 30303.03");
  ExpectInvalid(Limit::LeakyBucket("k", 10, 700'000),
                "rate_per_second 700000 cannot be kept to within 1%: a request every whole number");
  // Every rate up to 20,000/s is kept to within 1%, and those above near 1e6 / n.
  for (double r = 0.001; r <= 1e6; r *= 1.0137) {
    StatusOr<Limit> l = Limit::TokenBucket("b", 1, r);
    if (r <= 20'000) {
      ASSERT_TRUE(l.ok()) << r << ": " << l.status().ToString();
    }
    if (!l.ok()) continue;
    EXPECT_NEAR(l->refill_per_second(), r, r * 0.01) << r;
  }
  for (int64_t n : {1, 2, 3, 7, 33, 49, 50}) {
    const Limit l = *Limit::TokenBucket("b", 1, 1e6 / static_cast<double>(n));
    EXPECT_EQ(l.interval_micros(), n);
  }
  EXPECT_EQ(Limit::TokenBucket("b", 1, 30'303)->interval_micros(), 33);
}

TEST(Limit, LeakyBucketRejectsBadParametersByTheirNames) {
  ExpectInvalid(Limit::LeakyBucket("k", 0, 5), "depth must be positive");
  ExpectInvalid(Limit::LeakyBucket("k", 10, 0), "rate_per_second must be a positive");
  ExpectInvalid(Limit::LeakyBucket("k", 10, 2e6), "at most 1000000 (one request");
  ExpectInvalid(Limit::LeakyBucket("k", 1000, 1e-6), "draining a full queue");
  Limit l = *Limit::LeakyBucket("shape", 20, 5);
  EXPECT_EQ(l.algorithm(), Algorithm::kLeakyBucket);
  EXPECT_TRUE(l.is_gcra());
  EXPECT_EQ(l.interval_micros(), 200'000);
  EXPECT_EQ(l.window(), seconds(4));
  EXPECT_EQ(l.ToString(), "leaky_bucket(depth=20, rate_per_second=5)");
  EXPECT_NE(l.ValidateCost(21).message().find("exceeds the depth 20"), std::string::npos);
  // Same name and numbers as a token bucket: another identity in the store.
  EXPECT_NE(l.identity_hash(), Limit::TokenBucket("shape", 20, 5)->identity_hash());
}

// Every (algorithm, name) pair is its own identity: a store keys state by
// it. Token bucket "b" and fixed window "c" once shared one (the algorithm
// was XORed into the hash's first byte, and 0 ^ 'b' == 1 ^ 'c').
TEST(Limit, IdentityDiffersAcrossAlgorithmsAndNames) {
  std::set<uint64_t> seen;
  int made = 0;
  for (std::string name : {"a", "b", "c", "d", "e", "f", "burst", "curst", "ab", "ba"}) {
    const Limit ls[] = {*Limit::TokenBucket(name, 10, 1), *Limit::LeakyBucket(name, 10, 1),
                        *Limit::FixedWindow(name, 10, seconds(1)),
                        *Limit::SlidingWindow(name, 10, seconds(1)),
                        *Limit::SlidingLog(name, 10, seconds(1))};
    for (const Limit& l : ls) {
      seen.insert(l.identity_hash());
      ++made;
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(made));
}

// A window limit's state is per window: another length, calendar unit,
// time zone or alignment is another state (a new identity); a bucket's
// rate and a window's limit are not (the state carries over).
TEST(Limit, AWindowLimitsIdentityIsItsNameAndWindows) {
  using std::chrono::hours;
  const Limit a = *Limit::FixedWindow("q", 10, hours(24));
  const Limit others[] = {*Limit::FixedWindow("q", 10, hours(1)),
                          *Limit::CalendarQuota("q", 10, CalendarUnit::kDay, "UTC"),
                          *Limit::CalendarQuota("q", 10, CalendarUnit::kDay, "Europe/London"),
                          *Limit::CalendarQuota("q", 10, CalendarUnit::kMonth, "UTC"),
                          *Limit::SlidingWindow("q", 10, hours(24))};
  for (const Limit& o : others) {
    EXPECT_FALSE(SharesState(a, o)) << o.ToString();
    EXPECT_NE(a.identity_hash(), o.identity_hash()) << o.ToString();
  }
  EXPECT_FALSE(SharesState(others[1], others[2]));
  EXPECT_NE(others[1].identity_hash(), others[2].identity_hash());
  const Limit same[][2] = {
      {a, *Limit::FixedWindow("q", 99, hours(24))},
      {others[2], *Limit::CalendarQuota("q", 99, CalendarUnit::kDay, "Europe/London")},
      {*Limit::TokenBucket("b", 10, 1), *Limit::TokenBucket("b", 50, 7)},
      {*Limit::SlidingLog("l", 10, hours(1)), *Limit::SlidingLog("l", 5, hours(2))}};
  for (const auto& [x, y] : same) {
    EXPECT_TRUE(SharesState(x, y)) << x.ToString() << " " << y.ToString();
    EXPECT_EQ(x.identity_hash(), y.identity_hash()) << x.ToString();
  }
}

TEST(Limit, WindowsRejectBadParameters) {
  ExpectInvalid(Limit::FixedWindow("f", 0, seconds(1)), "limit must be positive");
  ExpectInvalid(Limit::FixedWindow("f", 5, microseconds(0)), "window must be positive");
  ExpectInvalid(Limit::FixedWindow("f", 5, seconds(-1)), "window must be positive");
  ExpectInvalid(Limit::SlidingWindow("s", 5, microseconds(1500)), "whole milliseconds");
  ExpectInvalid(Limit::SlidingWindow("s", 2'000'000'000, std::chrono::hours(24 * 300)), "2^53");
  ExpectInvalid(Limit::SlidingLog("l", 1'000'000, seconds(1)), "at most 100000");
}

TEST(Limit, NamesBecomeKeysSoTheyAreRestricted) {
  ExpectInvalid(Limit::TokenBucket("", 1, 1), "must not be empty");
  ExpectInvalid(Limit::TokenBucket("a{b}", 1, 1), "may contain only");
  ExpectInvalid(Limit::TokenBucket("a b", 1, 1), "may contain only");
  ExpectInvalid(Limit::TokenBucket(std::string(65, 'a'), 1, 1), "longer than 64");
  EXPECT_TRUE(Limit::TokenBucket("per-user.burst_1", 1, 1).ok());
}

TEST(Limit, CostLargerThanCapacityCanNeverSucceed) {
  Limit l = *Limit::TokenBucket("burst", 10, 5);
  EXPECT_TRUE(l.ValidateCost(0).ok());
  EXPECT_TRUE(l.ValidateCost(10).ok());
  Status s = l.ValidateCost(11);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("can never be allowed"), std::string::npos) << s.message();
  EXPECT_EQ(l.ValidateCost(-1).code(), StatusCode::kInvalidArgument);
}

TEST(Limit, RefillIntervalIsWholeMicroseconds) {
  Limit l = *Limit::TokenBucket("b", 10, 5);
  EXPECT_EQ(l.interval_micros(), 200'000);
  EXPECT_EQ(l.window(), seconds(2));
  EXPECT_DOUBLE_EQ(l.refill_per_second(), 5.0);
  EXPECT_EQ(l.ToString(), "token_bucket(capacity=10, refill_per_second=5)");
}

// IntervalsIn divides by a multiply: exact for every interval a bucket can
// have (1 us .. 366 days) and every non-negative dividend, the edges of each
// multiple of the interval and the largest int64 included.
TEST(Limit, IntervalsInIsExactDivision) {
  std::vector<int64_t> intervals;
  for (int64_t d = 1; d <= 200; ++d) intervals.push_back(d);
  for (int k = 8; k < 45; ++k) {
    for (int64_t e : {-1, 0, 1}) intervals.push_back((int64_t{1} << k) + e);
  }
  intervals.push_back(1'000'000);
  intervals.push_back(int64_t{366} * 24 * 3600 * 1'000'000);  // the longest: 1 per 366 days
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    intervals.push_back(1 + static_cast<int64_t>(rng() % intervals.back()));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int checked = 0;
  for (const int64_t d : intervals) {
    const StatusOr<Limit> l = Limit::TokenBucket("b", 1, 1e6 / static_cast<double>(d));
    ASSERT_TRUE(l.ok()) << d << ": " << l.status().ToString();
    ASSERT_EQ(l->interval_micros(), d);
    std::vector<int64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, kMax, kMax - 1, kMax - d};
    for (int i = 0; i < 40; ++i) {
      const int64_t q = static_cast<int64_t>(rng() % static_cast<uint64_t>(kMax / d));
      ns.push_back(q * d);
      ns.push_back(q * d - 1 < 0 ? 0 : q * d - 1);
      ns.push_back(static_cast<int64_t>(rng() >> 1));
    }
    for (const int64_t n : ns) {
      ASSERT_EQ(l->IntervalsIn(n), n / d) << n << " / " << d;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50'000);
}

TEST(Duration, ParsesAndFormats) {
  EXPECT_EQ(*ParseDuration("500ms"), std::chrono::milliseconds(500));
  EXPECT_EQ(*ParseDuration("60s"), seconds(60));
  EXPECT_EQ(*ParseDuration("15m"), std::chrono::minutes(15));
  EXPECT_EQ(*ParseDuration("1h"), std::chrono::hours(1));
  EXPECT_EQ(*ParseDuration("1d"), std::chrono::hours(24));
  for (const char* bad : {"", "s", "10", "-5s", "0s", "1.5s", "10x", "5 s", "999999d"}) {
    EXPECT_FALSE(ParseDuration(bad).ok()) << bad;
  }
  EXPECT_EQ(FormatDuration(std::chrono::hours(24)), "1d");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(1500)), "1500ms");
  EXPECT_EQ(FormatDuration(microseconds(7)), "7us");
}

TEST(Algorithm, Names) {
  EXPECT_EQ(*ParseAlgorithm("sliding_log"), Algorithm::kSlidingLog);
  EXPECT_EQ(*ParseAlgorithm("leaky_bucket"), Algorithm::kLeakyBucket);
  EXPECT_EQ(AlgorithmName(Algorithm::kLeakyBucket), "leaky_bucket");
  EXPECT_FALSE(ParseAlgorithm("leaky").ok());
}

}  // namespace
}  // namespace ratelimit

namespace ratelimit {
namespace {

TEST(LimitSpec, MakeLimitAndSpecOfRoundTripForEveryAlgorithm) {
  const std::chrono::microseconds minute = std::chrono::seconds(60);
  for (Algorithm a : {Algorithm::kTokenBucket, Algorithm::kLeakyBucket, Algorithm::kFixedWindow,
                      Algorithm::kSlidingWindow, Algorithm::kSlidingLog}) {
    LimitSpec spec{.name = "x", .algorithm = a, .count = 7};
    if (TakesRate(a)) {
      spec.per_second = 4;
    } else {
      spec.window = minute;
    }
    StatusOr<Limit> l = MakeLimit(spec);
    ASSERT_TRUE(l.ok()) << AlgorithmName(a);
    EXPECT_EQ(l->algorithm(), a);
    EXPECT_EQ(l->limit(), 7);
    EXPECT_EQ(*MakeLimit(SpecOf(*l)), *l) << AlgorithmName(a);
  }
  EXPECT_EQ(SpecFieldNames(Algorithm::kLeakyBucket).first, "depth");
  EXPECT_EQ(SpecFieldNames(Algorithm::kSlidingLog).second, "window");
  EXPECT_FALSE(MakeLimit({.name = "x", .algorithm = Algorithm::kFixedWindow, .count = 1}).ok());
}

}  // namespace
}  // namespace ratelimit
