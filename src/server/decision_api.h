// DecisionApi: POST /v1/check and POST /v1/check/batch, for any language.
//
//   POST /v1/check
//   {"key": "user:ada", "cost": 1,
//    "limits": [{"name": "burst", "algorithm": "token_bucket", "capacity": 10, "refill_per_second":
//    5},
//               "daily"]}                       // a string names a limit from the config
//   -> 200 (allowed) or 429 (denied)
//   {"allowed": true, "limit": 10, "remaining": 9, "retry_after_ms": 0, "reset_after_ms": 200,
//    "degraded": false, "limits": [{"name": "burst", "allowed": true, ...}, ...]}
//
// `"limit": {...}` (or "limit": "name") is shorthand for a one-element `limits`.
// Unknown fields are rejected (400 naming the field): a typo must not
// silently change a limit. The contract is in docs/http-api.md.
//
// ParseCheck and FormatCheckBody are pure and unit tested; DecisionApi wires
// them to the Enforcer.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "policy/policy.h"
#include "ratelimit/store.h"
#include "server/enforcer.h"
#include "server/reply.h"

namespace ratelimit::server {

inline constexpr size_t kMaxBatchChecks = 100;

// One parsed check. Move-only in spirit: `checks` point into `owned` (whose
// buffer survives a move) or into the Policy (keep it alive).
struct ParsedCheck {
  std::string key;  // as the caller gave it
  // Where its state lives: DecisionApiClient(key), "d:<key>", apart from
  // every key the rules form ("k:", "u:", "ip:", "~all", "envoy:"), so that
  // no caller reaches another face's client by naming its key.
  std::string store_key;
  int64_t cost = 1;
  std::vector<Limit> owned;        // limits defined inline
  std::vector<LimitCheck> checks;  // one per requested limit, in request order
  // "reserve": true (POST /v1/check only): an allowed answer carries a
  // reservation to settle later (server/reservation.h), held for
  // reserve_ttl_ms ("reserve_ttl": "30s"); `limits_json` is the request's
  // limits (JSON text), which the reservation carries.
  bool reserve = false;
  int64_t reserve_ttl_ms = 0;
  std::string limits_json;
};

// Same key, cost and limits (by name and parameters) in the same order.
bool operator==(const ParsedCheck& a, const ParsedCheck& b);

// Validates one check object. `policy` may be null (then named limits are
// unknown). Errors are InvalidArgument with the exact problem, e.g.
// "field 'cost' must be a non-negative integer".
StatusOr<ParsedCheck> ParseCheck(const nlohmann::json& j, const policy::Policy* policy,
                                 size_t max_key_length);

// The same as ParseBody + ParseCheck for the plain bodies most clients send,
// read in place without building a JSON DOM; nullopt for anything else (an
// escape in a string, a float, an unknown or repeated field, any error), which
// the caller then hands to the full parser. Whenever it answers, the answer
// equals the full parser's (the decision API fuzzer checks this).
std::optional<ParsedCheck> FastParseCheck(std::string_view body, const policy::Policy* policy,
                                          size_t max_key_length);

// One inline limit object of the decision API ({"name": "burst", "algorithm":
// "token_bucket", "capacity": 10, "refill_per_second": 5}), validated by
// MakeLimit; errors start with `where`. (Also the admin API's overrides,
// whose limits may also give `prefetch`, which the decision API's inline
// limits do not take: what LimitFields writes reads back.)
StatusOr<Limit> ParseLimitObject(const nlohmann::json& j, const std::string& where);

// Parses a request body (JSON text): the one JSON reader of every body the
// server reads (decision API, concurrency API). Errors as above, "request
// body is not valid JSON: ...", and "member 'key' appears twice in one JSON
// object" (a repeated member is refused, never last-wins).
StatusOr<nlohmann::json> ParseBody(std::string_view body);

// Appends the decision JSON object of `result` to `out` (no allocation beyond `out`).
void AppendCheckBody(const CheckResult& result, std::span<const LimitCheck> checks, bool degraded,
                     std::string& out);
// The same for an Enforcer outcome (its combined decision and every limit's).
void AppendOutcomeBody(const Outcome& o, std::string& out);

class DecisionApi {
 public:
  explicit DecisionApi(Enforcer& enforcer) : enforcer_(enforcer) {}

  // POST /v1/check
  void Check(std::shared_ptr<const policy::Policy> policy, std::string_view body,
             std::string_view path, std::function<void(Reply&&)> done);
  // POST /v1/settle {"reservation": "<id>", "cost": <actual>}: debits or
  // refunds actual - reserved on the reservation's limits, once (issue 21;
  // docs/http-api.md).
  void Settle(std::shared_ptr<const policy::Policy> policy, std::string_view body,
              std::string_view path, std::function<void(Reply&&)> done);
  // POST /v1/check/batch {"checks": [...]} -> 200 {"results": [...]}
  void Batch(std::shared_ptr<const policy::Policy> policy, std::string_view body,
             std::string_view path, std::function<void(Reply&&)> done);

  // An allowed check that asked to reserve: its reservation added (decision_api.cc).
  void AddReservation(std::shared_ptr<struct CheckOp> op, Reply r,
                      std::function<void(Reply&&)> done);

 private:
  Enforcer& enforcer_;
};

}  // namespace ratelimit::server
