// Limit: one rule such as "burst 10, then 5 a second" or "1000 a day".
//
// A Limit is validated when it is built; a Limit that exists is valid:
//
//   StatusOr<Limit> burst = Limit::TokenBucket("burst", 10, 5.0);
//   StatusOr<Limit> daily = Limit::FixedWindow("daily", 1000, std::chrono::hours(24));
//
// Algorithms:
//   token bucket      capacity, refill per second; integer cost. Kept as one
//                     integer (GCRA theoretical arrival time, microseconds).
//                     The refill interval (1/rate) is kept in whole microseconds.
//   fixed window      `limit` per window, windows aligned to the Unix epoch;
//                     or, a calendar quota (CalendarQuota), windows of the
//                     calendar of a time zone: a day, a week from Monday, a
//                     month, a year, each starting at local midnight
//                     (include/ratelimit/calendar.h).
//   sliding window    two fixed-window counters, the previous one weighted by
//                     how much of it still overlaps the sliding window
//                     (weights in whole milliseconds).
//   sliding log       exact: one timestamp per unit of cost; memory grows with
//                     the limit, so it is meant for small limits (login: 5/15m).
//   leaky bucket      shaping: requests leave at a fixed rate; an early request
//                     is allowed with a delay (Decision::delay, how long to wait
//                     before proceeding) while the queue it joins holds fewer
//                     than `depth` requests, and denied beyond that. The same
//                     GCRA state and admission as a token bucket of capacity
//                     `depth` (a burst of 10 at 5/s, depth 10: delays 0, 200ms,
//                     ..., 1800ms; the 11th is denied).
//
// Thread-safety: immutable value type.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/calendar.h"
#include "ratelimit/status.h"

namespace ratelimit {

enum class Algorithm { kTokenBucket, kFixedWindow, kSlidingWindow, kSlidingLog, kLeakyBucket };

// "token_bucket", "fixed_window", "sliding_window", "sliding_log", "leaky_bucket".
std::string_view AlgorithmName(Algorithm a);
StatusOr<Algorithm> ParseAlgorithm(std::string_view name);

// Parses "500ms", "60s", "15m", "1h", "1d" (also "250us"). Positive integers only.
StatusOr<std::chrono::microseconds> ParseDuration(std::string_view text);
// The inverse, in the largest unit that divides evenly: 86400000000us -> "1d".
std::string FormatDuration(std::chrono::microseconds d);

class Limit;

// The numbers every limit spec gives, whatever its source (the YAML config,
// the decision API's inline limits, the local fallback's scaling): a count
// (capacity, depth or limit) and, for the buckets, a rate per second or,
// for the window algorithms, a window. MakeLimit is the one dispatch on the
// algorithm.
//
//   StatusOr<Limit> l = MakeLimit({.name = "burst", .algorithm = Algorithm::kTokenBucket,
//                                  .count = 10, .per_second = 5});
struct LimitSpec {
  std::string name;
  Algorithm algorithm = Algorithm::kTokenBucket;
  int64_t count = 0;                    // capacity | depth | limit
  double per_second = 0;                // token_bucket, leaky_bucket
  std::chrono::microseconds window{0};  // fixed_window, sliding_window, sliding_log
  // fixed_window with `align: calendar`: the calendar unit (then `window` is
  // unused) and the IANA time zone ("" is UTC).
  CalendarUnit calendar = CalendarUnit::kNone;
  std::string timezone;
};
StatusOr<Limit> MakeLimit(LimitSpec spec);
// Fills `spec`'s window from the window fields as written in a config or an
// inline limit: `window` ("60s", or with align: calendar "1d", "1w", "1mo",
// "1y"), `align` (nullopt when absent; "epoch", the default, or "calendar")
// and `timezone` (nullopt when absent; UTC by default with align: calendar).
// The errors name the field ("window", "align" or "timezone") but not the
// limit. REQUIRES: spec.algorithm is set.
Status ApplyWindowFields(LimitSpec& spec, std::string_view window,
                         std::optional<std::string_view> align,
                         std::optional<std::string_view> timezone);
// The window as the config spells it: "60s", or a calendar unit ("1mo").
std::string WindowText(const Limit& limit);
// The spec of `limit` (MakeLimit(SpecOf(l)) == l, leases aside).
LimitSpec SpecOf(const Limit& limit);
// True for the buckets (a rate), false for the window algorithms (a window).
bool TakesRate(Algorithm a);
// The spec's field names for `a`: {"capacity", "refill_per_second"},
// {"depth", "rate_per_second"} or {"limit", "window"}.
std::pair<std::string_view, std::string_view> SpecFieldNames(Algorithm a);

class Limit {
 public:
  // Bounds, chosen so that every intermediate value stays exact in int64 and
  // in the doubles of Redis Lua (2^53).
  static constexpr int64_t kMaxCount = 2'147'483'647;                  // capacity / limit
  static constexpr int64_t kMaxSlidingLogCount = 100'000;              // memory grows with it
  static constexpr int64_t kMaxWindowMicros = 366LL * 86'400'000'000;  // a year
  static constexpr size_t kMaxNameLength = 64;

  static StatusOr<Limit> TokenBucket(std::string name, int64_t capacity, double refill_per_second);
  // Requests leave at `rate_per_second`; up to `depth` wait in the queue (the
  // one leaving now included), so the longest delay is (depth - 1) / rate.
  static StatusOr<Limit> LeakyBucket(std::string name, int64_t depth, double rate_per_second);
  static StatusOr<Limit> FixedWindow(std::string name, int64_t limit,
                                     std::chrono::microseconds window);
  // A fixed window that follows the calendar of `timezone` (an IANA name;
  // "" is UTC): `limit` per day, week, month or year (see calendar.h).
  static StatusOr<Limit> CalendarQuota(std::string name, int64_t limit, CalendarUnit unit,
                                       std::string_view timezone);
  // The same on a Calendar from Calendar::Get (no lookup: for limits built
  // per request).
  static StatusOr<Limit> CalendarQuota(std::string name, int64_t limit,
                                       std::shared_ptr<const Calendar> calendar);
  static StatusOr<Limit> SlidingWindow(std::string name, int64_t limit,
                                       std::chrono::microseconds window);
  static StatusOr<Limit> SlidingLog(std::string name, int64_t limit,
                                    std::chrono::microseconds window);

  const std::string& name() const { return name_; }
  Algorithm algorithm() const { return algorithm_; }
  // Capacity (token bucket), depth (leaky bucket) or count per window.
  int64_t limit() const { return limit_; }
  // Token bucket: time to refill completely (capacity * interval); leaky
  // bucket: time to drain a full queue (depth * interval). Others: the window
  // (a calendar quota: its nominal length, Calendar::nominal_micros).
  std::chrono::microseconds window() const { return std::chrono::microseconds(window_us_); }
  int64_t window_micros() const { return window_us_; }
  // Token and leaky bucket only: microseconds per token (per request leaving).
  int64_t interval_micros() const { return interval_us_; }
  // Token and leaky bucket: floor(us / interval_micros()) for 0 <= us, as a
  // multiply and a shift (a 64-bit division is 10-90 cycles: a decision's
  // remaining count is one on the memory store's lock-free path).
  int64_t IntervalsIn(int64_t us) const {
    return static_cast<int64_t>((static_cast<unsigned __int128>(us) * interval_magic_) >>
                                interval_shift_);
  }
  // Token or leaky bucket: the GCRA algorithms, kept as a theoretical arrival time.
  bool is_gcra() const {
    return algorithm_ == Algorithm::kTokenBucket || algorithm_ == Algorithm::kLeakyBucket;
  }
  double refill_per_second() const { return 1e6 / static_cast<double>(interval_us_); }
  // A calendar quota's windows (shared and interned: equal limits share
  // one), else null.
  const Calendar* calendar() const { return calendar_.get(); }
  // Whether Store::Settle can change what a check took: not for a sliding
  // log (it keeps one timestamp per unit) nor a calendar quota.
  bool settleable() const { return algorithm_ != Algorithm::kSlidingLog && calendar_ == nullptr; }

  // Token bucket only: token prefetch. With n >= 2, a RedisStore that sees
  // the limit's key hot takes up to n tokens from Redis in one call and
  // spends them locally (see docs/architecture.md, "Token prefetch"). 0: off
  // (exact). (Not to be confused with concurrency leases, ConcurrencyStore.)
  // `key` names the setting in error messages: the YAML key the user wrote.
  static constexpr int64_t kMaxPrefetch = 1000;
  StatusOr<Limit> WithPrefetch(int64_t n, std::string_view key = "prefetch") const;
  int64_t prefetch() const { return prefetch_; }
  // The old names of token prefetch, kept for embedders (YAML still accepts
  // `lease:` too).
  static constexpr int64_t kMaxLease = kMaxPrefetch;
  StatusOr<Limit> WithLease(int64_t n) const { return WithPrefetch(n, "lease"); }
  int64_t lease() const { return prefetch_; }

  // Block period (issue 21): with d > 0, a check this limit denies blocks
  // the client on it for d: every check of it is denied until then
  // (retry_after: the end of the block), in every instance sharing the
  // store, unless an admin lifts it (Store::Unblock). 0: off. At most 366
  // days; not with prefetch. Not part of the limit's identity in the store.
  StatusOr<Limit> WithBlockFor(std::chrono::microseconds d) const;
  std::chrono::microseconds block_for() const { return std::chrono::microseconds(block_for_us_); }

  // OK iff a request of this cost can ever be allowed. A cost above the limit
  // can never succeed and is an error, not a denial.
  Status ValidateCost(int64_t cost) const;

  // "token_bucket(capacity=10, refill_per_second=5)", "leaky_bucket(depth=10, rate_per_second=5)"
  std::string ToString() const;

  // A 64-bit hash of the limit's identity in a store (SharesState): the
  // name and algorithm and, for a fixed or sliding window, its windows.
  // Computed once when the limit is built.
  uint64_t identity_hash() const { return identity_hash_; }

  friend bool operator==(const Limit&, const Limit&) = default;

 private:
  Limit(std::string name, Algorithm a, int64_t limit, int64_t window_us, int64_t interval_us);
  uint64_t ComputeIdentity() const;
  static StatusOr<Limit> Gcra(std::string name, Algorithm a, int64_t count, double per_second);
  static StatusOr<Limit> Window(std::string name, Algorithm a, int64_t limit,
                                std::chrono::microseconds window);

  std::string name_;
  Algorithm algorithm_;
  int64_t limit_;
  int64_t window_us_;
  int64_t interval_us_;
  uint64_t identity_hash_;
  // IntervalsIn's reciprocal of interval_us_ (0 when not a bucket).
  uint64_t interval_magic_ = 0;
  int interval_shift_ = 0;
  int64_t prefetch_ = 0;
  std::shared_ptr<const Calendar> calendar_;
  int64_t block_for_us_ = 0;
};

// Names are 1..64 characters of [A-Za-z0-9_.-]; they become part of store keys.
Status ValidateLimitName(std::string_view name);

// Whether `a` and `b` keep one state per client in a store: the same name
// and algorithm and, for a fixed or sliding window, the same windows (their
// length; for a calendar quota its unit and time zone; epoch or calendar
// alignment). The state of a window limit is counts per window, which other
// windows would misread (a window index of another length), so a limit whose
// window changes (a reload, an override) starts from fresh counts. A bucket
// keeps its state across a new rate (one time, re-priced: docs/admin.md), a
// sliding log across a new window (timestamps). Limit::identity_hash hashes
// exactly this.
bool SharesState(const Limit& a, const Limit& b);

}  // namespace ratelimit
