// Overrides with a manual clock: precedence (override > plan > route), expiry
// at its time, the state a changed limit keeps, decision-API keys, the
// stored record (the fields given, and an earlier version's full ones), and
// what a reload does to them (resolved again; what no longer applies says so).
#include "server/overrides.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ratelimit/memory_store.h"
#include "server/decision_api.h"
#include "server/enforcer.h"
#include "server/metering.h"

namespace ratelimit::server {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view kConfig = R"(
limits:
  burst: {algorithm: token_bucket, capacity: 10, refill_per_second: 0.001}
  daily: {algorithm: fixed_window, limit: 100, window: 1d}
  daily_pro: {algorithm: fixed_window, limit: 1000, window: 1d}
  search: {algorithm: sliding_window, limit: 5, window: 1m}
plans:
  free: {limits: [daily]}
  pro: {limits: [daily_pro]}
default_plan: free
api_keys: {"key-a": free, "key-b": free}
routes:
  - {name: search, path: /search, limits: [burst, search]}
)";

policy::RequestPlan Resolve(const policy::Policy& p, std::string_view api_key,
                            std::string_view target = "/search") {
  policy::RequestView view{
      .method = "GET",
      .target = target,
      .peer = policy::IpAddress::FromV4(0x7f000001),
      .header = [api_key](std::string_view name) -> std::optional<std::string_view> {
        if (name == "X-API-Key") return api_key;
        return std::nullopt;
      }};
  auto plan = p.Resolve(view);
  if (!plan.ok()) throw std::runtime_error(plan.status().ToString());
  return *std::move(plan);
}

// name -> "algorithm(count)" of every check of the client's own key.
std::map<std::string, int64_t> Limits(const policy::RequestPlan& plan) {
  std::map<std::string, int64_t> out;
  for (const policy::CheckGroup& g : plan.groups) {
    for (const LimitCheck& c : g.checks) out[c.limit->name()] = c.limit->limit();
  }
  return out;
}

std::shared_ptr<const policy::Policy> MakePolicy(std::string_view yaml) {
  auto c = policy::ParseConfig(yaml, "overrides_test.yaml");
  if (!c.ok()) throw std::runtime_error(c.status().ToString());
  auto p = policy::Policy::Create(*std::move(c));
  if (!p.ok()) throw std::runtime_error(p.status().ToString());
  return *std::move(p);
}

// An override that gives every field of `limits` (as records of earlier
// versions did).
ClientOverride Override(std::string client, std::optional<std::string> plan,
                        const std::vector<Limit>& limits, int64_t expires_ms = 0) {
  ClientOverride o;
  o.client = std::move(client);
  o.plan = std::move(plan);
  for (const Limit& l : limits) o.given.push_back(EveryField(l));
  o.expires_unix_ms = expires_ms;
  o.reason = "test";
  o.by = "overrides_test";
  return o;
}

// One that gives `fields` (a JSON object) of the limit `name`.
ClientOverride Given(std::string client, std::string name, std::string fields) {
  ClientOverride o = Override(std::move(client), std::nullopt, {});
  o.given.push_back({std::move(name), std::move(fields)});
  return o;
}

ClientOverride Resolved(ClientOverride o, const policy::Policy& p) {
  ResolveOverride(o, p);
  return o;
}

TEST(Overrides, PrecedenceIsOverrideThenPlanThenRoute) {
  auto p = MakePolicy(kConfig);
  const std::map<std::string, int64_t> plain = {{"burst", 10}, {"search", 5}, {"daily", 100}};
  EXPECT_EQ(Limits(Resolve(*p, "key-a")), plain);

  // The plan an override names replaces the API key's plan; the route's limits stay.
  policy::RequestPlan moved = Resolve(*p, "key-a");
  ApplyOverride(Resolved(Override("k:key-a", "pro", {}), *p), *p, moved);
  EXPECT_EQ(moved.identity.plan, "pro");
  EXPECT_EQ(Limits(moved),
            (std::map<std::string, int64_t>{{"burst", 10}, {"search", 5}, {"daily_pro", 1000}}));

  // Its limits replace those of the plan (daily_pro) and of the route (burst).
  policy::RequestPlan both = Resolve(*p, "key-a");
  ClientOverride o = Resolved(
      Override("k:key-a", "pro",
               {*Limit::FixedWindow("daily_pro", 5, 24h), *Limit::TokenBucket("burst", 3, 0.001)}),
      *p);
  ApplyOverride(o, *p, both);
  EXPECT_EQ(Limits(both),
            (std::map<std::string, int64_t>{{"burst", 3}, {"search", 5}, {"daily_pro", 5}}));

  // A limit of another algorithm under that name is not replaced (its state
  // would not mean the same), nor is a plan the config does not have taken.
  policy::RequestPlan other = Resolve(*p, "key-a");
  ClientOverride neither =
      Resolved(Override("k:key-a", "gold", {*Limit::SlidingLog("burst", 3, 1s)}), *p);
  ApplyOverride(neither, *p, other);
  EXPECT_EQ(other.identity.plan, "free");
  EXPECT_EQ(Limits(other), plain);
  EXPECT_EQ(neither.not_applied.size(), 2u);
}

TEST(Overrides, TheTableFindsClientsAndDecisionKeysUntilTheyExpire) {
  OverrideTable t(7, {Override("k:key-a", "pro", {}, /*expires_ms=*/2000),
                      Override("d:job-7", std::nullopt, {*Limit::TokenBucket("burst", 1, 1)})});
  EXPECT_EQ(t.version(), 7);
  EXPECT_EQ(t.size(), 2u);
  ASSERT_NE(t.Find("k:key-a", 1999), nullptr);
  EXPECT_EQ(t.Find("k:key-a", 2000), nullptr);  // expired at its time
  EXPECT_EQ(t.Find("k:key-b", 0), nullptr);
  EXPECT_NE(t.FindDecisionKey("job-7", 1'000'000'000'000), nullptr);  // never expires
  EXPECT_NE(t.Find("d:job-7", 0), nullptr);
  EXPECT_EQ(t.FindDecisionKey("k:key-a", 0), nullptr);
}

TEST(Overrides, TheRecordRoundTrips) {
  ClientOverride o =
      Override("k:key-a", "pro",
               {*Limit::TokenBucket("burst", 50, 10), *Limit::SlidingLog("login", 5, 15min),
                *Limit::LeakyBucket("shape", 4, 2)},
               1234);
  o.given.push_back({"search", R"({"limit":7})"});
  o.set_unix_ms = 1000;
  StatusOr<ClientOverride> back = FromRecord(o.client, ToRecord(o));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->plan, o.plan);
  std::map<std::string, nlohmann::json> given, back_given;  // the same fields, in any order
  for (const GivenLimit& g : o.given) given[g.name] = nlohmann::json::parse(g.fields);
  for (const GivenLimit& g : back->given) back_given[g.name] = nlohmann::json::parse(g.fields);
  EXPECT_EQ(back_given, given);
  EXPECT_EQ(back->expires_unix_ms, 1234);
  EXPECT_EQ(back->set_unix_ms, 1000);
  EXPECT_EQ(back->reason, "test");
  EXPECT_EQ(back->by, "overrides_test");
  EXPECT_FALSE(FromRecord("k:x", "[1]").ok());
  EXPECT_FALSE(FromRecord("k:x", R"({"limits": {"b": 5}})").ok());
  EXPECT_FALSE(FromRecord("k:x", R"({"colour": "red"})").ok());
  // Fields that make no limit are read, and do not apply (the config says why).
  StatusOr<ClientOverride> odd =
      FromRecord("d:x", R"({"limits": {"b": {"algorithm": "token_bucket"}}})");
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  ResolveOverride(*odd, *MakePolicy(kConfig));
  EXPECT_TRUE(odd->limits.empty());
  ASSERT_EQ(odd->not_applied.size(), 1u);
  EXPECT_EQ(odd->not_applied[0], "limits.b: field 'capacity' is required for token_bucket");
}

// The record keeps everything that defines a limit: a calendar quota's
// alignment and time zone (written as a 30-day epoch window, the override
// moved the client to a new window with a new state key: its month's usage
// was forgotten), a block period and token prefetch (docs/admin.md: the
// limit keeps its algorithm and the client's state carries over). Found in
// review (OverridesReview.TheRecordKeepsCalendarAndBlockFor).
TEST(Overrides, TheRecordKeepsACalendarQuotaBlockForAndPrefetch) {
  Limit monthly = *Limit::CalendarQuota("monthly", 5, CalendarUnit::kMonth, "Europe/Paris");
  Limit login = *Limit::FixedWindow("login", 3, std::chrono::minutes(1))
                     ->WithBlockFor(std::chrono::minutes(10));
  Limit burst = *Limit::TokenBucket("burst", 100, 10)->WithPrefetch(20);
  // (A decision-API key's: monthly and login are limits of its requests, not the config's.)
  ClientOverride o = Override("d:key-a", std::nullopt, {monthly, login, burst});
  StatusOr<ClientOverride> back = FromRecord(o.client, ToRecord(o));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ResolveOverride(*back, *MakePolicy(kConfig));
  ASSERT_EQ(back->limits.size(), 3u);
  const Limit* m = back->Replacing(monthly);
  const Limit* l = back->Replacing(login);
  const Limit* b = back->Replacing(burst);
  ASSERT_TRUE(m != nullptr && l != nullptr && b != nullptr) << ToRecord(o);
  ASSERT_NE(m->calendar(), nullptr) << ToRecord(o);
  EXPECT_EQ(m->calendar()->zone().name(), "Europe/Paris");
  EXPECT_EQ(l->block_for(), std::chrono::minutes(10)) << ToRecord(o);
  EXPECT_EQ(b->prefetch(), 20) << ToRecord(o);
  EXPECT_TRUE(*m == monthly && *l == login && *b == burst) << ToRecord(o);
}

// The daemon's wiring in small: a memory store and the overrides on one manual clock.
struct Rig {
  ManualClock clock;
  std::shared_ptr<MemoryStore> store =
      std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock});
  Enforcer enforcer{store, 100};
  Overrides overrides{MakeMemoryOverrideStore(), clock};
  std::shared_ptr<const policy::Policy> policy = MakePolicy(kConfig);

  Rig() {
    enforcer.SetOverrides(&overrides);
    overrides.SetPolicy(policy);
  }
  // A reload, as the daemon makes it.
  void Reload(std::string_view yaml) {
    policy = MakePolicy(yaml);
    overrides.SetPolicy(policy);
  }

  // One request of key-a on /search: the outcome's limits by name -> remaining.
  std::map<std::string, int64_t> Remaining(std::string_view key = "key-a",
                                           bool* allowed = nullptr) {
    Outcome out;
    enforcer.Enforce(policy, Resolve(*policy, key), "/search", Face::kGateway,
                     [&out](Outcome o) { out = std::move(o); });
    if (allowed) *allowed = out.allowed();
    std::map<std::string, int64_t> r;
    for (const LimitOutcome& l : out.limits) r[l.limit->name()] = l.decision.remaining;
    return r;
  }
  void Put(ClientOverride o) {
    StatusOr<Overrides::Stored> v = Internal("no answer");
    overrides.Put(std::move(o), [&v](StatusOr<Overrides::Stored> r) { v = r; });
    ASSERT_TRUE(v.ok()) << v.status().ToString();
  }
};

TEST(Overrides, AnExpiredOverrideStopsApplyingAtItsTime) {
  Rig rig;
  const int64_t now_ms = rig.clock.NowMicros() / 1000;
  rig.Put(
      Override("k:key-a", std::nullopt, {*Limit::TokenBucket("burst", 2, 0.001)}, now_ms + 60'000));
  EXPECT_FALSE(rig.overrides.empty());
  bool allowed = false;
  EXPECT_EQ(rig.Remaining("key-a", &allowed)["burst"], 1);
  EXPECT_EQ(rig.Remaining("key-a", &allowed)["burst"], 0);
  rig.Remaining("key-a", &allowed);
  EXPECT_FALSE(allowed);                          // capacity 2
  EXPECT_EQ(rig.Remaining("key-b")["burst"], 9);  // another client: the route's 10
  rig.clock.Advance(59'999ms);
  rig.Remaining("key-a", &allowed);
  EXPECT_FALSE(allowed);  // still in effect a millisecond before its time
  rig.clock.Advance(1ms);
  // The route's limit again, on the same state: 2 used, 1 more now.
  EXPECT_EQ(rig.Remaining("key-a", &allowed)["burst"], 7);
  EXPECT_TRUE(allowed);

  const uint64_t expired_before = Metrics::Global().overrides_expire.value();
  rig.overrides.RemoveExpired();
  EXPECT_EQ(Metrics::Global().overrides_expire.value(), expired_before + 1);
  EXPECT_TRUE(rig.overrides.empty());
  EXPECT_EQ(Metrics::Global().overrides_in_effect.value(), 0);
  rig.overrides.RemoveExpired();  // nothing left: nothing counted twice
  EXPECT_EQ(Metrics::Global().overrides_expire.value(), expired_before + 1);
}

TEST(Overrides, AChangedLimitKeepsTheClientsState) {
  Rig rig;
  for (int i = 0; i < 4; ++i) rig.Remaining();  // 4 of burst, search and daily used
  // Token bucket: the used tokens stay (the state is the time the bucket is full again).
  rig.Put(Override("k:key-a", std::nullopt,
                   {*Limit::TokenBucket("burst", 50, 0.001), *Limit::FixedWindow("daily", 40, 24h),
                    *Limit::SlidingWindow("search", 8, 1min)}));
  std::map<std::string, int64_t> r = rig.Remaining();  // the 5th request
  EXPECT_EQ(r["burst"], 45);
  EXPECT_EQ(r["daily"], 35);  // a window keeps its count under a new limit
  EXPECT_EQ(r["search"], 3);
  // Lowered below what is used: nothing left, until it refills.
  rig.Put(Override("k:key-a", std::nullopt, {*Limit::TokenBucket("burst", 5, 0.001)}));
  bool allowed = true;
  rig.Remaining("key-a", &allowed);
  EXPECT_FALSE(allowed);
  // Deleted: the configured limits on the same state.
  StatusOr<Overrides::Stored> removed = Internal("no answer");
  rig.overrides.Remove("k:key-a", "test",
                       [&removed](StatusOr<Overrides::Stored> r) { removed = r; });
  ASSERT_TRUE(removed.ok() && removed->changed);
  // (Denied by search, 5 a minute again, 5 used: all or nothing, so the
  // others show their state as it stands.)
  r = rig.Remaining("key-a", &allowed);
  EXPECT_FALSE(allowed);
  EXPECT_EQ(r["search"], 0);
  EXPECT_EQ(r["burst"], 5);  // 5 used of 10
  EXPECT_EQ(r["daily"], 95);
}

TEST(Overrides, ADecisionApiKeysOverride) {
  Rig rig;
  rig.Put(Override("d:job-7", std::nullopt, {*Limit::TokenBucket("burst", 1, 0.001)}));
  const Limit configured = *Limit::TokenBucket("burst", 10, 0.001);
  const LimitCheck checks[] = {{&configured, 1}};
  auto check = [&](std::string_view key) {
    Outcome out;
    const std::string store_key = DecisionApiClient(key);  // where the decision API keeps it
    rig.enforcer.Check(store_key, checks, *rig.policy, "/v1/check", Face::kDecisionApi,
                       [&out](Outcome o) { out = std::move(o); });
    return out;
  };
  Outcome first = check("job-7");
  EXPECT_TRUE(first.allowed());
  EXPECT_EQ(first.decision.limit, 1);
  EXPECT_NE(first.overrides, nullptr);  // keeps the override's limit alive
  EXPECT_FALSE(check("job-7").allowed());
  Outcome other = check("job-8");
  EXPECT_TRUE(other.allowed());
  EXPECT_EQ(other.decision.limit, 10);
  EXPECT_EQ(other.overrides, nullptr);
}

// A cost that fits the caller's limit but not the capacity an override
// lowered it to is a denial (429), as on the gateway, and takes nothing;
// a cost above the caller's own limit stays a bad request.
TEST(Overrides, ADecisionApiCostAboveAnOverriddenCapacityIsDenied) {
  Rig rig;
  rig.Put(Override("d:job-7", std::nullopt, {*Limit::TokenBucket("burst", 3, 0.001)}));
  const Limit configured = *Limit::TokenBucket("burst", 10, 0.001);
  auto check = [&](std::string_view key, int64_t cost) {
    const LimitCheck checks[] = {{&configured, cost}};
    Outcome out;
    const std::string store_key = DecisionApiClient(key);
    rig.enforcer.Check(store_key, checks, *rig.policy, "/v1/check", Face::kDecisionApi,
                       [&out](Outcome o) { out = std::move(o); });
    return out;
  };
  Outcome denied = check("job-7", 5);
  EXPECT_EQ(denied.verdict, Verdict::kOverLimit) << denied.error;
  EXPECT_EQ(denied.decision.limit, 3);
  EXPECT_EQ(denied.decision.remaining, 3);  // nothing taken
  EXPECT_GE(denied.decision.retry_after, std::chrono::seconds(1));
  Outcome fits = check("job-7", 3);
  EXPECT_TRUE(fits.allowed());
  EXPECT_EQ(fits.decision.remaining, 0);
  // Above the caller's own limit: the request itself is wrong.
  EXPECT_EQ(check("job-8", 11).verdict, Verdict::kBadRequest);
}

TEST(Overrides, ChangesAreCountedAndInEffectWhenPutAnswers) {
  Rig rig;
  const uint64_t puts = Metrics::Global().overrides_put.value();
  const uint64_t deletes = Metrics::Global().overrides_delete.value();
  rig.Put(Override("k:key-a", "pro", {}));
  EXPECT_EQ(Metrics::Global().overrides_put.value(), puts + 1);
  EXPECT_EQ(Metrics::Global().overrides_in_effect.value(), 1);
  EXPECT_EQ(rig.Remaining().count("daily_pro"), 1u);
  StatusOr<Overrides::Stored> removed = Internal("no answer");
  auto got = [&removed](StatusOr<Overrides::Stored> r) { removed = r; };
  rig.overrides.Remove("k:key-a", "test", got);
  ASSERT_TRUE(removed.ok() && removed->changed && removed->applied);
  rig.overrides.Remove("k:key-a", "test", got);
  ASSERT_TRUE(removed.ok());
  EXPECT_FALSE(removed->changed);
  EXPECT_EQ(Metrics::Global().overrides_delete.value(), deletes + 1);
  EXPECT_EQ(rig.Remaining().count("daily"), 1u);
}

// A settlement of the decision API is made on the limits its check used: the
// key's override's. Settled against the configured 1-minute window, the
// override's 1-day window state was started over (each settlement, even of
// difference 0, wiped the day's count).
TEST(Overrides, ADecisionApiSettlementUsesTheKeysOverride) {
  Rig rig;
  rig.Put(Override("d:job-9", std::nullopt, {*Limit::FixedWindow("calls", 100, 24h)}));
  DecisionApi api(rig.enforcer);
  const std::string check =
      R"({"key":"job-9","reserve":true,"limit":{"name":"calls","algorithm":"fixed_window",)"
      R"("limit":100,"window":"1m"}})";
  auto run = [&](auto call, std::string body, std::string_view path) {
    Reply r;
    (api.*call)(rig.policy, body, path, [&r](Reply x) { r = std::move(x); });
    return r;
  };
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    Reply r = run(&DecisionApi::Check, check, "/v1/check");
    ASSERT_EQ(r.status, 200u) << r.body;
    const nlohmann::json j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["remaining"], 99 - i);
    ids.push_back(j["reservation"]["id"].get<std::string>());
  }
  Reply s =
      run(&DecisionApi::Settle, R"({"reservation":")" + ids[0] + R"(","cost":1})", "/v1/settle");
  ASSERT_EQ(s.status, 200u) << s.body;
  EXPECT_EQ(nlohmann::json::parse(s.body)["state"]["remaining"], 97);
  s = run(&DecisionApi::Settle, R"({"reservation":")" + ids[1] + R"(","cost":11})", "/v1/settle");
  ASSERT_EQ(s.status, 200u) << s.body;
  EXPECT_EQ(nlohmann::json::parse(s.body)["state"]["remaining"], 87);
  // Settled once: the second try is refused and changes nothing.
  s = run(&DecisionApi::Settle, R"({"reservation":")" + ids[1] + R"(","cost":0})", "/v1/settle");
  EXPECT_EQ(s.status, 409u);
  rig.clock.Advance(5min);  // another minute, the same day
  Reply r = run(&DecisionApi::Check, check, "/v1/check");
  ASSERT_EQ(r.status, 200u);
  EXPECT_EQ(nlohmann::json::parse(r.body)["remaining"], 86);
}

// A reservation is refused when the key's override makes one of its limits a
// calendar quota (or a sliding log): the request's own limit was
// settleable, but Enforcer::Check applies the override, and every
// settlement of the reservation would be refused. Nothing is taken; a check
// without a reservation is still decided under the override.
TEST(Overrides, ADecisionApiReservationUnderACalendarOverrideIsRefused) {
  Rig rig;
  StatusOr<Limit> monthly = ParseLimitObject({{"name", "calls"},
                                              {"algorithm", "fixed_window"},
                                              {"limit", 100},
                                              {"window", "1mo"},
                                              {"align", "calendar"},
                                              {"timezone", "UTC"}},
                                             "calls");
  ASSERT_TRUE(monthly.ok()) << monthly.status().ToString();
  rig.Put(Override("d:job-9", std::nullopt, {*monthly}));
  DecisionApi api(rig.enforcer);
  auto check = [&](bool reserve) {
    Reply r;
    api.Check(
        rig.policy,
        std::string(R"({"key":"job-9",)") + (reserve ? R"("reserve":true,)" : "") +
            R"("limit":{"name":"calls","algorithm":"fixed_window","limit":100,"window":"1d"}})",
        "/v1/check", [&r](Reply x) { r = std::move(x); });
    return r;
  };
  Reply refused = check(true);
  EXPECT_EQ(refused.status, 400u) << refused.body;
  EXPECT_NE(refused.body.find("limit 'calls' cannot be reserved: the key's override makes it a "
                              "calendar quota (align: calendar), which cannot be settled"),
            std::string::npos)
      << refused.body;
  Reply plain = check(false);
  ASSERT_EQ(plain.status, 200u) << plain.body;
  EXPECT_EQ(nlohmann::json::parse(plain.body)["remaining"], 99) << "the refusal took nothing";
}

// A metered route checks a request at its own reservation (SetRouteCost);
// moving the client to another plan rebuilt the checks from the templates,
// at the route's `reserve`: a reservation larger than what is left passed.
TEST(Overrides, APlanOverrideKeepsAMeteredRequestsReservation) {
  Rig rig;
  auto c = policy::ParseConfig(R"(
limits:
  tokens: {algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001}
  daily: {algorithm: fixed_window, limit: 100, window: 1d}
  daily_pro: {algorithm: fixed_window, limit: 1000, window: 1d}
plans:
  free: {limits: [daily]}
  pro: {limits: [daily_pro]}
default_plan: free
api_keys: {"key-a": free}
routes:
  - name: chat
    path: /chat
    limits: [tokens]
    cost: {from_request_header: X-Estimate, reserve: 10, settle_from: response_header,
           field: X-Usage}
)",
                               "metered.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  rig.policy = *policy::Policy::Create(*std::move(c));
  rig.overrides.SetPolicy(rig.policy);
  rig.Put(Override("k:key-a", "pro", {}));
  auto enforce = [&](int64_t reserved) {
    policy::RequestPlan plan = Resolve(*rig.policy, "key-a", "/chat");
    SetRouteCost(plan, reserved);
    Outcome out;
    rig.enforcer.Enforce(rig.policy, std::move(plan), "/chat", Face::kGateway,
                         [&out](Outcome o) { out = std::move(o); });
    return out;
  };
  Outcome first = enforce(600);
  ASSERT_TRUE(first.allowed());
  std::map<std::string, int64_t> remaining;
  for (const LimitOutcome& l : first.limits) remaining[l.limit->name()] = l.decision.remaining;
  EXPECT_EQ(remaining, (std::map<std::string, int64_t>{{"tokens", 400}, {"daily_pro", 999}}));
  ASSERT_EQ(first.charged.size(), 1u);  // settled from what was reserved
  ASSERT_EQ(first.charged[0].checks.size(), 1u);
  EXPECT_EQ(first.charged[0].checks[0].cost, 600);
  Outcome second = enforce(600);
  EXPECT_EQ(second.verdict, Verdict::kOverLimit);
  EXPECT_EQ(second.limit_name, "tokens");
}

// `yaml` with `from` replaced by `to` (which must be there).
std::string Edited(std::string yaml, std::string_view from, std::string_view to) {
  const size_t at = yaml.find(from);
  if (at == std::string::npos)
    throw std::runtime_error(std::string(from) + " is not in the config");
  return yaml.replace(at, from.size(), to);
}

constexpr std::string_view kConfiguredBurst =
    "burst: {algorithm: token_bucket, capacity: 10, refill_per_second: 0.001}";

// kConfig with burst's capacity 20.
std::string Raised() {
  return Edited(std::string(kConfig), kConfiguredBurst,
                "burst: {algorithm: token_bucket, capacity: 20, refill_per_second: 0.001}");
}

// The capacity (count) of each limit `key`'s request on /search is decided on.
std::map<std::string, int64_t> Capacities(Rig& rig, std::string_view key = "key-a") {
  Outcome out;
  rig.enforcer.Enforce(rig.policy, Resolve(*rig.policy, key), "/search", Face::kGateway,
                       [&out](Outcome o) { out = std::move(o); });
  std::map<std::string, int64_t> r;
  for (const LimitOutcome& l : out.limits) r[l.limit->name()] = l.limit->limit();
  return r;
}

// The record keeps what the admin gave, not the configured limit's other
// fields: those it once copied (and so pinned) too.
TEST(Overrides, TheRecordKeepsOnlyTheGivenFields) {
  Rig rig;
  rig.Put(Given("k:key-a", "burst", R"({"refill_per_second":50})"));
  const std::shared_ptr<const OverrideTable> t = rig.overrides.table();
  const ClientOverride* o = t->Find("k:key-a", 0);
  ASSERT_NE(o, nullptr);
  const nlohmann::json record = nlohmann::json::parse(o->record);
  EXPECT_EQ(record["limits"], nlohmann::json::parse(R"({"burst": {"refill_per_second": 50}})"))
      << o->record;
  // In effect: the configured capacity, the given rate.
  ASSERT_EQ(o->limits.size(), 1u);
  EXPECT_EQ(o->limits[0].limit(), 10);
  EXPECT_EQ(o->limits[0].refill_per_second(), 50);
  const nlohmann::json shown = o->ToJson(0);
  EXPECT_EQ(shown["given"], record["limits"]);
  EXPECT_EQ(shown["limits"]["burst"]["capacity"], 10);
  EXPECT_EQ(shown["in_effect"], true);
  EXPECT_EQ(shown["not_applied"], nlohmann::json::array());
}

// A reload that changes a field the override did not give reaches the
// client; one it gave stays the override's.
TEST(Overrides, APolicyChangeResolvesThemAgain) {
  Rig rig;
  ClientOverride o = Given("k:key-a", "burst", R"({"refill_per_second":50})");
  o.given.push_back({"search", R"({"limit":2})"});
  rig.Put(std::move(o));
  EXPECT_EQ(Capacities(rig),
            (std::map<std::string, int64_t>{{"burst", 10}, {"search", 2}, {"daily", 100}}));
  const int64_t version = rig.overrides.table()->version();
  rig.Reload(Raised());
  EXPECT_EQ(rig.overrides.table()->version(), version) << "the same overrides, resolved again";
  EXPECT_EQ(Capacities(rig),
            (std::map<std::string, int64_t>{{"burst", 20}, {"search", 2}, {"daily", 100}}));
  const ClientOverride* now = rig.overrides.table()->Find("k:key-a", 0);
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(now->limits[0].refill_per_second(), 50);
  EXPECT_EQ(Capacities(rig, "key-b")["burst"], 20);  // without an override: the config
}

// A reload that makes a given field meaningless (burst becomes a fixed
// window: no refill_per_second) does not apply that limit, says why, and
// counts it; the override's other limit still applies. Before, the
// override stopped applying silently while GET said in_effect: true.
TEST(Overrides, AnAlgorithmChangeIsNotAppliedAndSaysSo) {
  Rig rig;
  ClientOverride o = Given("k:key-a", "burst", R"({"refill_per_second":50})");
  o.given.push_back({"search", R"({"limit":2})"});
  rig.Put(std::move(o));
  EXPECT_EQ(Metrics::Global().overrides_in_effect.value(), 1);
  EXPECT_EQ(Metrics::Global().overrides_not_applied.value(), 0);
  rig.Reload(Edited(std::string(kConfig), kConfiguredBurst,
                    "burst: {algorithm: fixed_window, limit: 4, window: 1h}"));
  const ClientOverride* now = rig.overrides.table()->Find("k:key-a", 0);
  ASSERT_NE(now, nullptr);
  const nlohmann::json shown = now->ToJson(rig.overrides.NowMillis());
  EXPECT_EQ(shown["in_effect"], false) << shown.dump();
  EXPECT_EQ(shown["not_applied"],
            nlohmann::json::array({"limits.burst: field 'refill_per_second' does not apply to "
                                   "fixed_window (use 'limit' and 'window')"}))
      << shown.dump();
  EXPECT_EQ(shown["limits"].size(), 1u) << shown.dump();  // search's applies
  EXPECT_EQ(shown["given"].size(), 2u) << shown.dump();
  EXPECT_EQ(Metrics::Global().overrides_in_effect.value(), 0);
  EXPECT_EQ(Metrics::Global().overrides_not_applied.value(), 1);
  // The configured fixed window, the override's search limit.
  EXPECT_EQ(Capacities(rig),
            (std::map<std::string, int64_t>{{"burst", 4}, {"search", 2}, {"daily", 100}}));
  // Back to a bucket: it applies again.
  rig.Reload(kConfig);
  EXPECT_TRUE(rig.overrides.table()->Find("k:key-a", 0)->InEffectAt(0));
  EXPECT_EQ(Metrics::Global().overrides_not_applied.value(), 0);
  EXPECT_EQ(Capacities(rig)["burst"], 10);
}

// A given algorithm (which every record of an earlier version has) that the
// config no longer has, a limit or plan the config dropped: not applied.
TEST(Overrides, WhatTheConfigNoLongerHasIsNotApplied) {
  Rig rig;
  ClientOverride o = Given("k:key-a", "burst", R"({"algorithm":"token_bucket","capacity":3})");
  o.plan = "pro";
  rig.Put(std::move(o));
  EXPECT_EQ(Capacities(rig),
            (std::map<std::string, int64_t>{{"burst", 3}, {"search", 5}, {"daily_pro", 1000}}));
  rig.Reload(R"(
limits:
  burst: {algorithm: leaky_bucket, depth: 10, rate_per_second: 1}
  daily: {algorithm: fixed_window, limit: 100, window: 1d}
  search: {algorithm: sliding_window, limit: 5, window: 1m}
plans:
  free: {limits: [daily]}
default_plan: free
api_keys: {"key-a": free}
routes:
  - {name: search, path: /search, limits: [burst, search]}
)");
  const ClientOverride* now = rig.overrides.table()->Find("k:key-a", 0);
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(now->not_applied,
            (std::vector<std::string>{
                "field 'plan': this config has no plan 'pro'",
                "limits.burst: 'burst' is a leaky_bucket; an override keeps the algorithm (the "
                "client's state would mean something else)"}));
  EXPECT_EQ(Capacities(rig),
            (std::map<std::string, int64_t>{{"burst", 10}, {"search", 5}, {"daily", 100}}));
}

// A record an earlier version wrote has every field of the limit: all of
// them count as given, which is how that version applied it (a reload's
// new capacity does not reach it).
TEST(Overrides, AnEarlierVersionsFullRecordReads) {
  ManualClock clock;
  std::unique_ptr<OverrideStore> store = MakeMemoryOverrideStore();
  StatusOr<int64_t> put = Internal("no answer");
  store->Put("k:key-a",
             R"({"by":"admin token from 127.0.0.1:5123","limits":{"burst":{"algorithm":)"
             R"("token_bucket","capacity":3,"refill_per_second":0.001}},"reason":"incident 9",)"
             R"("set_at_ms":1700000000000})",
             [&put](StatusOr<int64_t> v) { put = v; });
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  Overrides overrides(std::move(store), clock);
  overrides.SetPolicy(MakePolicy(kConfig));
  Status read = Internal("no answer");
  overrides.Refresh([&read](const Status& s) { read = s; });
  ASSERT_TRUE(read.ok()) << read.ToString();
  const ClientOverride* o = overrides.table()->Find("k:key-a", 0);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->reason, "incident 9");
  ASSERT_EQ(o->given.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(o->given[0].fields).size(), 3u);
  ASSERT_EQ(o->limits.size(), 1u);
  EXPECT_EQ(o->limits[0], *Limit::TokenBucket("burst", 3, 0.001));
  overrides.SetPolicy(MakePolicy(Raised()));
  o = overrides.table()->Find("k:key-a", 0);
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->limits[0].limit(), 3);
  EXPECT_TRUE(o->InEffectAt(0));
}

}  // namespace
}  // namespace ratelimit::server
