// Router: one request in, one Reply out (through a callback: the store and
// the upstream answer asynchronously). Decides which face answers:
//
//   POST /v1/check, /v1/check/batch    decision API (other methods: 405)
//   POST /v1/acquire, /v1/release,     concurrency leases (with a limiter)
//        /v1/renew
//   /v1/auth (any method)              nginx auth_request
//   GET / (server.demo)                the demo page (not limited)
//   GET /demo/state (server.demo)      the CALLER's own bucket state (its own limit
//                                      per client address: DemoStateLimit)
//   other spellings of the paths above /v1/ (/V1/CHECK, /v1/check/, /v1/auth/x):
//                                      404, never forwarded nor limited
//   anything else                      the configured rules (Policy::Resolve ->
//                                      Enforcer), then: the route's concurrency
//                                      lease (gateway only), the upstream (gateway),
//                                      /api/ping (demo), or 404
//
// Shaping: when the limits allow a gateway or auth_request request with a
// delay (a leaky bucket), the Router asks the connection's Holder to wait for
// it, then forwards (gateway) or answers 2xx (auth_request). At most
// server.max_held_requests are held at once; beyond, 503. A client that
// leaves while held is never forwarded. Without a Holder there is no wait.
//
// The admin listener has a Router of its own (Router::Admin) that hands every
// request to the AdminApi: admin paths never reach the public listener.
//
// Thread-safety: Handle may be called from any thread; `done` may run on any
// thread. The request must stay alive and unchanged until `done` runs.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "policy/ip.h"
#include "server/concurrency_api.h"
#include "server/concurrency_guard.h"
#include "server/decision_api.h"
#include "server/enforcer.h"
#include "server/hold.h"
#include "server/http.h"
#include "server/policy_holder.h"
#include "server/reply.h"
#include "server/request_handler.h"

namespace ratelimit::server {

class AdminApi;
class DemoStateLimit;
class Gateway;

// The public listener's own paths, in canonical form (policy::CanonicalPath:
// case-insensitive, dot segments and duplicate or trailing slashes resolved,
// unreserved escapes decoded): /v1/check, /v1/auth, /v1/acquire, /v1/release,
// /v1/renew, /v1/settle and every path below one of them. The Router serves
// only their exact spellings; any other is a 404, never forwarded nor limited
// (docs/http-api.md). Segment-aware: /v1/checkout is not ours.
bool IsOwnPath(std::string_view canonical_path);

// Where a view's header lookup joins repeated lines (policy.h: a proxy may
// add its own line): one string per name, as the policy holds both values
// at once.
struct JoinedFields {
  std::string x_forwarded_for;
  std::string forwarded;
};

// How the policy sees a request (the gateway, /v1/auth, the demo and
// explain): the header lookup joins repeated X-Forwarded-For and Forwarded
// lines into `joined`, which must outlive the view, as must `req`.
policy::RequestView MakeView(const Request& req, std::string_view method, std::string_view target,
                             const policy::IpAddress& peer, JoinedFields& joined);

class Router final : public RequestHandler {
 public:
  // The public listener's router. `gateway` may be null (no upstream).
  // `demo`: serve the demo page, /api/ping and (with `admin`) /demo/state.
  // `limiter` (may be null) serves /v1/acquire, /v1/release, /v1/renew and
  // the routes' concurrency limits in the gateway. `demo_limit` (may be null:
  // not limited) bounds each client address's /demo/state calls.
  Router(PolicyHolder& policies, Enforcer& enforcer, Gateway* gateway, bool demo,
         AdminApi* admin = nullptr, ConcurrencyLimiter* limiter = nullptr,
         DemoStateLimit* demo_limit = nullptr);
  // The admin listener's router: everything goes to `admin`.
  static std::unique_ptr<Router> Admin(PolicyHolder& policies, Enforcer& enforcer, AdminApi& admin);

  // `holder` (may be null) holds shaped requests; it must outlive `done`.
  void Handle(const Request& request, const policy::IpAddress& peer, std::string_view peer_text,
              std::function<void(Reply&&)> done, Holder* holder = nullptr) override;

 private:
  void Rules(const Request& request, const policy::IpAddress& peer, std::string_view peer_text,
             std::shared_ptr<const policy::Policy> policy, bool auth,
             std::function<void(Reply&&)> done, Holder* holder);
  // Forwards an allowed request upstream, within its route's concurrency
  // limit when it has one (the lease lives until the answer has ended).
  void Forward(const Request& req, std::string_view peer_text, Outcome o,
               policy::HeaderDialect dialect, std::string_view path,
               std::optional<ConcurrencyRequest> concurrency, std::function<void(Reply&&)> done);
  // Runs proceed(done) after `delay` (at once when it is zero or there is no
  // holder), or answers `done` itself: 503 when too many are held already.
  void AfterDelay(std::chrono::microseconds delay, Face face, Holder* holder, size_t max_held,
                  std::string_view path, std::function<void(Reply&&)> done,
                  std::function<void(std::function<void(Reply&&)>)> proceed);

  PolicyHolder& policies_;
  Enforcer& enforcer_;
  DecisionApi decision_api_;
  Gateway* gateway_;
  ConcurrencyLimiter* limiter_;                      // may be null
  std::unique_ptr<ConcurrencyApi> concurrency_api_;  // with limiter_
  bool demo_;
  AdminApi* admin_;              // may be null
  DemoStateLimit* demo_limit_;   // may be null
  bool admin_listener_ = false;  // this router serves the admin listener
  std::atomic<size_t> held_{0};  // requests held for their delay now
};

}  // namespace ratelimit::server
