#include "envoy/plan.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <string_view>

namespace ratelimit::envoy {

namespace {

// '*' matches any run of characters (envoyproxy/ratelimit's wildcardMatch).
bool Glob(std::string_view pattern, std::string_view text) {
  const size_t star = pattern.find('*');
  if (star == std::string_view::npos) return pattern == text;
  const std::string_view head = pattern.substr(0, star);
  if (!text.starts_with(head)) return false;
  text.remove_prefix(head.size());
  pattern.remove_prefix(star + 1);
  size_t next;
  while ((next = pattern.find('*')) != std::string_view::npos) {
    const std::string_view part = pattern.substr(0, next);
    const size_t at = text.find(part);
    if (at == std::string_view::npos) return false;
    text.remove_prefix(at + part.size());
    pattern.remove_prefix(next + 1);
  }
  return text.size() >= pattern.size() && text.ends_with(pattern);
}

const Node* Find(const Node& level, std::string_view key) {
  auto it = level.children.find(key);
  return it == level.children.end() ? nullptr : &it->second;
}

// The node whose rules apply to `d`, or nullptr.
const Node* Match(const Domain& domain, const Descriptor& d) {
  const Node* level = &domain.root;
  for (size_t i = 0; i < d.entries.size(); ++i) {
    const Entry& e = d.entries[i];
    const std::string full = e.key + "_" + e.value;
    const Node* next = Find(*level, full);
    for (size_t w = 0; next == nullptr && w < level->wildcards.size(); ++w) {
      const Node* cand = level->wildcards[w];
      if (Glob(cand->key + "_" + cand->value, full)) next = cand;
    }
    if (next == nullptr) next = Find(*level, e.key);
    if (next == nullptr) return nullptr;
    if (i + 1 == d.entries.size()) return next->rules.empty() ? nullptr : next;
    if (next->children.empty()) return nullptr;  // the request is deeper than the config
    level = next;
  }
  return nullptr;
}

// FNV-1a, 64 bits: stable across builds and hosts (store keys are shared).
struct Fnv {
  uint64_t h = 14695981039346656037ULL;
  void Add(std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    h ^= 0xff;  // a separator no text contains
    h *= 1099511628211ULL;
  }
  void AddInt(int64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
      h *= 1099511628211ULL;
    }
  }
};

std::string MetricPath(const Node& node, const Descriptor& d) {
  if (!node.detailed_metric) return node.metric_path;
  std::string path;
  for (const Entry& e : d.entries) {
    if (!path.empty()) path += '.';
    path += e.key;
    if (!e.value.empty()) path += "_" + e.value;
  }
  return path;
}

// Finds the limits of `plan` (limits built, checks not yet) that name the
// same counter as an earlier one of the same list: two identical
// descriptors, or a `limit` override with the entries and unit of a
// configured rule beside it. Fills `leader` (see MakePlan) when there are
// any; InvalidArgument when two name one counter with different limits,
// which one store check cannot ask.
Status ShareCounters(const RequestPlan& plan, std::vector<uint32_t>& leader) {
  const std::vector<DescriptorPlan>& ds = plan.descriptors;
  if (std::count_if(ds.begin(), ds.end(), [](const DescriptorPlan& p) {
        return p.kind == DescriptorPlan::Kind::kLimited;
      }) < 2) {
    return Status::Ok();
  }
  for (size_t i = 0; i < ds.size(); ++i) {
    const DescriptorPlan& p = ds[i];
    if (p.kind != DescriptorPlan::Kind::kLimited) continue;
    for (size_t r = 0; r < p.rules.size(); ++r) {
      const size_t k = p.first_limit + r;
      const Limit& mine = plan.limits[k];
      for (size_t j = 0; j < i; ++j) {
        const DescriptorPlan& q = ds[j];
        if (q.kind != DescriptorPlan::Kind::kLimited || q.shadow != p.shadow) continue;
        size_t same = q.rules.size();
        for (size_t rq = 0; rq < q.rules.size(); ++rq) {
          if (plan.limits[q.first_limit + rq].name() == mine.name()) same = rq;
        }
        if (same == q.rules.size()) continue;
        const size_t other = q.first_limit + same;
        if (!(plan.limits[other] == mine)) {
          return InvalidArgument(
              "descriptors " + std::to_string(j + 1) + " and " + std::to_string(i + 1) +
              " of the request name one counter with different limits (a limit override "
              "beside the rule of the same entries and unit)");
        }
        if (leader.empty()) {
          leader.resize(plan.limits.size());
          std::iota(leader.begin(), leader.end(), 0U);
        }
        leader[k] = leader[other];
        break;
      }
    }
  }
  return Status::Ok();
}

// Per check of one list (plan.checks, or plan.shadow_checks), when checks
// are shared: how many of the request's limits ask it, and their costs.
struct Shares {
  std::vector<uint32_t> members;
  std::vector<int64_t> costs;
};

Shares SharesOf(const RequestPlan& plan, bool shadow) {
  const size_t n = (shadow ? plan.shadow_checks : plan.checks).size();
  Shares s{std::vector<uint32_t>(n, 0), std::vector<int64_t>(n, 0)};
  for (const DescriptorPlan& p : plan.descriptors) {
    if (p.kind != DescriptorPlan::Kind::kLimited || p.shadow != shadow) continue;
    for (size_t r = 0; r < p.rules.size(); ++r) {
      const size_t c = CheckOf(plan, p, r);
      ++s.members[c];
      s.costs[c] += p.cost;
    }
  }
  return s;
}

// Denied by the store, or up front (a cost above a limit: asked at cost 0).
bool Denied(const RequestPlan& plan, const CheckResult& result) {
  return !result.overall.allowed ||
         std::any_of(plan.descriptors.begin(), plan.descriptors.end(),
                     [](const DescriptorPlan& p) { return p.too_big && !p.shadow; });
}

// Whether check c's cost was taken: asked with a cost, and every step up to
// its own allowed (grpc/decide.cc asks kMaxChecksPerRequest checks a step, in
// order, and a step after a denied one without counting).
bool Taken(const CheckResult& result, const std::vector<LimitCheck>& checks, size_t c) {
  if (checks[c].cost == 0) return false;
  const size_t end =
      std::min(result.decisions.size(), (c / kMaxChecksPerRequest + 1) * kMaxChecksPerRequest);
  for (size_t i = 0; i < end; ++i) {
    if (!result.decisions[i].allowed) return false;
  }
  return true;
}

// Whether a denied request's descriptor of `rule`, whose check had `left`
// and asks `cost`, is charged anyway (Overdrafts; Respond reports it so): a
// cost that did not fit what was left, on a limit not spent already. A block
// has nothing to charge, and a sliding log cannot settle.
bool Overdrawn(const Rule& rule, int64_t cost, int64_t left) {
  return rule.requests_per_unit != 0 && rule.algorithm != Algorithm::kSlidingLog && cost > left &&
         left > 0;
}

// The part of a shared check's decision `d` that is one descriptor's, whose
// cost and its predecessors' on the check come to `upto`: the count after
// them, as envoyproxy/ratelimit's INCRBY per descriptor leaves it. A check
// taken, or charged whole because it did not fit (Overdrafts), leaves each
// descriptor what its predecessors and it left; when another limit denied
// the request, nothing was taken and each reports the count as it stands.
Decision Part(Decision d, int64_t asked, int64_t upto, bool taken, bool charged) {
  const int64_t before = d.remaining + (taken ? asked : 0);
  const bool allowed = upto <= before;
  if (allowed) {
    d.retry_after = std::chrono::microseconds(0);
  } else if (d.allowed) {
    d.retry_after = d.reset_after;  // the store's answer had no wait: the reset bounds it
  }
  d.allowed = allowed;
  d.remaining = taken || charged ? std::max<int64_t>(0, before - upto) : before;
  return d;
}

}  // namespace

Status TooManyDescriptors() {
  return InvalidArgument("the request has more than " + std::to_string(kMaxDescriptorsPerRequest) +
                         " descriptors");
}

Status TooManyEntries() {
  return InvalidArgument("the request's descriptors have more than " +
                         std::to_string(kMaxEntriesPerRequest) + " entries in all");
}

StatusOr<RequestPlan> MakePlan(const Config& config, const Request& request) {
  if (request.domain.empty()) return InvalidArgument("rate limit domain must not be empty");
  if (request.descriptors.empty())
    return InvalidArgument("rate limit descriptor list must not be empty");
  if (request.descriptors.size() > kMaxDescriptorsPerRequest) return TooManyDescriptors();
  size_t entries = 0;
  for (const Descriptor& d : request.descriptors) entries += d.entries.size();
  if (entries > kMaxEntriesPerRequest) return TooManyEntries();
  RequestPlan plan;
  plan.store_key = "envoy:" + request.domain;
  plan.descriptors.resize(request.descriptors.size());
  auto dom = config.domains.find(request.domain);
  plan.domain_known = dom != config.domains.end();
  if (!plan.domain_known) return plan;  // every descriptor: OK, no limit

  // Match, then drop what `replaces` names (envoyproxy/ratelimit's order).
  std::set<std::string, std::less<>> replaced;
  size_t total = 0;
  for (size_t i = 0; i < request.descriptors.size(); ++i) {
    const Descriptor& d = request.descriptors[i];
    DescriptorPlan& p = plan.descriptors[i];
    // A descriptor without entries (Envoy sends one when a request_headers
    // action with skip_if_absent finds no header) matches no rule: OK, no
    // limit, as in envoyproxy/ratelimit, and the others are decided.
    if (d.limit) {
      // requests_per_unit 0 blocks, as in a config file (envoyproxy/ratelimit
      // builds the override's rule as it builds a configured one).
      if (d.limit->unit == Unit::kUnknown) return InvalidArgument("a limit override needs a unit");
      p.kind = DescriptorPlan::Kind::kLimited;
      p.override_rule.requests_per_unit = d.limit->requests_per_unit;
      p.override_rule.unit = d.limit->unit;
      p.override_rule.period = UnitLength(d.limit->unit);
      p.rules.push_back(&p.override_rule);
      p.metric_path = "~override";
    } else if (const Node* node = Match(dom->second, d); node != nullptr) {
      p.shadow = node->shadow_mode;
      p.metric_path = MetricPath(*node, d);
      for (const Rule& r : node->rules) {
        for (const std::string& name : r.replaces) replaced.insert(name);
        p.rules.push_back(&r);
      }
      p.kind = node->rules.front().unlimited ? DescriptorPlan::Kind::kUnlimited
                                             : DescriptorPlan::Kind::kLimited;
    }
    if (p.kind == DescriptorPlan::Kind::kLimited) total += p.rules.size();
  }
  if (total > kMaxLimitsPerRequest) {
    return InvalidArgument("the request names " + std::to_string(total) + " limits; at most " +
                           std::to_string(kMaxLimitsPerRequest));
  }
  for (DescriptorPlan& p : plan.descriptors) {
    if (p.kind != DescriptorPlan::Kind::kLimited || replaced.empty()) continue;
    std::erase_if(p.rules,
                  [&](const Rule* r) { return !r->name.empty() && replaced.count(r->name); });
    if (p.rules.empty()) p.kind = DescriptorPlan::Kind::kNoRule;
  }

  // Limits are built before any check points at them (no reallocation).
  plan.limits.reserve(total);
  const int64_t request_cost = request.hits_addend == 0 ? 1 : request.hits_addend;
  std::vector<int64_t> costs;  // per limit
  bool too_big = false;        // a cost above a limit: over it, and nothing is taken
  for (size_t i = 0; i < plan.descriptors.size(); ++i) {
    DescriptorPlan& p = plan.descriptors[i];
    if (p.kind != DescriptorPlan::Kind::kLimited) continue;
    const Descriptor& d = request.descriptors[i];
    const int64_t cost =
        d.hits_addend
            ? static_cast<int64_t>(std::min<uint64_t>(*d.hits_addend, Limit::kMaxCount + 1ULL))
            : request_cost;
    p.cost = cost;
    p.first_limit = plan.limits.size();
    for (size_t r = 0; r < p.rules.size(); ++r) {
      const Rule& rule = *p.rules[r];
      Fnv h;
      h.Add(request.domain);
      for (const Entry& e : d.entries) {
        h.Add(e.key);
        h.Add(e.value);
      }
      h.Add(AlgorithmName(rule.algorithm));
      h.AddInt(rule.period.count());
      h.AddInt(static_cast<int64_t>(r));
      if (rule.calendar) h.Add(rule.calendar->zone().name());  // a calendar window, its zone
      // "e" and the hash in 16 hex digits (snprintf was a percent of a call).
      std::string name(17, '0');
      name[0] = 'e';
      for (uint64_t v = h.h, i = 16; i > 0; --i, v >>= 4) name[i] = "0123456789abcdef"[v & 15];
      StatusOr<Limit> limit = RuleLimit(rule, std::move(name));
      if (!limit.ok()) return limit.status();
      if (cost > limit->limit() || (rule.requests_per_unit == 0 && cost > 0)) {
        if (!p.too_big) p.too_big_rule = r;
        p.too_big = true;
        too_big = too_big || !p.shadow;
      }
      costs.push_back(std::min(cost, limit->limit()));
      plan.limits.push_back(std::move(*limit));
    }
  }
  // leader[k]: the first limit of the same list (enforcing or shadow) with
  // limits[k]'s name; empty when every name is once.
  std::vector<uint32_t> leader;
  if (Status s = ShareCounters(plan, leader); !s.ok()) return s;
  if (!leader.empty()) {
    // Each descriptor of a shared counter meets the count its predecessors'
    // costs leave: one whose costs and theirs together are above the limit
    // is over (as its own cost above the limit would be).
    std::vector<int64_t> sum(plan.limits.size(), 0);
    for (DescriptorPlan& p : plan.descriptors) {
      if (p.kind != DescriptorPlan::Kind::kLimited) continue;
      for (size_t r = 0; r < p.rules.size(); ++r) {
        const size_t k = p.first_limit + r;
        sum[leader[k]] += p.cost;
        if (leader[k] != k && sum[leader[k]] > plan.limits[k].limit()) {
          if (!p.too_big) p.too_big_rule = r;
          p.too_big = true;
          too_big = too_big || !p.shadow;
        }
      }
    }
    plan.check_of.resize(plan.limits.size());
  }
  size_t k = 0;
  for (DescriptorPlan& p : plan.descriptors) {
    if (p.kind != DescriptorPlan::Kind::kLimited) continue;
    std::vector<LimitCheck>& into = p.shadow ? plan.shadow_checks : plan.checks;
    p.first_check = into.size();
    for (size_t r = 0; r < p.rules.size(); ++r, ++k) {
      // A request denied up front is asked without counting (all or nothing),
      // and so is a block (requests_per_unit 0), whose store limit is 1.
      const bool counted =
          !((too_big && !p.shadow) || p.too_big) && p.rules[r]->requests_per_unit != 0;
      const int64_t cost = counted ? costs[k] : 0;
      if (leader.empty()) {
        into.push_back({&plan.limits[k], cost});
      } else if (leader[k] == k) {
        plan.check_of[k] = static_cast<uint32_t>(into.size());
        into.push_back({&plan.limits[k], cost});
      } else {  // the leader's check asks for both costs
        plan.check_of[k] = plan.check_of[leader[k]];
        into[plan.check_of[k]].cost += cost;
      }
    }
  }
  return plan;
}

std::vector<LimitSettle> Overdrafts(const RequestPlan& plan, const CheckResult& result) {
  std::vector<LimitSettle> out;
  if (!Denied(plan, result) || result.degraded || result.decisions.size() != plan.checks.size())
    return out;
  // A shared check is charged once, the costs of all who share it.
  Shares shares;
  if (!plan.check_of.empty()) shares = SharesOf(plan, false);
  for (const DescriptorPlan& p : plan.descriptors) {
    if (p.kind != DescriptorPlan::Kind::kLimited || p.shadow) continue;
    for (size_t r = 0; r < p.rules.size(); ++r) {
      const size_t k = CheckOf(plan, p, r);
      // Taken by an allowed step before the denied one (more limits than
      // one step): its cost is in the count already.
      if (Taken(result, plan.checks, k)) continue;
      int64_t cost = p.cost;
      if (!shares.members.empty()) {
        if (shares.members[k] == 0) continue;  // charged already
        shares.members[k] = 0;
        cost = shares.costs[k];
      }
      cost = std::min(cost, kMaxSettleDelta);
      if (Overdrawn(*p.rules[r], cost, result.decisions[k].remaining)) {
        out.push_back({plan.checks[k].limit, cost});
      }
    }
  }
  return out;
}

Response Respond(const RequestPlan& plan, const CheckResult* result, const CheckResult* shadow,
                 int64_t now_micros) {
  Response out;
  out.statuses.resize(plan.descriptors.size());
  // Shared checks: per list (enforcing, shadow), who shares each and the
  // costs so far, in request order.
  const bool shared = !plan.check_of.empty();
  std::array<Shares, 2> shares;
  std::array<std::vector<int64_t>, 2> upto;
  std::vector<Decision> parts;
  const bool denied = shared && result != nullptr && Denied(plan, *result);
  if (shared) {
    for (int l = 0; l < 2; ++l) {
      shares[l] = SharesOf(plan, l == 1);
      upto[l].assign(shares[l].members.size(), 0);
    }
  }
  for (size_t i = 0; i < plan.descriptors.size(); ++i) {
    const DescriptorPlan& p = plan.descriptors[i];
    DescriptorStatus& s = out.statuses[i];
    if (p.kind == DescriptorPlan::Kind::kUnlimited) {
      s.limit_remaining = 4294967295u;
      continue;
    }
    const CheckResult* r = p.shadow ? shadow : result;
    if (p.kind != DescriptorPlan::Kind::kLimited || r == nullptr) continue;
    std::span<const Decision> mine;
    if (!shared) {
      mine = std::span<const Decision>(r->decisions.data() + p.first_check, p.rules.size());
    } else {
      const int l = p.shadow ? 1 : 0;
      const std::vector<LimitCheck>& list = p.shadow ? plan.shadow_checks : plan.checks;
      parts.clear();
      for (size_t k = 0; k < p.rules.size(); ++k) {
        const size_t c = CheckOf(plan, p, k);
        const Decision& got = r->decisions[c];
        upto[l][c] += p.cost;
        if (shares[l].members[c] < 2 || r->degraded) {
          parts.push_back(got);
          continue;
        }
        const bool taken = Taken(*r, list, c);
        // As Overdrafts charges it.
        const bool charged =
            !p.shadow && denied && !taken &&
            Overdrawn(*p.rules[k], std::min(shares[l].costs[c], kMaxSettleDelta), got.remaining);
        parts.push_back(Part(got, list[c].cost, upto[l][c], taken, charged));
      }
      mine = parts;
    }
    const Decision d = Combine(mine);
    size_t which = p.too_big ? p.too_big_rule : 0;  // the limit that denies reports
    for (size_t k = 0; !p.too_big && k < mine.size(); ++k) {
      if (mine[k] == d) {
        which = k;
        break;
      }
    }
    // A check without counting (hits_addend 0: Envoy's check before a cost
    // known at the stream's end) is over when a limit has nothing left: the
    // overdraft that spent it must stop the next stream.
    bool spent = false;
    for (size_t k = 0; p.cost == 0 && !spent && k < mine.size(); ++k) {
      if (p.rules[k]->requests_per_unit == 0 || mine[k].remaining <= 0) {
        spent = true;
        which = k;
      }
    }
    const Rule& rule = *p.rules[which];
    const bool over = !d.allowed || p.too_big || spent;
    // The store counts to Limit::kMaxCount; a uint32 limit above it has the
    // difference on top.
    const int64_t beyond_store =
        std::max<int64_t>(0, int64_t{rule.requests_per_unit} - Limit::kMaxCount);
    s.code = over && !p.shadow ? Code::kOverLimit : Code::kOk;
    s.has_limit = true;
    s.rule = which;
    s.requests_per_unit = rule.requests_per_unit;
    s.unit = rule.unit;
    s.name = rule.name;
    // When another descriptor denied the request nothing was taken from this
    // one, and the store's answer says so already (its standing count).
    // A block (requests_per_unit 0) has nothing left, counted or not.
    s.limit_remaining = over || rule.requests_per_unit == 0
                            ? 0
                            : static_cast<uint32_t>(std::clamp<int64_t>(
                                  mine[which].remaining + beyond_store, 0, 4294967295));
    if (rule.calendar) {
      s.duration_until_reset =
          std::chrono::microseconds(rule.calendar->At(now_micros).end - now_micros);
    } else if (rule.algorithm == Algorithm::kFixedWindow) {
      const int64_t period = rule.period.count();
      s.duration_until_reset = std::chrono::microseconds(period - now_micros % period);
    } else if (rule.requests_per_unit == 0) {
      s.duration_until_reset = rule.period;  // nothing to wait for: a block
    } else {
      s.duration_until_reset = over ? d.retry_after : d.reset_after;
      // The plan denied what the store allowed (a cost above the burst, asked
      // without counting; a shared counter's later descriptor; a check before
      // a stream with nothing left): the store has no wait to give. A cost
      // above the burst never fits, and the time to full bounds any other:
      // the whole limit's refill (its window: a bucket's burst at its rate, a
      // sliding window's period), at least a second, as the HTTP faces'
      // Retry-After (server/enforcer.cc, DenyWhatNeverFits).
      if (over && s.duration_until_reset.count() <= 0) {
        s.duration_until_reset =
            std::max({d.reset_after, plan.limits[p.first_limit + which].window(),
                      std::chrono::microseconds(1'000'000)});
      }
    }
    if (s.code == Code::kOverLimit) out.overall = Code::kOverLimit;
  }
  return out;
}

HeaderSource HeaderSourceOf(const RequestPlan& plan, const CheckResult& result,
                            const Response& response) {
  HeaderSource out;
  if (result.decisions.empty() || result.decisions.size() != plan.checks.size()) return out;
  out.decision = result.overall;
  for (size_t k = 0; k < result.decisions.size(); ++k) {
    if (result.decisions[k] == result.overall) {
      out.limit = plan.checks[k].limit;
      break;
    }
  }
  if (out.limit == nullptr) out.limit = plan.checks.front().limit;
  if (response.overall != Code::kOverLimit || !result.overall.allowed) return out;
  for (size_t i = 0; i < plan.descriptors.size(); ++i) {
    const DescriptorPlan& p = plan.descriptors[i];
    const DescriptorStatus& s = response.statuses[i];
    if (p.kind != DescriptorPlan::Kind::kLimited || p.shadow || s.code != Code::kOverLimit)
      continue;
    const size_t c = CheckOf(plan, p, s.rule);
    out.limit = plan.checks[c].limit;
    out.decision = result.decisions[c];
    out.decision.allowed = false;
    out.decision.remaining = 0;
    out.decision.delay = std::chrono::microseconds(0);
    out.decision.retry_after = std::max(out.decision.retry_after, s.duration_until_reset);
    out.decision.reset_after = std::max(out.decision.reset_after, s.duration_until_reset);
    if (p.rules[s.rule]->requests_per_unit == 0) out.decision.limit = 0;
    break;
  }
  return out;
}

}  // namespace ratelimit::envoy
