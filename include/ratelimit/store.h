// Store: where limit state lives and where decisions are made atomically.
//
// A store decides all the limits of one request for one client key at once,
// all or nothing: the request is allowed only if every limit allows it, and a
// denied request consumes from none of them. Implementations: MemoryStore
// (one process), RedisStore (shared by every instance; one Lua script call).
//
//   LimitCheck checks[] = {{&burst, 1}, {&daily, 1}};
//   store.Check({"user:ada", checks}, [](StatusOr<CheckResult> r) { ... });
//
// A non-OK status means the store could not decide (unreachable, deadline,
// full, bad request); callers turn it into a decision by their failure policy.
//
// Thread-safety: every method may be called from any thread concurrently.
// `done` is called exactly once, either before Check returns (MemoryStore) or
// later on a store thread (RedisStore); it must not block.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.h"
#include "ratelimit/limit.h"
#include "ratelimit/status.h"

namespace ratelimit {

struct LimitCheck {
  const Limit* limit = nullptr;  // not owned; read only during the call
  int64_t cost = 1;              // 0 asks without consuming
};

struct CheckRequest {
  std::string_view key;                // the client's identity, e.g. "user:ada"
  std::span<const LimitCheck> checks;  // at least one
};

struct CheckResult {
  Decision overall;                 // Combine(decisions)
  std::vector<Decision> decisions;  // one per check, in request order
};

using CheckCallback = std::function<void(StatusOr<CheckResult>)>;
using ResetCallback = std::function<void(Status)>;

class Store {
 public:
  virtual ~Store() = default;

  // Decides and, when allowed, consumes. The request is read only during the call.
  virtual void Check(const CheckRequest& request, CheckCallback done) = 0;
  // The current state as a cost-0 check would report it; never creates state.
  virtual void Peek(const CheckRequest& request, CheckCallback done) = 0;
  // Forgets the state of `key` for these limits (a full bucket afterwards).
  virtual void Reset(std::string_view key, std::span<const Limit* const> limits,
                     ResetCallback done) = 0;

  // Blocking conveniences for tools and tests. REQUIRES: not called on a
  // thread that the store needs to complete the call (e.g. its I/O thread).
  StatusOr<CheckResult> CheckSync(const CheckRequest& request);
  StatusOr<CheckResult> PeekSync(const CheckRequest& request);
  Status ResetSync(std::string_view key, std::span<const Limit* const> limits);
};

// Validates a request before it reaches any store: key length, at least one
// check, each cost in [0, limit]. Stores call it; callers may too.
Status ValidateRequest(const CheckRequest& request, size_t max_key_length);

// The largest key accepted by default (bytes).
inline constexpr size_t kDefaultMaxKeyLength = 512;
// The largest number of limits in one request.
inline constexpr size_t kMaxChecksPerRequest = 16;

}  // namespace ratelimit
