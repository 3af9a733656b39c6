// Policy: the compiled, immutable form of a Config that answers, per request,
// "who is the client and which limits apply, with which key and cost".
//
//   StatusOr<std::shared_ptr<const Policy>> p = Policy::Create(std::move(config));
//   RequestView req{.method = "GET", .target = "/api/search?q=x", .peer = peer_ip,
//                   .header = [&](std::string_view name) { return find(name); }};
//   StatusOr<RequestPlan> plan = (*p)->Resolve(req);  // bad path encoding -> kInvalidArgument
//   (400) for (const CheckGroup& g : plan->groups) store.Check({g.key, g.checks}, ...);
//
// A reload builds a new Policy and swaps the shared_ptr; a request keeps the
// Policy it started with. Thread-safety: const methods are safe to call from
// any thread.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "policy/config.h"
#include "ratelimit/store.h"

namespace ratelimit::policy {

// How the server shows a request to the policy. `header` returns the value
// of the first header with that name (case-insensitive), or nullopt; for
// X-Forwarded-For and Forwarded the values of repeated headers are joined
// with ", " in order (a proxy may add its own header line instead of
// appending: reading only the first line would read the client's forgery).
// Headers asked for: the configured api_key_header and user_header, and,
// only when the peer is a trusted proxy, "Forwarded" and "X-Forwarded-For".
// `header` may be empty (no headers).
struct RequestView {
  std::string_view method;
  std::string_view target;  // origin-form: path and optional query
  IpAddress peer;           // the TCP peer
  std::function<std::optional<std::string_view>(std::string_view)> header;
};

enum class IdentitySource { kApiKey, kUser, kIp };

struct Identity {
  IdentitySource source = IdentitySource::kIp;
  std::string key;     // "k:<api key>", "u:<user id>" or "ip:<address or /64 prefix>"
  std::string ip_key;  // always "ip:<...>" of the client IP (for key_by: ip routes)
  std::string plan;    // plan name, "" if none
  IpAddress client_ip;
};

// Limits that share one store key: decided by one store call, all or nothing.
// Resolve builds one group per distinct (key, shadow, failure_mode): route
// limits (cost = route cost; key = identity.key, or identity.ip_key for
// key_by: ip), then plan limits and global limits (cost 1, identity.key). A
// limit name applying twice to one key is checked once (route, then plan,
// then global wins). The request is allowed iff every non-shadow group allows.
struct CheckGroup {
  std::string key;                 // the client part of the store key (unescaped)
  std::vector<LimitCheck> checks;  // point into the Policy; valid while it lives
  bool shadow = false;             // decide and count, never block
  FailureMode failure_mode = FailureMode::kOpen;
};

// The route's limit on requests in flight: take a lease of (key, route->name)
// with these settings before forwarding. key is the client (identity.key, or
// identity.ip_key for key_by: ip) or kWholeRouteKey for per: route.
struct ConcurrencyPlan {
  const ConcurrencyConfig* config = nullptr;  // points into the Policy
  std::string key;
  FailureMode failure_mode = FailureMode::kOpen;  // the route's, else the store's
  bool shadow = false;  // the route is in shadow mode: counted and logged, never refuses
};
inline constexpr std::string_view kWholeRouteKey = "~all";

struct RequestPlan {
  std::string canonical_path;
  const RouteClass* route = nullptr;  // nullptr: no route class matched
  Identity identity;
  std::vector<CheckGroup> groups;              // empty: nothing limits this request
  std::optional<ConcurrencyPlan> concurrency;  // the route's concurrency limit, if any
};

class Policy {
 public:
  static StatusOr<std::shared_ptr<const Policy>> Create(Config config);

  const Config& config() const { return config_; }

  StatusOr<RequestPlan> Resolve(const RequestView& request) const;

  // The same request as if the client were on plan `plan_name` (an override
  // moving the client, src/server/overrides.h): identity.plan and the groups
  // become that plan's (the route's and global limits stay; the route's keep
  // the cost the plan gave them: a metered request's reservation). False, and
  // `plan` unchanged, when the config has no such plan.
  bool Replan(RequestPlan& plan, std::string_view plan_name) const;

  // Who the client is (API key, then user header, then client IP).
  Identity Identify(const RequestView& request) const;
  // The first route class that matches, or nullptr.
  const RouteClass* Route(std::string_view method, std::string_view canonical_path) const;
  // A limit named in the config (for the decision API), or nullptr.
  const Limit* NamedLimit(std::string_view name) const;
  // Every limit that may apply to `identity` (for the admin API's state view).
  std::vector<const Limit*> LimitsFor(const Identity& identity) const;
  // The same as store requests, for the admin API: every (key, limit) that may
  // hold state for `identity` (route limits keyed by IP use identity.ip_key),
  // with cost 0, at most kMaxChecksPerRequest checks per group. Pass them to
  // Store::Peek, or their limits to Store::Reset.
  std::vector<CheckGroup> PeekGroupsFor(const Identity& identity) const;

  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  template <typename V>
  using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

  // A CheckGroup before the client is known.
  struct GroupTemplate {
    bool by_ip = false;  // key is identity.ip_key, not identity.key
    bool shadow = false;
    FailureMode failure_mode = FailureMode::kOpen;
    std::vector<LimitCheck> checks;
  };

  explicit Policy(Config config);
  Status Compile();
  Identity IdentifyImpl(const RequestView& request, int* plan_index) const;
  int RouteIndex(std::string_view method, std::string_view canonical_path) const;
  size_t TemplateIndex(int route_index, int plan_index, bool ip_identity) const;

  Config config_;
  std::vector<const Plan*> plans_;  // index 0: no plan
  StringMap<int> plan_index_;       // name -> index into plans_
  int default_plan_ = 0;
  StringMap<int> api_keys_;  // API key -> index into plans_
  StringMap<const Limit*> named_;
  std::vector<std::vector<std::string>> route_segments_;  // template routes: their segments
  // One per (route or none) x (plan or none) x (identity is / is not the IP).
  std::vector<std::vector<GroupTemplate>> templates_;
};

// A configured route path in canonical form, checked for its match type
// (templates: each {param} a whole segment). kInvalidArgument says why not;
// a ';', as written or escaped, is refused (CanonicalPath drops a request's
// path parameters, so no route could name one).
StatusOr<std::string> CanonicalRoutePath(std::string_view path, RouteClass::Match match);

// Canonical path: each segment's parameters (from a ';' as sent to the
// segment's end: "/login;jsessionid=x" is "/login"; an escaped %3B is data)
// dropped, percent-decoding, duplicate slashes collapsed, "." and ".."
// segments resolved (never above the root), trailing slash dropped (except
// "/"), lower-cased (route matching is case-insensitive; see
// docs/configuration.md). The query is dropped. Malformed input (bad
// percent-encoding, encoded '/' or NUL, not starting with '/') and ambiguous
// input (parameters on an empty or dot segment, a leading "//" that URL
// parsers read as a host, a '\' or %5C) -> kInvalidArgument.
// For policy decisions only: the upstream gets the target as it was sent.
StatusOr<std::string> CanonicalPath(std::string_view target);

// The client's IP: the peer, unless the peer is a trusted proxy; then
// X-Forwarded-For (or Forwarded) walked right to left, skipping trusted
// addresses; the first untrusted one is the client; all trusted -> leftmost.
// Malformed headers are ignored (the peer is used).
IpAddress ClientIp(const IpAddress& peer, std::optional<std::string_view> x_forwarded_for,
                   std::optional<std::string_view> forwarded, const std::vector<Cidr>& trusted);

}  // namespace ratelimit::policy
