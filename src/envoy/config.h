// Envoy config: envoyproxy/ratelimit's YAML, read unchanged, one domain per
// `*.yaml` file of a directory, validated with errors that name file:line.
//
//   StatusOr<std::shared_ptr<const envoy::Config>> c = envoy::LoadDirectory("/etc/ratelimit");
//   if (!c.ok()) std::cerr << c.status().message();
//   // "/etc/ratelimit/another.yaml:6: invalid rate limit unit 'foo'"
//
// Their fields: `domain`, `descriptors` (`key`, optional `value`, nested
// `descriptors`, `rate_limit` {`unit`, `requests_per_unit`, `name`,
// `unlimited`, `replaces`: [{name}]}, `shadow_mode`, `detailed_metric`;
// `value_to_metric` and `metadata` are accepted and ignored). Ours, opt-in:
// `rate_limit` may say `algorithm`, `burst`, `unit_multiplier` or `period`,
// and `rate_limits:` puts a list of limits on one descriptor. docs/envoy.md
// has the details.
//
// Thread-safety: a loaded Config is immutable and shared between threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/limit.h"
#include "ratelimit/status.h"

namespace ratelimit::envoy {

// Envoy's RateLimitResponse.RateLimit.Unit numbers.
enum class Unit : uint8_t { kUnknown = 0, kSecond, kMinute, kHour, kDay, kMonth, kYear, kWeek };

// As envoyproxy/ratelimit counts them: a month is 30 days, a year 365.
std::chrono::microseconds UnitLength(Unit unit);
// "second", "MINUTE", ... (any case); kUnknown for anything else.
Unit ParseUnit(std::string_view text);
std::string_view UnitName(Unit unit);  // "SECOND", ...

// One configured limit.
struct Rule {
  uint32_t requests_per_unit = 0;
  Unit unit = Unit::kUnknown;  // what current_limit reports (kUnknown with `period:` alone)
  std::string name;            // optional, for `replaces`
  bool unlimited = false;
  std::vector<std::string> replaces;
  Algorithm algorithm = Algorithm::kFixedWindow;
  int64_t burst = 0;                    // token/leaky bucket capacity; 0 = requests_per_unit
  std::chrono::microseconds period{0};  // unit x unit_multiplier, or `period:`
  int line = 0;                         // 1-based, in the domain's file
  // `align: calendar` (with `timezone:`): a fixed window of the calendar,
  // unit DAY, WEEK, MONTH or YEAR; null otherwise (windows from the epoch).
  std::shared_ptr<const Calendar> calendar;
};

// The store's limit for `rule` (not `unlimited`), named `name`. A block
// (requests_per_unit 0) is answered by the plan, not the store, which has no
// limit of 0: the store is asked about a limit of 1 without counting. Above
// Limit::kMaxCount the store counts to kMaxCount (the plan reports the
// remainder on top). Loading refuses a rule it fails for (file:line), so
// for a loaded rule only an invalid `name` can make it fail.
StatusOr<Limit> RuleLimit(const Rule& rule, std::string name);

struct Node {
  std::string key;          // "" for a domain's root
  std::string value;        // "" = any value of `key`
  std::vector<Rule> rules;  // empty: no limit at this level (several: `rate_limits:`)
  bool shadow_mode = false;
  bool detailed_metric = false;
  // The metric label of this level: "key" or "key_value" joined by '.', as
  // envoyproxy/ratelimit names its stats below the domain.
  std::string metric_path;
  // Children by "key" or "key_value"; the wildcard ones (a '*' in the value)
  // also in `wildcards`, in file order.
  std::map<std::string, Node, std::less<>> children;
  std::vector<const Node*> wildcards;
};

struct Domain {
  std::string name;
  std::string file;
  Node root;
};

struct Config {
  std::map<std::string, Domain, std::less<>> domains;
  std::string source;  // the directory (or the first file)
};

// Every `*.yaml` (and `*.yml`) of `dir`, in name order; no files is an
// empty config. Errors are kInvalidArgument ("file:line: why"), or
// kNotFound when the directory cannot be read.
StatusOr<std::shared_ptr<const Config>> LoadDirectory(const std::string& dir);
// The same for a list of files (tests, fixtures).
StatusOr<std::shared_ptr<const Config>> LoadFiles(const std::vector<std::string>& files);
// One file's text as `source_name` (errors name it); adds its domain to `config`.
Status ParseDomain(std::string_view yaml, std::string_view source_name, Config& config);

}  // namespace ratelimit::envoy
