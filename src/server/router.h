// Router: one request in, one Reply out (through a callback: the store and
// the upstream answer asynchronously). Decides which face answers:
//
//   POST /v1/check, /v1/check/batch    decision API (other methods: 405)
//   /v1/auth (any method)              nginx auth_request
//   GET / (server.demo)                the demo page (not limited)
//   anything else                      the configured rules (Policy::Resolve ->
//                                      Enforcer), then: the upstream (gateway),
//                                      /api/ping (demo), or 404
//
// Thread-safety: Handle may be called from any thread; `done` may run on any
// thread. The request must stay alive and unchanged until `done` runs.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "policy/ip.h"
#include "server/decision_api.h"
#include "server/enforcer.h"
#include "server/http.h"
#include "server/policy_holder.h"
#include "server/reply.h"

namespace ratelimit::server {

class Gateway;

class Router {
 public:
  // `gateway` may be null (no upstream). `demo`: serve the demo page and /api/ping.
  Router(PolicyHolder& policies, Enforcer& enforcer, Gateway* gateway, bool demo);

  void Handle(const Request& request, const policy::IpAddress& peer, std::string_view peer_text,
              std::function<void(Reply)> done);

 private:
  void Rules(const Request& request, const policy::IpAddress& peer, std::string_view peer_text,
             std::shared_ptr<const policy::Policy> policy, bool auth,
             std::function<void(Reply)> done);

  PolicyHolder& policies_;
  Enforcer& enforcer_;
  DecisionApi decision_api_;
  Gateway* gateway_;
  bool demo_;
};

}  // namespace ratelimit::server
