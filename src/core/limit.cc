#include "ratelimit/limit.h"

#include "core/ascii.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <sstream>

namespace ratelimit {
namespace {

constexpr int64_t kMaxExact = int64_t{1} << 53;  // doubles in Redis Lua stay exact below this
// How far a bucket's rate may be from the one configured: its interval is
// whole microseconds (Limit::Gcra).
constexpr double kMaxRateError = 0.01;

// A rate as a person writes it: at most two decimals, no trailing zeros
// ("29411.76", "500000", "0.5").
std::string RateText(double r) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(2);
  o << r;
  std::string s = o.str();
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

using core::Quote;

}  // namespace

Limit::Limit(std::string name, Algorithm a, int64_t limit, int64_t window_us, int64_t interval_us)
    : name_(std::move(name)),
      algorithm_(a),
      limit_(limit),
      window_us_(window_us),
      interval_us_(interval_us) {
  identity_hash_ = ComputeIdentity();
  // Granlund and Montgomery (1994), theorem 4.2 with N = 63: for d <= 2^l and
  // m = ceil(2^(63+l) / d), floor(n / d) = floor(n * m / 2^(63+l)) for every
  // 0 <= n < 2^63; m < 2^64 since d > 2^(l-1) (or d = 2^l: m = 2^63).
  if (interval_us_ > 0) {
    const auto d = static_cast<uint64_t>(interval_us_);
    const auto l = static_cast<int>(std::bit_width(d - 1));  // ceil(log2 d)
    const unsigned __int128 p = static_cast<unsigned __int128>(1) << (63 + l);
    interval_magic_ = static_cast<uint64_t>((p + d - 1) / d);
    interval_shift_ = 63 + l;
  }
}

// FNV-1a over the algorithm as one byte, then the name. (The algorithm
// XORed into the offset basis instead made token bucket "b" and fixed
// window "c" one identity: 0 ^ 'b' == 1 ^ 'c'.) A fixed or sliding window
// adds its windows (SharesState): after a byte no name has, the window's
// length and, for a calendar quota, its unit and time zone.
uint64_t Limit::ComputeIdentity() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto add = [&h](unsigned char c) { h = (h ^ c) * 0x100000001b3ULL; };
  add(static_cast<unsigned char>(algorithm_));
  for (unsigned char c : name_) add(c);
  if (algorithm_ == Algorithm::kFixedWindow || algorithm_ == Algorithm::kSlidingWindow) {
    add(0xff);
    for (int i = 0; i < 8; ++i) add(static_cast<unsigned char>(window_us_ >> (8 * i)));
    if (calendar_) {
      add(static_cast<unsigned char>(calendar_->unit()));
      for (unsigned char c : calendar_->zone().name()) add(c);
    }
  }
  return h;
}

bool SharesState(const Limit& a, const Limit& b) {
  if (a.name() != b.name() || a.algorithm() != b.algorithm()) return false;
  if (a.algorithm() != Algorithm::kFixedWindow && a.algorithm() != Algorithm::kSlidingWindow) {
    return true;
  }
  const Calendar* ca = a.calendar();
  const Calendar* cb = b.calendar();
  if (a.window_micros() != b.window_micros() || (ca == nullptr) != (cb == nullptr)) return false;
  return ca == nullptr || (ca->unit() == cb->unit() && ca->zone().name() == cb->zone().name());
}

std::string_view AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kTokenBucket: return "token_bucket";
    case Algorithm::kFixedWindow: return "fixed_window";
    case Algorithm::kSlidingWindow: return "sliding_window";
    case Algorithm::kSlidingLog: return "sliding_log";
    case Algorithm::kLeakyBucket: return "leaky_bucket";
  }
  return "unknown";
}

StatusOr<Algorithm> ParseAlgorithm(std::string_view name) {
  for (Algorithm a : {Algorithm::kTokenBucket, Algorithm::kFixedWindow, Algorithm::kSlidingWindow,
                      Algorithm::kSlidingLog, Algorithm::kLeakyBucket}) {
    if (name == AlgorithmName(a)) return a;
  }
  return InvalidArgument("unknown algorithm " + Quote(name) +
                         " (expected token_bucket, leaky_bucket, fixed_window, sliding_window or "
                         "sliding_log)");
}

StatusOr<std::chrono::microseconds> ParseDuration(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string_view unit = text.substr(digits);
  int64_t n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + digits, n);
  if (digits == 0 || ec != std::errc() || ptr != text.data() + digits) {
    return InvalidArgument("invalid duration " + Quote(text) +
                           " (expected a positive integer and a unit: 500ms, 60s, 15m, 1h, 1d)");
  }
  int64_t scale = 0;
  if (unit == "us")
    scale = 1;
  else if (unit == "ms")
    scale = 1000;
  else if (unit == "s")
    scale = 1'000'000;
  else if (unit == "m")
    scale = 60'000'000;
  else if (unit == "h")
    scale = 3'600'000'000;
  else if (unit == "d")
    scale = 86'400'000'000;
  else {
    return InvalidArgument("invalid duration " + Quote(text) + ": unknown unit " + Quote(unit) +
                           " (expected us, ms, s, m, h or d)");
  }
  if (n <= 0) return InvalidArgument("invalid duration " + Quote(text) + ": must be positive");
  if (n > Limit::kMaxWindowMicros / scale) {
    return InvalidArgument("invalid duration " + Quote(text) + ": longer than 366 days");
  }
  return std::chrono::microseconds(n * scale);
}

std::string FormatDuration(std::chrono::microseconds d) {
  const int64_t us = d.count();
  struct Unit {
    int64_t scale;
    const char* name;
  };
  for (Unit u : {Unit{86'400'000'000, "d"}, Unit{3'600'000'000, "h"}, Unit{60'000'000, "m"},
                 Unit{1'000'000, "s"}, Unit{1000, "ms"}}) {
    if (us != 0 && us % u.scale == 0) return std::to_string(us / u.scale) + u.name;
  }
  return std::to_string(us) + "us";
}

Status ValidateLimitName(std::string_view name) {
  if (name.empty()) return InvalidArgument("limit name must not be empty");
  if (name.size() > Limit::kMaxNameLength) {
    return InvalidArgument("limit name " + Quote(name.substr(0, 16)) + "... is longer than " +
                           std::to_string(Limit::kMaxNameLength) + " characters");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) {
      return InvalidArgument("limit name " + Quote(name) +
                             " may contain only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::Ok();
}

// Token and leaky bucket share the representation: `count` (capacity or
// depth) and the interval per unit, 1/per_second, in whole microseconds.
StatusOr<Limit> Limit::Gcra(std::string name, Algorithm a, int64_t count, double per_second) {
  if (Status s = ValidateLimitName(name); !s.ok()) return s;
  const bool leaky = a == Algorithm::kLeakyBucket;
  const std::string what = "limit " + Quote(name) + ": ";
  const std::string count_name = leaky ? "depth" : "capacity";
  const std::string rate_name = leaky ? "rate_per_second" : "refill_per_second";
  if (count <= 0)
    return InvalidArgument(what + count_name + " must be positive, got " + std::to_string(count));
  if (count > kMaxCount)
    return InvalidArgument(what + count_name + " must be at most " + std::to_string(kMaxCount));
  if (!std::isfinite(per_second) || per_second <= 0) {
    std::ostringstream o;
    o << what << rate_name << " must be a positive finite number, got " << per_second;
    return InvalidArgument(o.str());
  }
  if (per_second > 1e6) {
    return InvalidArgument(what + rate_name + " must be at most 1000000 (one " +
                           (leaky ? "request" : "token") + " per microsecond)");
  }
  // The interval is whole microseconds: a rate it cannot keep to within 1%
  // is refused rather than run at another (700000/s rounded to 1 us ran at
  // 1000000/s). Every rate up to 20,000/s is kept (intervals of 50 us and
  // more round by at most 1%); above, those near 1e6 / n.
  const double exact = 1e6 / per_second;
  const double interval = std::round(exact);
  if (std::abs(exact - interval) > kMaxRateError * interval) {
    const double slower = std::ceil(exact), faster = std::floor(exact);
    const std::string unit = leaky ? "a request" : "a token";
    return InvalidArgument(
        what + rate_name + " " + RateText(per_second) + " cannot be kept to within 1%: " + unit +
        " every whole number of microseconds is the resolution; the nearest "
        "rates that can are " +
        RateText(1e6 / slower) + " (" + unit + " every " + RateText(slower) + " us) and " +
        RateText(1e6 / faster) + " (every " + RateText(faster) + " us)");
  }
  const double full = interval * static_cast<double>(count);
  if (full > static_cast<double>(kMaxWindowMicros)) {
    return InvalidArgument(what + (leaky ? "draining a full queue" : "a full refill") +
                           " would take longer than 366 days; raise " + rate_name);
  }
  const auto interval_us = static_cast<int64_t>(interval);
  return Limit(std::move(name), a, count, interval_us * count, interval_us);
}

StatusOr<Limit> Limit::TokenBucket(std::string name, int64_t capacity, double refill_per_second) {
  return Gcra(std::move(name), Algorithm::kTokenBucket, capacity, refill_per_second);
}

StatusOr<Limit> Limit::LeakyBucket(std::string name, int64_t depth, double rate_per_second) {
  return Gcra(std::move(name), Algorithm::kLeakyBucket, depth, rate_per_second);
}

StatusOr<Limit> Limit::Window(std::string name, Algorithm a, int64_t limit,
                              std::chrono::microseconds window) {
  if (Status s = ValidateLimitName(name); !s.ok()) return s;
  const std::string what = "limit " + Quote(name) + ": ";
  if (limit <= 0)
    return InvalidArgument(what + "limit must be positive, got " + std::to_string(limit));
  const int64_t max = a == Algorithm::kSlidingLog ? kMaxSlidingLogCount : kMaxCount;
  if (limit > max)
    return InvalidArgument(what + "limit must be at most " + std::to_string(max) + " for " +
                           std::string(AlgorithmName(a)));
  const int64_t w = window.count();
  if (w <= 0) return InvalidArgument(what + "window must be positive");
  if (w > kMaxWindowMicros) return InvalidArgument(what + "window must be at most 366 days");
  if (a == Algorithm::kSlidingWindow) {
    if (w % 1000 != 0)
      return InvalidArgument(what + "a sliding_window window must be whole milliseconds");
    if (limit > kMaxExact / (w / 1000)) {
      return InvalidArgument(what +
                             "limit x window (in ms) must stay below 2^53; use a smaller "
                             "limit or window, or fixed_window");
    }
  }
  return Limit(std::move(name), a, limit, w, 0);
}

StatusOr<Limit> Limit::FixedWindow(std::string name, int64_t limit,
                                   std::chrono::microseconds window) {
  return Window(std::move(name), Algorithm::kFixedWindow, limit, window);
}
StatusOr<Limit> Limit::CalendarQuota(std::string name, int64_t limit, CalendarUnit unit,
                                     std::string_view timezone) {
  if (unit == CalendarUnit::kNone) {
    return InvalidArgument("limit " + Quote(name) + ": a calendar window is 1d, 1w, 1mo or 1y");
  }
  StatusOr<std::shared_ptr<const Calendar>> cal = Calendar::Get(unit, timezone);
  if (!cal.ok()) return InvalidArgument("limit " + Quote(name) + ": " + cal.status().message());
  return CalendarQuota(std::move(name), limit, *std::move(cal));
}

StatusOr<Limit> Limit::CalendarQuota(std::string name, int64_t limit,
                                     std::shared_ptr<const Calendar> calendar) {
  StatusOr<Limit> l = Window(std::move(name), Algorithm::kFixedWindow, limit,
                             std::chrono::microseconds(calendar->nominal_micros()));
  if (!l.ok()) return l;
  l->calendar_ = std::move(calendar);
  l->identity_hash_ = l->ComputeIdentity();
  return l;
}
StatusOr<Limit> Limit::SlidingWindow(std::string name, int64_t limit,
                                     std::chrono::microseconds window) {
  return Window(std::move(name), Algorithm::kSlidingWindow, limit, window);
}
StatusOr<Limit> Limit::SlidingLog(std::string name, int64_t limit,
                                  std::chrono::microseconds window) {
  return Window(std::move(name), Algorithm::kSlidingLog, limit, window);
}

Status Limit::ValidateCost(int64_t cost) const {
  if (cost < 0) return InvalidArgument("cost must not be negative, got " + std::to_string(cost));
  if (cost > limit_) {
    return InvalidArgument("cost " + std::to_string(cost) + " exceeds the " +
                           (algorithm_ == Algorithm::kTokenBucket   ? "capacity "
                            : algorithm_ == Algorithm::kLeakyBucket ? "depth "
                                                                    : "limit ") +
                           std::to_string(limit_) + " of limit '" + name_ +
                           "': such a request can never be allowed");
  }
  return Status::Ok();
}

StatusOr<Limit> Limit::WithPrefetch(int64_t n, std::string_view key) const {
  if (n == 0) {
    Limit l = *this;
    l.prefetch_ = 0;
    return l;
  }
  if (algorithm_ != Algorithm::kTokenBucket) {
    return InvalidArgument(std::string(key) + " is for token_bucket limits only");
  }
  if (block_for_us_ > 0) {
    return InvalidArgument(std::string(key) + " and block_for do not go together");
  }
  if (n < 2 || n > std::min(limit_, kMaxPrefetch)) {
    return InvalidArgument(std::string(key) + " must be 0 (off) or 2.." +
                           std::to_string(std::min(limit_, kMaxPrefetch)) +
                           " (at most the capacity and " + std::to_string(kMaxPrefetch) +
                           "), got " + std::to_string(n));
  }
  Limit l = *this;
  l.prefetch_ = n;
  return l;
}

StatusOr<Limit> Limit::WithBlockFor(std::chrono::microseconds d) const {
  if (d.count() < 0 || d.count() > kMaxWindowMicros) {
    return InvalidArgument("block_for must be at most 366 days");
  }
  if (d.count() > 0 && prefetch_ > 0) {
    return InvalidArgument(
        "block_for and prefetch do not go together (prefetched tokens are spent without asking "
        "the store, which keeps the block)");
  }
  Limit l = *this;
  l.block_for_us_ = d.count();
  return l;
}

std::string Limit::ToString() const {
  std::ostringstream o;
  o << AlgorithmName(algorithm_) << "(";
  if (algorithm_ == Algorithm::kTokenBucket) {
    o << "capacity=" << limit_ << ", refill_per_second=" << refill_per_second();
    if (prefetch_ > 0) o << ", prefetch=" << prefetch_;
  } else if (algorithm_ == Algorithm::kLeakyBucket) {
    o << "depth=" << limit_ << ", rate_per_second=" << refill_per_second();
  } else {
    o << "limit=" << limit_ << ", window=" << WindowText(*this);
    if (calendar_) o << ", align=calendar, timezone=" << calendar_->zone().name();
  }
  if (block_for_us_ > 0) o << ", block_for=" << FormatDuration(block_for());
  o << ")";
  return o.str();
}

bool TakesRate(Algorithm a) { return a == Algorithm::kTokenBucket || a == Algorithm::kLeakyBucket; }

std::pair<std::string_view, std::string_view> SpecFieldNames(Algorithm a) {
  switch (a) {
    case Algorithm::kTokenBucket: return {"capacity", "refill_per_second"};
    case Algorithm::kLeakyBucket: return {"depth", "rate_per_second"};
    default: return {"limit", "window"};
  }
}

StatusOr<Limit> MakeLimit(LimitSpec spec) {
  if (spec.calendar != CalendarUnit::kNone) {
    if (spec.algorithm != Algorithm::kFixedWindow) {
      return InvalidArgument("limit " + Quote(spec.name) +
                             ": align: calendar is for fixed_window " + "only, not " +
                             std::string(AlgorithmName(spec.algorithm)));
    }
    return Limit::CalendarQuota(std::move(spec.name), spec.count, spec.calendar, spec.timezone);
  }
  switch (spec.algorithm) {
    case Algorithm::kTokenBucket:
      return Limit::TokenBucket(std::move(spec.name), spec.count, spec.per_second);
    case Algorithm::kLeakyBucket:
      return Limit::LeakyBucket(std::move(spec.name), spec.count, spec.per_second);
    case Algorithm::kFixedWindow:
      return Limit::FixedWindow(std::move(spec.name), spec.count, spec.window);
    case Algorithm::kSlidingWindow:
      return Limit::SlidingWindow(std::move(spec.name), spec.count, spec.window);
    case Algorithm::kSlidingLog:
      return Limit::SlidingLog(std::move(spec.name), spec.count, spec.window);
  }
  return InvalidArgument("unknown algorithm");
}

LimitSpec SpecOf(const Limit& limit) {
  LimitSpec s{.name = limit.name(), .algorithm = limit.algorithm(), .count = limit.limit()};
  if (TakesRate(limit.algorithm())) {
    s.per_second = limit.refill_per_second();
  } else {
    s.window = limit.window();
  }
  if (const Calendar* c = limit.calendar()) {
    s.calendar = c->unit();
    s.timezone = c->zone().name();
  }
  return s;
}

Status ApplyWindowFields(LimitSpec& spec, std::string_view window,
                         std::optional<std::string_view> align,
                         std::optional<std::string_view> timezone) {
  const bool calendar = align && *align == "calendar";
  if (align && !calendar && *align != "epoch") {
    return InvalidArgument("align must be 'calendar' or 'epoch' (the default), got " +
                           Quote(*align));
  }
  if (calendar) {
    if (spec.algorithm != Algorithm::kFixedWindow) {
      return InvalidArgument("align: calendar is for fixed_window only, not " +
                             std::string(AlgorithmName(spec.algorithm)));
    }
    std::optional<CalendarUnit> unit = ParseCalendarUnit(window);
    if (!unit) {
      return InvalidArgument("window " + Quote(window) +
                             ": a calendar window is 1d, 1w, 1mo or 1y (one day, week, month or "
                             "year; multiples are not supported)");
    }
    spec.calendar = *unit;
    spec.timezone = std::string(timezone.value_or("UTC"));
    if (spec.timezone.empty()) return InvalidArgument("timezone must not be empty");
    return Status::Ok();
  }
  if (timezone) return InvalidArgument("timezone needs align: calendar");
  if (window.ends_with("mo") || window.ends_with("y") || window.ends_with("w")) {
    return InvalidArgument("window " + Quote(window) +
                           " needs align: calendar (weeks, months and years are calendar "
                           "windows; for a fixed length write days, e.g. 7d)");
  }
  StatusOr<std::chrono::microseconds> w = ParseDuration(window);
  if (!w.ok()) return w.status();
  spec.window = *w;
  return Status::Ok();
}

std::string WindowText(const Limit& limit) {
  if (const Calendar* c = limit.calendar()) return std::string(CalendarUnitName(c->unit()));
  return FormatDuration(limit.window());
}

}  // namespace ratelimit
