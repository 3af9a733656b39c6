#include "store/lua/check_codec.h"

#include <algorithm>
#include <array>

#include "core/algorithms.h"
#include "redis/reply.h"

namespace ratelimit::store::lua {
namespace {

char AlgorithmCode(Algorithm a) {
  switch (a) {
    case Algorithm::kTokenBucket: return 't';
    case Algorithm::kFixedWindow: return 'f';
    case Algorithm::kSlidingWindow: return 's';
    case Algorithm::kSlidingLog: return 'l';
    case Algorithm::kLeakyBucket: return 'k';
  }
  return '?';
}

// A one-limit check that consumes `cost` >= 1 of limit `spec` (1-based, of
// `specs`), as the one number check.lua unpacks; nullopt: not that shape, or
// too large to stay exact in Lua's doubles.
std::optional<uint64_t> Packed(const CheckCall& c, size_t spec, size_t specs) {
  if (c.peek || c.limits.size() != 1) return std::nullopt;
  const int64_t cost = c.limits[0].cost;
  if (cost < 1 || cost > (int64_t{1} << 32) || specs > (size_t{1} << 20)) return std::nullopt;
  return static_cast<uint64_t>(cost - 1) * specs + spec;  // < 2^52: exact in Lua
}

class Writer {
 public:
  explicit Writer(EncodedCall& call) : call_(call) {}
  std::string_view Number(int64_t v) {
    static const std::array<std::string, 1025> kSmall = [] {
      std::array<std::string, 1025> a;
      for (size_t i = 0; i < a.size(); ++i) a[i] = std::to_string(i);
      return a;
    }();
    if (v >= 0 && static_cast<size_t>(v) < kSmall.size()) return kSmall[static_cast<size_t>(v)];
    return call_.text.emplace_back(std::to_string(v));
  }
  std::string_view Text(std::string s) { return call_.text.emplace_back(std::move(s)); }

 private:
  EncodedCall& call_;
};

constexpr std::string_view kCodes[] = {"t", "k", "f", "s", "l", "T", "c"};

std::string_view CodeText(char code) {
  for (std::string_view c : kCodes) {
    if (c[0] == code) return c;
  }
  return "?";
}

}  // namespace

WireLimit WireOf(const Limit& limit) {
  return {.code = AlgorithmCode(limit.algorithm()),
          .limit = limit.limit(),
          .window = limit.window_micros(),
          .interval = limit.interval_micros(),
          .block = limit.block_for().count()};
}

size_t KeysPerLimit(const WireLimit& spec) {
  return (spec.code == 'c' ? 2 : 1) + (spec.block > 0 ? 1 : 0);
}

CalendarCall CalendarCallOf(const Limit& limit, int64_t now_us, int64_t cost) {
  const Calendar& cal = *limit.calendar();
  const Calendar::Span cur = cal.At(now_us);
  const Calendar::Span next = cal.Next(cur);
  return {.call = {.spec = {.code = 'c',
                            .limit = limit.limit(),
                            .window = cur.end,
                            .interval = next.end,
                            .block = limit.block_for().count()},
                   .cost = cost},
          .start = cur.start,
          .next_start = next.start};
}

void CheckCall::SetPrefetch(int64_t tokens) {
  limits[0].spec.code = tokens > 1 ? 'T' : 't';
  limits[0].cost = std::max<int64_t>(tokens, 1);
}

EncodedCall Encode(std::optional<int64_t> now_us, std::span<const CheckCall* const> checks) {
  EncodedCall call;
  Writer w(call);
  std::vector<std::string_view>& args = call.args;
  args.push_back(now_us ? w.Text(std::to_string(*now_us)) : std::string_view());
  args.emplace_back();  // the number of distinct limits, known below
  // Each distinct limit once. (Only the first 64 are looked for: a batch of
  // many inline limits repeats some rather than search quadratically.)
  std::vector<WireLimit> specs;
  std::vector<uint32_t> spec_of;  // per limit of each check, in order
  for (const CheckCall* c : checks) {
    for (const LimitCall& l : c->limits) {
      const size_t searched = std::min<size_t>(specs.size(), 64);
      const auto found =
          std::find(specs.begin(), specs.begin() + static_cast<std::ptrdiff_t>(searched), l.spec);
      size_t j = static_cast<size_t>(found - specs.begin());
      if (j == searched) {
        j = specs.size();
        specs.push_back(l.spec);
        args.push_back(l.spec.block > 0 ? w.Text(std::string(CodeText(l.spec.code)) + "/" +
                                                 std::to_string(l.spec.block))
                                        : CodeText(l.spec.code));
        args.push_back(w.Number(l.spec.limit));
        args.push_back(w.Number(l.spec.window));
        args.push_back(w.Number(l.spec.interval));
      }
      spec_of.push_back(static_cast<uint32_t>(j + 1));
    }
  }
  args[1] = w.Number(static_cast<int64_t>(specs.size()));
  args.push_back(w.Number(static_cast<int64_t>(checks.size())));
  size_t at = 0;
  for (const CheckCall* c : checks) {
    call.keys.insert(call.keys.end(), c->keys.begin(), c->keys.end());
    if (std::optional<uint64_t> packed = Packed(*c, spec_of[at], specs.size())) {
      args.push_back(w.Number(static_cast<int64_t>(*packed)));
      ++at;
      continue;
    }
    args.push_back(w.Text((c->peek ? "p" : "c") + std::to_string(c->limits.size())));
    for (const LimitCall& l : c->limits) {
      args.push_back(w.Number(spec_of[at++]));
      args.push_back(w.Number(c->peek ? 0 : l.cost));
    }
  }
  return call;
}

StatusOr<std::vector<CheckAnswer>> Decode(const StatusOr<redis::Reply>& reply,
                                          std::span<const CheckCall* const> checks) {
  if (!reply.ok()) return reply.status();
  if (reply->type == redis::Reply::Type::kError) {
    return Internal("redis script error: " + reply->str);
  }
  size_t expected = 0;
  for (const CheckCall* c : checks) expected += 4 * c->limits.size();
  if (reply->type != redis::Reply::Type::kArray || reply->elements.size() != expected) {
    return Internal("unexpected reply from the redis script (expected an array of " +
                    std::to_string(expected) + " integers)");
  }
  for (const redis::Reply& e : reply->elements) {
    if (e.type != redis::Reply::Type::kInteger) {
      return Internal("unexpected reply from the redis script: a non-integer element");
    }
  }
  std::vector<CheckAnswer> out(checks.size());
  const auto& e = reply->elements;
  size_t at = 0;
  for (size_t k = 0; k < checks.size(); ++k) {
    const CheckCall& c = *checks[k];
    CheckAnswer& a = out[k];
    a.result.decisions.resize(c.limits.size());
    bool all = true;
    for (size_t i = 0; i < c.limits.size(); ++i, at += 4) {
      Decision& d = a.result.decisions[i];
      d.limit = c.limits[i].spec.limit;  // not echoed by the script
      d.allowed = e[at].integer > 0;     // 'T': the tokens taken
      d.remaining = e[at + 1].integer;
      d.retry_after = std::chrono::microseconds(e[at + 2].integer);
      d.reset_after = std::chrono::microseconds(e[at + 3].integer);
      all = all && d.allowed;
      if (c.limits[i].spec.code == 'T') a.tokens_taken = e[at].integer;
    }
    // The leaky bucket's delay from its reset_after (core::LeakyDelay); a
    // denied check admits nothing, so no delay.
    for (size_t i = 0; all && i < c.limits.size(); ++i) {
      const LimitCall& l = c.limits[i];
      if (l.spec.code != 'k') continue;
      Decision& d = a.result.decisions[i];
      d.delay = core::LeakyDelay(l.spec.interval, d.reset_after, c.peek ? 0 : l.cost);
    }
    a.result.overall = Combine(a.result.decisions);
  }
  return out;
}

EncodedCall EncodeSettle(std::optional<int64_t> now_us, const SettleCall& call) {
  EncodedCall e;
  Writer w(e);
  e.keys.assign(call.keys.begin(), call.keys.end());
  e.args = {now_us ? w.Text(std::to_string(*now_us)) : std::string_view(), "S",
            w.Number(static_cast<int64_t>(call.limits.size()))};
  for (const LimitCall& l : call.limits) {
    e.args.insert(e.args.end(),
                  {CodeText(l.spec.code), w.Number(l.spec.limit), w.Number(l.spec.window),
                   w.Number(l.spec.interval), w.Number(l.cost)});
  }
  if (!call.once_key.empty()) {
    e.keys.push_back(call.once_key);
    e.args.push_back(w.Number(call.once_ttl_ms));
  }
  return e;
}

StatusOr<CheckResult> DecodeSettle(const StatusOr<redis::Reply>& reply, const SettleCall& call) {
  if (!reply.ok()) return reply.status();
  if (reply->type == redis::Reply::Type::kError) {
    return Internal("redis settle script error: " + reply->str);
  }
  const auto& e = reply->elements;
  if (reply->type == redis::Reply::Type::kArray && e.size() == 1 &&
      e[0].type == redis::Reply::Type::kInteger && e[0].integer == -1) {
    return CheckResult{.already_settled = true};
  }
  const bool integers = std::all_of(e.begin(), e.end(), [](const redis::Reply& r) {
    return r.type == redis::Reply::Type::kInteger;
  });
  if (reply->type != redis::Reply::Type::kArray || e.size() != 4 * call.limits.size() ||
      !integers) {
    return Internal("unexpected reply from the redis settle script (expected " +
                    std::to_string(4 * call.limits.size()) + " integers)");
  }
  CheckResult r;
  for (size_t i = 0; i < call.limits.size(); ++i) {
    r.decisions.push_back({.allowed = e[4 * i].integer > 0,
                           .limit = call.limits[i].spec.limit,
                           .remaining = e[4 * i + 1].integer,
                           .retry_after = std::chrono::microseconds(e[4 * i + 2].integer),
                           .reset_after = std::chrono::microseconds(e[4 * i + 3].integer)});
  }
  r.overall = Combine(r.decisions);
  return r;
}

}  // namespace ratelimit::store::lua
