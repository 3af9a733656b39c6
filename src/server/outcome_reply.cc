#include "server/outcome_reply.h"

#include <algorithm>

#include "server/problem.h"

namespace ratelimit::server {

RateLimitInfo InfoOf(const Outcome& o) {
  return RateLimitInfo{.decision = o.decision,
                       .name = o.limit_name,
                       .window = o.window,
                       .degraded = o.degraded,
                       .unit = o.unit};
}

unsigned HttpStatus(const Outcome& o, const HttpFace& face) {
  switch (o.verdict) {
    case Verdict::kAllowed: return 200;
    case Verdict::kOverLimit: return face.deny_status;
    case Verdict::kFailedClosed: return face.closed_status;
    case Verdict::kStoreError: return 503;
    case Verdict::kBadRequest: return 400;
  }
  return 500;
}

void AddOutcomeHeaders(const Outcome& o, policy::HeaderDialect dialect, Reply& r) {
  const size_t before = r.headers.size();
  if (o.limited) {
    AddRateLimitHeaders(dialect, InfoOf(o), r.headers);
  } else if (o.degraded) {
    r.Add("X-RateLimit-Degraded", "true");
  }
  if (before == 0 || r.headers.size() == before) return;
  auto ours = r.headers.begin() + static_cast<std::ptrdiff_t>(before);
  auto end = std::remove_if(r.headers.begin(), ours, [&](const auto& h) {
    return std::any_of(ours, r.headers.end(),
                       [&](const auto& mine) { return EqualsIgnoreCase(h.first, mine.first); });
  });
  r.headers.erase(end, ours);
}

Reply RefusalReply(const Outcome& o, const HttpFace& face, std::string_view instance) {
  const unsigned status = HttpStatus(o, face);
  if (o.verdict != Verdict::kOverLimit) return UndecidedReply(status, o.error, instance);
  Reply r;
  r.status = status;
  r.content_type = kProblemContentType;
  r.body = QuotaExceededBody(InfoOf(o), instance, status);
  if (face.mark_denied) r.Add("X-RateLimit-Denied", "true");
  AddOutcomeHeaders(o, face.dialect, r);
  return r;
}

Reply UndecidedReply(unsigned status, std::string_view error, std::string_view instance) {
  Reply r = ProblemReply(status, error, instance);
  if (status != 400) {
    r.Add("Retry-After", "1");
    r.Add("Cache-Control", "no-store");
    r.Add("X-RateLimit-Degraded", "true");
  }
  return r;
}

Reply ConcurrencyRefusalReply(const ConcurrencyOutcome& c, std::string_view name,
                              policy::HeaderDialect dialect, std::string_view instance) {
  // A failed-closed refusal is the store's, even with closed_status 429.
  if (c.denial == ConcurrencyOutcome::Denial::kNone) {
    return UndecidedReply(c.status, c.error, instance);
  }
  Reply r;
  r.status = 429;
  r.content_type = kProblemContentType;
  r.body = ConcurrencyExceededBody(c, name, instance);
  // A lease is usually freed long before it expires: retry in a second. The
  // quota is requests in flight at once, not per time: RateLimit-Policy says
  // qu="concurrent-requests" and has no window (w).
  const std::string label = "concurrency:" + std::string(name);
  RateLimitInfo info{.decision = Decision{.allowed = false,
                                          .limit = c.result.max_in_flight,
                                          .remaining = 0,
                                          .retry_after = std::chrono::seconds(1),
                                          .reset_after = std::chrono::seconds(1)},
                     .name = label,
                     .window = std::chrono::microseconds(0),
                     .degraded = c.degraded,
                     .unit = "concurrent-requests"};
  AddRateLimitHeaders(dialect, info, r.headers);
  return r;
}

}  // namespace ratelimit::server
