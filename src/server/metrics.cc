#include "server/metrics.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <mutex>
#include <tuple>
#include <vector>

namespace ratelimit::server {
namespace {

constexpr std::string_view kOther = "~other";

// Label values are route and limit names ([A-Za-z0-9_.-]); escape anyway.
void AppendLabelValue(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
}

void Header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out.push_back(' ');
  out += help;
  out += "\n# TYPE ";
  out += name;
  out.push_back(' ');
  out += type;
  out.push_back('\n');
}

std::string Seconds(int64_t micros) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", static_cast<double>(micros) / 1e6);
  return buf;
}

}  // namespace

std::string_view FaceName(Face f) {
  switch (f) {
    case Face::kDecisionApi: return "decision_api";
    case Face::kGateway: return "gateway";
    case Face::kAuthRequest: return "auth_request";
    case Face::kDemo: return "demo";
    case Face::kEnvoy: return "envoy";
  }
  return "unknown";
}

std::string_view OutcomeName(DecisionOutcome o) {
  switch (o) {
    case DecisionOutcome::kAllowed: return "allowed";
    case DecisionOutcome::kDenied: return "denied";
    case DecisionOutcome::kShadowDenied: return "shadow_denied";
    case DecisionOutcome::kDegraded: return "degraded";
    case DecisionOutcome::kNearLimit: return "near_limit";
  }
  return "unknown";
}

Histogram::Histogram(std::span<const int64_t> bounds) : bounds_(bounds) {
  assert(bounds.size() <= kMaxBuckets && std::is_sorted(bounds.begin(), bounds.end()));
}

void Histogram::Observe(std::chrono::microseconds d) {
  const int64_t us = std::max<int64_t>(0, d.count());
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), us);
  counts_[static_cast<size_t>(it - bounds_.begin())].fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(us), std::memory_order_relaxed);
}

namespace {

// The _bucket/_sum/_count lines of one histogram: counts[i] per bound (not
// cumulative), counts[bounds.size()] above the last.
void RenderBuckets(std::string_view name, std::string_view labels, std::span<const int64_t> bounds,
                   std::span<const uint64_t> counts, uint64_t sum_micros, std::string& out) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds.size(); ++i) {
    cumulative += counts[i];
    out += name;
    out += "_bucket{";
    if (!labels.empty()) {
      out += labels;
      out.push_back(',');
    }
    out += "le=\"";
    out += i < bounds.size() ? Seconds(bounds[i]) : std::string("+Inf");
    out += "\"} ";
    out += std::to_string(cumulative);
    out.push_back('\n');
  }
  auto tail = [&](std::string_view suffix) {
    out += name;
    out += suffix;
    if (!labels.empty()) {
      out.push_back('{');
      out += labels;
      out.push_back('}');
    }
    out.push_back(' ');
  };
  tail("_sum");
  out += Seconds(static_cast<int64_t>(sum_micros));
  out += "\n";
  tail("_count");
  out += std::to_string(cumulative);
  out.push_back('\n');
}

}  // namespace

void Histogram::Render(std::string_view name, std::string& out, std::string_view labels) const {
  std::array<uint64_t, kMaxBuckets + 1> counts{};
  for (size_t i = 0; i <= bounds_.size(); ++i)
    counts[i] = counts_[i].load(std::memory_order_relaxed);
  RenderBuckets(name, labels, bounds_, std::span(counts).first(bounds_.size() + 1),
                sum_micros_.load(std::memory_order_relaxed), out);
}

size_t Metrics::KeyHash::operator()(const KeyView& k) const {
  const size_t a = std::hash<std::string_view>{}(k.route);
  const size_t b = std::hash<std::string_view>{}(k.limit);
  return a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
}

Metrics::Metrics() = default;

Metrics& Metrics::Global() {
  static Metrics* m = new Metrics();  // never destroyed: threads may count until exit
  return *m;
}

DecisionCells& Metrics::Decisions(std::string_view route, std::string_view limit) {
  {
    SharedLockGuard lock(mu_);
    auto it = decisions_.find(KeyView{route, limit});
    if (it != decisions_.end()) return *it->second;
  }
  LockGuard lock(mu_);
  if (decisions_.size() >= kMaxDecisionLabelSets) {
    route = kOther;
    limit = kOther;
  }
  auto it = decisions_.find(KeyView{route, limit});
  if (it == decisions_.end()) {
    it =
        decisions_
            .emplace(Key{std::string(route), std::string(limit)}, std::make_unique<DecisionCells>())
            .first;
  }
  return *it->second;
}

ConcurrencyCells& Metrics::Concurrency(std::string_view route) {
  {
    SharedLockGuard lock(mu_);
    auto it = concurrency_.find(std::string(route));
    if (it != concurrency_.end()) return *it->second;
  }
  LockGuard lock(mu_);
  if (concurrency_.size() >= kMaxDecisionLabelSets) route = kOther;
  auto& cells = concurrency_[std::string(route)];
  if (!cells) cells = std::make_unique<ConcurrencyCells>();
  return *cells;
}

std::string Metrics::Render(const Store* store) const {
  std::string out;
  out.reserve(4096);

  Header(out, "ratelimit_decisions_total", "counter",
         "Limit decisions by face, route class, limit and outcome (one per limit checked).");
  {
    std::vector<std::pair<const Key*, const DecisionCells*>> rows;
    {
      SharedLockGuard lock(mu_);
      rows.reserve(decisions_.size());
      for (const auto& [k, v] : decisions_) rows.emplace_back(&k, v.get());
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      return std::tie(a.first->route, a.first->limit) < std::tie(b.first->route, b.first->limit);
    });
    // Entries are never erased, so the pointers stay valid without the lock.
    for (const auto& [k, cells] : rows) {
      for (size_t f = 0; f < kFaceCount; ++f) {
        for (size_t o = 0; o < kOutcomeCount; ++o) {
          const uint64_t v =
              cells->At(static_cast<Face>(f), static_cast<DecisionOutcome>(o)).value();
          if (v == 0) continue;
          out += "ratelimit_decisions_total{face=\"";
          out += FaceName(static_cast<Face>(f));
          out += "\",route=\"";
          AppendLabelValue(out, k->route);
          out += "\",limit=\"";
          AppendLabelValue(out, k->limit);
          out += "\",outcome=\"";
          out += OutcomeName(static_cast<DecisionOutcome>(o));
          out += "\"} ";
          out += std::to_string(v);
          out.push_back('\n');
        }
      }
    }
  }

  {
    std::vector<std::pair<const std::string*, const ConcurrencyCells*>> rows;
    {
      SharedLockGuard lock(mu_);
      for (const auto& [route, cells] : concurrency_) rows.emplace_back(&route, cells.get());
    }
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return *a.first < *b.first; });
    auto row = [&out](std::string_view name, const std::string& route, std::string_view extra,
                      int64_t v) {
      out += name;
      out += "{route=\"";
      AppendLabelValue(out, route);
      out += '"';
      out += extra;
      out += "} ";
      out += std::to_string(v);
      out.push_back('\n');
    };
    Header(out, "ratelimit_concurrency_in_flight", "gauge",
           "Concurrency leases this instance holds now, by route class.");
    for (const auto& [route, c] : rows)
      row("ratelimit_concurrency_in_flight", *route, "", c->in_flight.value());
    Header(out, "ratelimit_concurrency_waiting", "gauge",
           "Requests held waiting for a concurrency lease (on_limit: wait), by route class.");
    for (const auto& [route, c] : rows)
      row("ratelimit_concurrency_waiting", *route, "", c->waiting.value());
    Header(out, "ratelimit_concurrency_denied_total", "counter",
           "Requests refused by a concurrency limit, by route class and reason.");
    for (const auto& [route, c] : rows) {
      row("ratelimit_concurrency_denied_total", *route, ",reason=\"limit\"",
          static_cast<int64_t>(c->denied_limit.value()));
      row("ratelimit_concurrency_denied_total", *route, ",reason=\"wait_timeout\"",
          static_cast<int64_t>(c->denied_timeout.value()));
      row("ratelimit_concurrency_denied_total", *route, ",reason=\"queue_full\"",
          static_cast<int64_t>(c->denied_full.value()));
      row("ratelimit_concurrency_denied_total", *route, ",reason=\"shadow\"",
          static_cast<int64_t>(c->denied_shadow.value()));
    }
    Header(out, "ratelimit_concurrency_lease_lost_total", "counter",
           "Concurrency leases lost while their request still ran (not held any more at a "
           "renewal, or renewals failed until they expired), by route class.");
    for (const auto& [route, c] : rows) {
      row("ratelimit_concurrency_lease_lost_total", *route, "",
          static_cast<int64_t>(c->lease_lost.value()));
    }
  }

  Header(out, "ratelimit_degraded_decisions_total", "counter",
         "Store calls the failure mode decided, by cause of the store failure.");
  for (FailureCause c : {FailureCause::kTimeout, FailureCause::kRefused, FailureCause::kBreakerOpen,
                         FailureCause::kOverload, FailureCause::kError}) {
    out += "ratelimit_degraded_decisions_total{cause=\"";
    out += FailureCauseName(c);
    out += "\"} ";
    out += std::to_string(degraded_[static_cast<size_t>(c)].value());
    out.push_back('\n');
  }

  Header(out, "ratelimit_store_call_duration_seconds", "histogram",
         "Time from a decision's store call to its answer (or failure).");
  store_latency.Render("ratelimit_store_call_duration_seconds", out);

  Header(out, "ratelimit_stage_seconds", "histogram",
         "Where an HTTP request's time goes, by stage: parse (its first bytes read to the "
         "handler called), handler (to its answer, the store's call included), dispatch (the "
         "answer to its connection's thread), write (the answer written to the socket).");
  for (auto [stage, name] : {std::pair{Stage::kParse, "stage=\"parse\""},
                             std::pair{Stage::kHandler, "stage=\"handler\""},
                             std::pair{Stage::kDispatch, "stage=\"dispatch\""},
                             std::pair{Stage::kWrite, "stage=\"write\""}}) {
    stages_[static_cast<size_t>(stage)].Render("ratelimit_stage_seconds", out, name);
  }

  Header(out, "ratelimit_config_reloads_total", "counter",
         "Config reloads (SIGHUP) by result: ok, or failed (the old config kept serving).");
  out +=
      "ratelimit_config_reloads_total{result=\"ok\"} " + std::to_string(reloads_ok.value()) + "\n";
  out += "ratelimit_config_reloads_total{result=\"failed\"} " +
         std::to_string(reloads_failed.value()) + "\n";

  Header(out, "ratelimit_overrides_changes_total", "counter",
         "Per-client overrides changed by this instance, by op: put, delete, expire.");
  out += "ratelimit_overrides_changes_total{op=\"put\"} " + std::to_string(overrides_put.value()) +
         "\n";
  out += "ratelimit_overrides_changes_total{op=\"delete\"} " +
         std::to_string(overrides_delete.value()) + "\n";
  out += "ratelimit_overrides_changes_total{op=\"expire\"} " +
         std::to_string(overrides_expire.value()) + "\n";
  Header(out, "ratelimit_overrides_in_effect", "gauge",
         "Per-client overrides this instance applies now, wholly (expired ones not counted).");
  out += "ratelimit_overrides_in_effect " + std::to_string(overrides_in_effect.value()) + "\n";
  Header(out, "ratelimit_overrides_not_applied", "gauge",
         "Per-client overrides of which a part does not apply under the current config "
         "(GET /v1/overrides: not_applied).");
  out += "ratelimit_overrides_not_applied " + std::to_string(overrides_not_applied.value()) + "\n";

  Header(out, "ratelimit_http_requests_in_flight", "gauge",
         "HTTP requests being handled now (both listeners).");
  out += "ratelimit_http_requests_in_flight " + std::to_string(in_flight.value()) + "\n";

  Header(out, "ratelimit_delayed_requests_total", "counter",
         "Requests held for a leaky bucket's delay before they proceeded, by face.");
  for (Face f : {Face::kGateway, Face::kAuthRequest}) {
    out += "ratelimit_delayed_requests_total{face=\"";
    out += FaceName(f);
    out += "\"} " + std::to_string(delayed_[static_cast<size_t>(f)].value()) + "\n";
  }
  Header(out, "ratelimit_request_delay_seconds", "histogram",
         "The delay each held request was given (gateway and auth_request).");
  delay.Render("ratelimit_request_delay_seconds", out);
  Header(out, "ratelimit_held_requests", "gauge", "Requests being held for their delay now.");
  out += "ratelimit_held_requests " + std::to_string(held.value()) + "\n";
  Header(out, "ratelimit_held_requests_rejected_total", "counter",
         "Delayed requests answered 503 because server.max_held_requests were already held.");
  out += "ratelimit_held_requests_rejected_total " + std::to_string(held_rejected.value()) + "\n";
  Header(out, "ratelimit_held_requests_abandoned_total", "counter",
         "Held requests whose client disconnected before the delay ended (never forwarded).");
  out += "ratelimit_held_requests_abandoned_total " + std::to_string(held_abandoned.value()) + "\n";

  Header(out, "ratelimit_settlements_total", "counter",
         "Metered gateway requests settled after the response, by outcome: settled (the actual "
         "cost was read), missing (no usable actual cost: the reservation stands), disconnected "
         "(the client left mid-response: the reservation stands), error (the upstream failed "
         "mid-body or the store did not settle), not_forwarded (the request never reached the "
         "upstream: the reservation is given back).");
  for (const auto& [o, name] : {std::pair{SettleOutcome::kSettled, "settled"},
                                {SettleOutcome::kMissing, "missing"},
                                {SettleOutcome::kDisconnected, "disconnected"},
                                {SettleOutcome::kError, "error"},
                                {SettleOutcome::kNotForwarded, "not_forwarded"}}) {
    out += "ratelimit_settlements_total{outcome=\"";
    out += name;
    out += "\"} " + std::to_string(settlements_[static_cast<size_t>(o)].value()) + "\n";
  }
  Header(out, "ratelimit_settled_units_total", "counter",
         "Units of metered costs settled: debited beyond the reservations, or refunded.");
  out += "ratelimit_settled_units_total{direction=\"debited\"} " +
         std::to_string(settled_debited.value()) + "\n";
  out += "ratelimit_settled_units_total{direction=\"refunded\"} " +
         std::to_string(settled_refunded.value()) + "\n";

  Header(out, "ratelimit_paced_requests_total", "counter",
         "Requests read later because their connection exceeded "
         "server.max_requests_per_second_per_connection.");
  out += "ratelimit_paced_requests_total " + std::to_string(paced.value()) + "\n";

  Header(out, "ratelimit_denial_log_lines_suppressed_total", "counter",
         "Per-denial log lines dropped by the log sampler.");
  out += "ratelimit_denial_log_lines_suppressed_total " +
         std::to_string(denial_log_suppressed.value()) + "\n";

  {
    LockGuard lock(envoy_mu_);
    if (!envoy_domains_.empty()) {
      Header(out, "ratelimit_envoy_domain_descriptors", "gauge",
             "The gRPC face's loaded domains: descriptors with a rule, per domain.");
      for (const auto& [domain, n] : envoy_domains_) {
        out += "ratelimit_envoy_domain_descriptors{domain=\"";
        AppendLabelValue(out, domain);
        out += "\"} " + std::to_string(n) + "\n";
      }
    }
  }

  if (const Store* redis = store; redis != nullptr && redis->remote()) {
    Header(out, "ratelimit_store_breaker_state", "gauge",
           "Redis circuit breaker (worst node): 0 closed, 1 open, 2 half-open.");
    out += "ratelimit_store_breaker_state " +
           std::to_string(static_cast<int>(redis->breaker_state())) + "\n";
    const StoreStats st = redis->stats();
    Header(out, "ratelimit_over_limit_cache_hits_total", "counter",
           "Checks answered by the over-limit cache without a Redis call.");
    out += "ratelimit_over_limit_cache_hits_total " + std::to_string(st.cache_hits) + "\n";
    Header(out, "ratelimit_lease_hits_total", "counter",
           "Checks allowed with a leased token (limits with lease) without a Redis call.");
    out += "ratelimit_lease_hits_total " + std::to_string(st.prefetch_hits) + "\n";
    Header(out, "ratelimit_redis_resent_checks_total", "counter",
           "Redis Cluster: checks of a node call sent again one slot per call (a slot had "
           "moved; the map is refreshed).");
    out += "ratelimit_redis_resent_checks_total " + std::to_string(st.resent) + "\n";
    Header(out, "ratelimit_store_pending_checks", "gauge", "Redis checks queued or in flight now.");
    out += "ratelimit_store_pending_checks " + std::to_string(redis->pending()) + "\n";
    Header(out, "ratelimit_redis_queued_seconds", "histogram",
           "Each Redis check's time queued before its script call left (batching: hold_back, "
           "max_calls_in_flight).");
    RenderBuckets("ratelimit_redis_queued_seconds", {}, StageLatency::kBoundsMicros,
                  st.queued.counts, st.queued.sum_micros, out);
    Header(out, "ratelimit_redis_call_seconds", "histogram",
           "Each Redis script call's time from sending to its reply (the wire and Redis).");
    RenderBuckets("ratelimit_redis_call_seconds", {}, StageLatency::kBoundsMicros, st.call.counts,
                  st.call.sum_micros, out);
  }
  return out;
}

}  // namespace ratelimit::server
