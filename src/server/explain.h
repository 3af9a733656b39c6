// Explain: what the rules would do with a request, without doing it. Given a
// method, a target, headers and the TCP peer, it answers which route class,
// which client identity and plan, and which limits (parameters, cost, key,
// shadow, failure mode, store-call group) and concurrency limit the request
// would meet, using Policy::Resolve: the same resolution the gateway and
// /v1/auth run. Nothing is consumed; the store is not asked.
//
//   StatusOr<ExplainRequest> r = ParseExplainRequest(nlohmann::json::parse(
//       R"({"method": "GET", "target": "/api/x", "headers": {"X-API-Key": "k"}})"));
//   StatusOr<nlohmann::json> answer = Explain(*policy, *r);   // kInvalidArgument: 400
//
// Served as POST /v1/explain on the admin listener and printed by
// `ratelimitd --explain 'GET /api/x' -H 'X-API-Key: k'` (docs/admin.md).
// A request for /v1/auth with X-Original-Method and X-Original-URI is
// explained as the original request, as /v1/auth decides it.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/ip.h"
#include "policy/policy.h"
#include "ratelimit/status.h"
#include "server/overrides.h"

namespace ratelimit::server {

struct ExplainRequest {
  std::string method = "GET";
  std::string target = "/";
  std::vector<std::pair<std::string, std::string>> headers;  // in order; names may repeat
  std::string peer = "127.0.0.1";                            // the TCP peer's address
};

// "api_key", "user", "ip": how the answers of the admin API name an identity's source.
std::string_view IdentitySourceName(policy::IdentitySource s);

// {"method": "GET", "target": "/api/x?q=1", "headers": {"X-API-Key": "k",
//  "X-Forwarded-For": ["a", "b"]}, "peer": "203.0.113.7"}: every field but
// target optional (method GET, no headers, peer 127.0.0.1). Unknown fields
// and bad values: kInvalidArgument naming the field.
StatusOr<ExplainRequest> ParseExplainRequest(const nlohmann::json& body);

// "GET /api/x" and "Name: value" lines (the command line's form).
StatusOr<ExplainRequest> ParseExplainCommand(std::string_view request_line,
                                             const std::vector<std::string>& header_lines,
                                             std::string_view peer);

// The explanation (docs/admin.md, "Explain"). kInvalidArgument when the
// target cannot be canonicalised (the request would be a 400) or the peer
// is not an address.
// With `overrides`, a client's override in effect at `now_ms` is applied as
// the Enforcer applies it and shown ("override"; its limits say "from":
// "override").
StatusOr<nlohmann::json> Explain(const policy::Policy& policy, const ExplainRequest& request,
                                 const OverrideTable* overrides = nullptr, int64_t now_ms = 0);

// `ratelimitd --explain`: prints Explain's answer for `config` as JSON on
// stdout and returns 0; a config the policy refuses: its error on stderr, 1;
// a bad request: its error on stderr, 2.
int ExplainCommand(policy::Config config, std::string_view request_line,
                   const std::vector<std::string>& header_lines, std::string_view peer);

}  // namespace ratelimit::server
