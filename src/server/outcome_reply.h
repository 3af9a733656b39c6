// OutcomeReply: an Enforcer Outcome as HTTP, one module for every HTTP face
// (decision API, gateway, demo, nginx auth_request). The gRPC face renders
// the same Outcome in its own protocol; nothing here is needed for that.
//
//   HttpFace face{.dialect = config.server.headers,
//                 .closed_status = config.store.closed_status};
//   if (!o.allowed()) return done(RefusalReply(o, face, path));
//   Reply r = ...;                       // the face's own answer
//   AddOutcomeHeaders(o, face.dialect, r);
//
// Statuses: allowed 200 (the face may answer otherwise, e.g. 204 for
// auth_request), over limit deny_status (429 but for auth_request's
// ?deny_status=), failed closed store.closed_status, store error 503, bad
// request 400. A refusal carries an RFC 9457 body whose "status" is the
// answer's status; one that no limit decided (the store could not be asked)
// also Retry-After: 1, Cache-Control: no-store and X-RateLimit-Degraded: true.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "policy/config.h"
#include "server/concurrency_guard.h"
#include "server/enforcer.h"
#include "server/headers.h"
#include "server/reply.h"

namespace ratelimit::server {

struct HttpFace {
  policy::HeaderDialect dialect = policy::HeaderDialect::kDraft06;
  unsigned closed_status = 503;  // store.closed_status
  unsigned deny_status = 429;    // auth_request: 401, 403 or 429
  bool mark_denied = false;      // auth_request: X-RateLimit-Denied: true on a denial
};

// What the headers say for the outcome (the one place an Outcome becomes a
// RateLimitInfo). The name is a view into `o`.
RateLimitInfo InfoOf(const Outcome& o);

// The status of the outcome for this face.
unsigned HttpStatus(const Outcome& o, const HttpFace& face);

// The rate limit headers of the outcome in `dialect` (Retry-After and
// Cache-Control on a denial), or only X-RateLimit-Degraded when no limit
// applied but a failure mode decided. They replace any the reply carries
// already under the same names (an upstream's own): the client sees one
// value per field.
void AddOutcomeHeaders(const Outcome& o, policy::HeaderDialect dialect, Reply& r);

// The answer for an outcome that does not let the request through (any
// verdict but kAllowed), with its problem body; `instance` is its "instance".
Reply RefusalReply(const Outcome& o, const HttpFace& face, std::string_view instance);

// The answer when no limit decided: a bad request (400, the problem alone),
// or the store could not be asked (`status`: degraded, retry in a second).
Reply UndecidedReply(unsigned status, std::string_view error, std::string_view instance);

// The answer when a route's concurrency limit refuses a request (429, with
// the usual headers: the limit is max_in_flight, none remaining, a retry in
// a second; structured: RateLimit-Policy "concurrency:<route>";q=<max>;
// qu="concurrent-requests", no window), or its store is down and the
// failure mode is closed.
Reply ConcurrencyRefusalReply(const ConcurrencyOutcome& c, std::string_view name,
                              policy::HeaderDialect dialect, std::string_view instance);

}  // namespace ratelimit::server
