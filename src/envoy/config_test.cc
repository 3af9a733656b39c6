#include "envoy/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ratelimit::envoy {
namespace {

namespace fs = std::filesystem;

// Every folder of tests/envoy/config_errors is one broken config directory
// whose `expected` file holds the error, with paths relative to the folder.
TEST(EnvoyConfig, EveryErrorFixtureFailsWithItsFileAndLine) {
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(RL_ENVOY_ERRORS_DIR)) {
    if (!entry.is_directory()) continue;
    ++cases;
    const std::string dir = entry.path().string();
    std::ifstream in(entry.path() / "expected");
    std::string expected;
    std::getline(in, expected);
    auto c = LoadDirectory(dir);
    ASSERT_FALSE(c.ok()) << dir;
    std::string got = c.status().message();
    for (size_t at; (at = got.find(dir + "/")) != std::string::npos;) got.erase(at, dir.size() + 1);
    EXPECT_EQ(got, expected) << dir;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_GE(cases, 11);
}

TEST(EnvoyConfig, ReadsEnvoyproxyIntegrationConfigUnchanged) {
  auto c = LoadDirectory(RL_ENVOY_CONFIG_DIR);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ((*c)->domains.size(), 2u);
  const Domain& another = (*c)->domains.at("another");
  const Node& key2 = another.root.children.at("key2");
  ASSERT_EQ(key2.rules.size(), 1u);
  EXPECT_EQ(key2.rules[0].requests_per_unit, 20u);
  EXPECT_EQ(key2.rules[0].unit, Unit::kMinute);
  EXPECT_EQ(key2.rules[0].period, std::chrono::minutes(1));
  EXPECT_EQ(key2.rules[0].algorithm, Algorithm::kFixedWindow);
  EXPECT_EQ((*c)->domains.at("basic").root.children.size(), 3u);
}

TEST(EnvoyConfig, TheExampleDirectoryLoads) {
  auto c = LoadDirectory(RL_ENVOY_EXAMPLE_DIR);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ((*c)->domains.count("shop"), 1u);
}

TEST(EnvoyConfig, UnitsAsEnvoyproxyCountsThem) {
  EXPECT_EQ(ParseUnit("second"), Unit::kSecond);
  EXPECT_EQ(ParseUnit("WEEK"), Unit::kWeek);
  EXPECT_EQ(ParseUnit("fortnight"), Unit::kUnknown);
  EXPECT_EQ(UnitLength(Unit::kMonth), std::chrono::hours(24 * 30));
  EXPECT_EQ(UnitLength(Unit::kYear), std::chrono::hours(24 * 365));
}

TEST(EnvoyConfig, ExtensionsParse) {
  Config c;
  ASSERT_TRUE(ParseDomain(R"(domain: x
descriptors:
  - key: a
    rate_limit: {unit: second, unit_multiplier: 90, requests_per_unit: 9}
  - key: b
    rate_limit: {period: 90s, requests_per_unit: 9, algorithm: token_bucket, burst: 20}
  - key: c
    rate_limits:
      - {unit: second, requests_per_unit: 5, name: burst}
      - {unit: day, requests_per_unit: 1000, name: daily}
  - key: d
    value: "api*"
    rate_limit: {unit: second, requests_per_unit: 1}
)",
                          "x.yaml", c)
                  .ok());
  const Node& root = c.domains.at("x").root;
  EXPECT_EQ(root.children.at("a").rules[0].period, std::chrono::seconds(90));
  EXPECT_EQ(root.children.at("b").rules[0].burst, 20);
  EXPECT_EQ(root.children.at("b").rules[0].unit, Unit::kUnknown);
  EXPECT_EQ(root.children.at("c").rules.size(), 2u);
  ASSERT_EQ(root.wildcards.size(), 1u);
  EXPECT_EQ(root.wildcards[0]->value, "api*");
}

TEST(EnvoyConfig, MoreErrors) {
  Config c;
  auto err = [&](const char* yaml) {
    Config fresh;
    Status s = ParseDomain(yaml, "f.yaml", fresh);
    return s.ok() ? std::string("OK") : s.message();
  };
  EXPECT_EQ(err("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, "
                "requests_per_unit: 5, burst: 9}\n"),
            "f.yaml:4: 'burst' needs algorithm token_bucket or leaky_bucket");
  EXPECT_EQ(err("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, "
                "requests_per_unit: -1}\n"),
            "f.yaml:4: 'requests_per_unit' must be a whole number from 0 to 4294967295");
  EXPECT_EQ(err("domain: [x\n"), "f.yaml:2: end of sequence flow not found");
  auto rule = [&](const std::string& fields) {
    return err(("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {" + fields + "}\n").c_str());
  };
  EXPECT_EQ(rule("unit: month, requests_per_unit: 5, align: calendar"), "OK");
  EXPECT_EQ(rule("unit: week, requests_per_unit: 5, align: calendar, timezone: Asia/Kolkata"),
            "OK");
  EXPECT_EQ(rule("unit: month, requests_per_unit: 5, align: calendar, timezone: Mars/Base"),
            "f.yaml:4: unknown time zone 'Mars/Base' (an IANA time zone name such as "
            "Europe/Berlin, America/New_York or UTC, from " +
                ratelimit::TimeZone::Directory() + ")");
  EXPECT_EQ(rule("unit: hour, requests_per_unit: 5, align: calendar"),
            "f.yaml:4: 'align: calendar' needs unit day, week, month or year (got 'hour'), "
            "without 'period' or 'unit_multiplier'");
  EXPECT_EQ(rule("unit: day, unit_multiplier: 2, requests_per_unit: 5, align: calendar"),
            "f.yaml:4: 'align: calendar' needs unit day, week, month or year (got 'day'), "
            "without 'period' or 'unit_multiplier'");
  EXPECT_EQ(rule("unit: day, requests_per_unit: 5, align: calendar, algorithm: token_bucket"),
            "f.yaml:4: 'align: calendar' needs algorithm fixed_window");
  EXPECT_EQ(rule("unit: day, requests_per_unit: 5, timezone: UTC"),
            "f.yaml:4: 'timezone' needs 'align: calendar'");
  EXPECT_EQ(rule("unit: day, requests_per_unit: 5, align: lunar"),
            "f.yaml:4: 'align' must be calendar or epoch, got 'lunar'");
}

// A rule the store cannot apply is refused when the file loads (and by
// --check-config), with its file:line. Before, each of these loaded, and
// every request that matched it failed (INVALID_ARGUMENT, which Envoy lets
// through): the store's limit was built per request. A period of a year
// times 300,000 overflowed int64 (undefined; it came out negative and
// passed the check of the period's length).
TEST(EnvoyConfig, ARuleTheStoreCannotApplyIsRefusedAtLoad) {
  auto rule = [](const std::string& fields) {
    Config c;
    Status s = ParseDomain(
        "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {" + fields + "}\n", "f.yaml", c);
    return s.ok() ? std::string("OK") : s.message();
  };
  const std::string refused = "f.yaml:4: cannot apply this rate_limit: ";
  EXPECT_EQ(rule("algorithm: sliding_window, unit: year, requests_per_unit: 1000000"),
            refused +
                "limit x window (in ms) must stay below 2^53; use a smaller limit or window, or "
                "fixed_window");
  EXPECT_EQ(rule("algorithm: sliding_log, unit: day, requests_per_unit: 200000"),
            refused + "limit must be at most 100000 for sliding_log");
  EXPECT_EQ(rule("algorithm: token_bucket, unit: second, requests_per_unit: 2000000"),
            refused + "refill_per_second must be at most 1000000 (one token per microsecond)");
  EXPECT_EQ(rule("algorithm: token_bucket, unit: day, requests_per_unit: 1, burst: 1000"),
            refused + "a full refill would take longer than 366 days; raise refill_per_second");
  EXPECT_EQ(rule("algorithm: sliding_window, period: 1500us, requests_per_unit: 5"),
            refused + "a sliding_window window must be whole milliseconds");
  EXPECT_EQ(rule("unit: year, unit_multiplier: 300000, requests_per_unit: 5"),
            "f.yaml:4: the period is longer than a year");
  EXPECT_EQ(rule("unit: day, unit_multiplier: 367, requests_per_unit: 5"),
            "f.yaml:4: the period is longer than a year");
  // Their neighbours within the bounds load, and every rule that loads can
  // be built.
  for (const char* fine :
       {"algorithm: sliding_window, unit: year, requests_per_unit: 200000",
        "algorithm: sliding_log, unit: day, requests_per_unit: 100000",
        "algorithm: token_bucket, unit: second, requests_per_unit: 1000000",
        "algorithm: token_bucket, unit: day, requests_per_unit: 1, burst: 300",
        "unit: day, unit_multiplier: 366, requests_per_unit: 5", "unit: year, requests_per_unit: 0",
        "unit: second, requests_per_unit: 4294967295"}) {
    SCOPED_TRACE(fine);
    EXPECT_EQ(rule(fine), "OK");
    Config c;
    ASSERT_TRUE(ParseDomain(std::string("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {") +
                                fine + "}\n",
                            "f.yaml", c)
                    .ok());
    EXPECT_TRUE(RuleLimit(c.domains.at("x").root.children.at("a").rules[0], "e0").ok());
  }
}

}  // namespace
}  // namespace ratelimit::envoy
