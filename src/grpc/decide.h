// Decide: the one place where the gRPC face asks the enforcer. Everything the
// face knows about failure policy goes through here, so that moving to
// another enforcer API is a change of this file alone.
//
//   DecideEnvoy(enforcer, plan, FailureMode::kError, store_config,
//               [](EnvoyDecided d) { if (d.unavailable) ...; });
//
// Every failure mode is the store's (ResilientStore, include/ratelimit/
// failure_mode.h): open, closed and local answer as for every face; with
// `error` the store's failure comes back as it is and becomes `unavailable`,
// which the face answers with gRPC UNAVAILABLE so that Envoy's
// failure_mode_deny decides.
//
// Thread-safety: as Enforcer::DecideGroup; `done` runs once, on whatever
// thread the store completes on. `plan` must outlive the call.
#pragma once

#include <functional>
#include <optional>

#include "envoy/plan.h"
#include "policy/config.h"
#include "ratelimit/failure_mode.h"
#include "ratelimit/status.h"
#include "ratelimit/store.h"

namespace ratelimit::server {
class Enforcer;
}

namespace ratelimit::grpcface {

struct EnvoyDecided {
  Status error;              // InvalidArgument: the request's fault
  bool unavailable = false;  // mode error and the store could not decide (`error` says why)
  bool degraded = false;     // the failure mode decided
  std::optional<CheckResult> result;  // answers plan.checks (if any)
  std::optional<CheckResult> shadow;  // answers plan.shadow_checks (if any)
};

void DecideEnvoy(server::Enforcer& enforcer, const envoy::RequestPlan& plan, FailureMode mode,
                 const policy::StoreConfig& store_config, std::function<void(EnvoyDecided)> done);

}  // namespace ratelimit::grpcface
