#include "server/headers.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace ratelimit::server {
namespace {

using namespace std::chrono_literals;
using policy::HeaderDialect;

std::string Get(const HeaderList& h, std::string_view name) {
  for (const auto& [n, v] : h) {
    if (n == name) return v;
  }
  return "<absent>";
}

RateLimitInfo Allowed() {
  return {.decision = {.allowed = true,
                       .limit = 10,
                       .remaining = 9,
                       .retry_after = 0us,
                       .reset_after = 200ms},
          .name = "burst",
          .window = 2s};
}

// Waits that round to other whole seconds: 2 s until the next request
// would pass, 5 s until the bucket is full again.
RateLimitInfo Denied() {
  return {.decision = {.allowed = false,
                       .limit = 10,
                       .remaining = 0,
                       .retry_after = 1001ms,
                       .reset_after = 4500ms},
          .name = "burst",
          .window = 2s};
}

TEST(Headers, Rounding) {
  EXPECT_EQ(CeilSeconds(0us), 0);
  EXPECT_EQ(CeilSeconds(1us), 1);
  EXPECT_EQ(CeilSeconds(1s), 1);
  EXPECT_EQ(CeilSeconds(1000001us), 2);
  EXPECT_EQ(CeilMillis(1us), 1);
  EXPECT_EQ(CeilMillis(200ms), 200);
  EXPECT_EQ(CeilMillis(-5us), 0);
  EXPECT_EQ(RetryAfterSeconds({.retry_after = 0us}), 1);  // at least 1
  EXPECT_EQ(RetryAfterSeconds({.retry_after = 1001ms}), 2);
}

TEST(Headers, Draft06) {
  HeaderList h;
  AddRateLimitHeaders(HeaderDialect::kDraft06, Allowed(), h);
  EXPECT_EQ(Get(h, "RateLimit-Limit"), "10");
  EXPECT_EQ(Get(h, "RateLimit-Remaining"), "9");
  EXPECT_EQ(Get(h, "RateLimit-Reset"), "1");
  EXPECT_EQ(Get(h, "Retry-After"), "<absent>");
  EXPECT_EQ(Get(h, "X-RateLimit-Degraded"), "<absent>");
  EXPECT_EQ(h.size(), 3u);
}

TEST(Headers, Structured) {
  HeaderList h;
  AddRateLimitHeaders(HeaderDialect::kStructured, Allowed(), h);
  EXPECT_EQ(Get(h, "RateLimit-Policy"), "\"burst\";q=10;w=2");
  EXPECT_EQ(Get(h, "RateLimit"), "\"burst\";r=9;t=1");
}

// Denied, every reset value says when more quota is available: the same
// seconds as Retry-After (which must not be earlier), not the 5 s until the
// limit is full again.
TEST(Headers, DeniedResetIsTheRetryAfter) {
  HeaderList draft, structured, legacy;
  AddRateLimitHeaders(HeaderDialect::kDraft06, Denied(), draft);
  EXPECT_EQ(Get(draft, "RateLimit-Reset"), "2");
  EXPECT_EQ(Get(draft, "Retry-After"), "2");
  AddRateLimitHeaders(HeaderDialect::kStructured, Denied(), structured);
  EXPECT_EQ(Get(structured, "RateLimit"), "\"burst\";r=0;t=2");
  EXPECT_EQ(Get(structured, "Retry-After"), "2");
  AddRateLimitHeaders(HeaderDialect::kLegacy, Denied(), legacy);
  EXPECT_EQ(Get(legacy, "X-RateLimit-Reset"), "2");
  // Denied with no wait the store could name (a failure mode's closed
  // answer): at least 1, as Retry-After.
  RateLimitInfo closed = Denied();
  closed.decision.retry_after = 0us;
  HeaderList h;
  AddRateLimitHeaders(HeaderDialect::kDraft06, closed, h);
  EXPECT_EQ(Get(h, "RateLimit-Reset"), "1");
  EXPECT_EQ(Get(h, "Retry-After"), "1");
}

// A limit that counts something else than requests (a metered route's
// `unit`) says so with the draft's quota-unit parameter; RateLimit does not.
TEST(Headers, StructuredNamesTheQuotaUnit) {
  HeaderList h;
  RateLimitInfo info = Allowed();
  info.unit = "tokens";
  AddRateLimitHeaders(HeaderDialect::kStructured, info, h);
  EXPECT_EQ(Get(h, "RateLimit-Policy"), "\"burst\";q=10;w=2;qu=\"tokens\"");
  EXPECT_EQ(Get(h, "RateLimit"), "\"burst\";r=9;t=1");
  HeaderList draft;
  AddRateLimitHeaders(HeaderDialect::kDraft06, info, draft);
  EXPECT_EQ(draft.size(), 3u);  // the draft-06 fields have no unit
}

TEST(Headers, Legacy) {
  HeaderList h;
  AddRateLimitHeaders(HeaderDialect::kLegacy, Denied(), h);
  EXPECT_EQ(Get(h, "X-RateLimit-Limit"), "10");
  EXPECT_EQ(Get(h, "X-RateLimit-Remaining"), "0");
  EXPECT_EQ(Get(h, "X-RateLimit-Reset"), "2");
  EXPECT_EQ(Get(h, "Retry-After"), "2");
  EXPECT_EQ(Get(h, "Cache-Control"), "no-store");
}

TEST(Headers, NoneStillSaysRetryAfterAndDegraded) {
  HeaderList h;
  RateLimitInfo info = Denied();
  info.degraded = true;
  AddRateLimitHeaders(HeaderDialect::kNone, info, h);
  EXPECT_EQ(Get(h, "Retry-After"), "2");
  EXPECT_EQ(Get(h, "X-RateLimit-Degraded"), "true");
  EXPECT_EQ(Get(h, "RateLimit-Limit"), "<absent>");
}

TEST(Headers, QuotaExceededBody) {
  RateLimitInfo info = Denied();
  info.decision.retry_after = 300ms;
  auto j = nlohmann::json::parse(QuotaExceededBody(info, "/api/ping"));
  EXPECT_EQ(j["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded");
  EXPECT_EQ(j["title"], "Too Many Requests");
  EXPECT_EQ(j["status"], 429);
  EXPECT_EQ(j["detail"], "limit 'burst' exceeded: retry in 1 s");
  EXPECT_EQ(j["instance"], "/api/ping");
  EXPECT_EQ(j["limit"], "burst");
  EXPECT_EQ(j["retry_after_seconds"], 1);
  EXPECT_EQ(j["violated-policies"], nlohmann::json::array({"burst"}));
}

}  // namespace
}  // namespace ratelimit::server
