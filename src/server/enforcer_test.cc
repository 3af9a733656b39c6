#include "server/enforcer.h"

#include <gtest/gtest.h>

#include <functional>

#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"
#include "server/metering.h"

namespace ratelimit::server {
namespace {

using policy::FailureMode;

// A store that cannot decide: every call fails with `status`.
class FailingStore final : public Store {
 public:
  explicit FailingStore(Status status) : status_(std::move(status)) {}
  void Check(const CheckRequest&, CheckCallback done) override { done(status_); }
  void Peek(const CheckRequest&, CheckCallback done) override { done(status_); }
  void Reset(std::string_view, std::span<const Limit* const>, ResetCallback done) override {
    done(status_);
  }

 private:
  Status status_;
};

GroupOutcome Decide(Enforcer& e, const Limit& limit, FailureMode mode, int instances = 1) {
  LimitCheck checks[] = {{&limit, 1}};
  policy::StoreConfig sc;
  sc.expected_instances = instances;
  GroupOutcome out;
  e.DecideGroup("user:ada", checks, mode, sc, [&](GroupOutcome g) { out = std::move(g); });
  return out;
}

// A GET of `target` from 127.0.0.1 with no headers, enforced as the gateway
// enforces it.
Outcome EnforceGet(Enforcer& e, const std::shared_ptr<const policy::Policy>& policy,
                   const std::string& target) {
  auto plan = policy->Resolve(policy::RequestView{
      .method = "GET",
      .target = target,
      .peer = policy::IpAddress::FromV4(0x7f000001),
      .header = [](std::string_view) -> std::optional<std::string_view> { return std::nullopt; }});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  Outcome out;
  if (plan.ok()) {
    e.Enforce(policy, *std::move(plan), target, Face::kGateway,
              [&out](Outcome o) { out = std::move(o); });
  }
  return out;
}

// /chat metered from the X-Usage response header (reserve 1000) on a
// 10,000-token bucket, after `prefix` (e.g. a store section); nullptr if the
// config is refused.
std::shared_ptr<const policy::Policy> MeteredChat(const std::string& prefix) {
  auto c = policy::ParseConfig(prefix + R"(
limits:
  tokens: {algorithm: token_bucket, capacity: 10000, refill_per_second: 100}
routes:
  - name: chat
    path: /chat
    limits: [tokens]
    cost: {reserve: 1000, settle_from: response_header, field: X-Usage}
)",
                               "metered.yaml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  auto p = policy::Policy::Create(*std::move(c));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(Enforcer, FailOpenAllowsDegraded) {
  Enforcer e(std::make_shared<FailingStore>(Unavailable("redis down")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kOpen);
  EXPECT_TRUE(g.error.ok());
  EXPECT_TRUE(g.degraded);
  EXPECT_FALSE(g.failed_closed);
  EXPECT_TRUE(g.result.overall.allowed);
}

TEST(Enforcer, FailClosedBlocksDegraded) {
  Enforcer e(std::make_shared<FailingStore>(DeadlineExceeded("late")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kClosed);
  EXPECT_TRUE(g.degraded);
  EXPECT_TRUE(g.failed_closed);
  EXPECT_FALSE(g.result.overall.allowed);
}

TEST(Enforcer, FailLocalUsesTheScaledLimit) {
  Enforcer e(std::make_shared<FailingStore>(ResourceExhausted("full")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  int allowed = 0;
  for (int i = 0; i < 10; ++i) {
    GroupOutcome g = Decide(e, l, FailureMode::kLocal, /*instances=*/4);
    EXPECT_TRUE(g.degraded);
    allowed += g.result.overall.allowed ? 1 : 0;
  }
  EXPECT_EQ(allowed, 3);  // ceil(10 / 4)
}

// The local fallback's memory is bounded by local_max_keys: once full, a new
// client is let through (degraded) without taking memory, and a client that
// already has state there keeps being limited (never evicted by the flood).
TEST(Enforcer, FailLocalIsBoundedByLocalMaxKeys) {
  Enforcer e(std::make_shared<FailingStore>(Unavailable("redis down")), /*local_max_keys=*/2);
  Limit l = *Limit::TokenBucket("burst", 2, 0.001);
  LimitCheck checks[] = {{&l, 1}};
  auto decide = [&](const std::string& key) {
    GroupOutcome out;
    e.DecideGroup(key, checks, FailureMode::kLocal, policy::StoreConfig{},
                  [&](GroupOutcome g) { out = std::move(g); });
    EXPECT_TRUE(out.degraded);
    return out.result.overall.allowed;
  };
  EXPECT_TRUE(decide("a"));
  EXPECT_TRUE(decide("a"));
  EXPECT_FALSE(decide("a"));
  EXPECT_TRUE(decide("b"));
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(decide("flood" + std::to_string(i)));
  EXPECT_EQ(e.local_store().size(), 2u);
  EXPECT_FALSE(decide("a"));
  EXPECT_TRUE(decide("b"));
  EXPECT_FALSE(decide("b"));
}

TEST(Enforcer, InvalidArgumentIsTheRequestsFault) {
  Enforcer e(std::make_shared<FailingStore>(InvalidArgument("key too long")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kOpen);
  EXPECT_FALSE(g.error.ok());
  EXPECT_EQ(g.error.message(), "key too long");
}

TEST(Enforcer, Scaled) {
  Limit tb = *Limit::TokenBucket("tb", 10, 4);
  Limit s = Enforcer::Scaled(tb, 3);
  EXPECT_EQ(s.limit(), 4);
  EXPECT_NEAR(s.refill_per_second(), 4.0 / 3, 1e-3);
  Limit fw = *Limit::FixedWindow("fw", 2, std::chrono::seconds(60));
  EXPECT_EQ(Enforcer::Scaled(fw, 5).limit(), 1);  // at least 1
  EXPECT_EQ(Enforcer::Scaled(fw, 5).window(), fw.window());
  EXPECT_EQ(Enforcer::Scaled(fw, 1), fw);
  Limit lb = *Limit::LeakyBucket("lb", 20, 6);
  Limit ls = Enforcer::Scaled(lb, 3);
  EXPECT_EQ(ls.algorithm(), Algorithm::kLeakyBucket);
  EXPECT_EQ(ls.limit(), 7);
  EXPECT_NEAR(ls.refill_per_second(), 2.0, 1e-3);
}

// A store whose checks fail (the failure mode decides) but whose
// settlements succeed, as when it is back by the time the answer has ended.
class CheckFailsStore final : public Store {
 public:
  void Check(const CheckRequest&, CheckCallback done) override { done(Unavailable("down")); }
  void Peek(const CheckRequest&, CheckCallback done) override { done(Unavailable("down")); }
  void Reset(std::string_view, std::span<const Limit* const>, ResetCallback done) override {
    done(Unavailable("down"));
  }
  void Settle(const SettleRequest&, CheckCallback done) override {
    ++settled;
    done(CheckResult{});
  }
  int settled = 0;
};

// The decision API issues no reservation for a degraded answer; the gateway
// settled one all the same: the difference applied to state that never took
// the reservation (failure mode open: nothing was taken; local: it was taken
// from this instance's fallback, not from the shared store).
TEST(Enforcer, ADegradedMeteredRequestIsNotSettled) {
  for (const char* mode : {"open", "local"}) {
    SCOPED_TRACE(mode);
    const std::shared_ptr<const policy::Policy> policy =
        MeteredChat(std::string("store: {failure_mode: ") + mode + "}\n");
    ASSERT_NE(policy, nullptr);
    auto store = std::make_shared<CheckFailsStore>();
    Enforcer e(store, 100);
    const Outcome out = EnforceGet(e, policy, "/chat");
    EXPECT_TRUE(out.allowed());
    EXPECT_TRUE(out.degraded);
    EXPECT_TRUE(out.charged.empty());
    SettleCharged(e, out, 300, Metrics::SettleOutcome::kSettled);
    EXPECT_EQ(store->settled, 0);
  }
}

// A reported cost above what one settlement can debit (kMaxSettleDelta,
// 2^31-1, no `max`) debits that much and counts as settled; the store
// refused the larger delta, the settlement counted as an error and the
// client paid only its reservation.
TEST(Enforcer, ACostAboveTheLargestSettlementDebitsTheMost) {
  const std::shared_ptr<const policy::Policy> policy = MeteredChat("");
  ASSERT_NE(policy, nullptr);
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock});
  Enforcer e(store, 100);
  const Outcome out = EnforceGet(e, policy, "/chat");
  ASSERT_TRUE(out.allowed());
  Metrics& m = Metrics::Global();
  const uint64_t settled = m.Settlements(Metrics::SettleOutcome::kSettled).value();
  const uint64_t errors = m.Settlements(Metrics::SettleOutcome::kError).value();
  const uint64_t debited = m.settled_debited.value();
  SettleCharged(e, out, int64_t{3'000'000'000}, Metrics::SettleOutcome::kSettled);
  EXPECT_EQ(m.Settlements(Metrics::SettleOutcome::kSettled).value(), settled + 1);
  EXPECT_EQ(m.Settlements(Metrics::SettleOutcome::kError).value(), errors);
  EXPECT_EQ(m.settled_debited.value(), debited + static_cast<uint64_t>(kMaxSettleDelta));
  // The bucket owes 2^31-1 - 9,000 tokens: a day's refill (8.64 million) is not enough.
  clock.Advance(std::chrono::hours(24));
  const Limit* tokens = policy->NamedLimit("tokens");
  const LimitCheck peek[] = {{tokens, 0}};
  StatusOr<CheckResult> r = store->PeekSync({.key = "ip:127.0.0.1", .checks = peek});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->decisions[0].remaining, 0);
  EXPECT_GT(r->decisions[0].reset_after, std::chrono::hours(24 * 200));
}

// The limit that speaks for a request (its name and window go into the
// headers) is the one whose numbers the combined decision carries, though
// that decision carries the longest delay of all the limits: a shaping limit
// delaying while a token bucket has less room left once gave the headers the
// first limit's name (decision API) or "default" (the gateway).
TEST(Enforcer, TheSpeakerIsTheLimitWhoseNumbersAreSentWhileAnotherDelays) {
  auto c = policy::ParseConfig(R"(
routes:
  - name: shaped
    path: /shaped
    limits:
      - {name: shape, algorithm: leaky_bucket, depth: 10, rate_per_second: 1}
      - {name: tb, algorithm: token_bucket, capacity: 3, refill_per_second: 1}
)",
                               "speaker.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::shared_ptr<const policy::Policy> policy = *policy::Policy::Create(*std::move(c));
  const Limit shape = *Limit::LeakyBucket("shape", 10, 1);
  const Limit tb = *Limit::TokenBucket("tb", 3, 1);
  const LimitCheck checks[] = {{&shape, 1}, {&tb, 1}};
  ManualClock clock;
  Enforcer e(std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock}), 100);
  auto check = [&] {
    Outcome out;
    e.Check("d:shaped", checks, *policy, "/v1/check", Face::kDecisionApi,
            [&out](Outcome o) { out = std::move(o); });
    return out;
  };
  for (auto decide : {std::function<Outcome()>(check),
                      std::function<Outcome()>([&] { return EnforceGet(e, policy, "/shaped"); })}) {
    const Outcome first = decide();
    ASSERT_TRUE(first.allowed());
    EXPECT_EQ(first.limit_name, "tb");  // 2 left of 3, the shaper 9 of 10
    const Outcome second = decide();
    ASSERT_TRUE(second.allowed());
    EXPECT_EQ(second.decision.delay, std::chrono::seconds(1));  // the shaper's turn
    EXPECT_EQ(second.decision.limit, 3);                        // the token bucket's numbers
    EXPECT_EQ(second.decision.remaining, 1);
    EXPECT_EQ(second.limit_name, "tb");  // and its name
    EXPECT_EQ(second.window, tb.window());
  }
}

// A shadow group's denial is recorded (denials API, the "denied" log line,
// the metric's label) under the limit that denied, as an enforcing group's
// is; it was the group's first limit.
TEST(Enforcer, AShadowDenialNamesTheLimitThatDenied) {
  auto c = policy::ParseConfig(R"(
routes:
  - name: api
    path: /api
    shadow: true
    limits:
      - {name: burst, algorithm: token_bucket, capacity: 100, refill_per_second: 1}
      - {name: tight, algorithm: fixed_window, limit: 1, window: 1h}
)",
                               "shadow.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::shared_ptr<const policy::Policy> policy = *policy::Policy::Create(*std::move(c));
  ManualClock clock;
  Enforcer e(std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock}), 100);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(EnforceGet(e, policy, "/api").allowed());  // shadow: never blocks
  }
  const std::vector<DenialEntry> denials = e.denials().ForClient("ip:127.0.0.1");
  ASSERT_EQ(denials.size(), 1u);
  EXPECT_EQ(denials[0].limit, "tight");
  EXPECT_TRUE(denials[0].shadow);
}

}  // namespace
}  // namespace ratelimit::server
