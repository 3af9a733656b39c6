#include "server/enforcer.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "core/steady_clock.h"
#include "server/store_factory.h"

namespace ratelimit::server {

using policy::FailureMode;

namespace {

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A limit's metric label: its name, which the config bounds. The decision
// API's requests name their own limits, so there a limit counts as
// kInlineLimitLabel unless `policy` has a named limit of its name (an inline
// limit may take that name only with its very parameters; an override
// keeps the name it replaces): a caller cannot spend the label budget.
std::string_view LimitLabel(Face face, const Limit& limit, const policy::Policy* policy) {
  if (face != Face::kDecisionApi ||
      (policy != nullptr && policy->NamedLimit(limit.name()) != nullptr)) {
    return limit.name();
  }
  return kInlineLimitLabel;
}

// One count per limit of the group.
void CountDecisions(Face face, std::string_view route, bool shadow,
                    std::span<const LimitCheck> checks, const GroupOutcome& g,
                    const policy::Policy* policy) {
  Metrics& m = Metrics::Global();
  for (size_t i = 0; i < checks.size(); ++i) {
    DecisionOutcome o = DecisionOutcome::kAllowed;
    if (g.degraded) {
      o = DecisionOutcome::kDegraded;
    } else if (i < g.result.decisions.size() && !g.result.decisions[i].allowed) {
      o = shadow ? DecisionOutcome::kShadowDenied : DecisionOutcome::kDenied;
    }
    m.Decisions(route, LimitLabel(face, *checks[i].limit, policy)).At(face, o).Inc();
  }
}

std::shared_ptr<Store> Resilient(std::shared_ptr<Store> store, size_t local_max_keys,
                                 ResilientStore*& wrapped) {
  if (store == nullptr || store->decides_failures()) return store;
  auto r = std::make_shared<ResilientStore>(
      std::move(store), ResilientStore::Options{.local_max_keys = local_max_keys,
                                                .on_failure = RateLimitFailureReporter()});
  wrapped = r.get();
  return r;
}

// The combined decision of `decisions` (one per limit of `limits`), and the
// limit whose numbers it carries (it speaks for the request: its name and
// window go into the headers). Found by SpeakerOf: the combined decision
// carries the longest delay of all the limits, so it may equal none of them.
void SetSpeaker(Outcome& o, const Decision& combined, std::span<const Decision> decisions,
                std::span<const LimitOutcome> limits) {
  o.limited = true;
  o.decision = combined;
  if (decisions.empty() || limits.empty()) return;
  const LimitOutcome& speaker = limits[std::min(SpeakerOf(decisions), limits.size() - 1)];
  o.limit_name = speaker.limit->name();
  o.window = speaker.limit->window();
}

// Whether the limit speaking for `o` is one of the route's own (a metered
// route's limits count its unit; plan and global limits count requests).
bool SpeaksForRoute(const Outcome& o, const policy::RouteClass& route) {
  if (!o.limited) return false;
  return std::any_of(route.limits.begin(), route.limits.end(),
                     [&](const policy::RuleLimit& rl) { return rl.limit.name() == o.limit_name; });
}

// Whether a check's cost is above its limit's capacity: the request can
// never be allowed (a metered request's own reservation, or a limit an
// override lowered below the route's cost).
bool NeverFits(const LimitCheck& c) { return c.cost > c.limit->limit(); }

// `result` came from the store asked at cost 0 (the limits' state, nothing
// taken): the checks that can never fit are denied, and so the whole group.
// No wait makes them fit; Retry-After says the limit's whole window (a full
// refill, at least a second), not a time the same request would pass.
void DenyWhatNeverFits(std::span<const LimitCheck> checks, CheckResult& result) {
  for (size_t i = 0; i < checks.size() && i < result.decisions.size(); ++i) {
    if (!NeverFits(checks[i])) continue;
    Decision& d = result.decisions[i];
    d.allowed = false;
    d.delay = std::chrono::microseconds(0);
    d.retry_after = std::max(checks[i].limit->window(), std::chrono::microseconds(1'000'000));
  }
  result.overall = Combine(result.decisions);
}

// What to ask the store about `checks`: the checks themselves, or, when one
// can never fit, all of them at cost 0, copied into `probe` (the limits'
// state, nothing taken; DecideGroupAsking then denies what never fits).
std::span<const LimitCheck> AskedFor(std::span<const LimitCheck> checks,
                                     std::vector<LimitCheck>& probe) {
  if (std::none_of(checks.begin(), checks.end(), NeverFits)) return checks;
  probe.assign(checks.begin(), checks.end());
  for (LimitCheck& c : probe) c.cost = 0;
  return probe;
}

bool AllRefundable(const policy::CheckGroup& g) {
  return std::all_of(g.checks.begin(), g.checks.end(),
                     [](const LimitCheck& c) { return c.limit->settleable(); });
}

}  // namespace

void OrderForDecision(std::vector<policy::CheckGroup>& groups) {
  std::stable_partition(groups.begin(), groups.end(), AllRefundable);
}

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kAllowed: return "allowed";
    case Verdict::kOverLimit: return "over_limit";
    case Verdict::kFailedClosed: return "failed_closed";
    case Verdict::kStoreError: return "store_error";
    case Verdict::kBadRequest: return "bad_request";
  }
  return "bad_request";
}

void Enforcer::RecordDenial(std::string_view key, std::string_view limit, std::string_view path,
                            std::string_view route, bool shadow) {
  denial_record_.Record(DenialEntry{.unix_ms = UnixMillis(),
                                    .key = std::string(key),
                                    .route = std::string(route),
                                    .limit = std::string(limit),
                                    .path = std::string(path),
                                    .shadow = shadow});
  if (!denial_log_.AdmitAndReport()) {
    Metrics::Global().denial_log_suppressed.Inc();
    return;
  }
  const std::string shown_limit = shadow ? "shadow:" + std::string(limit) : std::string(limit);
  Log(Level::kInfo, "denied", {{"key", RedactKey(key)}, {"limit", shown_limit}, {"path", path}});
}

Enforcer::Enforcer(std::shared_ptr<Store> store, size_t local_max_keys)
    : store_(Resilient(std::move(store), local_max_keys, wrapped_)) {}

void Enforcer::DecideGroup(std::string_view key, std::span<const LimitCheck> checks,
                           FailureMode mode, const policy::StoreConfig& store_config,
                           std::function<void(GroupOutcome)> done, Face face,
                           std::string_view route, bool shadow) {
  DecideGroupAsking(key, checks, checks, mode, store_config, std::move(done), face, route, shadow);
}

void Enforcer::DecideGroupAsking(std::string_view key, std::span<const LimitCheck> checks,
                                 std::span<const LimitCheck> asked, FailureMode mode,
                                 const policy::StoreConfig& store_config,
                                 std::function<void(GroupOutcome)> done, Face face,
                                 std::string_view route, bool shadow,
                                 const policy::Policy* policy) {
  const auto started = core::SteadyClock::now();
  const CheckRequest request{
      .key = key,
      .checks = asked,
      .on_failure = {.mode = mode, .expected_instances = store_config.expected_instances}};
  const bool probed = asked.data() != checks.data();
  store_->Check(request, [face, route, shadow, checks, probed, started, policy,
                          done = std::move(done)](StatusOr<CheckResult> r) mutable {
    Metrics::Global().store_latency.Observe(
        std::chrono::duration_cast<std::chrono::microseconds>(core::SteadyClock::now() - started));
    GroupOutcome g;
    if (r.ok()) {
      g.degraded = r->degraded;
      g.failed_closed = r->failed_closed;
      g.result = *std::move(r);
      if (probed) DenyWhatNeverFits(checks, g.result);
      // The Envoy face's limit names are per-value hashes: it counts per
      // descriptor itself, with labels from its config (bounded).
      if (face != Face::kEnvoy) CountDecisions(face, route, shadow, checks, g, policy);
    } else {
      g.error = r.status();
    }
    done(std::move(g));
  });
}

struct Enforcer::Op {
  std::shared_ptr<const policy::Policy> policy;
  policy::RequestPlan plan;
  std::string path;
  size_t next = 0;
  std::vector<LimitOutcome> limits;  // every non-shadow decision so far
  std::vector<LimitCheck> probe;     // the group being decided, at cost 0 (NeverFits)
  // Per group: its checks took their costs from the store (not a shadow
  // group that denied, not a degraded one), so that there is something to settle.
  std::vector<bool> taken;
  bool degraded = false;
  Face face = Face::kGateway;
  std::shared_ptr<const OverrideTable> overrides;  // when one applied: its limits live here
  std::function<void(Outcome&&)> done;

  std::string_view route() const {
    return plan.route != nullptr ? std::string_view(plan.route->name) : std::string_view();
  }

  // The route's limits of every group that took its costs, shadow ones too,
  // as checked: what the gateway settles. A group that took nothing has
  // nothing to settle: a settlement would refund what was never taken.
  // Only the groups under the route's key hold the route's limits (a plan or
  // global limit of the same name under the client's key when the route is
  // keyed by IP is charged its own cost, 1, and is not settled); in those a
  // name is checked once, so it is matched by name: an override may have
  // replaced the limit by its own of that name.
  void Charge(Outcome& o) {
    const bool by_ip = plan.route->key_by == policy::RouteClass::KeyBy::kIp &&
                       plan.identity.source != policy::IdentitySource::kIp;
    const std::string& route_key = by_ip ? plan.identity.ip_key : plan.identity.key;
    for (size_t i = 0; i < plan.groups.size(); ++i) {
      if (i >= taken.size() || !taken[i]) continue;
      const policy::CheckGroup& g = plan.groups[i];
      if (g.key != route_key) continue;
      ChargedGroup charged{.key = g.key, .checks = {}, .failure_mode = g.failure_mode};
      for (const LimitCheck& c : g.checks) {
        for (const policy::RuleLimit& rl : plan.route->limits) {
          if (rl.limit.name() == c.limit->name()) {
            charged.checks.push_back(c);
            break;
          }
        }
      }
      if (!charged.checks.empty()) o.charged.push_back(std::move(charged));
    }
    if (o.charged.empty()) return;
    o.charged_policy = policy;
    o.metered = &*plan.route->metered;
  }

  void Finish(Verdict verdict, std::string error = {}) {
    Outcome o;
    o.verdict = verdict;
    o.error = std::move(error);
    o.degraded = degraded;
    if (!limits.empty()) {
      std::vector<Decision> decisions;
      decisions.reserve(limits.size());
      for (const LimitOutcome& l : limits) decisions.push_back(l.decision);
      SetSpeaker(o, Combine(decisions), decisions, limits);
    }
    o.limits = std::move(limits);
    o.overrides = std::move(overrides);
    if (plan.route != nullptr && plan.route->metered) {
      if (!plan.route->metered->unit.empty() && SpeaksForRoute(o, *plan.route)) {
        o.unit = plan.route->metered->unit;
      }
      if (verdict == Verdict::kAllowed) Charge(o);
    }
    auto cb = std::move(done);
    cb(std::move(o));
  }
};

void Enforcer::Enforce(std::shared_ptr<const policy::Policy> policy, policy::RequestPlan plan,
                       std::string path, Face face, std::function<void(Outcome&&)> done) {
  auto op = std::make_shared<Op>();
  op->face = face;
  op->policy = std::move(policy);
  op->plan = std::move(plan);
  op->path = std::move(path);
  op->done = std::move(done);
  if (overrides_ != nullptr && !overrides_->empty()) {
    std::shared_ptr<const OverrideTable> table = overrides_->table();
    if (const ClientOverride* o = table->Find(op->plan.identity.key, overrides_->NowMillis())) {
      ApplyOverride(*o, *op->policy, op->plan);
      op->overrides = std::move(table);
    }
  }
  OrderForDecision(op->plan.groups);
  Step(std::move(op));
}

void Enforcer::Check(std::string_view key, std::span<const LimitCheck> checks,
                     const policy::Policy& policy, std::string_view path, Face face,
                     std::function<void(Outcome&&)> done) {
  if (face == Face::kDecisionApi) {
    std::shared_ptr<const OverrideTable> table;
    if (const ClientOverride* o = DecisionOverride(key, table)) {
      struct Overridden {
        std::shared_ptr<const OverrideTable> table;
        std::vector<LimitCheck> checks;
        std::vector<LimitCheck> probe;  // at cost 0, when a cost is above an overridden capacity
      };
      auto held = std::make_shared<Overridden>(
          Overridden{std::move(table), std::vector<LimitCheck>(checks.begin(), checks.end()), {}});
      ApplyOverrideLimits(*o, held->checks);
      // The caller's cost fitted its own limit (else the request is refused
      // as it is, 400): an override that lowered the capacity below it denies
      // the request (429), as the gateway does, instead of calling it bad.
      const std::span<const LimitCheck> asked = std::any_of(checks.begin(), checks.end(), NeverFits)
                                                    ? std::span<const LimitCheck>(held->checks)
                                                    : AskedFor(held->checks, held->probe);
      return CheckLimits(key, held->checks, asked, policy, path, face,
                         [held, done = std::move(done)](Outcome out) {
                           out.overrides = held->table;
                           done(std::move(out));
                         });
    }
  }
  CheckLimits(key, checks, checks, policy, path, face, std::move(done));
}

const ClientOverride* Enforcer::DecisionOverride(
    std::string_view key, std::shared_ptr<const OverrideTable>& table) const {
  if (overrides_ == nullptr || overrides_->empty()) return nullptr;
  table = overrides_->table();
  return table->Find(key, overrides_->NowMillis());  // "d:<key>": FindDecisionKey
}

std::shared_ptr<const OverrideTable> Enforcer::ApplyDecisionOverride(
    std::string_view key, std::vector<LimitCheck>& checks) const {
  std::shared_ptr<const OverrideTable> table;
  const ClientOverride* o = DecisionOverride(key, table);
  if (o == nullptr) return nullptr;
  ApplyOverrideLimits(*o, checks);
  return table;
}

void Enforcer::CheckLimits(std::string_view key, std::span<const LimitCheck> checks,
                           std::span<const LimitCheck> asked, const policy::Policy& policy,
                           std::string_view path, Face face, std::function<void(Outcome&&)> done) {
  const policy::StoreConfig& store_config = policy.config().store;
  DecideGroupAsking(
      key, checks, asked, store_config.failure_mode, store_config,
      [this, key, checks, path, done = std::move(done)](GroupOutcome g) {
        Outcome o;
        if (!g.error.ok()) {
          o.verdict = IsStoreFailure(g.error) ? Verdict::kStoreError : Verdict::kBadRequest;
          o.error = o.verdict == Verdict::kStoreError
                        ? "the rate limit store is unavailable: " + g.error.message()
                        : g.error.message();
          return done(std::move(o));
        }
        o.degraded = g.degraded;
        o.limits.reserve(checks.size());
        for (size_t i = 0; i < checks.size() && i < g.result.decisions.size(); ++i) {
          o.limits.push_back({checks[i].limit, g.result.decisions[i]});
        }
        SetSpeaker(o, g.result.overall, g.result.decisions, o.limits);
        if (g.failed_closed) {
          o.verdict = Verdict::kFailedClosed;
          o.error = "the rate limit store is unavailable";
        } else if (!g.result.overall.allowed) {
          o.verdict = Verdict::kOverLimit;
          // A decision-API key is its store key, "d:<key>", as the admin API names it.
          RecordDenial(key, o.limit_name, path);
        }
        done(std::move(o));
      },
      face, /*route=*/{}, /*shadow=*/false, &policy);
}

namespace {

// The name of the limit that denied a group (its first check whose decision
// is a denial), for the denials list, the log line and the metric's label;
// the group's first limit if no decision says so.
std::string_view DenyingLimit(std::span<const LimitCheck> checks,
                              const std::vector<Decision>& decisions) {
  for (size_t i = 0; i < decisions.size() && i < checks.size(); ++i) {
    if (!decisions[i].allowed) return checks[i].limit->name();
  }
  return checks.front().limit->name();
}

}  // namespace

void Enforcer::Refuse(std::shared_ptr<Op> op, Verdict verdict, std::string error) {
  // Per group that took its costs: minus them, on the limits that can be
  // settled (OrderForDecision put the others last: they took nothing unless
  // two groups hold such limits).
  struct Refunds {
    std::vector<std::vector<LimitSettle>> groups;
    std::vector<size_t> index;  // each one's group in op->plan.groups
    std::atomic<size_t> pending{0};
    Verdict verdict;
    std::string error;
  };
  auto refunds = std::make_shared<Refunds>();
  refunds->verdict = verdict;
  refunds->error = std::move(error);
  for (size_t i = 0; i < op->taken.size() && i < op->plan.groups.size(); ++i) {
    if (!op->taken[i]) continue;
    std::vector<LimitSettle> settlements;
    for (const LimitCheck& c : op->plan.groups[i].checks) {
      if (c.cost > 0 && c.limit->settleable()) settlements.push_back({c.limit, -c.cost});
    }
    if (settlements.empty()) continue;
    refunds->groups.push_back(std::move(settlements));
    refunds->index.push_back(i);
  }
  if (refunds->groups.empty() || store_ == nullptr) {
    return op->Finish(refunds->verdict, std::move(refunds->error));
  }
  refunds->pending = refunds->groups.size();
  for (size_t j = 0; j < refunds->groups.size(); ++j) {
    const policy::CheckGroup& g = op->plan.groups[refunds->index[j]];
    // Failure mode error: a refund the store cannot apply is lost (what it
    // was to give back stays taken); none goes to the local fallback, which
    // took nothing. Whatever the answer, the verdict stands.
    store_->Settle(SettleRequest{.key = g.key,
                                 .settlements = refunds->groups[j],
                                 .on_failure = {.mode = FailureMode::kError}},
                   [op, refunds](const StatusOr<CheckResult>& /*answer*/) {
                     if (refunds->pending.fetch_sub(1) != 1) return;
                     op->Finish(refunds->verdict, std::move(refunds->error));
                   });
  }
}

void Enforcer::Step(std::shared_ptr<Op> op) {
  if (op->next == op->plan.groups.size()) return op->Finish(Verdict::kAllowed);
  const size_t index = op->next++;
  const policy::CheckGroup& group = op->plan.groups[index];
  // A cost above a limit's capacity is a denial like any other (429, or
  // nothing in a shadow group), not a bad request: the store is asked for the
  // group's state at cost 0, so that nothing is taken and the answer has the
  // limits' numbers.
  DecideGroupAsking(
      group.key, group.checks, AskedFor(group.checks, op->probe), group.failure_mode,
      op->policy->config().store,
      [this, op, index, &group](const GroupOutcome& g) {
        if (!g.error.ok()) {
          if (IsStoreFailure(g.error)) {
            return Refuse(op, Verdict::kStoreError,
                          "the rate limit store is unavailable: " + g.error.message());
          }
          return Refuse(op, Verdict::kBadRequest, g.error.message());
        }
        op->degraded = op->degraded || g.degraded;
        op->taken.resize(op->plan.groups.size());
        // A degraded group took nothing from the store (open), or took it
        // from this instance's fallback (local): like the decision API, which
        // issues no reservation for a degraded answer, the gateway settles
        // nothing for it.
        op->taken[index] = g.result.overall.allowed && !g.degraded;
        const std::vector<Decision>& ds = g.result.decisions;
        if (group.shadow) {
          if (!g.result.overall.allowed) {
            RecordDenial(group.key, DenyingLimit(group.checks, ds), op->path, op->route(),
                         /*shadow=*/true);
          }
          return Step(op);
        }
        for (size_t i = 0; i < ds.size() && i < group.checks.size(); ++i) {
          op->limits.push_back({group.checks[i].limit, ds[i]});
        }
        if (g.failed_closed) {
          return Refuse(op, Verdict::kFailedClosed, "the rate limit store is unavailable");
        }
        if (!g.result.overall.allowed) {
          RecordDenial(group.key, DenyingLimit(group.checks, ds), op->path, op->route());
          return Refuse(op, Verdict::kOverLimit);
        }
        Step(op);
      },
      op->face, op->route(), group.shadow);
}

}  // namespace ratelimit::server
