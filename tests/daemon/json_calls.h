// JSON helpers shared by the daemon tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "harness.h"

namespace rltest {

// The response body parsed as JSON; a discarded value (is_discarded()) when
// it is not JSON.
inline nlohmann::json Body(const HttpResponse& r) {
  return nlohmann::json::parse(r.body, nullptr, false);
}

// POST /v1/check with a JSON body.
inline HttpResponse Check(int port, const std::string& body) {
  return PostJson(port, "/v1/check", body);
}

}  // namespace rltest
