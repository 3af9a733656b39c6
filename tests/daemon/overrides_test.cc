// Overrides shared by every instance (issue 20): two ratelimitd on one real
// Redis. A PUT on one is in effect on the other within 1 s (20 tries, the
// worst printed); the override survives a restart of both; DELETE restores
// the plan's limits; an expired override stops applying at its time; a reset
// through one clears the other's cached denials.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>

#include "harness.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// free: 2 requests a day per client; pro: 1000. The decision API's `burst`.
std::string Config(const std::string& redis_url) {
  return "store: {type: redis, url: \"" + redis_url + "\"}\n" + R"(server: {threads: 2}
limits:
  burst: {algorithm: token_bucket, capacity: 2, refill_per_second: 0.001}
plans:
  free: {limits: [{name: quota, algorithm: fixed_window, limit: 2, window: 1d}]}
  pro: {limits: [{name: quota_pro, algorithm: fixed_window, limit: 1000, window: 1d}]}
api_keys: {acme-key: free}
)";
}

int Auth(const Daemon& d) {
  return Http(d.port(), "GET", "/v1/auth",
              {{"X-Original-Method", "GET"},
               {"X-Original-URI", "/api/x"},
               {"X-API-Key", "acme-key"}})
      .status;
}

// The capacity of `burst` the decision API applies to `key` on `d`.
int64_t BurstLimit(const Daemon& d, const std::string& key) {
  HttpResponse r = Http(d.port(), "POST", "/v1/check", {{"Content-Type", "application/json"}},
                        R"({"key": ")" + key + R"(", "limits": ["burst"]})");
  json j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("limit") ? j["limit"].get<int64_t>() : -1;
}

HttpResponse Admin(const Daemon& d, const std::string& method, const std::string& path,
                   const std::string& body = "") {
  return Http(d.admin_port(), method, path, {{"Content-Type", "application/json"}}, body);
}

// Polls `done` until it holds; the time it took, or `patience` if never.
template <typename Fn>
Clock::duration Until(Fn done, Clock::duration patience = 3s) {
  const auto start = Clock::now();
  while (Clock::now() - start < patience) {
    if (done()) return Clock::now() - start;
    std::this_thread::sleep_for(2ms);
  }
  return patience;
}

// The command line's exit code and output (stdout and stderr).
std::pair<int, std::string> Command(const std::string& args) {
  const std::string dir = MakeTempDir();
  const std::string cmd = std::string(RATELIMITD_PATH) + " " + args + " > " + dir + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), ReadFile(dir + "/out")};
}

struct Pair {
  ratelimit::testing::RedisServer redis{{.args = {"--appendonly", "yes"}}};
  std::string dir = MakeTempDir();
  std::unique_ptr<Daemon> a, b;

  Pair() {
    WriteFile(dir + "/c.yaml", Config(redis.url()));
    Start();
  }
  void Start() {
    a = std::make_unique<Daemon>(std::vector<std::string>{"--config", dir + "/c.yaml"});
    b = std::make_unique<Daemon>(std::vector<std::string>{"--config", dir + "/c.yaml"});
  }
};

TEST(OverridesDaemon, APutOnOneIsInEffectOnTheOtherWithinOneSecond) {
  Pair p;
  ASSERT_TRUE(p.a->started() && p.b->started());
  Clock::duration worst{0};
  for (int i = 0; i < 20; ++i) {
    const std::string key = "job-" + std::to_string(i);
    ASSERT_EQ(BurstLimit(*p.b, key), 2);
    const auto start = Clock::now();
    HttpResponse put = Admin(
        *p.a, "PUT", "/v1/overrides/d:" + key,
        R"({"limits": {"burst": {"capacity": 50}}, "reason": "try )" + std::to_string(i) + R"("})");
    ASSERT_EQ(put.status, 200) << put.body;
    const auto seen = Until([&] { return BurstLimit(*p.b, key) == 50; });
    const auto took = Clock::now() - start;
    ASSERT_LT(seen, 3s) << "never seen on the other instance";
    worst = std::max(worst, took);
  }
  const auto worst_ms = std::chrono::duration_cast<std::chrono::microseconds>(worst).count() / 1e3;
  std::printf("override PUT on one instance -> in effect on the other: worst of 20 %.1f ms\n",
              worst_ms);
  RecordProperty("worst_propagation_ms", std::to_string(worst_ms));
  EXPECT_LT(worst, 1s);
  // The answer says it is shared; each instance logged its own change only.
  HttpResponse list = Admin(*p.b, "GET", "/v1/overrides?limit=5");
  json j = json::parse(list.body);
  EXPECT_EQ(j["total"], 20);
  EXPECT_EQ(j["shared"], true);
  EXPECT_EQ(j["overrides"].size(), 5u);
  EXPECT_EQ(j["next_offset"], 5);
}

TEST(OverridesDaemon, SurvivesARestartDeleteRestoresThePlanAndExpiryEndsIt) {
  Pair p;
  ASSERT_TRUE(p.a->started() && p.b->started());
  EXPECT_EQ(Auth(*p.a), 204);
  EXPECT_EQ(Auth(*p.b), 204);
  EXPECT_EQ(Auth(*p.a), 429);  // the free plan's 2 a day

  HttpResponse put =
      Admin(*p.a, "PUT", "/v1/overrides/k:acme-key", R"({"plan": "pro", "reason": "upgraded"})");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(json::parse(put.body)["scope"], "every instance on this Redis");
  EXPECT_LT(Until([&] { return Auth(*p.b) == 204; }), 1s);
  EXPECT_TRUE(p.a->WaitForLog("\"op\":\"put\"", 1s));
  EXPECT_TRUE(p.a->WaitForLog("\"reason\":\"upgraded\"", 1s));
  // --explain reads Redis too and applies it; --check-config connects to
  // nothing (a config check, not a look at the store).
  auto [rc, out] = Command("--check-config " + p.dir + "/c.yaml");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("override"), std::string::npos) << out;
  std::tie(rc, out) =
      Command("--config " + p.dir + "/c.yaml --explain 'GET /api/x' -H 'X-API-Key: acme-key'");
  EXPECT_EQ(rc, 0) << out;
  json explained = json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_TRUE(explained.is_object()) << out;
  EXPECT_EQ(explained["client"]["plan"], "pro");
  EXPECT_EQ(explained["override"]["plan"], "pro");
  // And so does the explain endpoint.
  HttpResponse ex = Admin(*p.b, "POST", "/v1/explain",
                          R"({"target": "/api/x", "headers": {"X-API-Key": "acme-key"}})");
  EXPECT_EQ(json::parse(ex.body)["override"]["reason"], "upgraded") << ex.body;

  // Both instances restart: the override is in Redis.
  p.a.reset();
  p.b.reset();
  p.Start();
  ASSERT_TRUE(p.a->started() && p.b->started());
  EXPECT_EQ(Admin(*p.a, "GET", "/v1/overrides/k:acme-key").status, 200);
  EXPECT_LT(Until([&] { return Auth(*p.b) == 204; }), 1s);

  // DELETE on one: the other is back on the free plan (its quota used up).
  ASSERT_EQ(Admin(*p.b, "DELETE", "/v1/overrides/k:acme-key").status, 200);
  EXPECT_LT(Until([&] { return Auth(*p.a) == 429; }), 1s);
  EXPECT_EQ(Auth(*p.b), 429);

  // An override with a TTL: in effect until its time, not after.
  put = Admin(*p.a, "PUT", "/v1/overrides/k:acme-key", R"({"plan": "pro", "ttl": "2s"})");
  ASSERT_EQ(put.status, 200) << put.body;
  const int64_t expires_ms = json::parse(put.body)["expires_at_ms"].get<int64_t>();
  EXPECT_LT(Until([&] { return Auth(*p.b) == 204; }), 1s);
  auto unix_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  while (unix_ms() < expires_ms - 200) {
    EXPECT_EQ(Auth(*p.b), 204) << "before its time";
    std::this_thread::sleep_for(50ms);
  }
  while (unix_ms() < expires_ms) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(Auth(*p.b), 429) << "after its time";
  EXPECT_EQ(Auth(*p.a), 429);
  // One instance removes it from Redis and counts it.
  EXPECT_LT(Until([&] { return Admin(*p.a, "GET", "/v1/overrides/k:acme-key").status == 404; }),
            2s);
  const std::string metrics =
      Admin(*p.a, "GET", "/metrics").body + Admin(*p.b, "GET", "/metrics").body;
  EXPECT_NE(metrics.find("ratelimit_overrides_changes_total{op=\"expire\"} 1"), std::string::npos);
}

// The denials B answers from its over-limit cache (ratelimit_over_limit_cache_hits_total).
int64_t CacheHits(const Daemon& d) {
  const std::string m = Admin(d, "GET", "/metrics").body;
  const std::string name = "\nratelimit_over_limit_cache_hits_total ";
  const size_t at = m.find(name);
  return at == std::string::npos ? -1 : std::stoll(m.substr(at + name.size()));
}

// A reset through one instance reaches the other's cached denials. A
// calendar quota's denial waits until the month ends, and B answers it from
// its over-limit cache without asking Redis; the reset through A is
// announced on the overrides' channel and B forgets its cached denials: the
// next request through B is allowed at once (well within the cache's 5 s
// bound on an entry's age, which alone would let it through later).
TEST(OverridesDaemon, AResetOnOneClearsTheOthersCachedDenialsOfACalendarQuota) {
  ratelimit::testing::RedisServer redis;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "store: {type: redis, url: \"" + redis.url() + R"("}
plans:
  free: {limits: [{name: monthly, algorithm: fixed_window, limit: 2, window: 1mo,
                   align: calendar, timezone: UTC}]}
api_keys: {acme-key: free}
)");
  Daemon a({"--config", dir + "/c.yaml"});
  Daemon b({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(a.started() && b.started());
  ASSERT_EQ(Auth(b), 204);
  ASSERT_EQ(Auth(b), 204);  // the month's last: its denial is cached at once
  const int64_t hits = CacheHits(b);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Auth(b), 429);
  ASSERT_EQ(CacheHits(b), hits + 3) << "B answers the denials from its cache";

  HttpResponse reset = Admin(a, "POST", "/v1/clients/k:acme-key/reset");
  ASSERT_EQ(reset.status, 200) << reset.body;
  EXPECT_LT(Until([&] { return Auth(b) == 204; }, 4s), 1s) << "B still answers its cached denial";
}

// The overrides have no TTL: a Redis that may evict any key may drop them
// (and their version), so the daemon warns at start; under the default
// noeviction it says nothing.
TEST(OverridesDaemon, WarnsAtStartWhenRedisMayEvictTheOverrides) {
  ratelimit::testing::RedisServer lru{{.args = {"--maxmemory-policy", "allkeys-lru"}}};
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/lru.yaml", Config(lru.url()));
  Daemon d({"--config", dir + "/lru.yaml"});
  ASSERT_TRUE(d.started());
  EXPECT_TRUE(
      d.WaitForLog("overrides: Redis may evict the overrides (maxmemory-policy allkeys-lru)",
                   std::chrono::milliseconds(3000)))
      << d.Log();
  Pair p;
  ASSERT_TRUE(p.a->started());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(p.a->Log().find("may evict"), std::string::npos) << p.a->Log();
}

}  // namespace
}  // namespace rltest
