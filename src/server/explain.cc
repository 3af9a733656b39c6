#include "server/explain.h"

#include <algorithm>
#include <iostream>
#include <memory>

#include "server/enforcer.h"
#include "server/json_log.h"
#include "server/router.h"

namespace ratelimit::server {
namespace {

using json = nlohmann::json;

bool Token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
           c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~';
  });
}

// Beyond what a request head may hold anyway (and Beast's fields refuse
// larger parts by throwing).
constexpr size_t kMaxPart = 16 * 1024;

Status Check(const ExplainRequest& r) {
  if (!Token(r.method) || r.method.size() > 64) {
    return InvalidArgument("the method must be an HTTP token such as GET");
  }
  // Any target form: Resolve canonicalises it as the gateway does (an
  // absolute form to its path) and refuses what the gateway refuses, with
  // the gateway's words.
  if (r.target.size() > kMaxPart || r.headers.size() > 100) {
    return InvalidArgument("the target or the headers are too large for a request");
  }
  for (const auto& [name, value] : r.headers) {
    if (name.size() + value.size() > kMaxPart) {
      return InvalidArgument("header '" + name.substr(0, 64) + "' is too large for a request");
    }
    if (!Token(name)) return InvalidArgument("header name '" + name + "' is not an HTTP token");
    if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      return InvalidArgument("header '" + name + "' holds a line break or NUL");
    }
  }
  return Status::Ok();
}

json LimitJson(const Limit& l) {
  json j = {{"name", l.name()}, {"algorithm", AlgorithmName(l.algorithm())}};
  switch (l.algorithm()) {
    case Algorithm::kTokenBucket:
      j["capacity"] = l.limit();
      j["refill_per_second"] = l.refill_per_second();
      if (l.lease() > 0) j["lease"] = l.lease();
      break;
    case Algorithm::kLeakyBucket:
      j["depth"] = l.limit();
      j["rate_per_second"] = l.refill_per_second();
      break;
    default:
      j["limit"] = l.limit();
      j["window"] = WindowText(l);
      if (const Calendar* c = l.calendar()) {
        j["align"] = "calendar";
        j["timezone"] = c->zone().name();
      }
      break;
  }
  return j;
}

std::string_view MatchName(policy::RouteClass::Match m) {
  switch (m) {
    case policy::RouteClass::Match::kExact: return "exact";
    case policy::RouteClass::Match::kPrefix: return "prefix";
    case policy::RouteClass::Match::kTemplate: return "template";
  }
  return "prefix";
}

// Where a limit of the plan comes from: the route's, the plan's or the
// global limits (by address: the plan points into the policy's config).
std::string_view Origin(const policy::Config& c, const policy::RequestPlan& plan, const Limit* l) {
  auto in = [l](const std::vector<policy::RuleLimit>& rules) {
    return std::any_of(rules.begin(), rules.end(),
                       [l](const policy::RuleLimit& rl) { return &rl.limit == l; });
  };
  if (plan.route != nullptr && in(plan.route->limits)) return "route";
  if (auto it = c.plans.find(plan.identity.plan); it != c.plans.end() && in(it->second.limits)) {
    return "plan";
  }
  if (in(c.global_limits)) return "global";
  return "";
}

bool DecisionEndpoint(std::string_view path) {
  return path == "/v1/check" || path == "/v1/check/batch" || path == "/v1/acquire" ||
         path == "/v1/release" || path == "/v1/renew" || path == "/v1/settle";
}

}  // namespace

std::string_view IdentitySourceName(policy::IdentitySource s) {
  switch (s) {
    case policy::IdentitySource::kApiKey: return "api_key";
    case policy::IdentitySource::kUser: return "user";
    case policy::IdentitySource::kIp: return "ip";
  }
  return "ip";
}

StatusOr<ExplainRequest> ParseExplainRequest(const json& body) {
  if (!body.is_object()) return InvalidArgument("the body must be a JSON object");
  ExplainRequest r;
  bool have_target = false;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "method" || k == "target" || k == "peer") {
      if (!v.is_string()) return InvalidArgument("field '" + k + "' must be a string");
      (k == "method" ? r.method : k == "target" ? r.target : r.peer) = v.get<std::string>();
      have_target = have_target || k == "target";
    } else if (k == "headers") {
      if (!v.is_object()) {
        return InvalidArgument(
            "field 'headers' must be an object: {\"X-API-Key\": \"k\", \"X-Forwarded-For\": "
            "[\"a\", \"b\"]}");
      }
      for (auto h = v.begin(); h != v.end(); ++h) {
        const json values = h.value().is_array() ? h.value() : json::array({h.value()});
        for (const json& one : values) {
          if (!one.is_string())
            return InvalidArgument("header '" + h.key() + "' must be a string or strings");
          r.headers.emplace_back(h.key(), one.get<std::string>());
        }
      }
    } else {
      return InvalidArgument("unknown field '" + k + "' (expected method, target, headers, peer)");
    }
  }
  if (!have_target) return InvalidArgument("field 'target' is required");
  if (Status s = Check(r); !s.ok()) return s;
  return r;
}

StatusOr<ExplainRequest> ParseExplainCommand(std::string_view request_line,
                                             const std::vector<std::string>& header_lines,
                                             std::string_view peer) {
  ExplainRequest r;
  const size_t space = request_line.find(' ');
  if (space == std::string_view::npos)
    return InvalidArgument("--explain wants 'METHOD TARGET': 'GET /api/x'");
  r.method = std::string(request_line.substr(0, space));
  r.target = std::string(request_line.substr(space + 1));
  for (const std::string& line : header_lines) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos)
      return InvalidArgument("-H wants 'Name: value', not '" + line + "'");
    std::string_view value = std::string_view(line).substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    r.headers.emplace_back(line.substr(0, colon), std::string(value));
  }
  if (!peer.empty()) r.peer = std::string(peer);
  if (Status s = Check(r); !s.ok()) return s;
  return r;
}

StatusOr<json> Explain(const policy::Policy& policy, const ExplainRequest& req,
                       const OverrideTable* overrides, int64_t now_ms) {
  if (Status s = Check(req); !s.ok()) return s;
  StatusOr<policy::IpAddress> peer = policy::IpAddress::Parse(req.peer);
  if (!peer.ok()) return InvalidArgument("the peer '" + req.peer + "' is not an IP address");
  // The request as the server would hold it, seen through the Router's own view.
  Request http_req;
  http_req.method_string(req.method);
  http_req.target(req.target);
  for (const auto& [name, value] : req.headers) http_req.insert(name, value);
  json out = {{"request", {{"method", req.method}, {"target", req.target}, {"peer", req.peer}}}};
  const std::string_view path = std::string_view(req.target).substr(0, req.target.find('?'));
  std::string_view method = req.method, target = req.target;
  if (DecisionEndpoint(path)) {
    out["face"] = "decision_api";
    out["note"] =
        "the decision API: the key and limits come with each request's body; the "
        "configured rules do not apply";
    return out;
  }
  if (path == "/v1/auth") {
    // As /v1/auth decides: the original request nginx names in its headers.
    auto m = http_req.find("X-Original-Method");
    auto u = http_req.find("X-Original-URI");
    if (m == http_req.end() || u == http_req.end()) {
      return InvalidArgument(
          "/v1/auth needs X-Original-Method and X-Original-URI (it answers 400)");
    }
    method = m->value();
    target = u->value();
    out["face"] = "auth_request";
    out["original"] = {{"method", method}, {"target", target}};
  }
  JoinedFields joined;
  const policy::RequestView view = MakeView(http_req, method, target, *peer, joined);
  StatusOr<policy::RequestPlan> plan = policy.Resolve(view);
  if (!plan.ok()) return InvalidArgument(plan.status().message() + " (the request would be a 400)");
  const policy::Config& c = policy.config();
  out["canonical_path"] = plan->canonical_path;
  if (!out.contains("face")) {
    if (IsOwnPath(plan->canonical_path)) {
      out["face"] = "none";
      out["note"] = "a spelling of one of ratelimitd's own paths: 404, never forwarded";
      return out;
    }
    out["face"] = c.server.upstream.empty() ? "rules" : "gateway";
    if (!c.server.upstream.empty()) out["upstream"] = c.server.upstream;
  }
  const ClientOverride* over =
      overrides != nullptr ? overrides->Find(plan->identity.key, now_ms) : nullptr;
  if (over != nullptr) {
    ApplyOverride(*over, policy, *plan);
    out["override"] = over->ToJson(now_ms);
  } else {
    out["override"] = nullptr;
  }
  OrderForDecision(plan->groups);  // `group`: the order the enforcer decides them in
  const policy::Identity& who = plan->identity;
  out["client"] = {{"key", RedactKey(who.key)},
                   {"source", IdentitySourceName(who.source)},
                   {"plan", who.plan},
                   {"ip", who.client_ip.ToString()},
                   {"ip_key", who.ip_key}};
  if (const policy::RouteClass* r = plan->route) {
    out["route"] = {{"name", r->name},
                    {"path", r->path},
                    {"match", MatchName(r->match)},
                    {"methods", r->methods},
                    {"cost", r->cost},
                    {"key_by", r->key_by == policy::RouteClass::KeyBy::kIp ? "ip" : "client"},
                    {"shadow", r->shadow}};
    if (r->source_line > 0) out["route"]["line"] = r->source_line;
    if (const std::optional<policy::MeteredCost>& m = r->metered) {
      json metered = {{"source", policy::CostSourceName(m->source)},
                      {"settle_from", policy::SettleFromName(m->settle_from)},
                      {"field", m->field}};
      if (!m->request_field.empty()) metered["request_field"] = m->request_field;
      if (m->reserve) metered["reserve"] = *m->reserve;
      if (m->max) metered["max"] = *m->max;
      if (!m->unit.empty()) metered["unit"] = m->unit;
      out["route"]["metered_cost"] = std::move(metered);
    }
  } else {
    out["route"] = nullptr;
  }
  json limits = json::array();
  for (size_t g = 0; g < plan->groups.size(); ++g) {
    const policy::CheckGroup& group = plan->groups[g];
    for (const LimitCheck& check : group.checks) {
      json l = LimitJson(*check.limit);
      if (over != nullptr && over->Replacing(*check.limit) == check.limit) {
        l["from"] = "override";
      } else {
        l["from"] = Origin(c, *plan, check.limit);
      }
      l["cost"] = check.cost;
      l["key"] = RedactKey(group.key);
      l["scope"] = group.key == who.key ? "client" : "ip";
      l["shadow"] = group.shadow;
      l["failure_mode"] = policy::FailureModeName(group.failure_mode);
      l["group"] = g;
      limits.push_back(std::move(l));
    }
  }
  out["limits"] = std::move(limits);
  if (plan->concurrency && plan->route != nullptr) {
    const policy::ConcurrencyConfig& cc = *plan->concurrency->config;
    out["concurrency"] = {
        {"name", plan->route->name},
        {"max_in_flight", cc.max_in_flight},
        {"lease_ttl_ms", cc.lease_ttl.count()},
        {"per", cc.per == policy::ConcurrencyConfig::Per::kRoute ? "route" : "client"},
        {"on_limit", cc.on_limit == policy::ConcurrencyConfig::OnLimit::kWait ? "wait" : "reject"},
        {"key", RedactKey(plan->concurrency->key)},
        {"failure_mode", policy::FailureModeName(plan->concurrency->failure_mode)},
        {"applies", out["face"] == "gateway"}};
  } else {
    out["concurrency"] = nullptr;
  }
  return out;
}

int ExplainCommand(policy::Config config, std::string_view request_line,
                   const std::vector<std::string>& header_lines, std::string_view peer) {
  StatusOr<std::shared_ptr<const policy::Policy>> policy =
      policy::Policy::Create(std::move(config));
  if (!policy.ok()) {
    std::cerr << "ratelimitd: " << policy.status().message() << "\n";
    return 1;
  }
  StatusOr<ExplainRequest> request = ParseExplainCommand(request_line, header_lines, peer);
  // The overrides in effect (Redis: those every instance applies; the memory
  // store's live in a running daemon: ask its POST /v1/explain).
  StatusOr<std::shared_ptr<const OverrideTable>> overrides = ReadStoredOverrides(**policy);
  if (!overrides.ok()) {
    std::cerr << "ratelimitd: --explain: overrides not shown: " << overrides.status().message()
              << "\n";
  }
  const int64_t now_ms = Clock::System().NowMicros() / 1000;
  StatusOr<json> answer =
      request.ok()
          ? Explain(**policy, *request, overrides.ok() ? overrides->get() : nullptr, now_ms)
          : request.status();
  if (!answer.ok()) {
    std::cerr << "ratelimitd: --explain: " << answer.status().message() << "\n";
    return 2;
  }
  std::cout << answer->dump(2, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace ratelimit::server
