#include "server/outcome_reply.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/auth_request.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

using std::chrono::seconds;

const Limit kBurst = *Limit::TokenBucket("burst", 10, 5);

Outcome Denied() {
  Outcome o;
  o.verdict = Verdict::kOverLimit;
  o.limited = true;
  o.decision = Decision{.allowed = false,
                        .limit = 10,
                        .remaining = 0,
                        .retry_after = std::chrono::milliseconds(1500),
                        .reset_after = seconds(2)};
  o.limit_name = "burst";
  o.window = kBurst.window();
  o.limits = {{&kBurst, o.decision}};
  return o;
}

Outcome Allowed() {
  Outcome o;
  o.limited = true;
  o.decision = Decision{.allowed = true, .limit = 10, .remaining = 9, .reset_after = seconds(1)};
  o.limit_name = "burst";
  o.window = kBurst.window();
  o.limits = {{&kBurst, o.decision}};
  return o;
}

TEST(OutcomeReply, StatusByVerdict) {
  const HttpFace face{.closed_status = 429, .deny_status = 403};
  Outcome o;
  EXPECT_EQ(HttpStatus(o, face), 200u);
  o.verdict = Verdict::kOverLimit;
  EXPECT_EQ(HttpStatus(o, face), 403u);
  o.verdict = Verdict::kFailedClosed;
  EXPECT_EQ(HttpStatus(o, face), 429u);
  o.verdict = Verdict::kStoreError;
  EXPECT_EQ(HttpStatus(o, face), 503u);
  o.verdict = Verdict::kBadRequest;
  EXPECT_EQ(HttpStatus(o, face), 400u);
}

TEST(OutcomeReply, InfoIsTheSpeakersNumbers) {
  const Outcome o = Denied();
  const RateLimitInfo info = InfoOf(o);
  EXPECT_EQ(info.decision, o.decision);
  EXPECT_EQ(info.name, "burst");
  EXPECT_EQ(info.window, kBurst.window());
  EXPECT_FALSE(info.degraded);
}

TEST(OutcomeReply, DeniedIsAProblemWithTheHeaders) {
  Reply r = RefusalReply(Denied(), HttpFace{}, "/api/ping");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.content_type, kProblemContentType);
  EXPECT_EQ(*r.Find("RateLimit-Limit"), "10");
  EXPECT_EQ(*r.Find("RateLimit-Remaining"), "0");
  EXPECT_EQ(*r.Find("Retry-After"), "2");
  EXPECT_EQ(*r.Find("Cache-Control"), "no-store");
  EXPECT_EQ(r.Find("X-RateLimit-Denied"), nullptr);
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["status"], 429);
  EXPECT_EQ(j["limit"], "burst");
  EXPECT_EQ(j["instance"], "/api/ping");
}

TEST(OutcomeReply, FailedClosedSaysTheStoreIsUnavailable) {
  Outcome o;
  o.verdict = Verdict::kFailedClosed;
  o.error = "the rate limit store is unavailable";
  o.degraded = true;
  Reply r = RefusalReply(o, HttpFace{.closed_status = 503}, "/x");
  EXPECT_EQ(r.status, 503u);
  EXPECT_EQ(*r.Find("Retry-After"), "1");
  EXPECT_EQ(*r.Find("Cache-Control"), "no-store");
  EXPECT_EQ(*r.Find("X-RateLimit-Degraded"), "true");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["status"], 503);
  EXPECT_EQ(j["detail"], "the rate limit store is unavailable");
}

TEST(OutcomeReply, BadRequestIsTheProblemAlone) {
  Outcome o;
  o.verdict = Verdict::kBadRequest;
  o.error = "cost 11 exceeds the limit";
  Reply r = RefusalReply(o, HttpFace{}, "/x");
  EXPECT_EQ(r.status, 400u);
  EXPECT_TRUE(r.headers.empty());
}

TEST(OutcomeReply, OurHeadersReplaceTheUpstreams) {
  Reply r;
  r.Add("ratelimit-limit", "999");
  r.Add("X-Upstream", "1");
  AddOutcomeHeaders(Allowed(), policy::HeaderDialect::kDraft06, r);
  EXPECT_EQ(*r.Find("RateLimit-Limit"), "10");
  int n = 0;
  for (const auto& h : r.headers) n += EqualsIgnoreCase(h.first, "RateLimit-Limit") ? 1 : 0;
  EXPECT_EQ(n, 1);
  EXPECT_EQ(*r.Find("X-Upstream"), "1");
}

TEST(OutcomeReply, UnlimitedButDegradedSaysSo) {
  Outcome o;
  o.degraded = true;
  Reply r;
  AddOutcomeHeaders(o, policy::HeaderDialect::kDraft06, r);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(*r.Find("X-RateLimit-Degraded"), "true");
}

// A concurrency limit's quota is requests in flight, not per second: its
// policy says so (qu) and has no window (w=1 read as 3 requests a second).
TEST(OutcomeReply, AConcurrencyRefusalNamesItsQuotaUnit) {
  ConcurrencyOutcome c;
  c.status = 429;
  c.denial = ConcurrencyOutcome::Denial::kLimit;
  c.result.in_flight = 3;
  c.result.max_in_flight = 3;
  Reply r = ConcurrencyRefusalReply(c, "work", policy::HeaderDialect::kStructured, "/work");
  EXPECT_EQ(r.status, 429u);
  ASSERT_NE(r.Find("RateLimit-Policy"), nullptr);
  EXPECT_EQ(*r.Find("RateLimit-Policy"), "\"concurrency:work\";q=3;qu=\"concurrent-requests\"");
  EXPECT_EQ(*r.Find("RateLimit"), "\"concurrency:work\";r=0;t=1");
  EXPECT_EQ(*r.Find("Retry-After"), "1");
  Reply draft = ConcurrencyRefusalReply(c, "work", policy::HeaderDialect::kDraft06, "/work");
  EXPECT_EQ(*draft.Find("RateLimit-Limit"), "3");
  EXPECT_EQ(*draft.Find("RateLimit-Remaining"), "0");
  EXPECT_EQ(*draft.Find("RateLimit-Reset"), "1");
}

// Issue #16: /v1/auth?deny_status=401 answered 401 with a body saying 429.
TEST(AuthReply, TheProblemStatusIsTheAnswersStatus) {
  for (unsigned deny : {401u, 403u, 429u}) {
    Reply r = AuthReply(Denied(), HttpFace{.deny_status = deny}, "/api/ping?x=1");
    EXPECT_EQ(r.status, deny);
    EXPECT_EQ(*r.Find("X-RateLimit-Denied"), "true");
    auto j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["status"], deny);
    EXPECT_EQ(j["instance"], "/api/ping?x=1");
  }
  Reply ok = AuthReply(Allowed(), HttpFace{}, "/api/ping");
  EXPECT_EQ(ok.status, 204u);
  EXPECT_EQ(*ok.Find("RateLimit-Remaining"), "9");
}

}  // namespace
}  // namespace ratelimit::server
