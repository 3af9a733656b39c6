// The conformance suite: one table of (limits, time steps, costs, expected
// decisions) run against every store, so the Lua scripts and the C++
// arithmetic can never drift apart. Time comes from one ManualClock: the
// MemoryStore reads it directly and RedisStore uses its `local` time source.
// A randomized differential run then compares the stores step by step.
#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "support/redis_cluster.h"
#include "support/redis_server.h"

namespace ratelimit {
namespace {

using std::chrono::microseconds;

constexpr int64_t kMs = 1000;
constexpr int64_t kS = 1'000'000;
constexpr int64_t kStart = 1'700'000'000'000'000;  // epoch-aligned (a multiple of 10 s)

struct Step {
  int64_t at_us;  // since kStart
  int64_t cost;
  bool allowed;
  int64_t remaining;
  int64_t retry_after_us;
  int64_t reset_after_us;
  int64_t delay_us = 0;  // leaky bucket
};

struct Scenario {
  std::string name;
  std::vector<Limit> limits;  // checked together, all or nothing; expectations are overall
  std::vector<Step> steps;
  int64_t start = kStart;  // the time steps count from
};

Limit TB(const char* n, int64_t cap, double rate) { return *Limit::TokenBucket(n, cap, rate); }
Limit LB(const char* n, int64_t depth, double rate) { return *Limit::LeakyBucket(n, depth, rate); }
Limit FW(const char* n, int64_t lim, int64_t w) {
  return *Limit::FixedWindow(n, lim, microseconds(w));
}
Limit SW(const char* n, int64_t lim, int64_t w) {
  return *Limit::SlidingWindow(n, lim, microseconds(w));
}
Limit SL(const char* n, int64_t lim, int64_t w) {
  return *Limit::SlidingLog(n, lim, microseconds(w));
}
Limit CQ(const char* n, int64_t lim, CalendarUnit unit, const char* zone) {
  return *Limit::CalendarQuota(n, lim, unit, zone);
}

// Microseconds since the epoch of a UTC date and time (for calendar quotas).
int64_t Utc(int y, int mo, int d, int h, int mi, int s) {
  return ((DaysFromCivil(y, mo, d) * 24 + h) * 3600 + mi * 60 + s) * kS;
}

constexpr int64_t kH = 3600 * kS;
constexpr int64_t kDay = 24 * kH;

// Calendar quotas at their boundaries: the window each store counts in and
// the reset each one reports must be the calendar's, DST and leap years
// included (the Redis stores get the boundaries from the instance and pick
// by the script's clock, here the manual one).
std::vector<Scenario> CalendarTable() {
  return {
      {"calendar: a monthly quota in Berlin resets at local midnight on April 1st (CEST)",
       {CQ("monthly", 3, CalendarUnit::kMonth, "Europe/Berlin")},
       {{0, 2, true, 1, 0, 2 * kS},
        {1 * kS, 2, false, 1, 1 * kS, 1 * kS},
        {2 * kS, 3, true, 0, 0, 30 * kDay},
        {2 * kS, 1, false, 0, 30 * kDay, 30 * kDay}},
       Utc(2026, 3, 31, 21, 59, 58)},
      {"calendar: October in Berlin is an hour longer; November starts at 00:00 CET",
       {CQ("monthly", 1, CalendarUnit::kMonth, "Europe/Berlin")},
       {{0, 1, true, 0, 0, 1 * kS},
        {0, 1, false, 0, 1 * kS, 1 * kS},
        {1 * kS, 1, true, 0, 0, 30 * kDay}},
       Utc(2026, 10, 31, 22, 59, 59)},
      {"calendar: the day DST starts in New York lasts 23 hours",
       {CQ("daily", 2, CalendarUnit::kDay, "America/New_York")},
       {{0, 2, true, 0, 0, 23 * kH},
        {23 * kH - 1 * kS, 1, false, 0, 1 * kS, 1 * kS},
        {23 * kH, 1, true, 1, 0, 24 * kH}},
       Utc(2026, 3, 8, 5, 0, 0)},
      {"calendar: the day DST ends in New York lasts 25 hours",
       {CQ("daily", 1, CalendarUnit::kDay, "America/New_York")},
       {{0, 1, true, 0, 0, 25 * kH},
        {24 * kH, 1, false, 0, 1 * kH, 1 * kH},
        {25 * kH, 1, true, 0, 0, 24 * kH}},
       Utc(2026, 11, 1, 4, 0, 0)},
      {"calendar: a leap year's last second in Berlin, then 365 days of 2029",
       {CQ("yearly", 1, CalendarUnit::kYear, "Europe/Berlin")},
       {{0, 1, true, 0, 0, 1 * kS},
        {0, 1, false, 0, 1 * kS, 1 * kS},
        {1 * kS, 1, true, 0, 0, 365 * kDay}},
       Utc(2028, 12, 31, 22, 59, 59)},
      {"calendar: February 29th, then March, in UTC",
       {CQ("monthly", 1, CalendarUnit::kMonth, "UTC")},
       {{0, 1, true, 0, 0, 1 * kS},
        {0, 1, false, 0, 1 * kS, 1 * kS},
        {1 * kS, 1, true, 0, 0, 31 * kDay}},
       Utc(2028, 2, 29, 23, 59, 59)},
  };
}

std::vector<Scenario> Table() {
  return {
      {"token bucket: burst of 10 at 5/s, then the rate",
       {TB("burst", 10, 5)},
       {{0, 1, true, 9, 0, 200 * kMs},
        {0, 8, true, 1, 0, 1800 * kMs},
        {0, 1, true, 0, 0, 2 * kS},
        {0, 1, false, 0, 200 * kMs, 2 * kS},
        {199 * kMs, 1, false, 0, 1 * kMs, 1801 * kMs},
        {200 * kMs, 1, true, 0, 0, 2 * kS},
        {1200 * kMs, 5, true, 0, 0, 2 * kS},
        {1200 * kMs, 1, false, 0, 200 * kMs, 2 * kS}}},
      {"token bucket: refill is capped at the capacity",
       {TB("cap", 3, 1)},
       {{0, 3, true, 0, 0, 3 * kS},
        {3600 * kS, 3, true, 0, 0, 3 * kS},
        {3600 * kS, 1, false, 0, 1 * kS, 3 * kS}}},
      {"token bucket: cost 5 with 4 left is denied and consumes nothing",
       {TB("cost", 10, 1)},
       {{0, 6, true, 4, 0, 6 * kS}, {0, 5, false, 4, 1 * kS, 6 * kS}, {0, 4, true, 0, 0, 10 * kS}}},
      {"token bucket: cost 0 asks without consuming",
       {TB("ask", 3, 1)},
       {{0, 0, true, 3, 0, 0}, {0, 2, true, 1, 0, 2 * kS}, {500 * kMs, 0, true, 1, 0, 1500 * kMs}}},
      {"leaky bucket: a burst of 10 at 5/s, depth 10, waits 0, 200, ... 1800 ms; the 11th is "
       "denied",
       {LB("shape", 10, 5)},
       {{0, 1, true, 9, 0, 200 * kMs, 0},
        {0, 1, true, 8, 0, 400 * kMs, 200 * kMs},
        {0, 1, true, 7, 0, 600 * kMs, 400 * kMs},
        {0, 1, true, 6, 0, 800 * kMs, 600 * kMs},
        {0, 1, true, 5, 0, 1000 * kMs, 800 * kMs},
        {0, 1, true, 4, 0, 1200 * kMs, 1000 * kMs},
        {0, 1, true, 3, 0, 1400 * kMs, 1200 * kMs},
        {0, 1, true, 2, 0, 1600 * kMs, 1400 * kMs},
        {0, 1, true, 1, 0, 1800 * kMs, 1600 * kMs},
        {0, 1, true, 0, 0, 2000 * kMs, 1800 * kMs},
        {0, 1, false, 0, 200 * kMs, 2000 * kMs, 0},
        {200 * kMs, 1, true, 0, 0, 2000 * kMs, 1800 * kMs},
        {5 * kS, 1, true, 9, 0, 200 * kMs, 0}}},
      {"leaky bucket with a token bucket: the longest delay, none when denied",
       {LB("shape2", 3, 10), TB("cap2", 2, 1)},
       {{0, 1, true, 1, 0, 1 * kS, 0},
        {0, 1, true, 0, 0, 2 * kS, 100 * kMs},
        {0, 1, false, 0, 1 * kS, 2 * kS, 0},
        {50 * kMs, 0, true, 0, 0, 1950 * kMs, 150 * kMs}}},
      {"fixed window: 5 at t=9s and 5 at t=10s are all allowed (the edge)",
       {FW("fw", 5, 10 * kS)},
       {{9 * kS, 5, true, 0, 0, 1 * kS},
        {9 * kS, 1, false, 0, 1 * kS, 1 * kS},
        {10 * kS, 5, true, 0, 0, 10 * kS},
        {10 * kS, 1, false, 0, 10 * kS, 10 * kS}}},
      {"sliding window: 5 at t=9s, then at t=10s nothing (the edge)",
       {SW("sw", 5, 10 * kS)},
       {{9 * kS, 5, true, 0, 0, 11 * kS},
        {10 * kS, 1, false, 0, 2 * kS, 10 * kS},
        {12 * kS, 1, true, 0, 0, 18 * kS},
        {12 * kS, 1, false, 0, 2 * kS, 18 * kS}}},
      {"sliding window: the previous window weighted by overlap",
       {SW("sw2", 10, 10 * kS)},
       {{5 * kS, 10, true, 0, 0, 15 * kS},
        {13 * kS, 3, true, 0, 0, 17 * kS},
        {13 * kS, 1, false, 0, 1 * kS, 17 * kS},
        {14 * kS, 1, true, 0, 0, 16 * kS}}},
      {"sliding log: login, 5 per 15 minutes",
       {SL("login", 5, 900 * kS)},
       {{0, 1, true, 4, 0, 900 * kS},
        {60 * kS, 1, true, 3, 0, 900 * kS},
        {120 * kS, 3, true, 0, 0, 900 * kS},
        {300 * kS, 1, false, 0, 600 * kS, 720 * kS},
        {900 * kS, 1, true, 0, 0, 900 * kS},
        {900 * kS, 1, false, 0, 60 * kS, 900 * kS}}},
      {"two limits: a denied request consumes from neither",
       {TB("burst", 3, 1), FW("daily", 4, 86400 * kS)},
       {{0, 3, true, 0, 0, 3 * kS},
        {0, 1, false, 0, 1 * kS, 3 * kS},
        // kStart is 80,000 s into a UTC day: the daily window ends 6,400 s later.
        {1 * kS, 1, true, 0, 0, 6399 * kS},  // both at 0: the one that resets last
        {5 * kS, 1, false, 0, 6395 * kS, 6395 * kS}}},
  };
}

// A store under test plus the clock it reads.
struct Subject {
  std::string name;
  std::function<std::unique_ptr<Store>(const Clock*)> make;
};

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { redis_ = new testing::RedisServer(); }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
    delete cluster_;
    cluster_ = nullptr;
  }

  std::unique_ptr<Store> Make(const Clock* clock) {
    if (GetParam() == "memory")
      return std::make_unique<MemoryStore>(MemoryStore::Options{.clock = clock});
    std::string url = redis_->url();
    if (GetParam() == "cluster") {
      if (cluster_ == nullptr) cluster_ = new testing::RedisCluster();  // started on first use
      url = cluster_->url();
    }
    auto s = RedisStore::Create({.url = url,
                                 .deadline = std::chrono::seconds(5),
                                 .time_source = RedisStore::TimeSource::kLocal,
                                 .clock = clock,
                                 .steady_clock = clock});
    if (!s.ok()) throw std::runtime_error(s.status().ToString());
    return *std::move(s);
  }

  // Runs each scenario's steps on a fresh store and key (`key_prefix` + its
  // index), at the step's time, every limit at the step's cost, and hands
  // each answer to `expect`.
  template <typename Scenarios, typename Expect>
  void RunSteps(const Scenarios& table, const std::string& key_prefix, Expect expect) {
    int scenario_index = 0;
    for (const auto& sc : table) {
      int64_t start = kStart;
      if constexpr (requires { sc.start; }) start = sc.start;
      ManualClock clock(start);
      std::unique_ptr<Store> store = Make(&clock);
      const std::string key = key_prefix + std::to_string(scenario_index++);
      for (size_t i = 0; i < sc.steps.size(); ++i) {
        const auto& st = sc.steps[i];
        clock.Set(start + st.at_us);
        std::vector<LimitCheck> checks;
        for (const Limit& l : sc.limits) checks.push_back({&l, st.cost});
        StatusOr<CheckResult> r = store->CheckSync({key, checks});
        ASSERT_TRUE(r.ok()) << sc.name << " step " << i << ": " << r.status().ToString();
        SCOPED_TRACE(sc.name + ", step " + std::to_string(i));
        expect(sc, st, *r);
      }
    }
  }

  static testing::RedisServer* redis_;
  static testing::RedisCluster* cluster_;
};
testing::RedisServer* Conformance::redis_ = nullptr;
testing::RedisCluster* Conformance::cluster_ = nullptr;

void ExpectOverall(const Scenario&, const Step& st, const CheckResult& r) {
  const Decision& d = r.overall;
  EXPECT_EQ(d.allowed, st.allowed);
  EXPECT_EQ(d.remaining, st.remaining);
  EXPECT_EQ(d.retry_after.count(), st.retry_after_us);
  EXPECT_EQ(d.reset_after.count(), st.reset_after_us);
  EXPECT_EQ(d.delay.count(), st.delay_us);
}

TEST_P(Conformance, Table) { RunSteps(Table(), "conf:", ExpectOverall); }

TEST_P(Conformance, CalendarQuotas) { RunSteps(CalendarTable(), "cal:", ExpectOverall); }

// Every limit's numbers, not just the overall answer. A denied check takes
// nothing, so each limit of a denied answer reports the state as it stands (as
// a cost-0 check would: nothing taken, no delay), the denying ones with their
// retry_after. Issue #16: the limits that would have allowed used to answer as
// if the cost had been taken.
struct Each {
  bool allowed;
  int64_t remaining;
  int64_t retry_after_us;
  int64_t reset_after_us;
  int64_t delay_us = 0;
};

struct EveryLimitStep {
  int64_t at_us;
  int64_t cost;
  bool allowed;            // overall
  std::vector<Each> each;  // one per limit, in order
};

struct EveryLimitScenario {
  std::string name;
  std::vector<Limit> limits;
  std::vector<EveryLimitStep> steps;
};

std::vector<EveryLimitScenario> EveryLimitTable() {
  return {
      {"cost 2 on big (100) and small (3): small denies, big answers its standing state",
       {TB("big", 100, 1), TB("small", 3, 1)},
       {{0, 2, true, {{true, 98, 0, 2 * kS}, {true, 1, 0, 2 * kS}}},
        {0, 2, false, {{true, 98, 0, 2 * kS}, {false, 1, 1 * kS, 2 * kS}}},
        {0, 0, true, {{true, 98, 0, 2 * kS}, {true, 1, 0, 2 * kS}}},
        {500 * kMs, 3, false, {{true, 98, 0, 1500 * kMs}, {false, 1, 1500 * kMs, 1500 * kMs}}},
        {1 * kS, 2, true, {{true, 97, 0, 3 * kS}, {true, 0, 0, 3 * kS}}}}},
      {"every algorithm beside a denying one: nothing is taken from any",
       {FW("fw", 10, 10 * kS), SW("sw", 10, 10 * kS), SL("sl", 10, 10 * kS), LB("lb", 5, 1),
        TB("one", 1, 1)},
       {{0,
         1,
         true,
         {{true, 9, 0, 10 * kS},
          {true, 9, 0, 20 * kS},
          {true, 9, 0, 10 * kS},
          {true, 4, 0, 1 * kS, 0},
          {true, 0, 0, 1 * kS}}},
        {0,
         1,
         false,
         {{true, 9, 0, 10 * kS},
          {true, 9, 0, 20 * kS},
          {true, 9, 0, 10 * kS},
          {true, 4, 0, 1 * kS, 0},
          {false, 0, 1 * kS, 1 * kS}}},
        {200 * kMs,
         1,
         false,
         {{true, 9, 0, 9800 * kMs},
          {true, 9, 0, 19800 * kMs},
          {true, 9, 0, 9800 * kMs},
          {true, 4, 0, 800 * kMs, 0},
          {false, 0, 800 * kMs, 800 * kMs}}}}},
      // kStart is 2023-11-14 22:13:20 UTC: the UTC day ends 6,400 s later,
      // New York's (17:13:20 EST) 24,400 s later. Two calendar quotas (two
      // keys each in Redis) beside a token bucket that denies.
      {"calendar quotas beside a denying limit: nothing taken, each its own window",
       {CQ("cal_utc", 2, CalendarUnit::kDay, "UTC"),
        CQ("cal_ny", 3, CalendarUnit::kDay, "America/New_York"), TB("one", 1, 1)},
       {{0, 1, true, {{true, 1, 0, 6400 * kS}, {true, 2, 0, 24400 * kS}, {true, 0, 0, 1 * kS}}},
        {0,
         1,
         false,
         {{true, 1, 0, 6400 * kS}, {true, 2, 0, 24400 * kS}, {false, 0, 1 * kS, 1 * kS}}},
        {1 * kS,
         1,
         true,
         {{true, 0, 0, 6399 * kS}, {true, 1, 0, 24399 * kS}, {true, 0, 0, 1 * kS}}},
        {2 * kS,
         1,
         false,
         {{false, 0, 6398 * kS, 6398 * kS}, {true, 1, 0, 24398 * kS}, {true, 1, 0, 0}}},
        {6400 * kS,
         1,
         true,
         {{true, 1, 0, 86400 * kS}, {true, 0, 0, 18000 * kS}, {true, 0, 0, 1 * kS}}},
        {6401 * kS,
         1,
         false,
         {{true, 1, 0, 86399 * kS}, {false, 0, 17999 * kS, 17999 * kS}, {true, 1, 0, 0}}}}},
  };
}

TEST_P(Conformance, EveryLimitOfACheck) {
  RunSteps(EveryLimitTable(), "each:",
           [](const EveryLimitScenario& sc, const EveryLimitStep& st, const CheckResult& r) {
             ASSERT_EQ(r.decisions.size(), st.each.size());
             EXPECT_EQ(r.overall.allowed, st.allowed);
             for (size_t j = 0; j < st.each.size(); ++j) {
               SCOPED_TRACE("limit " + sc.limits[j].name());
               const Decision& d = r.decisions[j];
               const Each& want = st.each[j];
               EXPECT_EQ(d.allowed, want.allowed);
               EXPECT_EQ(d.remaining, want.remaining);
               EXPECT_EQ(d.retry_after.count(), want.retry_after_us);
               EXPECT_EQ(d.reset_after.count(), want.reset_after_us);
               EXPECT_EQ(d.delay.count(), want.delay_us);
             }
           });
}

// Settlement (issue 21): steps that check (`settle` false: the cost) or
// settle (the difference) every limit of the scenario; the expectation is
// the overall answer, for a settlement the state afterwards as the next
// cost-1 request meets it (core::Probe). check.lua's "S" call must agree.
struct SettleStep {
  int64_t at_us;
  bool settle;
  int64_t amount;
  bool allowed;
  int64_t remaining;
  int64_t retry_after_us;
  int64_t reset_after_us;
};

struct SettleScenario {
  std::string name;
  std::vector<Limit> limits;
  std::vector<SettleStep> steps;
};

std::vector<SettleScenario> SettleTable() {
  constexpr bool kCheck = false, kSettle = true;
  return {
      {"token bucket: a debt is waited for; a refund stops at a full bucket",
       {TB("tb", 10, 5)},
       {{0, kCheck, 4, true, 6, 0, 800 * kMs},
        {0, kSettle, 10, false, 0, 1 * kS, 2800 * kMs},
        {0, kCheck, 1, false, 0, 1 * kS, 2800 * kMs},
        {1 * kS, kCheck, 1, true, 0, 0, 2 * kS},
        {1 * kS, kSettle, -20, true, 10, 0, 0},
        {1 * kS, kCheck, 10, true, 0, 0, 2 * kS},
        {1 * kS, kSettle, -3, true, 3, 0, 1400 * kMs}}},
      {"leaky bucket: the same arithmetic",
       {LB("lb", 5, 1)},
       {{0, kCheck, 2, true, 3, 0, 2 * kS}, {0, kSettle, -1, true, 4, 0, 1 * kS}}},
      {"fixed window: the counter stays within [0, limit]",
       {FW("fw", 10, 10 * kS)},
       {{0, kCheck, 3, true, 7, 0, 10 * kS},
        {0, kSettle, 20, false, 0, 10 * kS, 10 * kS},
        {1 * kS, kSettle, -4, true, 4, 0, 9 * kS},
        {1 * kS, kSettle, -100, true, 10, 0, 0},
        {10 * kS, kSettle, -1, true, 10, 0, 0}}},
      {"sliding window: a settlement changes the current window only",
       {SW("sw", 10, 10 * kS)},
       {{5 * kS, kCheck, 10, true, 0, 0, 15 * kS},
        {13 * kS, kSettle, -4, true, 3, 0, 7 * kS},
        {13 * kS, kSettle, 5, false, 0, 3 * kS, 17 * kS},
        {13 * kS, kCheck, 1, false, 0, 3 * kS, 17 * kS}}},
      {"token bucket: a debt is capped at a year of refill",
       {TB("cap", 1000, 1)},
       {{0, kSettle, 2'147'483'647, false, 0, Limit::kMaxWindowMicros + kS,
         1000 * kS + Limit::kMaxWindowMicros}}},
      {"two limits settle together",
       {TB("b", 10, 1), FW("d", 100, 86400 * kS)},
       {{0, kCheck, 5, true, 5, 0, 5 * kS},
        {0, kSettle, 10, false, 0, 6 * kS, 15 * kS},
        {6 * kS, kCheck, 1, true, 0, 0, 10 * kS}}},
  };
}

TEST_P(Conformance, Settle) {
  int index = 0;
  for (const SettleScenario& sc : SettleTable()) {
    ManualClock clock(kStart);
    std::unique_ptr<Store> store = Make(&clock);
    const std::string key = "settle:" + std::to_string(index++);
    for (size_t i = 0; i < sc.steps.size(); ++i) {
      const SettleStep& st = sc.steps[i];
      SCOPED_TRACE(sc.name + ", step " + std::to_string(i));
      clock.Set(kStart + st.at_us);
      std::vector<LimitCheck> checks;
      std::vector<LimitSettle> settlements;
      for (const Limit& l : sc.limits) {
        checks.push_back({&l, st.amount});
        settlements.push_back({&l, st.amount});
      }
      StatusOr<CheckResult> r =
          st.settle ? store->SettleSync({key, settlements}) : store->CheckSync({key, checks});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->overall.allowed, st.allowed);
      EXPECT_EQ(r->overall.remaining, st.remaining);
      EXPECT_EQ(r->overall.retry_after.count(), st.retry_after_us);
      EXPECT_EQ(r->overall.reset_after.count(), st.reset_after_us);
    }
  }
}

// A settlement with a `once` id applies once: the second answers
// already_settled and changes nothing; another id applies again.
TEST_P(Conformance, SettleOnce) {
  const Limit tokens = TB("once", 100, 1);
  ManualClock clock(kStart);
  std::unique_ptr<Store> store = Make(&clock);
  LimitCheck c[] = {{&tokens, 10}};
  ASSERT_TRUE(store->CheckSync({"once:ada", c})->overall.allowed);
  LimitSettle s[] = {{&tokens, 5}};
  const SettleRequest first{
      .key = "once:ada", .settlements = s, .once = "n1", .once_ttl = microseconds(60 * kS)};
  StatusOr<CheckResult> r = store->SettleSync(first);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->already_settled);
  EXPECT_EQ(r->overall.remaining, 85);
  r = store->SettleSync(first);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->already_settled);
  EXPECT_TRUE(r->decisions.empty());
  SettleRequest second = first;
  second.once = "n2";
  EXPECT_EQ(store->SettleSync(second)->overall.remaining, 80);
  LimitCheck peek[] = {{&tokens, 0}};
  EXPECT_EQ(store->PeekSync({"once:ada", peek})->overall.remaining, 80);
}

// Block periods (issue 21): a login limit of 5 a minute with block_for 10m.
// The 6th attempt is denied and blocks the client for 10 minutes: every
// check is denied until then (retry_after: the block's end), though the
// window has long been empty; a peek shows the block without starting one;
// Blocks shows it, Unblock lifts it, Reset lifts it too.
TEST_P(Conformance, BlockFor) {
  const Limit login = *FW("login", 5, 60 * kS).WithBlockFor(microseconds(600 * kS));
  const Limit* limits[] = {&login};
  ManualClock clock(kStart);
  std::unique_ptr<Store> store = Make(&clock);
  auto check = [&](int64_t cost = 1) {
    LimitCheck c[] = {{&login, cost}};
    StatusOr<CheckResult> r = store->CheckSync({"block:ada", c});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->overall : Decision{};
  };
  auto blocked_for = [&] {
    std::promise<StatusOr<std::vector<microseconds>>> p;
    store->Blocks("block:ada", limits, [&](auto r) { p.set_value(std::move(r)); });
    StatusOr<std::vector<microseconds>> r = p.get_future().get();
    EXPECT_TRUE(r.ok() && r->size() == 1);
    return r.ok() && r->size() == 1 ? (*r)[0].count() : -1;
  };
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(check().allowed);
  EXPECT_EQ(blocked_for(), 0);
  LimitCheck peek[] = {{&login, 1}};
  EXPECT_EQ(store->PeekSync({"block:ada", peek})->overall.remaining, 0);
  EXPECT_EQ(blocked_for(), 0);  // nothing denied yet
  clock.Advance(microseconds(10 * kS));
  Decision sixth = check();
  EXPECT_FALSE(sixth.allowed);
  EXPECT_EQ(sixth.remaining, 0);
  EXPECT_EQ(sixth.retry_after.count(), 600 * kS);
  EXPECT_EQ(sixth.reset_after.count(), 600 * kS);
  if (GetParam() != "memory") {  // another instance on the same Redis: blocked as well
    std::unique_ptr<Store> other = Make(&clock);
    LimitCheck c[] = {{&login, 1}};
    StatusOr<CheckResult> r = other->CheckSync({"block:ada", c});
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->overall.allowed);
    EXPECT_EQ(r->overall.retry_after.count(), 600 * kS);
  }
  clock.Advance(microseconds(61 * kS));  // a new window, still blocked
  Decision later = check();
  EXPECT_FALSE(later.allowed);
  EXPECT_EQ(later.retry_after.count(), 539 * kS);
  EXPECT_EQ(store->PeekSync({"block:ada", peek})->overall.retry_after.count(), 539 * kS);
  EXPECT_EQ(blocked_for(), 539 * kS);
  clock.Advance(microseconds(538 * kS));
  EXPECT_EQ(check().retry_after.count(), 1 * kS);  // not extended by denials meanwhile
  clock.Advance(microseconds(1 * kS));
  EXPECT_TRUE(check().allowed);  // 10 minutes on
  EXPECT_EQ(blocked_for(), 0);

  // Block again, then lift it: Unblock, and Reset.
  for (int i = 0; i < 5; ++i) check();
  EXPECT_FALSE(check().allowed);
  EXPECT_GT(blocked_for(), 0);
  EXPECT_TRUE(store->SettleSync({"block:ada", std::vector<LimitSettle>{{&login, -5}}}).ok());
  EXPECT_FALSE(check().allowed);  // room in the window, but the block stands
  std::promise<Status> lifted;
  store->Unblock("block:ada", limits, [&](Status s) { lifted.set_value(s); });
  EXPECT_TRUE(lifted.get_future().get().ok());
  EXPECT_EQ(blocked_for(), 0);
  EXPECT_TRUE(check().allowed);
  for (int i = 0; i < 5; ++i) check();
  EXPECT_GT(blocked_for(), 0);
  EXPECT_TRUE(store->ResetSync("block:ada", limits).ok());
  EXPECT_EQ(blocked_for(), 0);
  EXPECT_TRUE(check(5).allowed);
}

// A limit beside a blocked one answers for its state; the check takes from neither.
TEST_P(Conformance, BlockForBesideAnotherLimit) {
  const Limit login = *FW("login2", 2, 60 * kS).WithBlockFor(microseconds(300 * kS));
  const Limit burst = TB("burst2", 10, 1);
  ManualClock clock(kStart);
  std::unique_ptr<Store> store = Make(&clock);
  LimitCheck c[] = {{&login, 1}, {&burst, 1}};
  EXPECT_TRUE(store->CheckSync({"block:bob", c})->overall.allowed);
  EXPECT_TRUE(store->CheckSync({"block:bob", c})->overall.allowed);
  StatusOr<CheckResult> r = store->CheckSync({"block:bob", c});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->overall.allowed);
  EXPECT_EQ(r->overall.retry_after.count(), 300 * kS);
  EXPECT_EQ(r->decisions[1].remaining, 8);  // burst: nothing taken
  clock.Advance(microseconds(120 * kS));
  r = store->CheckSync({"block:bob", c});
  EXPECT_FALSE(r->overall.allowed);
  EXPECT_EQ(r->overall.retry_after.count(), 180 * kS);
  EXPECT_EQ(r->decisions[1].remaining, 10);
}

INSTANTIATE_TEST_SUITE_P(Stores, Conformance, ::testing::Values("memory", "redis", "cluster"),
                         [](const auto& info) { return info.param; });

// Random steps for every algorithm: RedisStore must agree exactly with
// MemoryStore (the C++ arithmetic) on every decision, on the same clock.
class Differential : public Conformance {};

TEST_P(Differential, RedisAgreesWithMemoryOnRandomSteps) {
  std::vector<Limit> limits = {TB("tb", 7, 3),      TB("tb_slow", 20, 0.5),    FW("fw", 6, 2 * kS),
                               SW("sw", 9, 3 * kS), SW("sw_ms", 4, 250 * kMs), SL("sl", 5, 2 * kS),
                               LB("lb", 6, 4),      LB("lb_slow", 15, 0.7)};
  ManualClock clock(kStart);
  std::unique_ptr<Store> subject = Make(&clock);
  MemoryStore reference({.clock = &clock});
  std::mt19937_64 rng(20261130);
  for (const Limit& l : limits) {
    for (int i = 0; i < 400; ++i) {
      clock.Advance(microseconds(std::uniform_int_distribution<int64_t>(0, 400'000)(rng)));
      const int64_t cost =
          std::uniform_int_distribution<int64_t>(0, std::min<int64_t>(l.limit(), 4))(rng);
      LimitCheck c[] = {{&l, cost}};
      StatusOr<CheckResult> want = reference.CheckSync({"diff", c});
      StatusOr<CheckResult> got = subject->CheckSync({"diff", c});
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
      ASSERT_EQ(got->overall, want->overall)
          << l.ToString() << " step " << i << " cost " << cost << ": allowed "
          << got->overall.allowed << "/" << want->overall.allowed << " remaining "
          << got->overall.remaining << "/" << want->overall.remaining << " retry "
          << got->overall.retry_after.count() << "/" << want->overall.retry_after.count()
          << " reset " << got->overall.reset_after.count() << "/"
          << want->overall.reset_after.count() << " delay " << got->overall.delay.count() << "/"
          << want->overall.delay.count();
    }
  }
}

// A calendar quota (beside a token bucket) on random steps across the end
// of New York's 23-hour day and Berlin's March: the same answers everywhere.
TEST_P(Differential, CalendarQuotasAgreeAcrossBoundaries) {
  const Limit daily = CQ("d", 6, CalendarUnit::kDay, "America/New_York");
  const Limit monthly = CQ("m", 9, CalendarUnit::kMonth, "Europe/Berlin");
  const Limit tb = TB("tb", 4, 2);
  std::mt19937_64 rng(20261202);
  for (int64_t boundary : {Utc(2026, 3, 9, 4, 0, 0), Utc(2026, 3, 31, 22, 0, 0)}) {
    ManualClock clock(boundary - 20 * kS);
    std::unique_ptr<Store> subject = Make(&clock);
    MemoryStore reference({.clock = &clock});
    for (int i = 0; i < 300; ++i) {
      clock.Advance(microseconds(std::uniform_int_distribution<int64_t>(0, 150'000)(rng)));
      const int64_t cost = std::uniform_int_distribution<int64_t>(0, 3)(rng);
      std::vector<LimitCheck> c = {{&daily, cost}, {&monthly, cost}};
      if (i % 3 == 0) c.push_back({&tb, 1});
      if (i % 5 == 0) c = {{&monthly, cost}};
      const std::string key = "cal-diff:" + std::to_string(boundary);  // a fresh client each run
      StatusOr<CheckResult> want = reference.CheckSync({key, c});
      StatusOr<CheckResult> got = subject->CheckSync({key, c});
      ASSERT_TRUE(want.ok() && got.ok()) << got.status().ToString();
      ASSERT_EQ(got->overall, want->overall) << "step " << i << " cost " << cost;
      // Every limit's numbers too, when allowed (a denial may come from
      // RedisStore's over-limit cache, which keeps the overall answer only).
      if (want->overall.allowed) {
        ASSERT_EQ(got->decisions, want->decisions) << "step " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, Differential, ::testing::Values("redis", "cluster"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ratelimit
