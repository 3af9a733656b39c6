#include "server/auth_request.h"

#include <string>

#include "server/headers.h"
#include "server/problem.h"

namespace ratelimit::server {

StatusOr<unsigned> ParseDenyStatus(std::string_view query) {
  unsigned status = 429;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = param.find('=');
    std::string_view name = param.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view() : param.substr(eq + 1);
    if (name != "deny_status") {
      return InvalidArgument("unknown query parameter '" + std::string(name) +
                             "' (expected deny_status)");
    }
    if (value == "401")
      status = 401;
    else if (value == "403")
      status = 403;
    else if (value == "429")
      status = 429;
    else
      return InvalidArgument("deny_status must be 401, 403 or 429");
  }
  return status;
}

Reply AuthReply(const Outcome& o, policy::HeaderDialect dialect, unsigned deny_status,
                std::string_view original_uri) {
  Reply r;
  if (!o.error.empty()) {
    // failure_mode closed: the store could not be asked.
    r = ProblemReply(o.status, o.error, original_uri);
    r.Add("Retry-After", "1");
    r.Add("X-RateLimit-Degraded", "true");
    return r;
  }
  if (o.status == 200) {
    r.status = 204;
  } else {
    RateLimitInfo info{
        .decision = o.decision, .name = o.limit_name, .window = o.window, .degraded = o.degraded};
    r.status = deny_status;
    r.content_type = kProblemContentType;
    r.body = QuotaExceededBody(info, original_uri);
    r.Add("X-RateLimit-Denied", "true");
  }
  if (o.limited) {
    RateLimitInfo info{
        .decision = o.decision, .name = o.limit_name, .window = o.window, .degraded = o.degraded};
    AddRateLimitHeaders(dialect, info, r.headers);
  } else if (o.degraded) {
    r.Add("X-RateLimit-Degraded", "true");
  }
  return r;
}

}  // namespace ratelimit::server
