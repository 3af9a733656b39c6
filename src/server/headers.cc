#include "server/headers.h"

#include <nlohmann/json.hpp>

namespace ratelimit::server {

int64_t CeilSeconds(std::chrono::microseconds d) {
  const int64_t us = d.count();
  return us <= 0 ? 0 : (us + 999'999) / 1'000'000;
}

int64_t CeilMillis(std::chrono::microseconds d) {
  const int64_t us = d.count();
  return us <= 0 ? 0 : (us + 999) / 1'000;
}

int64_t RetryAfterSeconds(const Decision& d) {
  const int64_t s = CeilSeconds(d.retry_after);
  return s < 1 ? 1 : s;
}

void AddRateLimitHeaders(policy::HeaderDialect dialect, const RateLimitInfo& info,
                         HeaderList& out) {
  const Decision& d = info.decision;
  const int64_t remaining = d.remaining < 0 ? 0 : d.remaining;
  // The seconds until more quota is available (the draft's t): when
  // allowed, until the limit is full again; when denied, until this request
  // would pass, the Retry-After value (which must not be earlier than t).
  const int64_t reset = d.allowed ? CeilSeconds(d.reset_after) : RetryAfterSeconds(d);
  switch (dialect) {
    case policy::HeaderDialect::kDraft06:
      out.emplace_back("RateLimit-Limit", std::to_string(d.limit));
      out.emplace_back("RateLimit-Remaining", std::to_string(remaining));
      out.emplace_back("RateLimit-Reset", std::to_string(reset));
      break;
    case policy::HeaderDialect::kStructured: {
      // Limit names are [A-Za-z0-9_.-]: valid inside an sf-string as they are.
      std::string quoted = "\"";
      quoted.append(info.name.empty() ? std::string_view("default") : info.name);
      quoted.push_back('"');
      std::string policy = quoted;
      policy += ";q=" + std::to_string(d.limit);
      const int64_t w = CeilSeconds(info.window);
      if (w > 0) policy += ";w=" + std::to_string(w);
      if (!info.unit.empty()) {  // [a-z0-9-] (config.cc): valid in an sf-string as it is
        policy += ";qu=\"";
        policy.append(info.unit);
        policy.push_back('"');
      }
      out.emplace_back("RateLimit-Policy", std::move(policy));
      out.emplace_back("RateLimit",
                       quoted + ";r=" + std::to_string(remaining) + ";t=" + std::to_string(reset));
      break;
    }
    case policy::HeaderDialect::kLegacy:
      out.emplace_back("X-RateLimit-Limit", std::to_string(d.limit));
      out.emplace_back("X-RateLimit-Remaining", std::to_string(remaining));
      out.emplace_back("X-RateLimit-Reset", std::to_string(reset));
      break;
    case policy::HeaderDialect::kNone: break;
  }
  if (!d.allowed) {
    out.emplace_back("Retry-After", std::to_string(RetryAfterSeconds(d)));
    out.emplace_back("Cache-Control", "no-store");
  }
  if (info.degraded) out.emplace_back("X-RateLimit-Degraded", "true");
}

std::string QuotaExceededBody(const RateLimitInfo& info, std::string_view instance,
                              unsigned status) {
  const int64_t retry = RetryAfterSeconds(info.decision);
  const std::string name(info.name.empty() ? std::string_view("default") : info.name);
  nlohmann::json j = {
      {"type", "https://iana.org/assignments/http-problem-types#quota-exceeded"},
      {"title", "Too Many Requests"},
      {"status", status},
      {"detail", "limit '" + name + "' exceeded: retry in " + std::to_string(retry) + " s"},
  };
  if (!instance.empty()) j["instance"] = instance;
  j["limit"] = name;
  j["retry_after_seconds"] = retry;
  j["violated-policies"] = nlohmann::json::array({name});
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ratelimit::server
