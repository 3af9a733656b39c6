#include "envoy/plan.h"

#include <gtest/gtest.h>

#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"

namespace ratelimit::envoy {
namespace {

using namespace std::chrono_literals;

constexpr const char* kConfig = R"(domain: d
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: /api*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/login
    rate_limit: {unit: second, requests_per_unit: 1, name: login, replaces: [{name: user}]}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 4, name: user}
    descriptors:
      - key: tier
        value: gold
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: internal
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: bucket
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 10, burst: 30}
  - key: many
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: minute, requests_per_unit: 7}
)";

class EnvoyPlan : public ::testing::Test {
 protected:
  EnvoyPlan() : store_(MemoryStore::Options{.clock = &clock_}) {
    EXPECT_TRUE(ParseDomain(kConfig, "d.yaml", config_).ok());
  }

  Response Ask(Request req) {
    auto plan = MakePlan(config_, req);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    std::optional<CheckResult> r, s;
    if (!plan->checks.empty()) {
      auto got = store_.CheckSync({plan->store_key, plan->checks});
      EXPECT_TRUE(got.ok());
      r = *got;
      // What grpc/decide.cc does for a denied request.
      if (std::vector<LimitSettle> o = Overdrafts(*plan, *r); !o.empty()) {
        EXPECT_TRUE(store_.SettleSync({.key = plan->store_key, .settlements = o}).ok());
      }
    }
    if (!plan->shadow_checks.empty()) s = *store_.CheckSync({plan->store_key, plan->shadow_checks});
    return Respond(*plan, r ? &*r : nullptr, s ? &*s : nullptr, clock_.NowMicros());
  }

  static Request One(std::vector<Entry> entries) {
    return Request{.domain = "d", .descriptors = {Descriptor{.entries = std::move(entries)}}};
  }

  ManualClock clock_{1'700'000'020'000'000};  // 40 s into a minute
  MemoryStore store_;
  Config config_;
};

TEST_F(EnvoyPlan, UnknownDomainAndNoMatchAreOkWithoutLimit) {
  Response r = Ask({.domain = "nope", .descriptors = {{.entries = {{"key2", "x"}}}}});
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_FALSE(r.statuses[0].has_limit);
  r = Ask(One({{"other", "x"}}));
  EXPECT_FALSE(r.statuses[0].has_limit);
  EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
}

// A descriptor without entries (what Envoy sends for a request_headers
// action with skip_if_absent when the header is missing) matches no rule:
// OK, no limit, as in envoyproxy/ratelimit, and the request's other
// descriptors are decided and counted. Before, the whole request was
// INVALID_ARGUMENT, which Envoy lets through: a client that left out the
// header passed every other limit (per IP, per user) as well.
TEST_F(EnvoyPlan, ADescriptorWithoutEntriesHasNoLimitAndTheOthersCount) {
  Request req{.domain = "d",
              .descriptors = {Descriptor{}, Descriptor{.entries = {{"key3", "ip"}}}}};
  for (uint32_t left : {9u, 8u}) {
    Response r = Ask(req);
    ASSERT_EQ(r.statuses.size(), 2u);
    EXPECT_EQ(r.overall, Code::kOk);
    EXPECT_EQ(r.statuses[0].code, Code::kOk);
    EXPECT_FALSE(r.statuses[0].has_limit);
    EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
    EXPECT_TRUE(r.statuses[1].has_limit);
    EXPECT_EQ(r.statuses[1].limit_remaining, left);  // key3: 10 an hour, counted
  }
  Response alone = Ask({.domain = "d", .descriptors = {Descriptor{}}});
  EXPECT_EQ(alone.overall, Code::kOk);
  EXPECT_FALSE(alone.statuses[0].has_limit);
  // With a `limit` override it is limited, on the domain's one counter of no
  // entries (envoyproxy/ratelimit's override keys on the entries it has).
  Request o{.domain = "d",
            .descriptors = {Descriptor{
                .limit = Descriptor::Override{.requests_per_unit = 1, .unit = Unit::kHour}}}};
  EXPECT_EQ(Ask(o).overall, Code::kOk);
  EXPECT_EQ(Ask(o).overall, Code::kOverLimit);
}

// A limit's name is part of its counters' keys (in Redis too): the same
// request must name the same counter in every version, or an upgrade would
// start every client's count again. "e" and 16 hex digits of a hash of the
// domain, the descriptor's entries, the rule's algorithm, period and place.
// The plan refuses what the gRPC face refuses before parsing (a library
// user calling MakePlan has no such walk): more than kMaxEntriesPerRequest
// entries across the descriptors, whatever the domain.
TEST_F(EnvoyPlan, MoreEntriesThanTheMaximumAreRefused) {
  Request req{.domain = "nope",
              .descriptors = {Descriptor{.entries = std::vector<Entry>(2048, {"k", "v"})},
                              Descriptor{.entries = std::vector<Entry>(2048, {"k", "v"})}}};
  EXPECT_TRUE(MakePlan(config_, req).ok());
  req.descriptors[1].entries.push_back({"k", "v"});
  const auto plan = MakePlan(config_, req);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "the request's descriptors have more than 4096 entries in all");
}

TEST_F(EnvoyPlan, LimitNamesStayTheSameAcrossVersions) {
  Request req = One({{"key2", "v"}});
  StatusOr<RequestPlan> plan = MakePlan(config_, req);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->limits.size(), 1u);
  EXPECT_EQ(plan->limits[0].name(), "ee1a390bace1fae3a");
}

TEST_F(EnvoyPlan, FixedMinuteWindowCountsDownThenOverLimit) {
  for (int i = 0; i < 25; ++i) {
    Response r = Ask(One({{"key2", "v"}}));
    const DescriptorStatus& s = r.statuses[0];
    EXPECT_EQ(s.requests_per_unit, 20u);
    EXPECT_EQ(s.unit, Unit::kMinute);
    EXPECT_EQ(s.duration_until_reset, 20s);  // to the minute's boundary
    if (i < 20) {
      EXPECT_EQ(r.overall, Code::kOk);
      EXPECT_EQ(s.limit_remaining, static_cast<uint32_t>(19 - i));
    } else {
      EXPECT_EQ(r.overall, Code::kOverLimit);
      EXPECT_EQ(s.limit_remaining, 0u);
    }
  }
  clock_.Advance(20s);  // the next window
  EXPECT_EQ(Ask(One({{"key2", "v"}})).statuses[0].limit_remaining, 19u);
  EXPECT_EQ(Ask(One({{"key2", "other value"}})).statuses[0].limit_remaining, 19u);
}

// `align: calendar`: a month of Berlin's calendar, not 30 days from the
// epoch; duration_until_reset is the time to local midnight on the 1st.
TEST(EnvoyCalendar, MonthlyInBerlinResetsOnTheFirst) {
  Config config;
  ASSERT_TRUE(ParseDomain(R"(domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 2, align: calendar, timezone: Europe/Berlin}
)",
                          "d.yaml", config)
                  .ok());
  ManualClock clock(int64_t{1'774'990'800} * 1'000'000);  // 2026-03-31 21:00 UTC, 23:00 CEST
  MemoryStore store(MemoryStore::Options{.clock = &clock});
  auto ask = [&] {
    auto plan = MakePlan(
        config, Request{.domain = "d", .descriptors = {{.entries = {{"tenant", "acme"}}}}});
    EXPECT_TRUE(plan.ok());
    CheckResult r = *store.CheckSync({plan->store_key, plan->checks});
    return Respond(*plan, &r, nullptr, clock.NowMicros());
  };
  Response r = ask();
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].unit, Unit::kMonth);
  EXPECT_EQ(r.statuses[0].duration_until_reset, 1h);
  EXPECT_EQ(ask().overall, Code::kOk);
  EXPECT_EQ(ask().overall, Code::kOverLimit);
  clock.Advance(1h);  // April 1st, 00:00 CEST
  r = ask();
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 1u);
  EXPECT_EQ(r.statuses[0].duration_until_reset, 30 * 24h);
}

TEST_F(EnvoyPlan, TwoDescriptorsAllOrNothing) {
  Request req{.domain = "d",
              .descriptors = {{.entries = {{"key2", "v"}}}, {.entries = {{"key3", "v"}}}}};
  for (int i = 0; i < 15; ++i) {
    Response r = Ask(req);
    if (i < 10) {
      EXPECT_EQ(r.overall, Code::kOk) << i;
      EXPECT_EQ(r.statuses[0].limit_remaining, static_cast<uint32_t>(19 - i));
      EXPECT_EQ(r.statuses[1].limit_remaining, static_cast<uint32_t>(9 - i));
    } else {
      EXPECT_EQ(r.overall, Code::kOverLimit) << i;
      EXPECT_EQ(r.statuses[0].code, Code::kOk);
      EXPECT_EQ(r.statuses[1].code, Code::kOverLimit);
      EXPECT_EQ(r.statuses[1].limit_remaining, 0u);
      // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: key2 keeps its 10.
      EXPECT_EQ(r.statuses[0].limit_remaining, 10u) << i;
    }
  }
}

TEST_F(EnvoyPlan, MostSpecificMatchWins) {
  EXPECT_EQ(Ask(One({{"path", "/api/login"}})).statuses[0].requests_per_unit, 1u);
  EXPECT_EQ(Ask(One({{"path", "/api/x"}})).statuses[0].requests_per_unit, 2u);
  EXPECT_EQ(Ask(One({{"path", "/home"}})).statuses[0].requests_per_unit, 3u);
  // Nested: the rule at the last entry applies; deeper requests match nothing.
  EXPECT_EQ(Ask(One({{"user", "ada"}, {"tier", "gold"}})).statuses[0].requests_per_unit, 100u);
  EXPECT_FALSE(Ask(One({{"user", "ada"}, {"tier", "free"}})).statuses[0].has_limit);
  EXPECT_FALSE(Ask(One({{"key2", "v"}, {"x", "y"}})).statuses[0].has_limit);
}

TEST_F(EnvoyPlan, ReplacesUnlimitedShadow) {
  Request req{.domain = "d",
              .descriptors = {{.entries = {{"path", "/api/login"}}}, {.entries = {{"user", "a"}}}}};
  Response r = Ask(req);
  EXPECT_TRUE(r.statuses[0].has_limit);
  EXPECT_FALSE(r.statuses[1].has_limit);  // replaced by `login`
  r = Ask(One({{"internal", "x"}}));
  EXPECT_EQ(r.statuses[0].limit_remaining, 4294967295u);
  EXPECT_FALSE(r.statuses[0].has_limit);
  Ask(One({{"shadow", "x"}}));
  r = Ask(One({{"shadow", "x"}}));
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
}

TEST_F(EnvoyPlan, HitsAddendAndOverride) {
  Request req = One({{"key3", "h"}});
  req.hits_addend = 4;
  EXPECT_EQ(Ask(req).statuses[0].limit_remaining, 6u);
  req.descriptors[0].hits_addend = 0;  // checks without counting
  EXPECT_EQ(Ask(req).statuses[0].limit_remaining, 6u);
  req.descriptors[0].hits_addend = 11;  // above the limit: over, and the rest is spent
  EXPECT_EQ(Ask(req).overall, Code::kOverLimit);
  req.descriptors[0].hits_addend = 1;
  EXPECT_EQ(Ask(req).overall, Code::kOverLimit);
  EXPECT_EQ(Ask(req).statuses[0].limit_remaining, 0u);

  Request o = One({{"anything", "x"}});
  o.descriptors[0].limit = Descriptor::Override{.requests_per_unit = 3, .unit = Unit::kDay};
  Response r = Ask(o);
  EXPECT_EQ(r.statuses[0].requests_per_unit, 3u);
  EXPECT_EQ(r.statuses[0].unit, Unit::kDay);
  EXPECT_EQ(r.statuses[0].limit_remaining, 2u);
}

// Envoy's apply_on_stream_done (issue 21): the request is checked with
// hits_addend 0 (nothing counted), and when the stream is done a second
// ShouldRateLimit carries the actual cost as hits_addend, taken whole when
// it fits. One that does not fit is OVER_LIMIT and is charged all the same
// (envoyproxy/ratelimit's counters count every hit): the window is spent,
// so the next check before a stream is OVER_LIMIT. Before, it took nothing
// and the budget was never enforced.
TEST_F(EnvoyPlan, StreamDoneHitsAddendCountsTheActualCost) {
  Request before = One({{"key3", "llm"}});  // 10 an hour
  before.hits_addend = 0;
  before.descriptors[0].hits_addend = 0;
  EXPECT_EQ(Ask(before).statuses[0].limit_remaining, 10u);
  Request done = One({{"key3", "llm"}});
  done.hits_addend = 7;  // the response's usage
  EXPECT_EQ(Ask(done).statuses[0].limit_remaining, 3u);
  EXPECT_EQ(Ask(before).statuses[0].limit_remaining, 3u);
  EXPECT_EQ(Ask(before).overall, Code::kOk);
  done.hits_addend = 4;  // more than is left: over, and charged
  EXPECT_EQ(Ask(done).overall, Code::kOverLimit);
  Response next = Ask(before);
  EXPECT_EQ(next.overall, Code::kOverLimit);
  EXPECT_EQ(next.statuses[0].limit_remaining, 0u);
  EXPECT_EQ(Ask(done).overall, Code::kOverLimit);  // nothing left to charge
  // The next window starts afresh.
  clock_.Advance(1h);
  EXPECT_EQ(Ask(before).overall, Code::kOk);
  EXPECT_EQ(Ask(before).statuses[0].limit_remaining, 10u);
  // A cost above the whole limit is charged too (a request checked before
  // it has nothing left), and one beside another descriptor that was not
  // over takes nothing from that one.
  Request both = One({{"key3", "llm"}});
  both.descriptors.push_back(Descriptor{.entries = {{"key2", "b"}}});
  both.hits_addend = 15;
  Response r = Ask(both);
  EXPECT_EQ(r.statuses[0].code, Code::kOverLimit);
  EXPECT_EQ(r.statuses[1].code, Code::kOk);
  EXPECT_EQ(Ask(before).overall, Code::kOverLimit);
  EXPECT_EQ(Ask(One({{"key2", "b"}})).statuses[0].limit_remaining, 19u);
}

// envoyproxy/ratelimit's README, example 3 (and examples/ratelimit's
// `banned`): requests_per_unit 0 blocks. Its Redis counter is incremented by
// every hit and compared with 0, so a counted request is OVER_LIMIT with
// limit_remaining 0 and the time to the window's end, and so is one asked
// with hits_addend 0 (nothing is left).
TEST(EnvoyPlanBlock, ARequestsPerUnitOfZeroBlocks) {
  constexpr const char* kExample3 = R"(domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 4294967295}
)";
  Config config;
  ASSERT_TRUE(ParseDomain(kExample3, "example3.yaml", config).ok());
  ManualClock clock{1'700'000'020'250'000};  // 250 ms into a second
  MemoryStore store(MemoryStore::Options{.clock = &clock});
  auto ask = [&](std::vector<Descriptor> descriptors, uint32_t hits = 0) {
    auto plan = MakePlan(config, Request{.domain = "edge_proxy_per_ip",
                                         .descriptors = std::move(descriptors),
                                         .hits_addend = hits});
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    auto got = store.CheckSync({plan->store_key, plan->checks});
    EXPECT_TRUE(got.ok()) << got.status().message();
    return Respond(*plan, &*got, nullptr, clock.NowMicros());
  };
  const Descriptor banned{.entries = {{"remote_address", "50.0.0.5"}}};
  const Descriptor other{.entries = {{"remote_address", "50.0.0.1"}}};
  for (int i = 0; i < 3; ++i) {
    Response r = ask({banned});
    EXPECT_EQ(r.overall, Code::kOverLimit);
    ASSERT_TRUE(r.statuses[0].has_limit);
    EXPECT_EQ(r.statuses[0].requests_per_unit, 0u);
    EXPECT_EQ(r.statuses[0].unit, Unit::kSecond);
    EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
    EXPECT_EQ(r.statuses[0].duration_until_reset, 750ms);
  }
  Response r = ask({other});
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 9u);
  // With another descriptor: over, and the other takes nothing (all or nothing).
  r = ask({other, banned});
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[1].code, Code::kOverLimit);
  EXPECT_EQ(ask({other}).statuses[0].limit_remaining, 8u);
  // hits_addend 0 on the descriptor (a check before a stream): nothing is
  // left, so over too.
  Descriptor peek = banned;
  peek.hits_addend = 0;
  r = ask({peek});
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].limit_remaining, 0u);

  // A uint32 limit above the store's largest count: loaded, and reported as is.
  r = ask({Descriptor{.entries = {{"big", "x"}}}}, 5);
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].requests_per_unit, 4294967295u);
  EXPECT_EQ(r.statuses[0].limit_remaining, 4294967290u);
}

// Two identical descriptors in one request (two of a route's rate_limits
// actions that produce the same entries): envoyproxy/ratelimit checks each
// against the one counter, an INCRBY each in request order, so both hits
// count and each descriptor reports the count after its own hit. The store
// takes a counter once per request: the plan asks it once for both costs,
// and Respond tells each descriptor its part. Before, the store refused the
// request ("appears twice in one request": gRPC INVALID_ARGUMENT, which
// Envoy lets through by default).
TEST_F(EnvoyPlan, IdenticalDescriptorsCountEachHitOnTheirOneCounter) {
  const Descriptor dup{.entries = {{"key3", "dup"}}};  // 10 an hour
  const Request pair{.domain = "d", .descriptors = {dup, dup}};
  StatusOr<RequestPlan> plan = MakePlan(config_, pair);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(store_.PeekSync({plan->store_key, plan->checks}).ok());  // the store takes it

  Response r = Ask(pair);
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 9u);
  EXPECT_EQ(r.statuses[1].limit_remaining, 8u);
  Ask(pair);
  Ask(pair);  // 6 counted
  EXPECT_EQ(Ask(One({{"key3", "dup"}})).statuses[0].limit_remaining, 3u);
  r = Ask(pair);
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 2u);
  EXPECT_EQ(r.statuses[1].limit_remaining, 1u);
  // One left: the first hit fits (OK, 0 left), the second is over; both
  // count, so the window is spent.
  r = Ask(pair);
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
  EXPECT_EQ(r.statuses[1].code, Code::kOverLimit);
  EXPECT_EQ(r.statuses[1].limit_remaining, 0u);
  EXPECT_EQ(Ask(One({{"key3", "dup"}})).overall, Code::kOverLimit);

  // Beside a descriptor that is over: all or nothing, the pair takes nothing
  // and each reports the count as it stands.
  Ask(One({{"path", "/api/login"}}));  // 1 a second: spent
  const Descriptor other{.entries = {{"key3", "other"}}};
  r = Ask(Request{.domain = "d",
                  .descriptors = {other, Descriptor{.entries = {{"path", "/api/login"}}}, other}});
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 10u);
  EXPECT_EQ(r.statuses[2].code, Code::kOk);
  EXPECT_EQ(r.statuses[2].limit_remaining, 10u);
  EXPECT_EQ(Ask(One({{"key3", "other"}})).statuses[0].limit_remaining, 9u);

  // Costs above the limit together (6 + 6 of 10): the first fits, the
  // second is over, and both are charged.
  Request big{.domain = "d",
              .descriptors = {Descriptor{.entries = {{"key3", "big"}}},
                              Descriptor{.entries = {{"key3", "big"}}}}};
  big.hits_addend = 6;
  r = Ask(big);
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[0].limit_remaining, 4u);
  EXPECT_EQ(r.statuses[1].code, Code::kOverLimit);
  EXPECT_EQ(Ask(One({{"key3", "big"}})).overall, Code::kOverLimit);

  // Shadow mode (1 a second): counted together, never over.
  const Descriptor shadow{.entries = {{"shadow", "dup"}}};
  r = Ask(Request{.domain = "d", .descriptors = {shadow, shadow}});
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[1].code, Code::kOk);
  EXPECT_EQ(r.statuses[1].limit_remaining, 0u);

  // A `limit` override on the same entries and unit as a configured rule
  // names the same counter (as in envoyproxy/ratelimit); with another
  // number it cannot share one store check, and is refused.
  Request mixed = One({{"key2", "m"}});
  mixed.descriptors.push_back(
      Descriptor{.entries = {{"key2", "m"}},
                 .limit = Descriptor::Override{.requests_per_unit = 5, .unit = Unit::kMinute}});
  StatusOr<RequestPlan> refused = MakePlan(config_, mixed);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  mixed.descriptors[1].limit->requests_per_unit = 20;  // the configured number: one check
  r = Ask(mixed);
  EXPECT_EQ(r.statuses[0].limit_remaining, 19u);
  EXPECT_EQ(r.statuses[1].limit_remaining, 18u);
}

// A request's `limit` override of requests_per_unit 0 blocks, as the same
// number in the config does (envoyproxy/ratelimit builds the override's
// rule as it builds a configured one, and compares the counter with 0).
// Before, it was refused as INVALID_ARGUMENT.
TEST_F(EnvoyPlan, AnOverrideOfZeroBlocks) {
  Request o = One({{"anything", "blocked"}});
  o.descriptors[0].limit = Descriptor::Override{.requests_per_unit = 0, .unit = Unit::kMinute};
  StatusOr<RequestPlan> plan = MakePlan(config_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  for (int i = 0; i < 3; ++i) {
    Response r = Ask(o);
    EXPECT_EQ(r.overall, Code::kOverLimit);
    ASSERT_TRUE(r.statuses[0].has_limit);
    EXPECT_EQ(r.statuses[0].requests_per_unit, 0u);
    EXPECT_EQ(r.statuses[0].unit, Unit::kMinute);
    EXPECT_EQ(r.statuses[0].limit_remaining, 0u);
    EXPECT_EQ(r.statuses[0].duration_until_reset, 20s);  // to the minute's boundary
  }
  o.descriptors[0].hits_addend = 0;  // a check before a stream: nothing is left
  EXPECT_EQ(Ask(o).overall, Code::kOverLimit);
  // A unit is still needed.
  o.descriptors[0].limit->unit = Unit::kUnknown;
  EXPECT_EQ(MakePlan(config_, o).status().code(), StatusCode::kInvalidArgument);
}

// A bucket's denial says how long to wait (duration_until_reset, and so the
// headers' Retry-After), also when the plan denied what the store allowed:
// a cost above the burst (asked without counting) never fits, and the
// bucket's time to full bounds the wait of a shared counter's later
// descriptor. Before, both said 0.
TEST_F(EnvoyPlan, ABucketsDenialByThePlanSaysHowLongToWait) {
  Request big = One({{"bucket", "b1"}});
  big.descriptors[0].hits_addend = 31;  // above the burst of 30
  Response r = Ask(big);
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_GE(r.statuses[0].duration_until_reset, 1s);
  Request pair = One({{"bucket", "b2"}});
  pair.descriptors[0].hits_addend = 20;
  pair.descriptors.push_back(pair.descriptors[0]);  // 20 + 20 of 30
  r = Ask(pair);
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].code, Code::kOk);
  EXPECT_EQ(r.statuses[1].code, Code::kOverLimit);
  EXPECT_GT(r.statuses[1].duration_until_reset, 0s);
  EXPECT_LE(r.statuses[1].duration_until_reset, 3s);  // the bucket full again
}

// response_headers_to_add's numbers (grpc_face.cc): a limit of 0 reports 0
// with nothing left, denied, as envoyproxy/ratelimit's headers report
// current_limit; the store's own limit there is a stand-in of 1, and it
// allowed the check (asked without counting).
TEST_F(EnvoyPlan, HeadersOfAZeroLimitReportZero) {
  Request o = One({{"anything", "blocked"}});
  o.descriptors[0].limit = Descriptor::Override{.requests_per_unit = 0, .unit = Unit::kMinute};
  o.descriptors.push_back(Descriptor{.entries = {{"key2", "h"}}});
  StatusOr<RequestPlan> plan = MakePlan(config_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const CheckResult got = *store_.CheckSync({plan->store_key, plan->checks});
  ASSERT_TRUE(got.overall.allowed);
  const Response r = Respond(*plan, &got, nullptr, clock_.NowMicros());
  ASSERT_EQ(r.overall, Code::kOverLimit);
  HeaderSource h = HeaderSourceOf(*plan, got, r);
  ASSERT_NE(h.limit, nullptr);
  EXPECT_FALSE(h.decision.allowed);
  EXPECT_EQ(h.decision.limit, 0);
  EXPECT_EQ(h.decision.remaining, 0);
  EXPECT_EQ(h.decision.reset_after, 20s);  // to the minute's boundary
  EXPECT_EQ(h.decision.retry_after, 20s);

  // Without it: key2's own numbers (20, 19 left).
  o.descriptors.erase(o.descriptors.begin());
  plan = MakePlan(config_, o);
  ASSERT_TRUE(plan.ok());
  const CheckResult ok = *store_.CheckSync({plan->store_key, plan->checks});
  h = HeaderSourceOf(*plan, ok, Respond(*plan, &ok, nullptr, clock_.NowMicros()));
  ASSERT_NE(h.limit, nullptr);
  EXPECT_TRUE(h.decision.allowed);
  EXPECT_EQ(h.decision.limit, 20);
  EXPECT_EQ(h.decision.remaining, 19);
}

TEST_F(EnvoyPlan, SeveralLimitsOnOneDescriptor) {
  for (int i = 0; i < 5; ++i) Ask(One({{"many", "m"}}));
  Response r = Ask(One({{"many", "m"}}));
  EXPECT_EQ(r.overall, Code::kOverLimit);
  EXPECT_EQ(r.statuses[0].unit, Unit::kSecond);
  clock_.Advance(1s);
  r = Ask(One({{"many", "m"}}));
  EXPECT_EQ(r.overall, Code::kOk);
  EXPECT_EQ(r.statuses[0].unit, Unit::kMinute);  // the closest to its limit
  EXPECT_EQ(r.statuses[0].limit_remaining, 1u);
}

TEST_F(EnvoyPlan, BadRequests) {
  EXPECT_FALSE(MakePlan(config_, Request{.domain = "", .descriptors = {{}}}).ok());
  EXPECT_FALSE(MakePlan(config_, Request{.domain = "d"}).ok());
}

}  // namespace
}  // namespace ratelimit::envoy
