#include "grpc/decide.h"

#include <algorithm>
#include <memory>
#include <span>

#include "server/enforcer.h"
#include "store/resilient_store.h"

namespace ratelimit::grpcface {

namespace {

struct Op {
  server::Enforcer& enforcer;
  const envoy::RequestPlan& plan;
  FailureMode mode;
  const policy::StoreConfig& store_config;
  std::function<void(EnvoyDecided)> done;
  EnvoyDecided out;
  // The checks of the steps after a denial, asked without counting.
  std::vector<LimitCheck> uncounted;
  std::vector<LimitSettle> settlements;  // read by the store during Settle
};

void Step(std::shared_ptr<Op> op, bool shadow, size_t from);

// A denied request's costs that did not fit are charged (envoy::Overdrafts)
// before the answer, so that the next check sees them; then the shadow step.
void Settle(std::shared_ptr<Op> op) {
  if (!op->out.result || !op->enforcer.has_store()) return Step(std::move(op), true, 0);
  op->settlements = envoy::Overdrafts(op->plan, *op->out.result);
  if (op->settlements.empty()) return Step(std::move(op), true, 0);
  const SettleRequest request{
      .key = op->plan.store_key,
      .settlements = op->settlements,
      .on_failure = {.mode = op->mode, .expected_instances = op->store_config.expected_instances}};
  // A failed settlement leaves the request's answer as it is.
  op->enforcer.store().Settle(
      request, [op](StatusOr<CheckResult>) mutable { Step(std::move(op), true, 0); });
}

// The shadow descriptors are a group of their own: decided and counted, but
// they never block, and a denial there takes nothing from the others.
// A group of more than kMaxChecksPerRequest limits (the most one atomic store
// step takes) is decided that many at a time, in order: a step after a denied
// one takes nothing (it is asked with cost 0, for its state), while the steps
// before it keep what they took (docs/envoy.md).
void Step(std::shared_ptr<Op> op, bool shadow, size_t from) {
  const std::vector<LimitCheck>& all = shadow ? op->plan.shadow_checks : op->plan.checks;
  std::optional<CheckResult>& into = shadow ? op->out.shadow : op->out.result;
  if (from == all.size()) {
    if (into) into->overall = Combine(into->decisions);
    if (!shadow) return Settle(std::move(op));
    return op->done(std::move(op->out));
  }
  const size_t n = std::min(all.size() - from, kMaxChecksPerRequest);
  std::span<const LimitCheck> checks(all.data() + from, n);
  if (into && !into->overall.allowed) {
    op->uncounted.assign(checks.begin(), checks.end());
    for (LimitCheck& c : op->uncounted) c.cost = 0;
    checks = op->uncounted;
  }
  op->enforcer.DecideGroup(
      op->plan.store_key, checks, op->mode, op->store_config,
      [op, shadow, from, n](server::GroupOutcome g) mutable {
        if (!g.error.ok()) {
          // Mode error: the store's failure, as it is; otherwise the request's fault.
          op->out.unavailable = IsStoreFailure(g.error);
          op->out.error = g.error;
          return op->done(std::move(op->out));
        }
        op->out.degraded = op->out.degraded || g.degraded;
        std::optional<CheckResult>& into = shadow ? op->out.shadow : op->out.result;
        if (!into) {
          into = std::move(g.result);
        } else {
          into->decisions.insert(into->decisions.end(), g.result.decisions.begin(),
                                 g.result.decisions.end());
          into->overall = Combine(into->decisions);
          into->degraded = into->degraded || g.result.degraded;
          into->failed_closed = into->failed_closed || g.result.failed_closed;
        }
        Step(std::move(op), shadow, from + n);
      },
      server::Face::kEnvoy, {}, shadow);
}

}  // namespace

void DecideEnvoy(server::Enforcer& enforcer, const envoy::RequestPlan& plan, FailureMode mode,
                 const policy::StoreConfig& store_config, std::function<void(EnvoyDecided)> done) {
  Step(std::make_shared<Op>(Op{enforcer, plan, mode, store_config, std::move(done), {}, {}, {}}),
       false, 0);
}

}  // namespace ratelimit::grpcface
