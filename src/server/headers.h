// Headers: what clients are told about their limits, as pure functions.
//
// From the decision that speaks for a request (the Combine of its limits),
// the name and window of the limit that produced it, and whether the store
// could be asked:
//
//   draft06     RateLimit-Limit: 10, RateLimit-Remaining: 9, RateLimit-Reset: 1 (default)
//   structured  RateLimit-Policy: "burst";q=10;w=2  and  RateLimit: "burst";r=9;t=1
//   legacy      X-RateLimit-Limit / X-RateLimit-Remaining / X-RateLimit-Reset
//               (reset in delta seconds, like Envoy; not GitHub's epoch seconds)
//   none        nothing
//
// Reset values (RateLimit-Reset, t=, X-RateLimit-Reset) are ceil(reset_after)
// in seconds when allowed (until the limit is full again), and the
// Retry-After value when denied (until more quota is available: a client
// that waits for the reset is not refused again). On a denial (any dialect,
// even none): Retry-After = ceil(retry_after) seconds, at least 1, and
// Cache-Control: no-store.
// X-RateLimit-Degraded: true when the failure mode decided instead of the store.
//
//   RateLimitInfo info{.decision = d, .name = "burst", .window = 2s};
//   AddRateLimitHeaders(HeaderDialect::kDraft06, info, reply.headers);
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "policy/config.h"
#include "ratelimit/decision.h"

namespace ratelimit::server {

struct RateLimitInfo {
  Decision decision;
  std::string_view name;                // the limit that speaks for the request
  std::chrono::microseconds window{0};  // Limit::window(): full refill time or window
  bool degraded = false;
  std::string_view unit;  // what the limit counts when not requests: RateLimit-Policy's qu
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// ceil(d / 1 s), never negative.
int64_t CeilSeconds(std::chrono::microseconds d);
// ceil(d / 1 ms), never negative.
int64_t CeilMillis(std::chrono::microseconds d);
// ceil(retry_after) seconds, at least 1 (the Retry-After value).
int64_t RetryAfterSeconds(const Decision& d);

// Adds the dialect's headers, and on a denial Retry-After and Cache-Control.
void AddRateLimitHeaders(policy::HeaderDialect dialect, const RateLimitInfo& info, HeaderList& out);

// The RFC 9457 body of a denial answered with `status` (429; auth_request's
// deny_status may ask 401 or 403: the body's "status" is the answer's):
// {"type": ".../http-problem-types#quota-exceeded", "title": "Too Many Requests",
//  "status": 429, "detail": "limit 'burst' exceeded: retry in 1 s", "instance": "/api/ping",
//  "limit": "burst", "retry_after_seconds": 1, "violated-policies": ["burst"]}
std::string QuotaExceededBody(const RateLimitInfo& info, std::string_view instance,
                              unsigned status = 429);

}  // namespace ratelimit::server
