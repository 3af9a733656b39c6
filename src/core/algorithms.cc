#include "core/algorithms.h"

#include <algorithm>
#include <cassert>

namespace ratelimit::core {
namespace {

using std::chrono::microseconds;

// Leaky bucket: GCRA with tau = depth * T, so the admission is that of a
// token bucket of capacity `depth`. An allowed request does not pass at once
// but takes the next free slots of the queue, starting at max(TAT, now): its
// delay is that start minus now. A burst of n at time 0 gets delays 0, T, ...,
// (depth - 1) * T; the request that would start at depth * T is denied.
Evaluation LeakyBucket(const Limit& l, CompactState s, int64_t now, int64_t cost) {
  Evaluation e = TokenBucket(l, s, now, cost);
  if (e.decision.allowed)
    e.decision.delay = LeakyDelay(l.interval_micros(), e.decision.reset_after, cost);
  return e;
}

// The window a window limit's decision counts in: the one holding `now`, or
// the state's own if that is later. A reading behind the state's (a clock
// read before a slower path to the state, a clock stepped back, an instance
// whose clock is behind another's over a shared store) counts in the newer
// window: taken for a fresh window, it would overwrite that window's count.
// Waits are still measured from `now`, so they only grow.
int64_t WindowIndex(int64_t now, int64_t w, CompactState s) { return std::max(now / w, s.t); }

// A fixed window's admission, whatever its windows: `idx` names the window
// holding `now`, which ends at `end`; `n0` is what the state keeps beside the
// count (0, or a calendar window's length).
Evaluation WindowCount(const Limit& l, CompactState s, int64_t now, int64_t cost, int64_t idx,
                       int64_t end, int32_t n0) {
  const int64_t count = s.t == idx ? s.n1 : 0;
  Evaluation e{.decision = {.limit = l.limit()}, .next = s};
  if (count + cost <= l.limit()) {
    const int64_t after = count + cost;
    e.decision.allowed = true;
    e.decision.remaining = l.limit() - after;
    e.decision.reset_after = microseconds(after > 0 ? end - now : 0);
    e.next = {.t = idx, .n0 = n0, .n1 = static_cast<int32_t>(after)};
  } else {
    e.decision.remaining = std::max<int64_t>(0, l.limit() - count);
    e.decision.retry_after = microseconds(end - now);  // cost <= limit fits a fresh window
    e.decision.reset_after = microseconds(end - now);
  }
  return e;
}

// Fixed window: windows [k*W, (k+1)*W) aligned to the epoch.
Evaluation FixedWindow(const Limit& l, CompactState s, int64_t now, int64_t cost) {
  const int64_t w = l.window_micros();
  const int64_t idx = WindowIndex(now, w, s);
  return WindowCount(l, s, now, cost, idx, (idx + 1) * w, 0);
}

// A calendar quota: the window [start, end) of the calendar holding `now`,
// kept as t = start (us) and n0 = its length in seconds (for ExpiresAt).
Evaluation CalendarWindow(const Limit& l, CompactState s, int64_t now, int64_t cost) {
  Calendar::Span w = l.calendar()->At(now);
  if (s.t > w.start) w = l.calendar()->At(s.t);  // the state's window is later (WindowIndex)
  return WindowCount(l, s, now, cost, w.start, w.end,
                     static_cast<int32_t>((w.end - w.start) / 1'000'000));
}

// Sliding window counter. With W the window in ms and e the ms elapsed in the
// current window, estimate = prev * (W - e) / W + cur. All comparisons are
// done on estimate * W, which is an exact integer (limit * W < 2^53 is
// enforced when the limit is built), so Lua's doubles agree with int64 here.
Evaluation SlidingWindow(const Limit& l, CompactState s, int64_t now, int64_t cost) {
  const int64_t w = l.window_micros();
  const int64_t wm = w / 1000;
  const int64_t idx = WindowIndex(now, w, s);
  const int64_t start = idx * w;
  const int64_t em = std::max<int64_t>(0, now - start) / 1000;
  int64_t prev = 0, cur = 0;
  if (s.t == idx) {
    prev = s.n0;
    cur = s.n1;
  } else if (s.t == idx - 1) {
    prev = s.n1;
  }
  const int64_t limit = l.limit();
  const int64_t weighted = prev * (wm - em);  // previous window's share, times W
  Evaluation e{.decision = {.limit = limit}, .next = s};
  auto reset_after = [&](int64_t cur_after) -> int64_t {
    if (cur_after > 0) return start + 2 * w - now;
    if (weighted > 0) return start + w - now;
    return 0;
  };
  if (weighted + (cur + cost) * wm <= limit * wm) {
    const int64_t after = cur + cost;
    e.decision.allowed = true;
    e.decision.remaining = (limit * wm - weighted - after * wm) / wm;
    e.decision.reset_after = microseconds(reset_after(after));
    e.next = {.t = idx, .n0 = static_cast<int32_t>(prev), .n1 = static_cast<int32_t>(after)};
    return e;
  }
  e.decision.remaining = std::max<int64_t>(0, (limit * wm - weighted - cur * wm) / wm);
  e.decision.reset_after = microseconds(reset_after(cur));
  int64_t allow_at;
  if (cur + cost <= limit) {
    // Wait in this window until prev * (W - e') <= (limit - cur - cost) * W.
    // prev > 0 here, since the request would otherwise fit.
    const int64_t room = (limit - cur - cost) * wm / prev;
    allow_at = start + (wm - room) * 1000;
  } else if (cur == 0) {
    allow_at = start + w;  // unreachable with cost <= limit; kept for safety
  } else {
    // The next window: cur becomes prev; wait until cur * (W - e'') <= (limit - cost) * W.
    const int64_t room = std::min(wm, (limit - cost) * wm / cur);
    allow_at = start + w + (wm - room) * 1000;
  }
  e.decision.retry_after = microseconds(std::max<int64_t>(allow_at - now, 1));
  return e;
}

}  // namespace

Evaluation EvaluateOther(const Limit& limit, CompactState state, int64_t now, int64_t cost) {
  assert(cost >= 0 && cost <= limit.limit());
  switch (limit.algorithm()) {
    case Algorithm::kTokenBucket: return TokenBucket(limit, state, now, cost);
    case Algorithm::kFixedWindow:
      return limit.calendar() != nullptr ? CalendarWindow(limit, state, now, cost)
                                         : FixedWindow(limit, state, now, cost);
    case Algorithm::kSlidingWindow: return SlidingWindow(limit, state, now, cost);
    case Algorithm::kLeakyBucket: return LeakyBucket(limit, state, now, cost);
    case Algorithm::kSlidingLog: break;
  }
  assert(false && "sliding log has its own functions");
  return {};
}

Decision Standing(const Limit& limit, CompactState state, int64_t now) {
  Decision d = Evaluate(limit, state, now, 0).decision;
  d.delay = microseconds(0);
  return d;
}

std::chrono::microseconds LeakyDelay(int64_t interval_us, std::chrono::microseconds reset_after,
                                     int64_t cost) {
  return std::max(microseconds(0), reset_after - microseconds(cost * interval_us));
}

int64_t ExpiresAt(const Limit& limit, CompactState state) {
  switch (limit.algorithm()) {
    case Algorithm::kTokenBucket:
    case Algorithm::kLeakyBucket: return state.t;
    case Algorithm::kFixedWindow:
      if (limit.calendar() != nullptr) return state.t + int64_t{state.n0} * 1'000'000;
      return (state.t + 1) * limit.window_micros();
    case Algorithm::kSlidingWindow: return (state.t + 2) * limit.window_micros();
    case Algorithm::kSlidingLog: break;
  }
  return 0;
}

CompactState SettleState(const Limit& limit, CompactState state, int64_t now, int64_t delta) {
  using Wide = __int128;
  if (limit.is_gcra()) {
    const Wide base = std::max(state.t, now);
    const Wide most = Wide{now} + limit.window_micros() + kMaxDebtMicros;
    Wide next = base + Wide{delta} * limit.interval_micros();
    if (delta > 0) next = std::max(base, std::min(next, most));
    next = std::max(next, Wide{now});  // a refund fills the bucket at most
    return {.t = static_cast<int64_t>(next)};
  }
  const int64_t w = limit.window_micros();
  const int64_t idx = WindowIndex(now, w, state);
  int64_t prev = 0, cur = 0;
  if (state.t == idx) {
    prev = state.n0;
    cur = state.n1;
  } else if (state.t == idx - 1 && limit.algorithm() == Algorithm::kSlidingWindow) {
    prev = state.n1;
  }
  const int64_t after = std::clamp<int64_t>(cur + delta, 0, limit.limit());
  return {.t = idx, .n0 = static_cast<int32_t>(prev), .n1 = static_cast<int32_t>(after)};
}

Decision Probe(const Limit& limit, CompactState state, int64_t now) {
  Decision d = Standing(limit, state, now);
  const Decision one = Evaluate(limit, state, now, 1).decision;
  d.allowed = one.allowed;
  d.retry_after = one.retry_after;
  return d;
}

Decision EvaluateLog(const Limit& limit, std::span<const int64_t> log, int64_t now, int64_t cost) {
  const int64_t w = limit.window_micros();
  // Entries at or before now - w have left the window.
  const auto first = std::upper_bound(log.begin(), log.end(), now - w);
  const auto live = log.subspan(static_cast<size_t>(first - log.begin()));
  const auto n = static_cast<int64_t>(live.size());
  Decision d{.limit = limit.limit()};
  if (n + cost <= limit.limit()) {
    d.allowed = true;
    d.remaining = limit.limit() - n - cost;
    const int64_t newest = cost > 0 ? now : (n > 0 ? live.back() : now - w);
    d.reset_after = microseconds(newest + w - now);
  } else {
    d.remaining = std::max<int64_t>(0, limit.limit() - n);
    // The oldest (n + cost - limit) entries must leave the window first.
    const int64_t must_leave = n + cost - limit.limit();
    d.retry_after = microseconds(live[static_cast<size_t>(must_leave - 1)] + w - now);
    d.reset_after = microseconds(live.back() + w - now);
  }
  return d;
}

Decision StandingLog(const Limit& limit, std::span<const int64_t> log, int64_t now) {
  return EvaluateLog(limit, log, now, 0);
}

bool PruneLog(const Limit& limit, std::vector<int64_t>& log, int64_t now) {
  const auto first = std::upper_bound(log.begin(), log.end(), now - limit.window_micros());
  log.erase(log.begin(), first);
  return log.empty();
}

void ApplyLog(const Limit& limit, std::vector<int64_t>& log, int64_t now, int64_t cost) {
  PruneLog(limit, log, now);
  // Timestamps stay ascending even if the clock stepped back.
  const int64_t at = log.empty() ? now : std::max(now, log.back());
  log.insert(log.end(), static_cast<size_t>(cost), at);
}

}  // namespace ratelimit::core
