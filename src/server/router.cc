#include "server/router.h"

#include <algorithm>
#include <optional>
#include <string>

#include "core/steady_clock.h"
#include "server/admin.h"
#include "server/auth_request.h"
#include "server/demo.h"
#include "server/gateway.h"
#include "server/metering.h"
#include "server/metrics.h"
#include "server/outcome_reply.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

// A streamed upstream answer keeps its concurrency lease until its body has
// ended (or the client went away: the guard's destructor releases). The last
// piece is passed on only once the release is answered, so a client that
// sends its next request after the answer never finds its lease still held.
class LeasedBody final : public BodyStream {
 public:
  LeasedBody(std::shared_ptr<BodyStream> inner, std::shared_ptr<LeaseGuard> lease)
      : inner_(std::move(inner)), lease_(std::move(lease)) {}

  void Next(Piece piece) override {
    inner_->Next(
        [lease = lease_, piece = std::move(piece)](bool ok, std::string_view p, bool last) mutable {
          if (!last) return piece(ok, p, last);
          lease->Release([piece = std::move(piece), ok, p]() mutable { piece(ok, p, true); });
        });
  }
  std::optional<uint64_t> content_length() const override { return inner_->content_length(); }
  std::optional<std::string> Trailer(std::string_view name) const override {
    return inner_->Trailer(name);
  }
  void Delivered() override { inner_->Delivered(); }

 private:
  std::shared_ptr<BodyStream> inner_;
  std::shared_ptr<LeaseGuard> lease_;
};

}  // namespace

bool IsOwnPath(std::string_view canonical) {
  for (std::string_view own :
       {"/v1/check", "/v1/auth", "/v1/acquire", "/v1/release", "/v1/renew", "/v1/settle"}) {
    if (canonical.starts_with(own) &&
        (canonical.size() == own.size() || canonical[own.size()] == '/')) {
      return true;
    }
  }
  return false;
}

namespace {

// Every `name` field's value, joined with ", " in order into `joined` when
// there is more than one; the one value itself otherwise.
std::optional<std::string_view> JoinedField(const Request& req, std::string_view name,
                                            std::string& joined) {
  auto range = req.equal_range(name);
  if (range.first == range.second) return std::nullopt;
  auto next = range.first;
  if (++next == range.second) return range.first->value();
  joined.clear();
  for (auto it = range.first; it != range.second; ++it) {
    if (!joined.empty()) joined += ", ";
    joined.append(it->value());
  }
  return std::string_view(joined);
}

}  // namespace

policy::RequestView MakeView(const Request& req, std::string_view method, std::string_view target,
                             const policy::IpAddress& peer, JoinedFields& joined) {
  return policy::RequestView{
      .method = method,
      .target = target,
      .peer = peer,
      .header = [&req, &joined](std::string_view name) -> std::optional<std::string_view> {
        if (EqualsIgnoreCase(name, "X-Forwarded-For")) {
          return JoinedField(req, "X-Forwarded-For", joined.x_forwarded_for);
        }
        if (EqualsIgnoreCase(name, "Forwarded")) {
          return JoinedField(req, "Forwarded", joined.forwarded);
        }
        auto it = req.find(name);
        if (it == req.end()) return std::nullopt;
        return it->value();
      }};
}

Router::Router(PolicyHolder& policies, Enforcer& enforcer, Gateway* gateway, bool demo,
               AdminApi* admin, ConcurrencyLimiter* limiter, DemoStateLimit* demo_limit)
    : policies_(policies),
      enforcer_(enforcer),
      decision_api_(enforcer),
      gateway_(gateway),
      limiter_(limiter),
      concurrency_api_(limiter != nullptr ? std::make_unique<ConcurrencyApi>(*limiter, enforcer)
                                          : nullptr),
      demo_(demo),
      admin_(admin),
      demo_limit_(demo_limit) {}

std::unique_ptr<Router> Router::Admin(PolicyHolder& policies, Enforcer& enforcer, AdminApi& admin) {
  auto r = std::make_unique<Router>(policies, enforcer, nullptr, false, &admin);
  r->admin_listener_ = true;
  return r;
}

void Router::Handle(const Request& req, const policy::IpAddress& peer, std::string_view peer_text,
                    std::function<void(Reply&&)> done, Holder* holder) {
  std::shared_ptr<const policy::Policy> policy = policies_.Get();
  if (admin_listener_) return admin_->Handle(req, std::move(policy), std::move(done), peer_text);
  const std::string_view target = req.target();
  const std::string_view path = target.substr(0, target.find('?'));
  if (path.starts_with("/v1/")) {
    if (path == "/v1/check" || path == "/v1/check/batch") {
      if (req.method() != http::verb::post) {
        Reply r = ProblemReply(405, "use POST for " + std::string(path), path);
        r.Add("Allow", "POST");
        return done(std::move(r));
      }
      if (path == "/v1/check") {
        return decision_api_.Check(std::move(policy), req.body(), path, std::move(done));
      }
      return decision_api_.Batch(std::move(policy), req.body(), path, std::move(done));
    }
    if (path == "/v1/settle") {  // reservations (issue 21)
      if (req.method() != http::verb::post) {
        Reply r = ProblemReply(405, "use POST for " + std::string(path), path);
        r.Add("Allow", "POST");
        return done(std::move(r));
      }
      return decision_api_.Settle(std::move(policy), req.body(), path, std::move(done));
    }
    if (concurrency_api_ &&
        (path == "/v1/acquire" || path == "/v1/release" || path == "/v1/renew")) {
      if (req.method() != http::verb::post) {
        Reply r = ProblemReply(405, "use POST for " + std::string(path), path);
        r.Add("Allow", "POST");
        return done(std::move(r));
      }
      if (path == "/v1/acquire") {
        return concurrency_api_->Acquire(std::move(policy), req.body(), path, std::move(done));
      }
      if (path == "/v1/renew") {
        return concurrency_api_->Renew(std::move(policy), req.body(), path, std::move(done));
      }
      return concurrency_api_->Release(std::move(policy), req.body(), path, std::move(done));
    }
    if (path == "/v1/auth")
      return Rules(req, peer, peer_text, std::move(policy), true, std::move(done), holder);
  }
  if (demo_ && (req.method() == http::verb::get || req.method() == http::verb::head) &&
      (path == "/" || path == "/index.html")) {
    return done(DemoPage());
  }
  if (demo_ && admin_ != nullptr && path == "/demo/state") {
    if (req.method() != http::verb::get) {
      Reply r = ProblemReply(405, "use GET for /demo/state", path);
      r.Add("Allow", "GET");
      return done(std::move(r));
    }
    // The caller's own identity, formed exactly as for its /api/ping requests.
    JoinedFields joined;
    const policy::Identity who =
        policy->Identify(MakeView(req, req.method_string(), req.target(), peer, joined));
    if (demo_limit_ != nullptr) {
      if (std::optional<Reply> refused = demo_limit_->Admit(who.ip_key)) {
        return done(*std::move(refused));
      }
    }
    return admin_->DemoState(std::move(policy), who, std::move(done));
  }
  Rules(req, peer, peer_text, std::move(policy), false, std::move(done), holder);
}

void Router::Rules(const Request& req, const policy::IpAddress& peer, std::string_view peer_text,
                   std::shared_ptr<const policy::Policy> policy, bool auth,
                   std::function<void(Reply&&)> done, Holder* holder) {
  std::string_view method = req.method_string();
  std::string_view target = req.target();
  unsigned deny_status = 429;
  if (auth) {
    auto m = req.find("X-Original-Method");
    auto u = req.find("X-Original-URI");
    if (m == req.end() || u == req.end()) {
      return done(
          ProblemReply(400,
                       std::string(m == req.end() ? "X-Original-Method" : "X-Original-URI") +
                           " header is required (nginx: proxy_set_header X-Original-URI "
                           "$request_uri; proxy_set_header X-Original-Method $request_method;)",
                       "/v1/auth"));
    }
    method = m->value();
    target = u->value();
    const std::string_view own = req.target();
    const size_t q = own.find('?');
    StatusOr<unsigned> s = ParseDenyStatus(q == std::string_view::npos ? "" : own.substr(q + 1));
    if (!s.ok()) return done(ProblemReply(400, s.status().message(), "/v1/auth"));
    deny_status = *s;
  }
  JoinedFields joined;
  const policy::RequestView view = MakeView(req, method, target, peer, joined);
  const std::string path(target.substr(0, target.find('?')));
  StatusOr<policy::RequestPlan> plan = policy->Resolve(view);
  if (!plan.ok()) return done(ProblemReply(400, plan.status().message(), path));
  // A metered cost (issue 21): the gateway checks with the reservation the
  // request names, and settles after the answer (server/metering.h).
  if (!auth && gateway_ != nullptr && plan->route != nullptr && plan->route->metered) {
    StatusOr<int64_t> reserved = ReserveCost(*plan->route->metered, plan->route->cost, req);
    if (!reserved.ok()) return done(ProblemReply(400, reserved.status().message(), path));
    if (*reserved != plan->route->cost) SetRouteCost(*plan, *reserved);
  }
  if (!auth && IsOwnPath(plan->canonical_path)) {
    return done(ProblemReply(404,
                             "no endpoint '" + path +
                                 "': paths under /v1/check, /v1/auth, /v1/acquire, /v1/release, "
                                 "/v1/renew and /v1/settle are ratelimitd's and never forwarded; "
                                 "its endpoints are spelled exactly /v1/check, /v1/check/batch, "
                                 "/v1/auth, /v1/acquire, /v1/release, /v1/renew, /v1/settle",
                             path));
  }

  const policy::HeaderDialect dialect = policy->config().server.headers;
  const HttpFace http_face{
      .dialect = dialect,
      .closed_status = static_cast<unsigned>(policy->config().store.closed_status),
      .deny_status = deny_status};
  const size_t max_held = policy->config().server.max_held_requests;
  // The route's concurrency limit applies where the end of the request is
  // seen: in the gateway (not to /v1/auth, whose request nginx forwards).
  std::optional<ConcurrencyRequest> concurrency;
  if (gateway_ != nullptr && limiter_ != nullptr && !auth && plan->concurrency) {
    concurrency =
        ConcurrencyRequest{.key = plan->concurrency->key,
                           .name = plan->route->name,
                           .route = plan->route->name,
                           .config = *plan->concurrency->config,
                           .failure_mode = plan->concurrency->failure_mode,
                           .expected_instances = policy->config().store.expected_instances,
                           .closed_status = policy->config().store.closed_status,
                           .shadow = plan->concurrency->shadow};
    // A shadow limit never holds a request back either.
    if (concurrency->shadow)
      concurrency->config.on_limit = policy::ConcurrencyConfig::OnLimit::kReject;
  }
  const Face face = auth                              ? Face::kAuthRequest
                    : (gateway_ != nullptr || !demo_) ? Face::kGateway
                                                      : Face::kDemo;
  enforcer_.Enforce(
      std::move(policy), std::move(*plan), path, face,
      [this, &req, peer_text, auth, http_face, dialect, path, target, face, holder, max_held,
       concurrency = std::move(concurrency), done = std::move(done)](Outcome&& o) mutable {
        if (auth) {
          if (o.verdict == Verdict::kBadRequest) return done(ProblemReply(400, o.error, path));
          if (!o.allowed()) return done(AuthReply(o, http_face, target));
          const std::chrono::microseconds delay = o.decision.delay;
          return AfterDelay(
              delay, face, holder, max_held, path, std::move(done),
              [o = std::move(o), http_face, target = std::string(target)](
                  std::function<void(Reply &&)> done) { done(AuthReply(o, http_face, target)); });
        }
        if (!o.allowed()) return done(RefusalReply(o, http_face, path));
        if (gateway_ != nullptr) {
          // Shaping first, then the concurrency lease: a request waiting for
          // its turn does not hold a place in the upstream.
          const std::chrono::microseconds delay = o.decision.delay;
          // A held request that is never forwarded (too many held, or its
          // client left) gives a metered reservation back when dropped.
          std::shared_ptr<Outcome> unsent(new Outcome(std::move(o)), [this](Outcome* held) {
            RefundUnforwarded(enforcer_, *held);
            delete held;
          });
          return AfterDelay(
              delay, face, holder, max_held, path, std::move(done),
              [this, &req, peer_text, dialect, path, unsent = std::move(unsent),
               concurrency = std::move(concurrency)](std::function<void(Reply &&)> done) mutable {
                Outcome o = std::move(*unsent);
                unsent->charged.clear();  // forwarded: it settles after the answer
                Forward(req, peer_text, std::move(o), dialect, path, std::move(concurrency),
                        std::move(done));
              });
        }
        Reply r =
            demo_ && path == "/api/ping" ? Pong() : ProblemReply(404, "no route for " + path, path);
        AddOutcomeHeaders(o, dialect, r);
        done(std::move(r));
      });
}

void Router::Forward(const Request& req, std::string_view peer_text, Outcome o,
                     policy::HeaderDialect dialect, std::string_view path,
                     std::optional<ConcurrencyRequest> concurrency,
                     std::function<void(Reply&&)> done) {
  if (!concurrency) {
    return gateway_->Forward(
        req, peer_text,
        [this, o = std::move(o), dialect, done = std::move(done)](Reply&& r) mutable {
          AddOutcomeHeaders(o, dialect, r);
          MeterReply(enforcer_, std::move(o), r);
          done(std::move(r));
        });
  }
  const std::string name = concurrency->name, key = concurrency->key;
  const bool shadow = concurrency->shadow;
  limiter_->Acquire(*std::move(concurrency),
                    [this, &req, peer_text, dialect, path = std::string(path), name, key, shadow,
                     o = std::move(o), done = std::move(done)](ConcurrencyOutcome c) mutable {
                      if (c.status != 200) {
                        if (c.denial != ConcurrencyOutcome::Denial::kNone)
                          enforcer_.RecordDenial(key, "concurrency:" + name, path, name, shadow);
                        // A shadow route's limit is counted and logged ("shadow:concurrency:..."),
                        // and the request goes on without a lease (a failed-closed store does
                        // not refuse it either).
                        if (!shadow || c.status == 400) {
                          RefundUnforwarded(enforcer_, o);
                          return done(ConcurrencyRefusalReply(c, name, dialect, path));
                        }
                      }
                      // The lease is held until the upstream answer ended, failed or was
                      // dropped: the guard releases it on every path.
                      std::shared_ptr<LeaseGuard> lease = std::move(c.lease);
                      o.degraded = o.degraded || c.degraded;
                      gateway_->Forward(
                          req, peer_text,
                          [this, o = std::move(o), dialect, lease = std::move(lease),
                           done = std::move(done)](Reply&& r) mutable {
                            AddOutcomeHeaders(o, dialect, r);
                            MeterReply(enforcer_, std::move(o), r);
                            if (!lease) return done(std::move(r));
                            if (r.body_stream != nullptr) {
                              r.body_stream = std::make_shared<LeasedBody>(std::move(r.body_stream),
                                                                           std::move(lease));
                              return done(std::move(r));
                            }
                            auto answer = std::make_shared<Reply>(std::move(r));
                            lease->Release([answer, done = std::move(done)]() mutable {
                              done(std::move(*answer));
                            });
                          });
                    });
}

void Router::AfterDelay(std::chrono::microseconds delay, Face face, Holder* holder, size_t max_held,
                        std::string_view path, std::function<void(Reply&&)> done,
                        std::function<void(std::function<void(Reply&&)>)> proceed) {
  if (delay.count() <= 0 || holder == nullptr) return proceed(std::move(done));
  const auto until = core::SteadyClock::now() + delay;  // the decision is just in
  Metrics& m = Metrics::Global();
  if (held_.fetch_add(1, std::memory_order_relaxed) >= max_held) {
    held_.fetch_sub(1, std::memory_order_relaxed);
    m.held_rejected.Inc();
    Reply r = ProblemReply(
        503, "too many requests are waiting for their turn (server.max_held_requests)", path);
    r.Add("Retry-After", "1");
    return done(std::move(r));
  }
  m.held.Add(1);
  m.Delayed(face).Inc();
  m.delay.Observe(delay);
  holder->Hold(until, [this, done = std::move(done), proceed = std::move(proceed),
                       path = std::string(path)](bool client_alive) mutable {
    held_.fetch_sub(1, std::memory_order_relaxed);
    Metrics::Global().held.Add(-1);
    if (client_alive) return proceed(std::move(done));
    // Nobody to answer: the session has closed the connection already.
    Metrics::Global().held_abandoned.Inc();
    Reply r = ProblemReply(503, "the client left while its request was held", path);
    r.close = true;
    done(std::move(r));
  });
}

}  // namespace ratelimit::server
