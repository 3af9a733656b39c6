#include "server/concurrency_api.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>

#include "server/decision_api.h"
#include "server/headers.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

using nlohmann::json;

const json* Field(const json& j, std::string_view name) {
  auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

Status String(const json& j, std::string_view name, std::string* out) {
  const json* v = Field(j, name);
  if (v == nullptr) return Status::Ok();
  if (!v->is_string() || v->get_ref<const std::string&>().empty()) {
    return InvalidArgument("field '" + std::string(name) + "' must be a non-empty string");
  }
  *out = v->get<std::string>();
  return Status::Ok();
}

// The form of every lease id /v1/acquire hands out: NewLeaseId's 32
// lower-case hex digits, with "l-" when the local fallback issued it. Anything
// else was never ours: a 400, not {"released": false} (which says "not held").
bool IssuedLeaseId(std::string_view id) {
  if (id.starts_with("l-")) id.remove_prefix(2);
  return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A release's or renewal's lease_id, checked.
StatusOr<ParsedAcquire> WithLeaseId(const json& j, ParsedAcquire p) {
  if (Status s = String(j, "lease_id", &p.lease_id); !s.ok()) return s;
  if (p.lease_id.empty()) return InvalidArgument("field 'lease_id' is required");
  if (!IssuedLeaseId(p.lease_id)) {
    return InvalidArgument(
        "field 'lease_id' is not a lease id /v1/acquire gives out (32 hex digits, "
        "or l- and 32 hex digits)");
  }
  return p;
}

// An acquire's or renewal's lease_ttl, when the body has one.
Status LeaseTtl(const json& j, std::chrono::milliseconds* out) {
  const json* ttl = Field(j, "lease_ttl");
  if (ttl == nullptr) return Status::Ok();
  if (!ttl->is_string()) {
    return InvalidArgument("field 'lease_ttl' must be a duration string such as \"30s\"");
  }
  StatusOr<std::chrono::microseconds> d = ParseDuration(ttl->get_ref<const std::string&>());
  if (!d.ok()) return InvalidArgument("field 'lease_ttl': " + d.status().message());
  if (*d < std::chrono::milliseconds(10) || *d > kMaxLeaseTtl || d->count() % 1000 != 0) {
    return InvalidArgument("field 'lease_ttl' must be whole milliseconds between 10ms and 24h");
  }
  *out = std::chrono::duration_cast<std::chrono::milliseconds>(*d);
  return Status::Ok();
}

const policy::RouteClass* FindRoute(const policy::Policy* policy, std::string_view name) {
  if (policy == nullptr) return nullptr;
  const policy::RouteClass* r = nullptr;
  for (const policy::RouteClass& rc : policy->config().routes) {
    if (rc.name == name) r = &rc;
  }
  return r;
}

enum class Kind { kAcquire, kRelease, kRenew };

// Common to all three: key, and either route or name (+ limits, for acquire).
StatusOr<ParsedAcquire> Parse(const json& j, const policy::Policy* policy, Kind kind) {
  if (!j.is_object()) return InvalidArgument("the body must be a JSON object");
  static constexpr std::string_view kAcquireFields[] = {"key", "name", "route", "max_in_flight",
                                                        "lease_ttl"};
  static constexpr std::string_view kReleaseFields[] = {"key", "name", "route", "lease_id"};
  static constexpr std::string_view kRenewFields[] = {"key", "name", "route", "lease_id",
                                                      "lease_ttl"};
  const std::span<const std::string_view> allowed =
      kind == Kind::kAcquire   ? std::span<const std::string_view>(kAcquireFields)
      : kind == Kind::kRelease ? std::span<const std::string_view>(kReleaseFields)
                               : std::span<const std::string_view>(kRenewFields);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return InvalidArgument("unknown field '" + it.key() + "' (expected " + list + ")");
    }
  }
  ParsedAcquire p;
  policy::ConcurrencyConfig& c = p.request.config;
  c.on_limit = policy::ConcurrencyConfig::OnLimit::kReject;  // the caller decides what to do
  std::string key;
  if (Status s = String(j, "key", &key); !s.ok()) return s;
  if (key.empty()) return InvalidArgument("field 'key' is required");
  const size_t max_key_length =
      policy != nullptr ? policy->config().store.max_key_length : kDefaultMaxKeyLength;
  if (Status s = ValidateKey(key, max_key_length, "field 'key'"); !s.ok()) return s;
  // Its leases live under "d:<key>", apart from the keys the rules form: a
  // caller naming "~all" (a route's whole-route key) or "k:<api key>" never
  // takes a place of a route's own concurrency limit.
  p.request.key = DecisionApiClient(key);
  std::string route;
  if (Status s = String(j, "route", &route); !s.ok()) return s;
  if (Status s = String(j, "name", &p.request.name); !s.ok()) return s;
  if (policy != nullptr) {
    p.request.failure_mode = policy->config().store.failure_mode;
    p.request.expected_instances = policy->config().store.expected_instances;
    p.request.closed_status = policy->config().store.closed_status;
  }
  if (!route.empty()) {
    for (const char* f : {"name", "max_in_flight", "lease_ttl"}) {
      // The holder of a lease chooses how long a renewal keeps it, as a
      // caller naming the limit does: the route's is only the default.
      if (kind == Kind::kRenew && std::string_view(f) == "lease_ttl") continue;
      if (Field(j, f) != nullptr) {
        return InvalidArgument("field '" + std::string(f) +
                               "' does not go with 'route' (the route sets it)");
      }
    }
    const policy::RouteClass* r = FindRoute(policy, route);
    // A release or renewal needs only the limit's name, which is the route's
    // name: a reload that removed the route (or its concurrency block) since
    // the acquire must neither keep its place held until lease_ttl nor take
    // it from a holder still at work (renewed by the default lease_ttl).
    if (kind != Kind::kAcquire) {
      p.request.name = route;
      if (r != nullptr && r->concurrency) c.lease_ttl = r->concurrency->lease_ttl;
      if (Status s = LeaseTtl(j, &c.lease_ttl); !s.ok()) return s;
      return WithLeaseId(j, std::move(p));
    }
    if (r == nullptr) return InvalidArgument("unknown route '" + route + "'");
    if (!r->concurrency) return InvalidArgument("route '" + route + "' has no concurrency limit");
    p.request.name = r->name;
    c.max_in_flight = r->concurrency->max_in_flight;
    c.lease_ttl = r->concurrency->lease_ttl;
    // Not its `per`: the lease is the caller's own "d:<key>", whatever the
    // route's, so it never passes a full store as a route-wide one does
    // (AcquireRequest::route_wide): callers choose keys without bound.
    if (r->failure_mode) p.request.failure_mode = *r->failure_mode;
    return p;
  }
  if (p.request.name.empty()) return InvalidArgument("field 'name' (or 'route') is required");
  if (Status s = ValidateLimitName(p.request.name); !s.ok()) {
    return InvalidArgument("field 'name': " + s.message());
  }
  if (kind == Kind::kAcquire) {
    const json* max = Field(j, "max_in_flight");
    if (max == nullptr) return InvalidArgument("field 'max_in_flight' is required");
    if (!max->is_number_integer() || max->get<int64_t>() < 1 ||
        max->get<int64_t>() > kMaxInFlight) {
      return InvalidArgument("field 'max_in_flight' must be an integer in [1, " +
                             std::to_string(kMaxInFlight) + "]");
    }
    c.max_in_flight = max->get<int64_t>();
  }
  if (Status s = LeaseTtl(j, &c.lease_ttl); !s.ok()) return s;  // a release has none
  if (kind != Kind::kAcquire) return WithLeaseId(j, std::move(p));
  return p;
}

// What a release or a renewal answers once the store has: {"<field>": true}
// (with `held` after it), {"<field>": false} when the lease is not held, 400
// for what the store refused, 503 when the store could not say (`meanwhile`:
// what becomes of the lease).
Reply LeaseAnswer(const StatusOr<bool>& r, std::string_view field, std::string_view held,
                  std::string_view meanwhile, const std::string& path) {
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kInvalidArgument) {
      return ProblemReply(400, r.status().message(), path);
    }
    Reply e = ProblemReply(503,
                           "the concurrency store is unavailable: " + r.status().message() + " (" +
                               std::string(meanwhile) + ")",
                           path);
    e.Add("Retry-After", "1");
    return e;
  }
  Reply ok;
  ok.content_type = "application/json";
  ok.body = "{\"" + std::string(field) + "\":" + (*r ? "true" + std::string(held) : "false") + "}";
  return ok;
}

// A call's body, read as JSON and then as `kind` asks (any error: a 400).
StatusOr<ParsedAcquire> ParseCall(std::string_view body, const policy::Policy* policy, Kind kind) {
  StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  return Parse(*j, policy, kind);
}

}  // namespace

StatusOr<ParsedAcquire> ParseAcquire(const json& j, const policy::Policy* policy) {
  return Parse(j, policy, Kind::kAcquire);
}

StatusOr<ParsedAcquire> ParseRelease(const json& j, const policy::Policy* policy) {
  return Parse(j, policy, Kind::kRelease);
}

StatusOr<ParsedAcquire> ParseRenew(const json& j, const policy::Policy* policy) {
  return Parse(j, policy, Kind::kRenew);
}

void ConcurrencyApi::Acquire(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                             std::string_view path, std::function<void(Reply&&)> done) {
  StatusOr<ParsedAcquire> p = ParseCall(body, policy.get(), Kind::kAcquire);
  if (!p.ok()) return done(ProblemReply(400, p.status().message(), path));
  const std::string key = p->request.key, name = p->request.name;  // key: "d:<key>"
  const auto ttl = p->request.config.lease_ttl;
  limiter_.Acquire(std::move(p->request), [this, policy, key, name, ttl, path = std::string(path),
                                           done = std::move(done)](ConcurrencyOutcome o) {
    if (o.status == 400) return done(ProblemReply(400, o.error, path));
    Reply r;
    r.status = o.status;
    r.content_type = "application/json";
    json body = {{"acquired", o.status == 200},
                 {"in_flight", o.result.in_flight},
                 {"max_in_flight", o.result.max_in_flight},
                 {"lease_ttl_ms", ttl.count()},
                 {"retry_after_ms", o.status == 200 ? 0 : 1000},
                 {"degraded", o.degraded}};
    if (o.lease) body["lease_id"] = o.lease->Detach();
    if (o.status == 200 && !o.lease) body["lease_id"] = nullptr;  // failed open: none
    if (o.status != 200) {
      if (!o.error.empty()) body["error"] = o.error;
      r.Add("Retry-After", "1");
      r.Add("Cache-Control", "no-store");
      if (o.denial != ConcurrencyOutcome::Denial::kNone)
        enforcer_.RecordDenial(key, "concurrency:" + name, path);
    }
    if (o.degraded) r.Add("X-RateLimit-Degraded", "true");
    r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    done(std::move(r));
  });
}

void ConcurrencyApi::Release(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                             std::string_view path, std::function<void(Reply&&)> done) {
  StatusOr<ParsedAcquire> p = ParseCall(body, policy.get(), Kind::kRelease);
  if (!p.ok()) return done(ProblemReply(400, p.status().message(), path));
  limiter_.Release(
      p->request.key, p->request.name, p->lease_id,
      [path = std::string(path), done = std::move(done)](StatusOr<bool> r) {
        // Nothing was freed now; the lease expires by itself.
        done(LeaseAnswer(r, "released", "", "the lease expires after its lease_ttl", path));
      });
}

void ConcurrencyApi::Renew(std::shared_ptr<const policy::Policy> policy, std::string_view body,
                           std::string_view path, std::function<void(Reply&&)> done) {
  StatusOr<ParsedAcquire> p = ParseCall(body, policy.get(), Kind::kRenew);
  if (!p.ok()) return done(ProblemReply(400, p.status().message(), path));
  const auto ttl = p->request.config.lease_ttl;
  limiter_.Renew(
      p->request.key, p->request.name, p->lease_id, ttl,
      [path = std::string(path), ttl, done = std::move(done)](StatusOr<bool> r) {
        // Neither renewed nor lost: a heartbeat that fails like this is
        // sent again, while the work goes on.
        done(LeaseAnswer(r, "renewed", ",\"lease_ttl_ms\":" + std::to_string(ttl.count()),
                         "the renewal may or may not have been made: renew again before the "
                         "earlier of its last expiry and lease_ttl from now",
                         path));
      });
}

}  // namespace ratelimit::server
