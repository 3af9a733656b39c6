// Envoy plan: what one ShouldRateLimit request asks of the store, and the
// answer it gets, without any gRPC in sight (the gRPC face translates).
//
//   envoy::Request req{.domain = "another", .descriptors = {{.entries = {{"key2", "x"}}}}};
//   StatusOr<envoy::RequestPlan> plan = envoy::MakePlan(*config, req);
//   store.Check({plan->store_key, plan->checks}, ...);           // all or nothing
//   envoy::Response resp = envoy::Respond(*plan, &result, nullptr, now_us);
//
// Matching is envoyproxy/ratelimit's: per entry, "key_value" first, then a
// wildcard value ('*' anywhere, in file order), then "key" alone; nested
// descriptors follow the entries in order; a rule applies only if it sits at
// the request descriptor's last entry. A request `limit` override replaces
// the configured rule (when the domain is known). `replaces` drops the named
// rules of the same request. Counters are per actual value: every limit's
// store name is a hash of the domain, the entries, the algorithm and period
// (so a wildcard rule counts each value apart, and a changed unit starts
// afresh), and every descriptor of the domain shares one store key, so a
// request's limits are decided in one store step (kMaxChecksPerRequest at a
// time: a request with more takes several, grpc/decide.cc).
//
// Thread-safety: pure functions; a plan points into its Config, which must
// outlive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "envoy/config.h"
#include "ratelimit/decision.h"
#include "ratelimit/store.h"

namespace ratelimit::envoy {

struct Entry {
  std::string key;
  std::string value;
};

struct Descriptor {
  std::vector<Entry> entries;
  struct Override {
    uint32_t requests_per_unit = 0;
    Unit unit = Unit::kUnknown;
  };
  std::optional<Override> limit;
  std::optional<uint64_t> hits_addend;  // 0: check without counting
};

struct Request {
  std::string domain;
  std::vector<Descriptor> descriptors;
  uint32_t hits_addend = 0;  // 0 counts as 1
};

enum class Code : uint8_t { kUnknown = 0, kOk = 1, kOverLimit = 2 };

// One request descriptor's part of the plan.
struct DescriptorPlan {
  enum class Kind : uint8_t { kNoRule, kUnlimited, kLimited } kind = Kind::kNoRule;
  std::vector<const Rule*> rules;  // kLimited: the rules (several with `rate_limits:`)
  Rule override_rule;              // the request's `limit`, when it gave one
  bool shadow = false;
  bool too_big = false;     // its cost is above one of its limits: over the limit
  size_t too_big_rule = 0;  // too_big: the first rule it is above (what it reports)
  int64_t cost = 0;         // what it asks (0: a check without counting)
  size_t first_check = 0;   // kLimited: checks [first_check, first_check + rules.size())
                            // (when RequestPlan::check_of is empty; else CheckOf)
  size_t first_limit = 0;   // kLimited: limits [first_limit, first_limit + rules.size())
  // The metrics label: the matched rule's path ("key2", "key1_v.sub"), with
  // the request's values when the rule says detailed_metric.
  std::string metric_path;
};

struct RequestPlan {
  std::string store_key;  // "envoy:<domain>"
  bool domain_known = false;
  std::vector<Limit> limits;              // owned; `checks` and `shadow_checks` point into it
  std::vector<LimitCheck> checks;         // the enforcing ones: one store step (per 16)
  std::vector<LimitCheck> shadow_checks;  // shadow_mode descriptors: a step of their own
  std::vector<DescriptorPlan> descriptors;
  // Limits that name one counter (identical descriptors: two of a route's
  // rate_limits actions that produce the same entries) share one check,
  // which asks for their costs together, since the store takes a counter
  // once per request. check_of[k]: the check (in `checks` or
  // `shadow_checks`) that limits[k] asks; empty when no check is shared.
  std::vector<uint32_t> check_of;

  RequestPlan() = default;
  RequestPlan(RequestPlan&&) = default;
  RequestPlan& operator=(RequestPlan&&) = default;
};

// The most descriptors one request may have. Envoy sends one per
// `rate_limits` entry of a route that applies (a handful); each costs the
// plan and the answer hundreds of times its size on the wire (an empty
// descriptor is 2 bytes: a 4 MiB request of them held about 1 GB).
inline constexpr size_t kMaxDescriptorsPerRequest = 1024;

// The most entries one request's descriptors may hold in all. Envoy sends
// one per action of a `rate_limits` entry (a handful a descriptor). An empty
// entry is 2 bytes on the wire, 48 once libprotobuf parsed it (measured with
// mallinfo2, a million of them) and 64 more as an envoy::Entry: one
// descriptor of a 4 MiB request held about 235 MB.
inline constexpr size_t kMaxEntriesPerRequest = 4096;

// The most limits one request may apply: 32 descriptors of the config's
// largest `rate_limits:` (8). More than kMaxChecksPerRequest are decided in
// several store steps (grpc/decide.cc); this bounds how many.
inline constexpr size_t kMaxLimitsPerRequest = 256;

// The check (in plan.checks, or plan.shadow_checks for a shadow descriptor)
// that rule `rule` of `p` asks.
inline size_t CheckOf(const RequestPlan& plan, const DescriptorPlan& p, size_t rule) {
  return plan.check_of.empty() ? p.first_check + rule : plan.check_of[p.first_limit + rule];
}

// InvalidArgument for an empty domain, no descriptors, more than
// kMaxDescriptorsPerRequest descriptors or kMaxEntriesPerRequest entries, more than
// kMaxLimitsPerRequest limits, an override with an
// unknown unit, or two descriptors that name one counter with different limits (a `limit` override
// beside the configured rule of the same entries and unit, with another requests_per_unit). A
// descriptor without entries matches no rule (OK, no limit); with a `limit` override it counts on
// the domain's counter of no entries, as envoyproxy/ratelimit's override does.
StatusOr<RequestPlan> MakePlan(const Config& config, const Request& request);
// MakePlan's answer to more than kMaxDescriptorsPerRequest descriptors (the
// gRPC face gives it before parsing such a request).
Status TooManyDescriptors();
// The same for more than kMaxEntriesPerRequest entries.
Status TooManyEntries();

// A denied request's descriptors whose cost did not fit what their limits had
// left are charged anyway, as envoyproxy/ratelimit's counters count every
// hit: otherwise a cost known only after the response (Envoy's
// apply_on_stream_done: a check with hits_addend 0 before, the actual cost
// after) that is larger than what remains would never be taken, and the
// budget would never run out. The settlements (Store::Settle) for `result`
// (answering plan.checks): a window fills, a bucket goes into debt; a limit
// already spent is left alone. Empty when the request was allowed.
std::vector<LimitSettle> Overdrafts(const RequestPlan& plan, const CheckResult& result);

struct DescriptorStatus {
  Code code = Code::kOk;
  bool has_limit = false;  // current_limit is set
  uint32_t requests_per_unit = 0;
  Unit unit = Unit::kUnknown;
  std::string name;
  uint32_t limit_remaining = 0;
  std::chrono::microseconds duration_until_reset{0};
  size_t rule = 0;  // has_limit: the descriptor's rule it reports (DescriptorPlan::rules)
};

struct Response {
  Code overall = Code::kOk;
  std::vector<DescriptorStatus> statuses;  // one per request descriptor, in order
};

// `result` answers plan.checks (nullptr when there are none), `shadow`
// answers plan.shadow_checks. Fixed windows report the time to the window's
// boundary from the epoch at `now_micros`; other algorithms their retry time
// when denied and their reset time otherwise. Descriptors that share a check
// each report the count after their own cost, in request order (the count
// as envoyproxy/ratelimit's INCRBY per descriptor leaves it).
Response Respond(const RequestPlan& plan, const CheckResult* result, const CheckResult* shadow,
                 int64_t now_micros);

// What response_headers_to_add reports: the decision that speaks for the
// request's enforcing limits, and the limit it is of (null when the request
// has none). The store's answer closest to its limit (the Combine of
// `result`, which answers plan.checks), unless `response` (Respond's) is
// over where the store was not (a limit of 0, a cost above a limit, a
// spent limit asked without counting): then the first such descriptor,
// denied, with nothing left, its reset the time to its window's end. A
// limit of 0 reports 0 (the store's limit is a stand-in of 1), as
// envoyproxy/ratelimit reports current_limit's requests_per_unit.
struct HeaderSource {
  Decision decision;
  const Limit* limit = nullptr;
};
HeaderSource HeaderSourceOf(const RequestPlan& plan, const CheckResult& result,
                            const Response& response);

}  // namespace ratelimit::envoy
