// AuthRequest: GET /v1/auth, the endpoint nginx's auth_request consults.
//
// nginx sends the original request's method and URI in X-Original-Method and
// X-Original-URI (both required; missing -> 400) and the client address in
// X-Forwarded-For (used only when nginx is a trusted proxy). The answer:
//   204                   allowed, with the rate limit headers
//   429 (or deny_status)  denied, with the headers, Retry-After and a problem body
//                         (whose "status" is the answer's: RFC 9457)
// nginx's auth_request turns any status other than 2xx/401/403 into 500, so
// the example config asks for `?deny_status=403` and maps that 403 back to a
// 429 in a named location (examples/nginx-auth-request.conf). A denial is
// marked `X-RateLimit-Denied: true` so it cannot be mistaken for another 403.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "policy/config.h"
#include "ratelimit/status.h"
#include "server/enforcer.h"
#include "server/outcome_reply.h"
#include "server/reply.h"

namespace ratelimit::server {

// The status to deny with, from the query: "" -> 429; "deny_status=403" -> 403.
// Allowed: 401, 403, 429. Anything else is InvalidArgument.
StatusOr<unsigned> ParseDenyStatus(std::string_view query);

// The answer for an Outcome of the rules (any verdict but kBadRequest).
// `face` says the dialect, closed_status and deny_status.
Reply AuthReply(const Outcome& outcome, const HttpFace& face, std::string_view original_uri);

}  // namespace ratelimit::server
