// ConcurrencyApi: POST /v1/acquire, /v1/release and /v1/renew, the decision
// API of concurrency limits (contract in docs/http-api.md, "Concurrency").
//
//   POST /v1/acquire {"key": "user:ada", "name": "upload", "max_in_flight": 3, "lease_ttl": "30s"}
//   POST /v1/acquire {"key": "user:ada", "route": "upload"}  // the route's concurrency settings
//   -> 200 {"acquired": true, "lease_id": "9f...", "in_flight": 1, "max_in_flight": 3,
//           "lease_ttl_ms": 30000, "retry_after_ms": 0, "degraded": false}
//   -> 429 {"acquired": false, "in_flight": 3, "max_in_flight": 3, "retry_after_ms": 1000, ...}
//   POST /v1/renew {"key": "user:ada", "name": "upload", "lease_id": "9f...", "lease_ttl": "30s"}
//   -> 200 {"renewed": true, "lease_ttl_ms": 30000}   (it now expires lease_ttl from now)
//   -> 200 {"renewed": false}   (not held: released, or expired: acquire again)
//   POST /v1/release {"key": "user:ada", "name": "upload", "lease_id": "9f..."}
//   -> 200 {"released": true}   (false: not held: released before, or expired)
//   -> 400 when lease_id is not of the form /v1/acquire hands out
//   -> 503 (renew, release) the store could not be reached: the lease keeps
//          its expiry; ask again
//
// The caller holds the lease until it releases it or lease_ttl passes
// without a renewal: a caller renewing every third of lease_ttl while it
// works may take a short lease_ttl, so that its place frees soon after a crash.
// Unknown fields and bad values are 400 problem+json naming the field.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "policy/policy.h"
#include "server/concurrency_guard.h"
#include "server/enforcer.h"
#include "server/reply.h"

namespace ratelimit::server {

// A parsed acquire (or release, renew: then lease_id is set and the limits
// unused but a renewal's lease_ttl).
// request.key is the store key: the caller's key (1..store.max_key_length
// bytes) as the admin API names it, DecisionApiClient(key) = "d:<key>".
struct ParsedAcquire {
  ConcurrencyRequest request;
  std::string lease_id;
};

// Pure: validate a /v1/acquire body (`policy` resolves "route"; may be null).
StatusOr<ParsedAcquire> ParseAcquire(const nlohmann::json& j, const policy::Policy* policy);
// Pure: validate a /v1/release body.
StatusOr<ParsedAcquire> ParseRelease(const nlohmann::json& j, const policy::Policy* policy);
// Pure: validate a /v1/renew body. request.config.lease_ttl is the renewal's:
// the body's, else the route's (a route still configured with concurrency),
// else the default /v1/acquire takes.
StatusOr<ParsedAcquire> ParseRenew(const nlohmann::json& j, const policy::Policy* policy);

class ConcurrencyApi {
 public:
  ConcurrencyApi(ConcurrencyLimiter& limiter, Enforcer& enforcer)
      : limiter_(limiter), enforcer_(enforcer) {}

  void Acquire(std::shared_ptr<const policy::Policy> policy, std::string_view body,
               std::string_view path, std::function<void(Reply&&)> done);
  void Release(std::shared_ptr<const policy::Policy> policy, std::string_view body,
               std::string_view path, std::function<void(Reply&&)> done);
  void Renew(std::shared_ptr<const policy::Policy> policy, std::string_view body,
             std::string_view path, std::function<void(Reply&&)> done);

 private:
  ConcurrencyLimiter& limiter_;
  Enforcer& enforcer_;
};

}  // namespace ratelimit::server
