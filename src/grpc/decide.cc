#include "grpc/decide.h"

#include <memory>

#include "server/enforcer.h"

namespace ratelimit::grpcface {

StatusOr<EnvoyFailureMode> ParseEnvoyFailureMode(std::string_view text) {
  if (text == "open") return EnvoyFailureMode::kOpen;
  if (text == "closed") return EnvoyFailureMode::kClosed;
  if (text == "local") return EnvoyFailureMode::kLocal;
  if (text == "error") return EnvoyFailureMode::kError;
  return InvalidArgument("failure mode must be open, closed, local or error, got '" +
                         std::string(text) + "'");
}

EnvoyFailureMode FromStoreMode(policy::FailureMode mode) {
  switch (mode) {
    case policy::FailureMode::kClosed: return EnvoyFailureMode::kClosed;
    case policy::FailureMode::kLocal: return EnvoyFailureMode::kLocal;
    case policy::FailureMode::kOpen: break;
  }
  return EnvoyFailureMode::kOpen;
}

namespace {

policy::FailureMode ToEnforcerMode(EnvoyFailureMode mode) {
  switch (mode) {
    case EnvoyFailureMode::kClosed: return policy::FailureMode::kClosed;
    case EnvoyFailureMode::kLocal: return policy::FailureMode::kLocal;
    case EnvoyFailureMode::kOpen:
    case EnvoyFailureMode::kError: break;
  }
  return policy::FailureMode::kOpen;
}

struct Op {
  server::Enforcer& enforcer;
  const envoy::RequestPlan& plan;
  EnvoyFailureMode mode;
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
      op->plan.store_key, checks, ToEnforcerMode(op->mode), op->store_config,
      [op, shadow](server::GroupOutcome g) mutable {
        if (!g.error.ok()) {
          op->out.error = g.error;
          return op->done(std::move(op->out));
        }
        op->out.degraded = op->out.degraded || g.degraded;
        if (g.degraded && op->mode == EnvoyFailureMode::kError) {
          op->out.unavailable = true;
          return op->done(std::move(op->out));
        }
        (shadow ? op->out.shadow : op->out.result) = std::move(g.result);
        if (!shadow) return Step(std::move(op), true);
        op->done(std::move(op->out));
      },
      server::Face::kEnvoy, {}, shadow);
}

}  // namespace

void DecideEnvoy(server::Enforcer& enforcer, const envoy::RequestPlan& plan, EnvoyFailureMode mode,
                 const policy::StoreConfig& store_config, std::function<void(EnvoyDecided)> done) {
  Step(std::make_shared<Op>(Op{enforcer, plan, mode, store_config, std::move(done), {}}), false);
}

}  // namespace ratelimit::grpcface
