#include "server/auth_request.h"

#include <string>

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

Reply AuthReply(const Outcome& o, const HttpFace& face, std::string_view original_uri) {
  if (!o.allowed()) {
    HttpFace auth = face;
    auth.mark_denied = true;
    return RefusalReply(o, auth, original_uri);
  }
  Reply r;
  r.status = 204;
  AddOutcomeHeaders(o, face.dialect, r);
  return r;
}

}  // namespace ratelimit::server
