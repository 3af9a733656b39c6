// Calendar quotas through the running daemon, on the real clock: the
// decision API's reset_after_ms / retry_after_ms, and its and /v1/auth's
// RateLimit and Retry-After headers, point at the calendar boundary of the
// limit's time zone, which the test computes with the C library (mktime
// under TZ), not with the daemon's code. On the memory store and on Redis.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "json_calls.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using nlohmann::json;

// Within 3 s (the test's and the daemon's clocks read a moment apart,
// headers round up to whole seconds).
void ExpectNear(int64_t got_s, int64_t want_s, const std::string& what) {
  EXPECT_LE(std::llabs(got_s - want_s), 3) << what << ": " << got_s << " vs " << want_s;
}

const char* kConfig = R"(server:
  headers: structured
limits:
  monthly: {algorithm: fixed_window, limit: 2, window: 1mo, align: calendar, timezone: Europe/Berlin}
routes:
  - {name: api, path: /api, limits: [monthly]}
)";

void ChecksPointAtTheBoundary(Daemon& d) {
  const time_t now = time(nullptr);
  const int64_t month_end = NextLocalMidnight("Europe/Berlin", now, true);
  const int64_t day_end = NextLocalMidnight("America/New_York", now, false);

  // A configured monthly quota in Berlin: to local midnight on the 1st.
  HttpResponse r = Check(d.port(), R"({"key": "acme", "limits": ["monthly"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["remaining"], 1);
  ExpectNear(j["reset_after_ms"].get<int64_t>() / 1000, month_end - now, "reset_after_ms");
  EXPECT_EQ(r.Header("RateLimit-Policy"), "\"monthly\";q=2;w=2592000");
  const std::string rl = r.Header("RateLimit");
  ASSERT_EQ(rl.rfind("\"monthly\";r=1;t=", 0), 0u) << rl;
  ExpectNear(std::stoll(rl.substr(rl.find("t=") + 2)), month_end - now, "RateLimit t=");
  EXPECT_EQ(Check(d.port(), R"({"key": "acme", "limits": ["monthly"]})").status, 200);
  r = Check(d.port(), R"({"key": "acme", "limits": ["monthly"]})");
  ASSERT_EQ(r.status, 429) << r.body;
  ExpectNear(std::stoll(r.Header("Retry-After")), month_end - now, "Retry-After");
  ExpectNear(Body(r)["retry_after_ms"].get<int64_t>() / 1000, month_end - now, "retry_after_ms");

  // The same configured limit on a route, through nginx's auth_request face
  // (per client IP: a state of its own).
  const Headers auth = {{"X-Original-Method", "GET"}, {"X-Original-URI", "/api/x"}};
  r = Http(d.port(), "GET", "/v1/auth", auth);
  ASSERT_EQ(r.status, 204) << r.body;  // allowed
  const std::string auth_rl = r.Header("RateLimit");
  ASSERT_EQ(auth_rl.rfind("\"monthly\";r=1;t=", 0), 0u) << auth_rl;
  ExpectNear(std::stoll(auth_rl.substr(auth_rl.find("t=") + 2)), month_end - now, "auth t=");
  Http(d.port(), "GET", "/v1/auth", auth);
  r = Http(d.port(), "GET", "/v1/auth", auth);
  ASSERT_EQ(r.status, 429) << r.body;
  ExpectNear(std::stoll(r.Header("Retry-After")), month_end - now, "auth Retry-After");

  // An inline daily quota in New York: to local midnight there.
  const std::string daily =
      R"({"key": "acme", "limit": {"name": "daily_ny", "algorithm": "fixed_window", "limit": 1,
          "window": "1d", "align": "calendar", "timezone": "America/New_York"}})";
  r = Check(d.port(), daily);
  ASSERT_EQ(r.status, 200) << r.body;
  ExpectNear(Body(r)["reset_after_ms"].get<int64_t>() / 1000, day_end - now, "daily reset");
  r = Check(d.port(), daily);
  ASSERT_EQ(r.status, 429) << r.body;
  ExpectNear(std::stoll(r.Header("Retry-After")), day_end - now, "daily Retry-After");
}

TEST(CalendarQuota, DecisionApiAndAuthRequestPointAtTheBoundaryOnMemory) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", kConfig);
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  ChecksPointAtTheBoundary(d);
}

TEST(CalendarQuota, DecisionApiAndAuthRequestPointAtTheBoundaryOnRedis) {
  ratelimit::testing::RedisServer redis;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", kConfig);
  Daemon d({"--config", dir + "/c.yaml", "--redis", redis.url()});
  ASSERT_TRUE(d.started()) << d.Log();
  ChecksPointAtTheBoundary(d);
  // The window's key, named by its unit, zone and start, expires at the
  // boundary (+1 s).
  const std::string keys = redis.Cli("KEYS", "*monthly:1mo:Europe/Berlin@*");
  ASSERT_NE(keys.find("monthly:1mo:Europe/Berlin@"), std::string::npos) << keys;
  const long long pttl = std::stoll(redis.Cli("PTTL", keys.substr(0, keys.find('\n'))));
  const int64_t month_end = NextLocalMidnight("Europe/Berlin", time(nullptr), true);
  ExpectNear(pttl / 1000, month_end - time(nullptr) + 1, "PTTL");
}

TEST(CalendarQuota, BadCalendarLimitsSayWhy) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  struct Case {
    std::string limit, detail;
  } cases[] = {
      {R"({"algorithm": "fixed_window", "limit": 5, "window": "1mo", "align": "calendar", "timezone": "Mars/Olympus"})",
       "limit: unknown time zone 'Mars/Olympus'"},
      {R"({"algorithm": "fixed_window", "limit": 5, "window": "1mo"})",
       "limit: field 'window': window '1mo' needs align: calendar"},
      {R"({"algorithm": "fixed_window", "limit": 5, "window": "3d", "align": "calendar"})",
       "limit: field 'window': window '3d': a calendar window is 1d, 1w, 1mo or 1y"},
      {R"({"algorithm": "sliding_window", "limit": 5, "window": "1d", "align": "calendar"})",
       "limit: align: calendar is for fixed_window only, not sliding_window"},
      {R"({"algorithm": "token_bucket", "capacity": 5, "refill_per_second": 1, "timezone": "UTC"})",
       "limit: field 'timezone' is for fixed_window only, not token_bucket"},
      {R"({"algorithm": "fixed_window", "limit": 5, "window": "1d", "timezone": 3})",
       "limit: field 'timezone' must be a string"},
  };
  for (const Case& c : cases) {
    HttpResponse r = Check(d.port(), R"({"key": "k", "limit": )" + c.limit + "}");
    EXPECT_EQ(r.status, 400) << c.limit;
    const std::string detail = Body(r)["detail"].get<std::string>();
    EXPECT_EQ(detail.substr(0, c.detail.size()), c.detail) << detail;
  }
}

}  // namespace
}  // namespace rltest
