// Metrics: every Prometheus metric of ratelimitd, declared in this one place
// and rendered in the text exposition format 0.0.4 at GET /metrics on the
// admin listener. docs/admin.md lists each one (name, type, labels, meaning).
//
//   Metrics& m = Metrics::Global();
//   DecisionCells& cells = m.Decisions("search", "burst");   // one lookup per (route, limit)
//   cells.At(Face::kGateway, DecisionOutcome::kDenied).Inc();
//   m.store_latency.Observe(std::chrono::microseconds(420));
//   std::string text = m.Render(store);                      // for the scrape
//
// Labels are fixed sets: faces and outcomes are enums; route classes and limit
// names come from the config (bounded: at most kMaxDecisionLabelSets pairs,
// beyond which they are counted under route="~other",limit="~other"); the
// decision API's inline limits, named by its callers, count as
// limit="~inline" (kInlineLimitLabel) unless the config has a named limit of
// their name. Client keys never become labels.
//
// Increments are relaxed atomic adds. The (route, limit) cells are found in a
// map under a shared lock without allocating; everything else is a field.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/store.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::server {

// Which HTTP face asked for a decision.
// kEnvoy: the gRPC face (src/grpc); it counts per domain and descriptor
// itself (route "envoy:<domain>", limit the descriptor's config path).
enum class Face : uint8_t { kDecisionApi = 0, kGateway, kAuthRequest, kDemo, kEnvoy };
inline constexpr size_t kFaceCount = 5;
std::string_view FaceName(Face f);  // "decision_api", "gateway", "auth_request", "demo", "envoy"

// What one limit said for one request.
// kNearLimit: the Envoy face only (envoyproxy/ratelimit's near_limit): allowed,
// and past 80% of the limit after it.
enum class DecisionOutcome : uint8_t {
  kAllowed = 0,
  kDenied,
  kShadowDenied,
  kDegraded,
  kNearLimit
};
inline constexpr size_t kOutcomeCount = 5;
std::string_view OutcomeName(DecisionOutcome o);  // "allowed", "denied", "shadow_denied", ...

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Add(int64_t n) { v_.fetch_add(n, std::memory_order_relaxed); }
  void Set(int64_t n) { v_.store(n, std::memory_order_relaxed); }
  int64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// A histogram in seconds with fixed bucket bounds (kept in microseconds,
// ascending, at most kMaxBuckets), by default those of a store call.
class Histogram {
 public:
  static constexpr size_t kMaxBuckets = 16;
  // 100us, 250us, 500us, 1ms, 2.5ms, 5ms, 10ms, 25ms, 50ms, 100ms, 250ms, 500ms, 1s
  static constexpr std::array<int64_t, 13> kLatencyBoundsMicros = {
      100,    250,    500,     1'000,   2'500,   5'000,    10'000,
      25'000, 50'000, 100'000, 250'000, 500'000, 1'000'000};
  // Shaping delays: 10ms, 50ms, 100ms, 250ms, 500ms, 1s, 2.5s, 5s, 10s, 30s, 60s
  static constexpr std::array<int64_t, 11> kDelayBoundsMicros = {
      10'000,    50'000,    100'000,    250'000,    500'000,   1'000'000,
      2'500'000, 5'000'000, 10'000'000, 30'000'000, 60'000'000};

  explicit Histogram(std::span<const int64_t> bounds = kLatencyBoundsMicros);

  void Observe(std::chrono::microseconds d);
  template <typename Rep, typename Period>
  void Observe(std::chrono::duration<Rep, Period> d) {  // truncated to microseconds
    Observe(std::chrono::duration_cast<std::chrono::microseconds>(d));
  }
  // Appends the _bucket/_sum/_count lines of `name` (HELP/TYPE not included);
  // `labels` (`stage="parse"`) goes before `le` on every line.
  void Render(std::string_view name, std::string& out, std::string_view labels = {}) const;

 private:
  const std::span<const int64_t> bounds_;                        // static storage
  std::array<std::atomic<uint64_t>, kMaxBuckets + 1> counts_{};  // index bounds_.size(): +Inf only
  std::atomic<uint64_t> sum_micros_{0};
};

// The decision counters of one (route class, limit) pair: face x outcome.
class DecisionCells {
 public:
  Counter& At(Face f, DecisionOutcome o) {
    return cells_[static_cast<size_t>(f) * kOutcomeCount + static_cast<size_t>(o)];
  }
  const Counter& At(Face f, DecisionOutcome o) const {
    return cells_[static_cast<size_t>(f) * kOutcomeCount + static_cast<size_t>(o)];
  }

 private:
  std::array<Counter, kFaceCount * kOutcomeCount> cells_;
};

inline constexpr size_t kMaxDecisionLabelSets = 4096;
// The limit label of a decision-API request's own limits (whose names its
// caller chooses), unless the config has a named limit of the name.
inline constexpr std::string_view kInlineLimitLabel = "~inline";

// The concurrency limit of one route class, on this instance.
struct ConcurrencyCells {
  Gauge in_flight;         // ratelimit_concurrency_in_flight: leases held now
  Gauge waiting;           // ratelimit_concurrency_waiting: requests held for a lease
  Counter denied_limit;    // ratelimit_concurrency_denied_total{reason="limit"}
  Counter denied_timeout;  // {reason="wait_timeout"}: waited max_wait in vain
  Counter denied_full;     // {reason="queue_full"}: max_waiting already waiting
  Counter denied_shadow;   // {reason="shadow"}: a shadow route's limit; the request passed
  // ratelimit_concurrency_lease_lost_total: leases lost while their request
  // ran (the store no longer held one at a renewal, or renewals failed until
  // it expired)
  Counter lease_lost;
};

class Metrics {
 public:
  Metrics();
  // The process's registry.
  static Metrics& Global();

  // The cells of (route, limit); route "" when no route class applies (the
  // decision API, plan and global limits).
  DecisionCells& Decisions(std::string_view route, std::string_view limit);
  Counter& Degraded(FailureCause c) { return degraded_[static_cast<size_t>(c)]; }
  // The cells of a route's concurrency limit (bounded like Decisions).
  ConcurrencyCells& Concurrency(std::string_view route);

  Histogram store_latency;  // ratelimit_store_call_duration_seconds
  // ratelimit_stage_seconds{stage}: where an HTTP request's time goes (both
  // listeners; answers written in one piece: Session): parse (its first bytes read
  // to the handler called: the rest of the head and the body), handler (to
  // its answer: the decision, the store's call), dispatch (the answer to the
  // connection's executor), write (the answer written into the socket).
  enum class Stage : uint8_t { kParse = 0, kHandler, kDispatch, kWrite };
  static constexpr size_t kStageCount = 4;
  Histogram& StageTime(Stage s) { return stages_[static_cast<size_t>(s)]; }
  Counter reloads_ok;             // ratelimit_config_reloads_total{result="ok"}
  Counter reloads_failed;         // ratelimit_config_reloads_total{result="failed"}
  Gauge in_flight;                // ratelimit_http_requests_in_flight
  Counter denial_log_suppressed;  // ratelimit_denial_log_lines_suppressed_total
  // Per-client overrides (server/overrides.h).
  Counter overrides_put;        // ratelimit_overrides_changes_total{op="put"}
  Counter overrides_delete;     // ratelimit_overrides_changes_total{op="delete"}
  Counter overrides_expire;     // ratelimit_overrides_changes_total{op="expire"}
  Gauge overrides_in_effect;    // ratelimit_overrides_in_effect
  Gauge overrides_not_applied;  // ratelimit_overrides_not_applied
  // ratelimit_paced_requests_total: requests whose read waited for
  // server.max_requests_per_second_per_connection.
  Counter paced;

  // Shaping (leaky bucket): requests held for their delay before they proceed.
  Counter& Delayed(Face f) { return delayed_[static_cast<size_t>(f)]; }  // ..._delayed_total{face}
  Histogram delay{Histogram::kDelayBoundsMicros};  // ratelimit_request_delay_seconds
  Gauge held;                                      // ratelimit_held_requests
  Counter held_rejected;   // ratelimit_held_requests_rejected_total (server.max_held_requests)
  Counter held_abandoned;  // ratelimit_held_requests_abandoned_total (client left while held)

  // Metered costs settled by the gateway (issue 21, server/metering.h):
  // ratelimit_settlements_total{outcome} and ratelimit_settled_units_total{direction}.
  enum class SettleOutcome : uint8_t {
    kSettled = 0,
    kMissing,
    kDisconnected,
    kError,
    kNotForwarded,
  };
  Counter& Settlements(SettleOutcome o) { return settlements_[static_cast<size_t>(o)]; }
  Counter settled_debited;   // {direction="debited"}: units taken beyond the reservations
  Counter settled_refunded;  // {direction="refunded"}: units given back

  // The Envoy face's loaded domains (src/grpc sets them on every load), as
  // ratelimit_envoy_domain_descriptors{domain} (descriptors with a rule).
  void SetEnvoyDomains(std::vector<std::pair<std::string, int64_t>> domains) {
    LockGuard lock(envoy_mu_);
    envoy_domains_ = std::move(domains);
  }

  // The whole exposition. `store` (may be null) adds what only it knows: the
  // breaker state and over-limit cache hits of a RedisStore.
  std::string Render(const Store* store) const;

 private:
  std::array<Counter, 5> settlements_;
  mutable Mutex envoy_mu_;
  std::vector<std::pair<std::string, int64_t>> envoy_domains_ RL_GUARDED_BY(envoy_mu_);

  struct Key {
    std::string route, limit;
    bool operator==(const Key&) const = default;
  };
  struct KeyView {
    std::string_view route, limit;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(const KeyView& k) const;
    size_t operator()(const Key& k) const { return (*this)(KeyView{k.route, k.limit}); }
  };
  struct KeyEq {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return std::string_view(a.route) == std::string_view(b.route) &&
             std::string_view(a.limit) == std::string_view(b.limit);
    }
  };

  mutable SharedMutex mu_;
  std::unordered_map<Key, std::unique_ptr<DecisionCells>, KeyHash, KeyEq> decisions_
      RL_GUARDED_BY(mu_);
  std::array<Counter, 5> degraded_;  // by FailureCause
  std::array<Counter, kFaceCount> delayed_;
  std::array<Histogram, kStageCount> stages_{
      Histogram(StageLatency::kBoundsMicros), Histogram(StageLatency::kBoundsMicros),
      Histogram(StageLatency::kBoundsMicros), Histogram(StageLatency::kBoundsMicros)};
  std::unordered_map<std::string, std::unique_ptr<ConcurrencyCells>> concurrency_
      RL_GUARDED_BY(mu_);
};

}  // namespace ratelimit::server
