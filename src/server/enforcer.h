// Enforcer: asks the store about a request's limits and applies the failure
// modes, for the decision API and for the rules in front of an API alike.
//
//   Enforcer enforcer(store, store_config);
//   enforcer.Enforce(policy, std::move(plan), path, [](Outcome o) { ... });
//
// When the store cannot decide (Unavailable, DeadlineExceeded,
// ResourceExhausted, Internal), the group's failure mode decides:
//   open    allowed, degraded
//   closed  blocked with store.closed_status (503 or 429), degraded
//   local   a process-local MemoryStore on the limits divided by
//           store.expected_instances (rounded up, at least 1; a token bucket's
//           refill divided too), degraded
// An InvalidArgument from the store (cost above a limit, key too long) is the
// request's fault: status 400.
//
// Groups of a RequestPlan are asked one after the other; the first
// non-shadow group that denies ends the request (later groups consume
// nothing). Shadow groups are decided and counted but never block.
//
// Every decision is counted in Metrics::Global() (by face, route class, limit
// and outcome; degraded ones by cause; store latency), and every denial goes
// to the sampled "denied" log line and to denials(), the admin API's record.
//
// Thread-safety: all methods may be called from any thread. Callbacks run on
// whatever thread the store completes on (possibly inside the call).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "policy/policy.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/store.h"
#include "server/admin_denials.h"
#include "server/json_log.h"
#include "server/metrics.h"

namespace ratelimit::server {

// One store call's result after the failure mode was applied.
struct GroupOutcome {
  Status error;                // non-OK only for InvalidArgument (answer 400)
  CheckResult result;          // one decision per check (valid when error is OK)
  bool degraded = false;       // the failure mode decided, not the store
  bool failed_closed = false;  // degraded and blocked by failure_mode closed
};

// The outcome for a whole request.
struct Outcome {
  unsigned status = 200;   // 200, 429 (denied), closed_status, 400
  std::string error;       // detail when status is 400 or a closed failure
  bool limited = false;    // some non-shadow limit applied: `decision` is meaningful
  Decision decision;       // the Combine of every non-shadow decision
  std::string limit_name;  // the limit that speaks for the request
  std::chrono::microseconds window{0};
  bool degraded = false;
};

class Enforcer {
 public:
  Enforcer(std::shared_ptr<Store> store, size_t local_max_keys);

  // Decides one group. `key`, `checks` and `route` must stay valid until
  // `done` runs. `face`, `route` (the route class, "" if none) and `shadow`
  // only label the metrics.
  void DecideGroup(std::string_view key, std::span<const LimitCheck> checks,
                   policy::FailureMode mode, const policy::StoreConfig& store_config,
                   std::function<void(GroupOutcome)> done, Face face = Face::kDecisionApi,
                   std::string_view route = {}, bool shadow = false);

  // Decides a whole request plan. `policy` keeps the plan's limits alive.
  void Enforce(std::shared_ptr<const policy::Policy> policy, policy::RequestPlan plan,
               std::string path, Face face, std::function<void(Outcome)> done);

  // The limit of a token bucket or window divided among `instances` (for local).
  static Limit Scaled(const Limit& limit, int instances);

  // A denial: the sampled "denied" log line and the admin record. Called for
  // the decision API's denials; Enforce records its own.
  void RecordDenial(std::string_view key, std::string_view limit, std::string_view path,
                    std::string_view route = {}, bool shadow = false);

  Store& store() { return *store_; }
  AdminDenials& denials() { return denial_record_; }
  // Gives up the enforcer's reference to the store, so that its owner can
  // destroy the store (and let it complete its pending calls, whose callbacks
  // reach this enforcer) while the enforcer still exists. Afterwards no new
  // request may be enforced.
  std::shared_ptr<Store> ReleaseStore() { return std::move(store_); }
  MemoryStore& local_store() { return *local_; }

 private:
  struct Op;
  void Step(std::shared_ptr<Op> op);
  void DecideLocal(std::string_view key, std::span<const LimitCheck> checks, int instances,
                   std::function<void(GroupOutcome)> done);

  std::shared_ptr<Store> store_;
  std::unique_ptr<MemoryStore> local_;
  LogSampler denial_log_{20};
  AdminDenials denial_record_;
  LogSampler degraded_log_{10};
};

}  // namespace ratelimit::server
