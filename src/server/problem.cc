#include "server/problem.h"

#include <nlohmann/json.hpp>

namespace ratelimit::server {

const std::string* Reply::Find(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (EqualsIgnoreCase(n, name)) return &v;
  }
  return nullptr;
}

std::string_view StatusTitle(unsigned status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

nlohmann::json Problem(unsigned status, std::string_view detail, std::string_view instance) {
  nlohmann::json j = {{"type", "about:blank"},
                      {"title", StatusTitle(status)},
                      {"status", status},
                      {"detail", detail}};
  if (!instance.empty()) j["instance"] = instance;
  return j;
}

Reply ProblemReply(unsigned status, std::string_view detail, std::string_view instance) {
  Reply r;
  r.status = status;
  r.content_type = kProblemContentType;
  // Client-supplied text may be invalid UTF-8: replace rather than throw.
  r.body = Problem(status, detail, instance)
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

}  // namespace ratelimit::server
