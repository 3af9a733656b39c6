#include "server/enforcer.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// The policy of `yaml` (read as if from `file`); nullptr, with a test
// failure, if it is refused.
std::shared_ptr<const policy::Policy> CompiledPolicy(const std::string& yaml, const char* file) {
  auto c = policy::ParseConfig(yaml, file);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  auto p = policy::Policy::Create(*std::move(c));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *std::move(p) : nullptr;
}

// /chat metered from the X-Usage response header (reserve 1000) on a
// 10,000-token bucket, after `prefix` (e.g. a store section); nullptr if the
// config is refused.
std::shared_ptr<const policy::Policy> MeteredChat(const std::string& prefix) {
  return CompiledPolicy(prefix + R"(
limits:
  tokens: {algorithm: token_bucket, capacity: 10000, refill_per_second: 100}
routes:
  - name: chat
    path: /chat
    limits: [tokens]
    cost: {reserve: 1000, settle_from: response_header, field: X-Usage}
)",
                        "metered.yaml");
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

// A route keyed by IP whose limit shares its name with a global limit
// checks both (each under its own key), and a settlement corrects only the
// route's: the global limit costs 1 per request whatever the usage. Charge
// once matched the route's limits by name: usage 50 took 50 of the global
// 100 per hour (Remaining 99, 49, 0), and usage 0 refunded the global's 1.
TEST(Enforcer, AKeyByIpMeteredRouteSettlesOnlyTheRoutesOwnChecks) {
  auto c = policy::ParseConfig(R"(
limits:
  tok: {algorithm: fixed_window, limit: 100, window: 1h}
global: [tok]
api_keys: {key-a: basic}
plans:
  basic: {limits: []}
routes:
  - name: chat
    path: /chat
    key_by: ip
    limits: [tok]
    cost: {reserve: 1, settle_from: response_header, field: X-Usage}
)",
                               "metered.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto p = policy::Policy::Create(*std::move(c));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::shared_ptr<const policy::Policy> policy = *std::move(p);
  ManualClock clock;
  auto store = std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock});
  Enforcer e(store, 100);
  const Limit* tok = policy->NamedLimit("tok");
  ASSERT_NE(tok, nullptr);
  auto remaining = [&](const std::string& key) {
    const LimitCheck peek[] = {{tok, 0}};
    StatusOr<CheckResult> r = store->PeekSync({.key = key, .checks = peek});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->decisions[0].remaining : -1;
  };
  // Three clients' IPs, one API key: usage 50, 50, then 0.
  const int64_t usages[] = {50, 50, 0};
  for (uint32_t i = 0; i < 3; ++i) {
    const uint32_t ip = 0x0a000001 + i;
    auto plan = policy->Resolve(
        policy::RequestView{.method = "GET",
                            .target = "/chat",
                            .peer = policy::IpAddress::FromV4(ip),
                            .header = [](std::string_view name) -> std::optional<std::string_view> {
                              if (name == "X-API-Key" || name == "x-api-key") return "key-a";
                              return std::nullopt;
                            }});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->identity.key, "k:key-a");
    Outcome out;
    e.Enforce(policy, *std::move(plan), "/chat", Face::kGateway,
              [&out](Outcome o) { out = std::move(o); });
    ASSERT_TRUE(out.allowed());
    ASSERT_EQ(out.charged.size(), 1u);
    EXPECT_EQ(out.charged[0].key, "ip:10.0.0." + std::to_string(i + 1));
    SettleCharged(e, out, usages[i], Metrics::SettleOutcome::kSettled);
    EXPECT_EQ(remaining("ip:10.0.0." + std::to_string(i + 1)), 100 - usages[i]);
    EXPECT_EQ(remaining("k:key-a"), 100 - static_cast<int64_t>(i) - 1);
  }
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

// A MemoryStore whose settlements fail (the store unreachable for them).
class SettleFailsStore final : public Store {
 public:
  explicit SettleFailsStore(const Clock* clock) : inner_(MemoryStore::Options{.clock = clock}) {}
  void Check(const CheckRequest& r, CheckCallback done) override {
    inner_.Check(r, std::move(done));
  }
  void Peek(const CheckRequest& r, CheckCallback done) override { inner_.Peek(r, std::move(done)); }
  void Reset(std::string_view key, std::span<const Limit* const> limits,
             ResetCallback done) override {
    inner_.Reset(key, limits, std::move(done));
  }
  void Settle(const SettleRequest&, CheckCallback done) override {
    ++settles;
    done(Unavailable("the store went away"));
  }
  MemoryStore inner_;
  int settles = 0;
};

// `method` `target` from 10.0.0.7 with the API key `api_key` ("": none).
Outcome EnforceAs(Enforcer& e, const std::shared_ptr<const policy::Policy>& policy,
                  std::string_view method, const std::string& target, std::string api_key) {
  auto plan = policy->Resolve(policy::RequestView{
      .method = method,
      .target = target,
      .peer = policy::IpAddress::FromV4(0x0a000007),
      .header = [api_key](std::string_view name) -> std::optional<std::string_view> {
        if (name == "X-API-Key" && !api_key.empty()) return std::string_view(api_key);
        return std::nullopt;
      }});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  Outcome out;
  if (plan.ok()) {
    e.Enforce(policy, *std::move(plan), target, Face::kGateway,
              [&out](Outcome o) { out = std::move(o); });
  }
  return out;
}

// The per-IP `login` limit (POST /login, key_by: ip) of `login` and the
// clients' global burst of capacity 1 (two API keys behind one IP), the route
// shadow when `shadow`.
std::shared_ptr<const policy::Policy> LoginBehindNat(const std::string& login, bool shadow) {
  return CompiledPolicy(R"(
limits:
  burst: {algorithm: token_bucket, capacity: 1, refill_per_second: 0.001}
plans:
  p: {limits: []}
api_keys: {key-a: p, key-b: p}
global: [burst]
routes:
  - name: login
    methods: [POST]
    path: /login
    match: exact
    key_by: ip
    shadow: )" + std::string(shadow ? "true" : "false") +
                            R"(
    limits:
      - )" + login + "\n",
                        "nat.yaml");
}

// A request denied by a later group was never forwarded, yet what the
// earlier groups took stayed taken: key-a over its own burst drained the
// per-IP login limit, and key-b behind the same IP met 429 from `login`
// (remaining 0) though one login had reached the upstream. Now the earlier
// groups' takes are given back (Store::Settle; a sliding log or a calendar
// quota, which cannot be, is asked last), shadow groups' too, and a refund
// that fails leaves the answer a denial.
TEST(Enforcer, ARequestDeniedByALaterGroupLeavesEarlierGroupsUntouched) {
  const std::string logins[] = {
      "{name: login, algorithm: fixed_window, limit: 3, window: 1h}",
      "{name: login, algorithm: sliding_window, limit: 3, window: 1h}",
      "{name: login, algorithm: sliding_log, limit: 3, window: 1h}",
      "{name: login, algorithm: token_bucket, capacity: 3, refill_per_second: 0.0001}",
      "{name: login, algorithm: leaky_bucket, depth: 3, rate_per_second: 0.0001}",
      "{name: login, algorithm: fixed_window, limit: 3, window: 1d, align: calendar, "
      "timezone: UTC}",
  };
  for (const std::string& login : logins) {
    for (bool shadow : {false, true}) {
      SCOPED_TRACE(login + (shadow ? " shadow" : ""));
      const std::shared_ptr<const policy::Policy> policy = LoginBehindNat(login, shadow);
      ASSERT_NE(policy, nullptr);
      ManualClock clock;
      auto store = std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock});
      Enforcer e(store, 100);
      EXPECT_TRUE(EnforceAs(e, policy, "POST", "/login", "key-a").allowed());
      for (int i = 0; i < 2; ++i) {
        const Outcome denied = EnforceAs(e, policy, "POST", "/login", "key-a");
        EXPECT_EQ(denied.verdict, Verdict::kOverLimit);
        EXPECT_EQ(denied.limit_name, "burst");
      }
      // One login reached the upstream: two of three are left.
      const Limit* limit = policy->config().routes[0].limits.empty()
                               ? nullptr
                               : &policy->config().routes[0].limits[0].limit;
      ASSERT_NE(limit, nullptr);
      const LimitCheck peek[] = {{limit, 0}};
      StatusOr<CheckResult> r = store->PeekSync({.key = "ip:10.0.0.7", .checks = peek});
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->decisions[0].remaining, 2);
      const Outcome b = EnforceAs(e, policy, "POST", "/login", "key-b");
      EXPECT_TRUE(b.allowed());
      if (!shadow) {
        auto l = std::find_if(b.limits.begin(), b.limits.end(),
                              [](const LimitOutcome& o) { return o.limit->name() == "login"; });
        ASSERT_NE(l, b.limits.end());
        EXPECT_EQ(l->decision.remaining, 1);
      }
    }
  }
}

// A refund the store cannot apply leaves what it was to give back taken; the
// answer is the denial all the same (not a store error).
TEST(Enforcer, ARefundThatFailsLeavesTheDenial) {
  const std::shared_ptr<const policy::Policy> policy =
      LoginBehindNat("{name: login, algorithm: fixed_window, limit: 3, window: 1h}", false);
  ASSERT_NE(policy, nullptr);
  ManualClock clock;
  auto store = std::make_shared<SettleFailsStore>(&clock);
  Enforcer e(store, 100);
  EXPECT_TRUE(EnforceAs(e, policy, "POST", "/login", "key-a").allowed());
  const Outcome denied = EnforceAs(e, policy, "POST", "/login", "key-a");
  EXPECT_EQ(denied.verdict, Verdict::kOverLimit);
  EXPECT_EQ(denied.limit_name, "burst");
  EXPECT_EQ(store->settles, 1);
}

}  // namespace
}  // namespace ratelimit::server
