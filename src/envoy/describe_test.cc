#include "envoy/describe.h"

#include <gtest/gtest.h>

namespace ratelimit::envoy {
namespace {

TEST(EnvoyDescribe, EveryDomainAndRuleByItsPath) {
  Config c;
  ASSERT_TRUE(ParseDomain(R"(domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 20}
    descriptors:
      - key: path
        value: /checkout
        shadow_mode: true
        rate_limits:
          - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
          - {unit: hour, requests_per_unit: 100, name: hourly}
  - key: internal
    rate_limit: {unlimited: true}
)",
                          "shop.yaml", c)
                  .ok());
  c.source = "dir";
  const nlohmann::json j = Describe(c);
  EXPECT_EQ(j["source"], "dir");
  ASSERT_EQ(j["domains"].size(), 1u);
  const nlohmann::json& d = j["domains"][0];
  EXPECT_EQ(d["domain"], "shop");
  EXPECT_EQ(d["file"], "shop.yaml");
  ASSERT_EQ(d["descriptors"].size(), 3u) << d.dump();
  EXPECT_EQ(d["descriptors"][0]["path"], "api_key");
  EXPECT_EQ(d["descriptors"][0]["rules"][0]["requests_per_unit"], 20);
  EXPECT_EQ(d["descriptors"][0]["rules"][0]["unit"], "MINUTE");
  EXPECT_EQ(d["descriptors"][0]["rules"][0]["algorithm"], "fixed_window");
  EXPECT_EQ(d["descriptors"][0]["rules"][0]["line"], 4);
  const nlohmann::json& checkout = d["descriptors"][1];
  EXPECT_EQ(checkout["path"], "api_key.path_/checkout");
  EXPECT_EQ(checkout["shadow_mode"], true);
  ASSERT_EQ(checkout["rules"].size(), 2u);
  EXPECT_EQ(checkout["rules"][0]["algorithm"], "token_bucket");
  EXPECT_EQ(checkout["rules"][0]["burst"], 10);
  EXPECT_EQ(checkout["rules"][1]["name"], "hourly");
  EXPECT_EQ(checkout["rules"][1]["period"], "1h");
  EXPECT_EQ(d["descriptors"][2]["path"], "internal");
  EXPECT_EQ(d["descriptors"][2]["rules"][0]["unlimited"], true);
  EXPECT_FALSE(d["descriptors"][2]["rules"][0].contains("requests_per_unit"));
}

TEST(EnvoyDescribe, NoDomains) {
  const nlohmann::json j = Describe(Config{});
  EXPECT_TRUE(j["domains"].empty());
}

}  // namespace
}  // namespace ratelimit::envoy
