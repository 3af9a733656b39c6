#include "grpc/decide.h"

#include <memory>

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
};

// The shadow descriptors are a group of their own: decided and counted, but
// they never block, and a denial there takes nothing from the others.
void Step(std::shared_ptr<Op> op, bool shadow) {
  const std::vector<LimitCheck>& checks = shadow ? op->plan.shadow_checks : op->plan.checks;
  if (checks.empty()) {
    if (!shadow) return Step(std::move(op), true);
    return op->done(std::move(op->out));
  }
  op->enforcer.DecideGroup(
      op->plan.store_key, checks, op->mode, op->store_config,
      [op, shadow](server::GroupOutcome g) mutable {
        if (!g.error.ok()) {
          // Mode error: the store's failure, as it is; otherwise the request's fault.
          op->out.unavailable = IsStoreFailure(g.error);
          op->out.error = g.error;
          return op->done(std::move(op->out));
        }
        op->out.degraded = op->out.degraded || g.degraded;
        (shadow ? op->out.shadow : op->out.result) = std::move(g.result);
        if (!shadow) return Step(std::move(op), true);
        op->done(std::move(op->out));
      },
      server::Face::kEnvoy, {}, shadow);
}

}  // namespace

void DecideEnvoy(server::Enforcer& enforcer, const envoy::RequestPlan& plan, FailureMode mode,
                 const policy::StoreConfig& store_config, std::function<void(EnvoyDecided)> done) {
  Step(std::make_shared<Op>(Op{enforcer, plan, mode, store_config, std::move(done), {}}), false);
}

}  // namespace ratelimit::grpcface
