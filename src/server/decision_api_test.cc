#include "server/decision_api.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "policy/config.h"
#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"

namespace ratelimit::server {
namespace {

using nlohmann::json;

std::string ParseError(std::string_view body, const policy::Policy* p = nullptr) {
  StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status().message();
  StatusOr<ParsedCheck> c = ParseCheck(*j, p, 32);
  return c.ok() ? "" : c.status().message();
}

TEST(ParseCheck, Valid) {
  StatusOr<json> j = ParseBody(R"({"key": "user:ada", "cost": 2, "limits": [
      {"name": "burst", "algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5},
      {"name": "daily", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]})");
  ASSERT_TRUE(j.ok());
  StatusOr<ParsedCheck> c = ParseCheck(*j, nullptr, 512);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->key, "user:ada");
  EXPECT_EQ(c->store_key, "d:user:ada");  // apart from the rules' "k:", "u:", "ip:" keys
  ASSERT_EQ(c->checks.size(), 2u);
  EXPECT_EQ(c->checks[0].limit->name(), "burst");
  EXPECT_EQ(c->checks[0].cost, 2);
  EXPECT_EQ(c->checks[1].limit->window(), std::chrono::hours(24));
}

TEST(ParseCheck, ShorthandAndDefaults) {
  StatusOr<json> j = ParseBody(
      R"({"key": "k", "limit": {"algorithm": "sliding_log", "limit": 5, "window": "15m"}})");
  StatusOr<ParsedCheck> c = ParseCheck(*j, nullptr, 512);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->cost, 1);
  EXPECT_EQ(c->checks[0].limit->name(), "default");
}

// Issue 21: "reserve" (with "reserve_ttl") and an inline limit's "block_for".
TEST(ParseCheck, ReserveAndBlockFor) {
  StatusOr<json> j = ParseBody(R"({"key": "k", "cost": 3, "reserve": true, "reserve_ttl": "30s",
      "limit": {"algorithm": "fixed_window", "limit": 5, "window": "1m", "block_for": "10m"}})");
  StatusOr<ParsedCheck> c = ParseCheck(*j, nullptr, 512);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->reserve);
  EXPECT_EQ(c->reserve_ttl_ms, 30000);
  EXPECT_EQ(json::parse(c->limits_json)[0]["block_for"], "10m");
  EXPECT_EQ(c->checks[0].limit->block_for(), std::chrono::minutes(10));
  j = ParseBody(R"({"key": "k", "reserve": true, "limit": "x"})");
  EXPECT_EQ(ParseError(R"({"key": "k", "reserve": true, "limit": {"algorithm": "fixed_window",
      "limit": 5, "window": "1m"}})"),
            "");
  const std::string fw = R"({"algorithm": "fixed_window", "limit": 5, "window": "1m"})";
  EXPECT_EQ(ParseError(R"({"key": "k", "reserve": 1, "limit": )" + fw + "}"),
            "field 'reserve' must be true or false");
  EXPECT_EQ(ParseError(R"({"key": "k", "reserve_ttl": "1s", "limit": )" + fw + "}"),
            "field 'reserve_ttl' needs \"reserve\": true");
  EXPECT_EQ(
      ParseError(R"({"key": "k", "reserve": true, "reserve_ttl": "2h", "limit": )" + fw + "}"),
      "field 'reserve_ttl' must be 1ms..1h");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "fixed_window", "limit": 5,
      "window": "1m", "block_for": 600}})"),
            "limit: field 'block_for' must be a duration string such as \"10m\"");
}

// The fast path of /v1/check answers the plain bodies, each as the full
// parser does, and leaves everything else to the full parser.
TEST(FastParseCheck, AgreesWithTheFullParserOrStepsAside) {
  StatusOr<policy::Config> config = policy::ParseConfig(
      "limits:\n"
      "  burst: {algorithm: token_bucket, capacity: 20, refill_per_second: 10}\n"
      "  daily: {algorithm: fixed_window, limit: 10000, window: 1d}\n",
      "t.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto policy = policy::Policy::Create(*std::move(config));
  ASSERT_TRUE(policy.ok());
  const std::string tb =
      R"({"name":"b","algorithm":"token_bucket","capacity":10,"refill_per_second":5})";
  const std::string fw = R"({"algorithm": "fixed_window", "limit": 3, "window": "1m"})";
  const std::vector<std::string> fast = {
      R"({"key":"k1","limits":[)" + tb + "]}",
      R"({"key":"k1","limit":)" + tb + "}",
      R"({"limit":"burst","key":"user:ada"})",
      " {\n \"key\" : \"k\" ,\t\"cost\": 3, \"limits\" : [ \"burst\", \"daily\", " + fw +
          " ] }\r\n",
      R"({"key":"utf-8: café","cost":0,"limit":"daily"})",
      R"({"key":"k","limit":{"algorithm":"token_bucket","capacity":10,"refill_per_second":0.5}})",
  };
  const std::vector<std::string> full_only = {
      R"({"key":"k\"q","limit":"burst"})",          // an escape
      R"({"key":"k","cost":1.0,"limit":"burst"})",  // a float cost
      R"({"key":"k","cost":-1,"limit":"burst"})",   // an error
      R"({"key":"k","key":"j","limit":"burst"})",   // a repeated field
      R"({"key":"k","limit":"burst","extra":1})",   // an unknown field
      R"({"key":"k","limits":["burst","burst"]})",  // a limit twice
      R"({"key":"k","limits":[]})",                 // no limit
      R"({"key":"k","limit":"nope"})",              // unknown name
      R"({"key":"k","cost":30,"limit":"burst"})",   // cost above capacity
      R"({"key":"","limit":"burst"})",              // empty key
      R"({"key":"k","limit":{"algorithm":"token_bucket","capacity":0,"refill_per_second":1}})",
      R"({"key":"k","limit":"burst"} x)",                 // trailing bytes
      R"({"key":"k","limit":"burst")",                    // cut short
      "\xEF\xBB\xBF{\"key\":\"k\",\"limit\":\"burst\"}",  // a byte order mark
      "{\"key\":\"\xC3\x28\",\"limit\":\"burst\"}",       // invalid UTF-8
  };
  for (const std::string& body : fast) {
    std::optional<ParsedCheck> f = FastParseCheck(body, policy->get(), 64);
    ASSERT_TRUE(f.has_value()) << body;
    StatusOr<json> j = ParseBody(body);
    ASSERT_TRUE(j.ok()) << body;
    StatusOr<ParsedCheck> full = ParseCheck(*j, policy->get(), 64);
    ASSERT_TRUE(full.ok()) << body << ": " << full.status().message();
    EXPECT_TRUE(*f == *full) << body;
    // A second time: inline limits now come from the per-thread table.
    std::optional<ParsedCheck> again = FastParseCheck(body, policy->get(), 64);
    ASSERT_TRUE(again.has_value()) << body;
    EXPECT_TRUE(*again == *full) << body;
  }
  for (const std::string& body : full_only) {
    EXPECT_FALSE(FastParseCheck(body, policy->get(), 64).has_value()) << body;
  }
  // Over max_key_length: the full parser gives the error.
  EXPECT_FALSE(FastParseCheck(R"({"key":"0123456789","limit":"burst"})", policy->get(), 9));
}

TEST(ParseCheck, Errors) {
  const std::string tb = R"({"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5})";
  EXPECT_EQ(ParseError(R"({"key": "k", "cost": 1.5, "limit": )" + tb + "}"),
            "field 'cost' must be a non-negative integer");
  EXPECT_EQ(ParseError(R"({"key": "k", "cost": -1, "limit": )" + tb + "}"),
            "field 'cost' must be a non-negative integer");
  EXPECT_EQ(ParseError(R"({"key": "k", "cost": "1", "limit": )" + tb + "}"),
            "field 'cost' must be a non-negative integer");
  EXPECT_EQ(ParseError(R"({"key": "k", "cost": 18446744073709551615, "limit": )" + tb + "}"),
            "field 'cost' must be a non-negative integer");
  EXPECT_NE(
      ParseError(R"({"key": "k", "cost": 1e400, "limit": )" + tb + "}").find("not valid JSON"),
      std::string::npos);
  EXPECT_EQ(
      ParseError(R"({"key": "k", "cots": 1, "limit": )" + tb + "}"),
      "unknown field 'cots' (expected key, cost, limits or limit, or reserve and reserve_ttl)");
  EXPECT_EQ(ParseError(R"({"cost": 1, "limit": )" + tb + "}"), "field 'key' is required");
  EXPECT_EQ(ParseError(R"({"key": "", "limit": )" + tb + "}"), "field 'key' must not be empty");
  EXPECT_EQ(ParseError(R"({"key": ")" + std::string(33, 'a') + R"(", "limit": )" + tb + "}"),
            "field 'key' is 33 bytes; the maximum is 32");
  EXPECT_EQ(ParseError(R"({"key": "k"})"), "field 'limits' is required");
  EXPECT_EQ(ParseError(R"({"key": "k", "limits": []})"),
            "field 'limits' must name at least one limit");
  EXPECT_EQ(ParseError(R"({"key": "k", "limits": ["nope"]})"), "limits[0]: unknown limit 'nope'");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "token_bucket", "capacity": 10}})"),
            "limit: field 'refill_per_second' is required for token_bucket");
  EXPECT_EQ(
      ParseError(
          R"({"key": "k", "limit": {"algorithm": "fixed_window", "limit": 10, "window": "10 s"}})")
          .substr(0, 23),
      "limit: field 'window': ");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "leaky", "limit": 10}})"),
            "limit: unknown algorithm 'leaky' (token_bucket, leaky_bucket, fixed_window, "
            "sliding_window or sliding_log)");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "leaky_bucket", "depth": 10,)"
                       R"( "refill_per_second": 5}})"),
            "limit: field 'refill_per_second' does not apply to leaky_bucket (use 'depth' and "
            "'rate_per_second')");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "leaky_bucket", "depth": 10}})"),
            "limit: field 'rate_per_second' is required for leaky_bucket");
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "leaky_bucket", "depth": 0,)"
                       R"( "rate_per_second": 5}})"),
            "limit: field 'depth' must be a positive integer");
  // The core's own "limit 'default': " is not repeated after "limit: ".
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": {"algorithm": "token_bucket", "capacity": 10,)"
                       R"( "refill_per_second": 2000000}})"),
            "limit: refill_per_second must be at most 1000000 (one token per microsecond)");
  EXPECT_EQ(
      ParseError(
          R"({"key": "k", "limit": {"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 1, "window": "1s"}})"),
      "limit: field 'window' does not apply to token_bucket (use 'capacity' and "
      "'refill_per_second')");
  EXPECT_EQ(ParseError(R"({"key": "k", "limits": [)" + tb + "," + tb + "]}"),
            "limit 'default' appears twice");
  EXPECT_EQ(ParseError(R"({"key": "k", "cost": 11, "limit": )" + tb + "}").substr(0, 21),
            "limit 'default': cost");
  std::string many = R"({"key": "k", "limits": [)";
  for (int i = 0; i < 17; ++i) {
    many += std::string(i ? "," : "") + R"({"name": "l)" + std::to_string(i) +
            R"(", "algorithm": "fixed_window", "limit": 1, "window": "1s"})";
  }
  EXPECT_EQ(ParseError(many + "]}"), "field 'limits' has 17 entries; the maximum is 16");
  EXPECT_NE(ParseError("{\"key\": \"a\xff\", \"limit\": " + tb + "}").find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(ParseError("{").find("request body is not valid JSON"), std::string::npos);
}

// "reserve": true on a limit that cannot be settled (a sliding log, a
// calendar quota) is refused when asked (400), not answered with a
// reservation whose settlement is refused (400) while its cost stays
// charged. A check of the same limits without "reserve" is fine.
TEST(DecisionApi, ReserveRefusesLimitsThatCannotBeSettled) {
  const std::string log = R"({"algorithm": "sliding_log", "limit": 5, "window": "1m"})";
  const std::string month =
      R"({"algorithm": "fixed_window", "limit": 5, "window": "1mo", "align": "calendar"})";
  const std::string bucket =
      R"({"name": "b", "algorithm": "token_bucket", "capacity": 5, "refill_per_second": 1})";
  EXPECT_EQ(ParseError(R"({"key": "k", "reserve": true, "limit": )" + log + "}"),
            "limit 'default' cannot be reserved: a sliding log cannot be settled; reserve on "
            "token buckets, leaky buckets, fixed windows aligned to the epoch or sliding windows");
  EXPECT_NE(ParseError(R"({"key": "k", "reserve": true, "limits": [)" + bucket + "," + month + "]}")
                .find("limit 'default' cannot be reserved: a calendar quota"),
            std::string::npos);
  EXPECT_EQ(ParseError(R"({"key": "k", "limit": )" + log + "}"), "");
  EXPECT_EQ(ParseError(R"({"key": "k", "limits": [)" + bucket + "," + month + "]}"), "");
  EXPECT_EQ(ParseError(R"({"key": "k", "reserve": true, "limit": )" + bucket + "}"), "");
}

TEST(DecisionApi, LeakyBucketAnswers200WithTheDelay) {
  ManualClock clock(1'700'000'000'000'000);
  auto store = std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock});
  Enforcer enforcer(store, 1000);
  DecisionApi api(enforcer);
  auto policy = policy::Policy::Create(policy::EmbeddedDefault());
  ASSERT_TRUE(policy.ok());
  const std::string body = R"({"key": "shaped", "limits": [{"name": "shape", )"
                           R"("algorithm": "leaky_bucket", "depth": 3, "rate_per_second": 4},)"
                           R"( {"name": "tb", "algorithm": "token_bucket", "capacity": 100, )"
                           R"("refill_per_second": 100}]})";
  std::vector<Reply> replies;
  for (int i = 0; i < 4; ++i) {
    api.Check(*policy, body, "/v1/check", [&](Reply r) { replies.push_back(std::move(r)); });
  }
  ASSERT_EQ(replies.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(replies[i].status, 200u) << i;
    json j = json::parse(replies[i].body);
    EXPECT_EQ(j["delay_ms"], 250 * i) << i;  // the longest of the limits
    EXPECT_EQ(j["limits"][0]["delay_ms"], 250 * i) << i;
    EXPECT_EQ(j["limits"][1]["delay_ms"], 0) << i;
  }
  EXPECT_EQ(replies[3].status, 429u);  // the queue holds 3
  json denied = json::parse(replies[3].body);
  EXPECT_EQ(denied["delay_ms"], 0);
  EXPECT_EQ(denied["retry_after_ms"], 250);
}

TEST(AppendCheckBody, Format) {
  Limit burst = *Limit::TokenBucket("burst", 10, 5);
  LimitCheck checks[] = {{&burst, 1}};
  CheckResult r;
  r.decisions.push_back({.allowed = true,
                         .limit = 10,
                         .remaining = 9,
                         .retry_after = std::chrono::microseconds(0),
                         .reset_after = std::chrono::microseconds(199'001)});
  r.overall = r.decisions[0];
  std::string out;
  AppendCheckBody(r, checks, false, out);
  EXPECT_EQ(out,
            R"({"allowed":true,"limit":10,"remaining":9,"retry_after_ms":0,"reset_after_ms":200,)"
            R"("delay_ms":0,"degraded":false,"limits":[{"name":"burst","allowed":true,"limit":10,)"
            R"("remaining":9,"retry_after_ms":0,"reset_after_ms":200,"delay_ms":0}]})");
}

TEST(DecisionApi, ChecksAgainstTheStore) {
  auto store = std::make_shared<MemoryStore>();
  Enforcer enforcer(store, 1000);
  DecisionApi api(enforcer);
  auto policy = policy::Policy::Create(policy::EmbeddedDefault());
  ASSERT_TRUE(policy.ok());
  const std::string body = R"({"key": "user:ada", "limits": ["ping"]})";
  std::vector<unsigned> statuses;
  for (int i = 0; i < 6; ++i) {
    api.Check(*policy, body, "/v1/check", [&](Reply r) { statuses.push_back(r.status); });
  }
  EXPECT_EQ(statuses, (std::vector<unsigned>{200, 200, 200, 200, 200, 429}));
  Reply batch;
  api.Batch(*policy, R"({"checks": [{"key": "user:bob", "limits": ["ping"]}, {"key": 1}]})",
            "/v1/check/batch", [&](Reply r) { batch = std::move(r); });
  EXPECT_EQ(batch.status, 200u);
  json j = json::parse(batch.body);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["allowed"], true);
  EXPECT_EQ(j["results"][0]["remaining"], 4);
  EXPECT_EQ(j["results"][1]["error"]["detail"], "checks[1]: field 'key' must be a string");
}

std::shared_ptr<const policy::Policy> BurstPolicy() {
  StatusOr<policy::Config> c = policy::ParseConfig(R"(
limits:
  burst:
    algorithm: token_bucket
    capacity: 20
    refill_per_second: 10
)",
                                                   "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *policy::Policy::Create(std::move(*c));
}

// Issue #16: an inline limit named like a configured one, with other
// parameters, shared its state (capacity 3 spent, then the configured
// capacity-20 limit answered remaining 9, not 19). One name, one set of
// parameters: the clash is refused; the same parameters are the same limit.
TEST(DecisionApi, AnInlineLimitMayNotTakeAConfiguredNameWithOtherParameters) {
  auto policy = BurstPolicy();
  const std::string clash =
      R"({"key":"user:43","limit":{"name":"burst","algorithm":"token_bucket","capacity":3,)"
      R"("refill_per_second":1}})";
  const std::string expected =
      "limit: limit 'burst' is configured with other parameters; name it (\"limit\": "
      "\"burst\") to use the configured one, or give this one another name";
  EXPECT_EQ(ParseError(clash, policy.get()), expected);
  EXPECT_FALSE(FastParseCheck(clash, policy.get(), 512));
  // Through the API (the fast path steps aside, the full parser answers).
  auto store = std::make_shared<MemoryStore>();
  Enforcer enforcer(store, 1000);
  DecisionApi api(enforcer);
  Reply r;
  api.Check(policy, clash, "/v1/check", [&](Reply x) { r = std::move(x); });
  EXPECT_EQ(r.status, 400u);
  EXPECT_EQ(json::parse(r.body)["detail"], expected);
  // The configured limit's state is untouched.
  api.Check(policy, R"({"key":"user:43","limit":"burst"})", "/v1/check",
            [&](Reply x) { r = std::move(x); });
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(json::parse(r.body)["remaining"], 19);
  // The same parameters are the same limit; another name is another limit.
  EXPECT_EQ(ParseError(R"({"key":"k","limit":{"name":"burst","algorithm":"token_bucket",)"
                       R"("capacity":20,"refill_per_second":10}})",
                       policy.get()),
            "");
  EXPECT_EQ(ParseError(R"({"key":"k","limits":[{"name":"mine","algorithm":"token_bucket",)"
                       R"("capacity":3,"refill_per_second":1}]})",
                       policy.get()),
            "");
}

// Issue #16: a repeated member was accepted, the last one winning.
TEST(ParseBody, RefusesARepeatedMember) {
  EXPECT_EQ(ParseError(R"({"key":"a","key":"b","limit":"ping"})"),
            "member 'key' appears twice in one JSON object");
  EXPECT_EQ(ParseError(R"({"key":"a","limit":{"algorithm":"token_bucket","capacity":3,)"
                       R"("capacity":30,"refill_per_second":1}})"),
            "member 'capacity' appears twice in one JSON object");
  // The same name in different objects is fine.
  EXPECT_TRUE(ParseBody(R"({"a":{"x":1},"b":{"x":2},"c":[{"x":1},{"x":2}]})").ok());
  auto policy = policy::Policy::Create(policy::EmbeddedDefault());
  ASSERT_TRUE(policy.ok());
  auto store = std::make_shared<MemoryStore>();
  Enforcer enforcer(store, 1000);
  DecisionApi api(enforcer);
  for (const std::string body :
       {R"({"key":"a","key":"b","limits":["ping"]})",
        R"({"key":"a","limit":{"algorithm":"token_bucket","capacity":3,"capacity":30,)"
        R"("refill_per_second":1}})",
        R"({"key":"a","cost":1,"cost":2,"limit":"ping"})"}) {
    Reply r;
    api.Check(*policy, body, "/v1/check", [&](Reply x) { r = std::move(x); });
    EXPECT_EQ(r.status, 400u) << body;
    EXPECT_NE(r.body.find("appears twice"), std::string::npos) << r.body;
  }
  Reply batch;
  api.Batch(*policy, R"({"checks":[],"checks":[{"key":"a","limit":"ping"}]})", "/v1/check/batch",
            [&](Reply x) { batch = std::move(x); });
  EXPECT_EQ(batch.status, 400u);
}

}  // namespace
}  // namespace ratelimit::server
