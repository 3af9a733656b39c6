#include "server/enforcer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "ratelimit/circuit_breaker.h"

namespace ratelimit::server {

using policy::FailureMode;

namespace {

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One count per limit of the group.
void CountDecisions(Face face, std::string_view route, bool shadow,
                    std::span<const LimitCheck> checks, const GroupOutcome& g) {
  Metrics& m = Metrics::Global();
  for (size_t i = 0; i < checks.size(); ++i) {
    DecisionOutcome o = DecisionOutcome::kAllowed;
    if (g.degraded) {
      o = DecisionOutcome::kDegraded;
    } else if (i < g.result.decisions.size() && !g.result.decisions[i].allowed) {
      o = shadow ? DecisionOutcome::kShadowDenied : DecisionOutcome::kDenied;
    }
    m.Decisions(route, checks[i].limit->name()).At(face, o).Inc();
  }
}

}  // namespace

void Enforcer::RecordDenial(std::string_view key, std::string_view limit, std::string_view path,
                            std::string_view route, bool shadow) {
  denial_record_.Record(DenialEntry{.unix_ms = UnixMillis(),
                                    .key = std::string(key),
                                    .route = std::string(route),
                                    .limit = std::string(limit),
                                    .path = std::string(path),
                                    .shadow = shadow});
  int64_t suppressed = 0;
  if (!denial_log_.Admit(suppressed)) {
    Metrics::Global().denial_log_suppressed.Inc();
    return;
  }
  if (suppressed > 0) Log(Level::kWarn, "denials suppressed", {{"count", suppressed}});
  const std::string shown_limit = shadow ? "shadow:" + std::string(limit) : std::string(limit);
  Log(Level::kInfo, "denied", {{"key", RedactKey(key)}, {"limit", shown_limit}, {"path", path}});
}

Enforcer::Enforcer(std::shared_ptr<Store> store, size_t local_max_keys)
    : store_(std::move(store)),
      local_(std::make_unique<MemoryStore>(MemoryStore::Options{.max_keys = local_max_keys})) {}

Limit Enforcer::Scaled(const Limit& limit, int instances) {
  if (instances <= 1) return limit;
  const int64_t n = instances;
  const int64_t count = std::max<int64_t>(1, (limit.limit() + n - 1) / n);
  StatusOr<Limit> out = Status(StatusCode::kInternal, "unreachable");
  switch (limit.algorithm()) {
    case Algorithm::kTokenBucket:
      out = Limit::TokenBucket(limit.name(), count,
                               limit.refill_per_second() / static_cast<double>(n));
      break;
    case Algorithm::kLeakyBucket:
      out = Limit::LeakyBucket(limit.name(), count,
                               limit.refill_per_second() / static_cast<double>(n));
      break;
    case Algorithm::kFixedWindow:
      out = Limit::FixedWindow(limit.name(), count, limit.window());
      break;
    case Algorithm::kSlidingWindow:
      out = Limit::SlidingWindow(limit.name(), count, limit.window());
      break;
    case Algorithm::kSlidingLog:
      out = Limit::SlidingLog(limit.name(), count, limit.window());
      break;
  }
  return out.ok() ? *out : limit;  // a refill too slow to express: keep the full limit
}

void Enforcer::DecideLocal(std::string_view key, std::span<const LimitCheck> checks, int instances,
                           std::function<void(GroupOutcome)> done) {
  std::vector<Limit> scaled;
  scaled.reserve(checks.size());
  for (const LimitCheck& c : checks) scaled.push_back(Scaled(*c.limit, instances));
  std::vector<LimitCheck> local_checks;
  local_checks.reserve(checks.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    local_checks.push_back({&scaled[i], std::min(checks[i].cost, scaled[i].limit())});
  }
  StatusOr<CheckResult> r = local_->Decide({key, local_checks});
  GroupOutcome out;
  out.degraded = true;
  if (r.ok()) {
    out.result = std::move(*r);
  } else {
    // The local store is full too: nothing left to decide with; let it through.
    out.result.decisions.assign(checks.size(), Decision{.allowed = true});
    for (size_t i = 0; i < checks.size(); ++i)
      out.result.decisions[i].limit = checks[i].limit->limit();
    out.result.overall = Combine(out.result.decisions);
  }
  done(std::move(out));
}

void Enforcer::DecideGroup(std::string_view key, std::span<const LimitCheck> checks,
                           FailureMode mode, const policy::StoreConfig& store_config,
                           std::function<void(GroupOutcome)> inner_done, Face face,
                           std::string_view route, bool shadow) {
  const int instances = store_config.expected_instances;
  const auto started = std::chrono::steady_clock::now();
  // Counts the group's decisions on the way out.
  auto done = [inner_done = std::move(inner_done), face, route, shadow,
               checks](GroupOutcome g) mutable {
    // The Envoy face's limit names are per-value hashes: it counts per
    // descriptor itself, with labels from its config (bounded).
    if (g.error.ok() && face != Face::kEnvoy) CountDecisions(face, route, shadow, checks, g);
    inner_done(std::move(g));
  };
  store_->Check({key, checks}, [this, key, checks, mode, instances, started,
                                done = std::move(done)](StatusOr<CheckResult> r) mutable {
    Metrics& metrics = Metrics::Global();
    metrics.store_latency.Observe(std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - started));
    if (r.ok()) {
      done(GroupOutcome{.result = std::move(*r)});
      return;
    }
    if (r.status().code() == StatusCode::kInvalidArgument) {
      done(GroupOutcome{.error = r.status()});
      return;
    }
    metrics.Degraded(CauseOf(r.status())).Inc();
    int64_t suppressed = 0;
    if (degraded_log_.Admit(suppressed)) {
      if (suppressed > 0) Log(Level::kWarn, "store errors suppressed", {{"count", suppressed}});
      Log(Level::kWarn, "store error: failure mode decides",
          {{"error", r.status().ToString()},
           {"failure_mode", mode == FailureMode::kOpen     ? "open"
                            : mode == FailureMode::kClosed ? "closed"
                                                           : "local"}});
    }
    if (mode == FailureMode::kLocal) {
      DecideLocal(key, checks, instances, std::move(done));
      return;
    }
    GroupOutcome out;
    out.degraded = true;
    out.failed_closed = mode == FailureMode::kClosed;
    out.result.decisions.resize(checks.size());
    for (size_t i = 0; i < checks.size(); ++i) {
      Decision& d = out.result.decisions[i];
      d.limit = checks[i].limit->limit();
      d.allowed = !out.failed_closed;
      d.remaining = out.failed_closed ? 0 : d.limit;  // unknown: the store could not say
      if (out.failed_closed) d.retry_after = std::chrono::seconds(1);
    }
    out.result.overall = Combine(out.result.decisions);
    done(std::move(out));
  });
}

struct Enforcer::Op {
  std::shared_ptr<const policy::Policy> policy;
  policy::RequestPlan plan;
  std::string path;
  size_t next = 0;
  std::vector<Decision> decisions;   // every non-shadow decision so far
  std::vector<const Limit*> limits;  // parallel to decisions
  bool degraded = false;
  Face face = Face::kGateway;
  std::function<void(Outcome)> done;

  std::string_view route() const {
    return plan.route != nullptr ? std::string_view(plan.route->name) : std::string_view();
  }

  void Finish(unsigned status, std::string error = {}) {
    Outcome o;
    o.status = status;
    o.error = std::move(error);
    o.degraded = degraded;
    if (!decisions.empty()) {
      o.limited = true;
      o.decision = Combine(decisions);
      for (size_t i = 0; i < decisions.size(); ++i) {
        if (decisions[i].allowed == o.decision.allowed && decisions[i] == o.decision) {
          o.limit_name = limits[i]->name();
          o.window = limits[i]->window();
          break;
        }
      }
    }
    auto cb = std::move(done);
    cb(std::move(o));
  }
};

void Enforcer::Enforce(std::shared_ptr<const policy::Policy> policy, policy::RequestPlan plan,
                       std::string path, Face face, std::function<void(Outcome)> done) {
  auto op = std::make_shared<Op>();
  op->face = face;
  op->policy = std::move(policy);
  op->plan = std::move(plan);
  op->path = std::move(path);
  op->done = std::move(done);
  Step(std::move(op));
}

void Enforcer::Step(std::shared_ptr<Op> op) {
  if (op->next == op->plan.groups.size()) {
    op->Finish(200);
    return;
  }
  const policy::CheckGroup& group = op->plan.groups[op->next++];
  const policy::StoreConfig& store_config = op->policy->config().store;
  DecideGroup(
      group.key, group.checks, group.failure_mode, store_config,
      [this, op, &group](GroupOutcome g) {
        if (!g.error.ok()) {
          op->Finish(400, g.error.message());
          return;
        }
        op->degraded = op->degraded || g.degraded;
        const std::vector<Decision>& ds = g.result.decisions;
        if (group.shadow) {
          if (!g.result.overall.allowed) {
            RecordDenial(group.key, group.checks.front().limit->name(), op->path, op->route(),
                         /*shadow=*/true);
          }
          Step(op);
          return;
        }
        for (size_t i = 0; i < ds.size() && i < group.checks.size(); ++i) {
          op->decisions.push_back(ds[i]);
          op->limits.push_back(group.checks[i].limit);
        }
        if (g.failed_closed) {
          op->Finish(static_cast<unsigned>(op->policy->config().store.closed_status),
                     "the rate limit store is unavailable");
          return;
        }
        if (!g.result.overall.allowed) {
          // Name the limit that denied in the log line.
          std::string_view name = group.checks.front().limit->name();
          for (size_t i = 0; i < ds.size() && i < group.checks.size(); ++i) {
            if (!ds[i].allowed) {
              name = group.checks[i].limit->name();
              break;
            }
          }
          RecordDenial(group.key, name, op->path, op->route());
          op->Finish(429);
          return;
        }
        Step(op);
      },
      op->face, op->route(), group.shadow);
}

}  // namespace ratelimit::server
