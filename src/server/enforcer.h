// Enforcer: asks the store about a request's limits and says what came of
// it, in no protocol: every face (decision API, gateway, auth_request, gRPC)
// renders the same Outcome in its own (HTTP: outcome_reply.h).
//
//   Enforcer enforcer(store, local_max_keys);
//   enforcer.Enforce(policy, std::move(plan), path, Face::kGateway, [](Outcome o) {
//     switch (o.verdict) { case Verdict::kAllowed: ...; case Verdict::kOverLimit: ...; }
//   });
//
// The store is a ResilientStore (src/store/resilient_store.h; the enforcer
// wraps a plain one itself): when it cannot decide, the group's failure mode
// does (open, closed, local, error); the enforcer only passes the mode along.
// An InvalidArgument from the store (key too long; the decision API's cost
// above a limit) is the request's fault: Verdict::kBadRequest. A request plan's
// cost above a limit's capacity (Enforce) is a denial: it can never fit.
//
// Groups of a RequestPlan are asked one after the other; the first
// non-shadow group that denies ends the request (later groups consume
// nothing), and what the groups before it took is given back (one
// Store::Settle per such group, at minus its costs, before the answer): a
// request that is not allowed (denied, failed closed, a store error, a bad
// request) consumes from none of its limits, as one group's store call
// takes nothing when it denies. Shadow groups are decided and counted but
// never block; a shadow group before the denying one is given back too.
// Sliding logs and calendar quotas cannot be settled: OrderForDecision asks
// the groups holding one last, so that no later group can deny after they
// took (only when two groups hold such limits does the earlier one keep
// what it took). A refund that fails changes nothing about the answer (what
// it was to give back stays taken); a degraded group took nothing from the
// store and is given nothing back. Racing requests may meet a unit taken by
// a request that is about to give it back (an over-denial for a round trip,
// never an over-admission); a window's refund arriving in the next window
// is taken from that one's count (Store::Settle).
//
// Every decision is counted in Metrics::Global() (by face, route class, limit
// and outcome; store latency), and every denial, whatever the face, goes to
// the sampled "denied" log line and to denials(), the admin API's record.
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
#include "server/overrides.h"
#include "store/resilient_store.h"

namespace ratelimit::server {

// One store call's result after the failure mode was applied.
struct GroupOutcome {
  Status error;                // non-OK for InvalidArgument (a bad request) and, with
                               // failure mode error, for the store's failure
  CheckResult result;          // one decision per check (valid when error is OK)
  bool degraded = false;       // the failure mode decided, not the store
  bool failed_closed = false;  // degraded and blocked by failure_mode closed
};

// What came of a request, in no protocol.
enum class Verdict {
  kAllowed,       // every limit allowed (possibly with a delay: decision.delay)
  kOverLimit,     // a limit denied: decision says when to retry
  kFailedClosed,  // the store could not decide and the failure mode is closed
  kStoreError,    // the store could not decide and the failure mode is error
  kBadRequest,    // the request cannot be decided (error says why)
};
std::string_view VerdictName(Verdict v);  // "allowed", "over_limit", ...

// One limit's decision. `limit` points at the request's limit (the policy's
// or the caller's): valid while those live.
struct LimitOutcome {
  const Limit* limit = nullptr;
  Decision decision;
};

// A metered route's limits in one group, as checked (issue 21): the gateway
// settles them after the response (server/metering.h). `checks` carry the
// reserved cost; their limits live in Outcome::charged_policy or overrides.
struct ChargedGroup {
  std::string key;
  std::vector<LimitCheck> checks;
  policy::FailureMode failure_mode = policy::FailureMode::kOpen;
};

struct Outcome {
  Verdict verdict = Verdict::kAllowed;
  std::string error;       // kBadRequest, kFailedClosed, kStoreError: what went wrong
  bool limited = false;    // some non-shadow limit applied: `decision` is meaningful
  Decision decision;       // the Combine of every non-shadow decision
  std::string limit_name;  // the limit that speaks for the request (its numbers are decision's)
  std::chrono::microseconds window{0};  // that limit's window (Limit::window())
  // What that limit counts when not requests (a metered route's `unit`, e.g.
  // "tokens": RateLimit-Policy's qu); empty: requests.
  std::string unit;
  bool degraded = false;             // a failure mode decided some group
  std::vector<LimitOutcome> limits;  // every non-shadow limit asked, in order
  // When a client's override applied: the table its limits (in `limits`) live in.
  std::shared_ptr<const OverrideTable> overrides;
  // Allowed requests on a route with a metered cost (RouteClass::metered):
  // the route's limits per group that took the reservation from the store
  // (none of a degraded group or a denying shadow one), and the policy that
  // holds them and the cost.
  std::vector<ChargedGroup> charged;
  std::shared_ptr<const policy::Policy> charged_policy;
  const policy::MeteredCost* metered = nullptr;  // the route's, in charged_policy

  bool allowed() const { return verdict == Verdict::kAllowed; }
};

// The order in which Enforce decides a plan's groups: as planned, except
// that the groups holding a limit whose take cannot be given back (a sliding
// log, a calendar quota: Store::Settle refuses them) come after the others.
// Stable: it keeps the order among those and among the others.
void OrderForDecision(std::vector<policy::CheckGroup>& groups);

class Enforcer {
 public:
  // `store` is used as it is when it decides_failures() (MakeStore's), and
  // is wrapped in a ResilientStore with a local fallback of `local_max_keys`
  // otherwise.
  Enforcer(std::shared_ptr<Store> store, size_t local_max_keys);

  // Decides one group. `key`, `checks` and `route` must stay valid until
  // `done` runs. `face`, `route` (the route class, "" if none) and `shadow`
  // only label the metrics. Records no denial (Check and Enforce do).
  void DecideGroup(std::string_view key, std::span<const LimitCheck> checks,
                   policy::FailureMode mode, const policy::StoreConfig& store_config,
                   std::function<void(GroupOutcome)> done, Face face = Face::kDecisionApi,
                   std::string_view route = {}, bool shadow = false);

  // Decides a whole request plan. `policy` keeps the plan's limits alive.
  void Enforce(std::shared_ptr<const policy::Policy> policy, policy::RequestPlan plan,
               std::string path, Face face, std::function<void(Outcome&&)> done);

  // Decides one group of limits for a face without routes (the decision
  // API): `policy`'s store failure mode, the denial recorded under `path`;
  // the metrics label a limit by its name only when `policy` has a named
  // limit of that name (others: kInlineLimitLabel). `key` is the store key,
  // for the decision API the caller's key as the admin API names it
  // (DecisionApiClient: "d:<key>"), under which its override is found and
  // its denials are recorded. `policy`, `key` and `checks` must stay valid
  // until `done` runs.
  void Check(std::string_view key, std::span<const LimitCheck> checks, const policy::Policy& policy,
             std::string_view path, Face face, std::function<void(Outcome&&)> done);

  // Replaces `checks`' limits with those of the override in effect now for
  // the decision-API store key `key` ("d:<key>"), as Check does: the table
  // the replaced limits live in (keep it alive with `checks`), or nullptr
  // when none applied.
  std::shared_ptr<const OverrideTable> ApplyDecisionOverride(std::string_view key,
                                                             std::vector<LimitCheck>& checks) const;

  // The limit of a token bucket or window divided among `instances` (for local).
  static Limit Scaled(const Limit& limit, int instances) {
    return ResilientStore::Scaled(limit, instances);
  }

  // A denial: the sampled "denied" log line and the admin record. The
  // enforcer records the denials of rate limits itself; the concurrency
  // limits' (decided elsewhere) come here too.
  void RecordDenial(std::string_view key, std::string_view limit, std::string_view path,
                    std::string_view route = {}, bool shadow = false);

  Store& store() { return *store_; }
  bool has_store() const { return store_ != nullptr; }  // false once ReleaseStore ran
  AdminDenials& denials() { return denial_record_; }
  // The per-client overrides applied to every request (Enforce: the
  // identity's, Check: the decision-API key's "d:<key>"); nullptr: none.
  // Set before the first request; not owned.
  void SetOverrides(Overrides* overrides) { overrides_ = overrides; }
  Overrides* overrides() const { return overrides_; }
  // Gives up the enforcer's reference to the store, so that its owner can
  // destroy the store (and let it complete its pending calls, whose callbacks
  // reach this enforcer) while the enforcer still exists. Afterwards no new
  // request may be enforced.
  std::shared_ptr<Store> ReleaseStore() { return std::move(store_); }
  // The local fallback of the ResilientStore the enforcer made.
  // REQUIRES: the enforcer was given a plain store (tests).
  MemoryStore& local_store() { return wrapped_->local_store(); }

 private:
  struct Op;
  void Step(std::shared_ptr<Op> op);
  // Finishes `op` with `verdict` (not allowed) once what its groups took is
  // given back (Op::taken; Store::Settle, failure mode error).
  void Refuse(std::shared_ptr<Op> op, Verdict verdict, std::string error = {});
  // The override in effect now for the decision-API store key `key`
  // ("d:<key>"; it lives in `table`), or nullptr.
  const ClientOverride* DecisionOverride(std::string_view key,
                                         std::shared_ptr<const OverrideTable>& table) const;
  // DecideGroup asking the store about `asked` (the same limits, other costs)
  // and deciding `checks`: when they differ, the checks that can never fit are
  // denied (DenyWhatNeverFits). `policy`: the decision API's, whose named
  // limits label the metrics (Check); nullptr elsewhere.
  void DecideGroupAsking(std::string_view key, std::span<const LimitCheck> checks,
                         std::span<const LimitCheck> asked, policy::FailureMode mode,
                         const policy::StoreConfig& store_config,
                         std::function<void(GroupOutcome)> done, Face face, std::string_view route,
                         bool shadow, const policy::Policy* policy = nullptr);
  // Check, once any override was applied to `checks`, asking the store
  // about `asked` (DecideGroupAsking).
  void CheckLimits(std::string_view key, std::span<const LimitCheck> checks,
                   std::span<const LimitCheck> asked, const policy::Policy& policy,
                   std::string_view path, Face face, std::function<void(Outcome&&)> done);

  ResilientStore* wrapped_ =
      nullptr;                    // store_, when the enforcer wrapped it (set by store_'s init)
  std::shared_ptr<Store> store_;  // decides failures
  Overrides* overrides_ = nullptr;
  LogSampler denial_log_{20, "denials suppressed"};
  AdminDenials denial_record_;
};

}  // namespace ratelimit::server
