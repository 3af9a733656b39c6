// Problem: RFC 9457 `application/problem+json` error answers.
//
// Every error the server answers (400, 404, 405, 413, 429, 431, 502, 503,
// 504) carries a problem body whose `detail` says exactly what was wrong:
//
//   Reply r = ProblemReply(400, "field 'cost' must be a non-negative integer", "/v1/check");
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "server/reply.h"

namespace ratelimit::server {

inline constexpr std::string_view kProblemContentType = "application/problem+json";
inline constexpr std::string_view kQuotaExceededType =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

// The standard reason phrase ("Too Many Requests"), or "Error".
std::string_view StatusTitle(unsigned status);

// {"type": "about:blank", "title": ..., "status": ..., "detail": ..., "instance": ...}
// `instance` is omitted when empty.
nlohmann::json Problem(unsigned status, std::string_view detail, std::string_view instance);

// A complete error reply with the problem body.
Reply ProblemReply(unsigned status, std::string_view detail, std::string_view instance);

}  // namespace ratelimit::server
