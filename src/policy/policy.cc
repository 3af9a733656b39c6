// Policy: compiles a Config into per-(route, plan) group templates so that
// Resolve only identifies the client, matches a route and fills in keys.
//
// Group rules (docs/configuration.md, "How limits combine"):
//   - route limits use the route's cost and are keyed by the client, or by the
//     client IP when the route says key_by: ip; plan and global limits cost 1
//     and are keyed by the client;
//   - a limit (by name) that applies twice to the same key is checked once:
//     the first of route, plan, global wins (its cost, shadow, failure mode);
//   - one CheckGroup per distinct (key, shadow, failure mode), in that order
//     of first appearance; enforcing limits of one key share one group and are
//     decided all or nothing.
#include "policy/policy.h"
#include "core/ascii.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace ratelimit::policy {
namespace {

using core::Quote;
using core::Trim;
// A header value usable as an identity: 1..200 visible ASCII characters.
// Anything else is ignored (the next identity source is used), so a client
// cannot grow keys without bound or smuggle control characters into them.
bool UsableIdentity(std::string_view v) {
  if (v.empty() || v.size() > 200) return false;
  for (char c : v) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

struct Entry {
  bool by_ip;
  const Limit* limit;
  int64_t cost;
  bool shadow;
  FailureMode failure_mode;
};

}  // namespace

Policy::Policy(Config config) : config_(std::move(config)) {}

StatusOr<std::shared_ptr<const Policy>> Policy::Create(Config config) {
  std::shared_ptr<Policy> p(new Policy(std::move(config)));
  if (Status s = p->Compile(); !s.ok()) return s;
  return std::shared_ptr<const Policy>(std::move(p));
}

size_t Policy::TemplateIndex(int route_index, int plan_index, bool ip_identity) const {
  return ((static_cast<size_t>(route_index + 1) * plans_.size()) +
          static_cast<size_t>(plan_index)) *
             2 +
         (ip_identity ? 1 : 0);
}

Status Policy::Compile() {
  const Config& c = config_;
  const std::string where = c.source + ": ";
  // Plans.
  plans_.push_back(nullptr);
  for (const auto& [name, plan] : c.plans) {
    plan_index_.emplace(name, static_cast<int>(plans_.size()));
    plans_.push_back(&plan);
  }
  if (!c.default_plan.empty()) {
    auto it = plan_index_.find(c.default_plan);
    if (it == plan_index_.end())
      return InvalidArgument(where + "default_plan " + Quote(c.default_plan) + " is not a plan");
    default_plan_ = it->second;
  }
  for (const auto& [key, plan] : c.api_keys) {
    auto it = plan_index_.find(plan);
    if (it == plan_index_.end())
      return InvalidArgument(where + "API key maps to unknown plan " + Quote(plan));
    api_keys_.emplace(key, it->second);
  }
  for (const auto& [name, limit] : c.named_limits) named_.emplace(name, &limit);

  // Routes.
  for (const RouteClass& r : c.routes) {
    const std::string what =
        where + "route " + Quote(r.name) +
        (r.source_line > 0 ? " (line " + std::to_string(r.source_line) + ")" : "") + ": ";
    StatusOr<std::string> path = CanonicalRoutePath(r.path, r.match);
    if (!path.ok())
      return InvalidArgument(what + "path " + Quote(r.path) + " " + path.status().message());
    if (*path != r.path) {
      return InvalidArgument(what + "path " + Quote(r.path) + " is not canonical (expected " +
                             Quote(*path) + ")");
    }
    for (const std::string& m : r.methods) {
      if (m.empty() ||
          !std::all_of(m.begin(), m.end(), [](char ch) { return ch >= 'A' && ch <= 'Z'; })) {
        return InvalidArgument(what + "method " + Quote(m) + " must be upper-case letters");
      }
    }
    if (r.cost < 0) return InvalidArgument(what + "cost must not be negative");
    for (const RuleLimit& rl : r.limits) {
      if (Status s = rl.limit.ValidateCost(r.cost); !s.ok())
        return InvalidArgument(what + s.message());
    }
    std::vector<std::string> segments;
    if (r.match == RouteClass::Match::kTemplate) {
      size_t pos = 1;
      while (pos <= r.path.size() && r.path != "/") {
        size_t end = r.path.find('/', pos);
        if (end == std::string::npos) end = r.path.size();
        segments.push_back(r.path.substr(pos, end - pos));
        pos = end + 1;
      }
    }
    route_segments_.push_back(std::move(segments));
  }

  // Group templates for every (route or none) x (plan or none) x ip_identity.
  const int routes = static_cast<int>(c.routes.size());
  const int plans = static_cast<int>(plans_.size());
  templates_.resize(static_cast<size_t>(routes + 1) * plans_.size() * 2);
  for (int ri = -1; ri < routes; ++ri) {
    const RouteClass* route = ri >= 0 ? &c.routes[ri] : nullptr;
    for (int pi = 0; pi < plans; ++pi) {
      for (bool ip_identity : {false, true}) {
        std::vector<Entry> entries;
        auto add = [&](bool by_ip, const RuleLimit& rl, int64_t cost, bool shadow,
                       std::optional<FailureMode> fm) {
          if (ip_identity) by_ip = false;  // the client key is the IP key
          for (const Entry& e : entries) {
            if (e.by_ip == by_ip && e.limit->name() == rl.limit.name()) return;  // first wins
          }
          entries.push_back({by_ip, &rl.limit, cost, shadow || rl.shadow,
                             rl.failure_mode.value_or(fm.value_or(c.store.failure_mode))});
        };
        if (route) {
          for (const RuleLimit& rl : route->limits) {
            add(route->key_by == RouteClass::KeyBy::kIp, rl, route->cost, route->shadow,
                route->failure_mode);
          }
        }
        if (plans_[pi]) {
          for (const RuleLimit& rl : plans_[pi]->limits) add(false, rl, 1, false, std::nullopt);
        }
        for (const RuleLimit& rl : c.global_limits) add(false, rl, 1, false, std::nullopt);

        std::vector<GroupTemplate>& groups = templates_[TemplateIndex(ri, pi, ip_identity)];
        for (const Entry& e : entries) {
          auto g = std::find_if(groups.begin(), groups.end(), [&](const GroupTemplate& t) {
            return t.by_ip == e.by_ip && t.shadow == e.shadow && t.failure_mode == e.failure_mode;
          });
          if (g == groups.end()) {
            groups.push_back({e.by_ip, e.shadow, e.failure_mode, {}});
            g = groups.end() - 1;
          }
          g->checks.push_back({e.limit, e.cost});
          if (g->checks.size() > kMaxChecksPerRequest) {
            return InvalidArgument(
                where +
                (route ? "route " + Quote(route->name) : std::string("requests without a route")) +
                (plans_[pi] ? " with plan " + Quote(plans_[pi]->name) : std::string()) +
                " would check more than " + std::to_string(kMaxChecksPerRequest) +
                " limits on one key at once");
          }
        }
      }
    }
  }
  return Status::Ok();
}

Identity Policy::IdentifyImpl(const RequestView& request, int* plan_index) const {
  const ClientConfig& cc = config_.clients;
  Identity id;
  auto header = [&](std::string_view name) -> std::optional<std::string_view> {
    if (name.empty() || !request.header) return std::nullopt;
    std::optional<std::string_view> v = request.header(name);
    if (v) v = Trim(*v);
    return v;
  };
  bool peer_trusted = false;
  for (const Cidr& cidr : cc.trusted_proxies) {
    if (cidr.Contains(request.peer)) {
      peer_trusted = true;
      break;
    }
  }
  if (peer_trusted) {
    // Only the header the proxies set: a client's own copy of the other one
    // would pass through them.
    const std::optional<std::string_view> xff = cc.client_ip_header != ClientIpHeader::kForwarded
                                                    ? header("X-Forwarded-For")
                                                    : std::nullopt;
    const std::optional<std::string_view> forwarded =
        cc.client_ip_header != ClientIpHeader::kXForwardedFor ? header("Forwarded") : std::nullopt;
    id.client_ip = ClientIp(request.peer, xff, forwarded, cc.trusted_proxies);
  } else {
    id.client_ip = request.peer;
  }
  id.ip_key = "ip:" + id.client_ip.KeyString(cc.ipv6_prefix);
  *plan_index = default_plan_;

  bool identified = false;
  if (std::optional<std::string_view> key = header(cc.api_key_header);
      key && UsableIdentity(*key)) {
    auto it = api_keys_.find(*key);
    if (it != api_keys_.end() || cc.accept_unknown_api_keys) {
      id.source = IdentitySource::kApiKey;
      id.key.reserve(key->size() + 2);
      id.key = "k:";
      id.key += *key;
      if (it != api_keys_.end()) *plan_index = it->second;
      identified = true;
    }
  }
  if (!identified) {
    if (std::optional<std::string_view> user = header(cc.user_header);
        user && UsableIdentity(*user)) {
      id.source = IdentitySource::kUser;
      id.key.reserve(user->size() + 2);
      id.key = "u:";
      id.key += *user;
      identified = true;
    }
  }
  if (!identified) {
    id.source = IdentitySource::kIp;
    id.key = id.ip_key;
  }
  if (plans_[*plan_index]) id.plan = plans_[*plan_index]->name;
  return id;
}

Identity Policy::Identify(const RequestView& request) const {
  int plan_index = 0;
  return IdentifyImpl(request, &plan_index);
}

namespace {

// `method` (as the request sent it) equal to `upper` (a route's method: upper
// case, checked by Policy::Create) in ASCII upper case.
bool MethodIs(std::string_view method, std::string_view upper) {
  if (method.size() != upper.size()) return false;
  for (size_t i = 0; i < method.size(); ++i) {
    char c = method[i];
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (c != upper[i]) return false;
  }
  return true;
}

// Whether a request's method is one of a route's `methods`. Upper-cased
// first: Werkzeug (Flask) upper-cases the method it routes on, so "post"
// reaches a POST view and must not escape a [POST] route. GET implies HEAD:
// Go 1.22's ServeMux, Express and Flask serve HEAD with the GET handler.
bool RouteTakesMethod(const std::vector<std::string>& methods, std::string_view method) {
  const bool head = MethodIs(method, "HEAD");
  for (const std::string& m : methods) {
    if (MethodIs(method, m) || (head && m == "GET")) return true;
  }
  return false;
}

}  // namespace

int Policy::RouteIndex(std::string_view method, std::string_view path) const {
  for (size_t i = 0; i < config_.routes.size(); ++i) {
    const RouteClass& r = config_.routes[i];
    if (!r.methods.empty() && !RouteTakesMethod(r.methods, method)) continue;
    switch (r.match) {
      case RouteClass::Match::kExact:
        if (path == r.path) return static_cast<int>(i);
        break;
      case RouteClass::Match::kPrefix:
        // Segment-aware: /api matches /api and /api/x, not /apix.
        if (r.path == "/" || path == r.path ||
            (path.size() > r.path.size() && path.starts_with(r.path) &&
             path[r.path.size()] == '/')) {
          return static_cast<int>(i);
        }
        break;
      case RouteClass::Match::kTemplate: {
        const std::vector<std::string>& segs = route_segments_[i];
        size_t pos = 1, n = 0;
        bool ok = true;
        if (path == "/") {
          ok = segs.empty();
        } else {
          while (ok && pos <= path.size()) {
            size_t end = path.find('/', pos);
            if (end == std::string_view::npos) end = path.size();
            std::string_view seg = path.substr(pos, end - pos);
            pos = end + 1;
            if (n >= segs.size()) {
              ok = false;
            } else if (segs[n].front() == '{') {
              ok = !seg.empty();  // a {param} is one non-empty segment
            } else {
              ok = seg == segs[n];
            }
            ++n;
          }
          ok = ok && n == segs.size();
        }
        if (ok) return static_cast<int>(i);
        break;
      }
    }
  }
  return -1;
}

const RouteClass* Policy::Route(std::string_view method, std::string_view canonical_path) const {
  const int i = RouteIndex(method, canonical_path);
  return i < 0 ? nullptr : &config_.routes[i];
}

StatusOr<RequestPlan> Policy::Resolve(const RequestView& request) const {
  StatusOr<std::string> path = CanonicalPath(request.target);
  if (!path.ok()) return path.status();
  RequestPlan plan;
  plan.canonical_path = std::move(*path);
  int plan_index = 0;
  plan.identity = IdentifyImpl(request, &plan_index);
  const int route_index = RouteIndex(request.method, plan.canonical_path);
  plan.route = route_index < 0 ? nullptr : &config_.routes[route_index];
  const std::vector<GroupTemplate>& groups = templates_[TemplateIndex(
      route_index, plan_index, plan.identity.source == IdentitySource::kIp)];
  plan.groups.reserve(groups.size());
  for (const GroupTemplate& g : groups) {
    plan.groups.push_back(CheckGroup{g.by_ip ? plan.identity.ip_key : plan.identity.key, g.checks,
                                     g.shadow, g.failure_mode});
  }
  if (plan.route != nullptr && plan.route->concurrency) {
    const RouteClass& r = *plan.route;
    const bool whole = r.concurrency->per == ConcurrencyConfig::Per::kRoute;
    const bool by_ip = r.key_by == RouteClass::KeyBy::kIp;
    plan.concurrency =
        ConcurrencyPlan{.config = &*r.concurrency,
                        .key = whole ? std::string(kWholeRouteKey)
                                     : (by_ip ? plan.identity.ip_key : plan.identity.key),
                        .failure_mode = r.failure_mode.value_or(config_.store.failure_mode),
                        .shadow = r.shadow};
  }
  return plan;
}

namespace {

// Whether `limit` is one of the route's own (not a plan's or a global one of the same name).
bool IsRouteLimit(const RouteClass& route, const Limit* limit) {
  return std::any_of(route.limits.begin(), route.limits.end(),
                     [limit](const RuleLimit& rl) { return &rl.limit == limit; });
}

}  // namespace

bool Policy::Replan(RequestPlan& plan, std::string_view plan_name) const {
  auto it = plan_index_.find(plan_name);
  if (it == plan_index_.end()) return false;
  const int route_index =
      plan.route == nullptr ? -1 : static_cast<int>(plan.route - config_.routes.data());
  const std::vector<GroupTemplate>& groups = templates_[TemplateIndex(
      route_index, it->second, plan.identity.source == IdentitySource::kIp)];
  plan.identity.plan = plans_[it->second]->name;
  // A metered route's limits carry the request's reservation (set after
  // Resolve): the templates have the route's fixed cost, which would check
  // the request at its `reserve` and settle the difference from that.
  std::optional<int64_t> reserved;
  if (plan.route != nullptr) {
    for (const CheckGroup& g : plan.groups) {
      for (const LimitCheck& c : g.checks) {
        if (IsRouteLimit(*plan.route, c.limit)) reserved = c.cost;
      }
    }
  }
  // In place: the groups' strings and vectors keep their buffers (a
  // decision of a client with an override must cost about what one without does).
  plan.groups.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupTemplate& g = groups[i];
    CheckGroup& out = plan.groups[i];
    out.key = g.by_ip ? plan.identity.ip_key : plan.identity.key;
    out.checks.assign(g.checks.begin(), g.checks.end());
    out.shadow = g.shadow;
    out.failure_mode = g.failure_mode;
    if (!reserved || *reserved == plan.route->cost) continue;
    for (LimitCheck& c : out.checks) {
      if (IsRouteLimit(*plan.route, c.limit)) c.cost = *reserved;
    }
  }
  return true;
}

const Limit* Policy::NamedLimit(std::string_view name) const {
  auto it = named_.find(name);
  return it == named_.end() ? nullptr : it->second;
}

std::vector<const Limit*> Policy::LimitsFor(const Identity& identity) const {
  std::vector<const Limit*> out;
  auto add = [&](const std::vector<RuleLimit>& rules) {
    for (const RuleLimit& rl : rules) {
      if (std::none_of(out.begin(), out.end(),
                       [&](const Limit* l) { return l->name() == rl.limit.name(); })) {
        out.push_back(&rl.limit);
      }
    }
  };
  for (const RouteClass& r : config_.routes) add(r.limits);
  if (auto it = plan_index_.find(identity.plan); it != plan_index_.end())
    add(plans_[it->second]->limits);
  add(config_.global_limits);
  return out;
}

std::vector<CheckGroup> Policy::PeekGroupsFor(const Identity& identity) const {
  int plan_index = 0;
  if (auto it = plan_index_.find(identity.plan); it != plan_index_.end()) plan_index = it->second;
  const bool ip_identity = identity.source == IdentitySource::kIp;
  std::vector<std::pair<bool, const Limit*>> seen;  // (by_ip, limit)
  std::vector<CheckGroup> out;
  for (int ri = -1; ri < static_cast<int>(config_.routes.size()); ++ri) {
    for (const GroupTemplate& g : templates_[TemplateIndex(ri, plan_index, ip_identity)]) {
      for (const LimitCheck& check : g.checks) {
        if (std::any_of(seen.begin(), seen.end(), [&](const auto& s) {
              return s.first == g.by_ip && s.second->name() == check.limit->name();
            })) {
          continue;
        }
        seen.emplace_back(g.by_ip, check.limit);
        const std::string& key = g.by_ip ? identity.ip_key : identity.key;
        auto it = std::find_if(out.begin(), out.end(), [&](const CheckGroup& cg) {
          return cg.key == key && cg.checks.size() < kMaxChecksPerRequest;
        });
        if (it == out.end()) {
          out.push_back(CheckGroup{key, {}, false, config_.store.failure_mode});
          it = out.end() - 1;
        }
        it->checks.push_back({check.limit, 0});
      }
    }
  }
  return out;
}

}  // namespace ratelimit::policy
