// The check.lua codec without Redis: what Encode writes is read back by a
// reader of check.lua's argument grammar (the script's own loop, in C++), and
// Decode turns every reply shape into answers or the call's failure.
#include "store/lua/check_codec.h"

#include <gtest/gtest.h>

#include <charconv>

#include "redis/reply.h"

namespace ratelimit::store::lua {
namespace {

using redis::Reply;
using std::chrono::microseconds;

int64_t Num(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  EXPECT_TRUE(ec == std::errc() && p == s.data() + s.size()) << "not a number: '" << s << "'";
  return v;
}

// check.lua's reading of ARGV and KEYS, back into CheckCalls.
struct Read {
  std::optional<int64_t> now;
  std::vector<CheckCall> checks;
};

Read ReadArgs(const EncodedCall& e) {
  Read out;
  const auto& a = e.args;
  if (!a[0].empty()) out.now = Num(a[0]);
  const auto nspecs = static_cast<size_t>(Num(a[1]));
  std::vector<WireLimit> specs;
  size_t i = 2;
  for (size_t s = 0; s < nspecs; ++s, i += 4) {
    // A letter, then "/<us>" with a block period.
    const std::string_view code = a[i];
    EXPECT_TRUE(code.size() == 1 || code[1] == '/') << code;
    const int64_t block = code.size() > 1 ? Num(code.substr(2)) : 0;
    specs.push_back({code[0], Num(a[i + 1]), Num(a[i + 2]), Num(a[i + 3]), block});
  }
  const int64_t checks = Num(a[i++]);
  size_t key = 0;
  for (int64_t c = 0; c < checks; ++c) {
    CheckCall call;
    std::string_view head = a[i++];
    if (head[0] != 'c' && head[0] != 'p') {  // packed: (cost - 1) x S + index
      const auto v = static_cast<size_t>(Num(head));
      call.limits.push_back({specs[(v - 1) % nspecs], static_cast<int64_t>((v - 1) / nspecs) + 1});
    } else {
      call.peek = head[0] == 'p';
      const int64_t n = Num(head.substr(1));
      for (int64_t l = 0; l < n; ++l, i += 2) {
        call.limits.push_back({specs[static_cast<size_t>(Num(a[i])) - 1], Num(a[i + 1])});
      }
    }
    for (const LimitCall& l : call.limits) {
      for (size_t k = 0; k < KeysPerLimit(l.spec); ++k) call.keys.emplace_back(e.keys[key++]);
    }
    out.checks.push_back(std::move(call));
  }
  EXPECT_EQ(i, a.size());
  EXPECT_EQ(key, e.keys.size());
  return out;
}

WireLimit Spec(const Limit& l) { return WireOf(l); }

const Limit kBurst = *Limit::TokenBucket("burst", 10, 5);
const Limit kDaily = *Limit::FixedWindow("daily", 1000, std::chrono::hours(24));
const Limit kShape = *Limit::LeakyBucket("shape", 5, 10);

// The result views the checks' keys: `checks` must outlive it (no temporary).
EncodedCall EncodeAll(std::optional<int64_t> now, const std::vector<CheckCall>& checks) {
  std::vector<const CheckCall*> p;
  for (const CheckCall& c : checks) p.push_back(&c);
  return Encode(now, p);
}

// What check.lua reads back from `e` is `checks`, key for key.
void ExpectReadsBack(const EncodedCall& e, const std::vector<CheckCall>& checks) {
  const Read back = ReadArgs(e);
  ASSERT_EQ(back.checks.size(), checks.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    EXPECT_EQ(back.checks[i].peek, checks[i].peek) << i;
    EXPECT_EQ(back.checks[i].keys, checks[i].keys) << i;
    EXPECT_EQ(back.checks[i].limits, checks[i].limits) << i;
  }
}

std::vector<CheckCall> Sample() {
  CheckCall one{.keys = {"rl:{a}burst"}, .limits = {{Spec(kBurst), 1}}};
  CheckCall three{.keys = {"rl:{b}burst"}, .limits = {{Spec(kBurst), 3}}};
  CheckCall two{.keys = {"rl:{c}burst", "rl:{c}daily"},
                .limits = {{Spec(kBurst), 2}, {Spec(kDaily), 2}}};
  CheckCall peek{.peek = true, .keys = {"rl:{d}shape"}, .limits = {{Spec(kShape), 0}}};
  CheckCall prefetch{.keys = {"rl:{e}burst"}, .limits = {{Spec(kBurst), 1}}};
  prefetch.SetPrefetch(8);
  return {one, three, two, peek, prefetch};
}

TEST(CheckCodec, RoundTrip) {
  const std::vector<CheckCall> checks = Sample();
  for (std::optional<int64_t> now :
       {std::optional<int64_t>(), std::optional<int64_t>(1'700'000'000'123'456)}) {
    const EncodedCall e = EncodeAll(now, checks);
    EXPECT_EQ(ReadArgs(e).now, now);
    ExpectReadsBack(e, checks);
  }
}

TEST(CheckCodec, EachDistinctLimitOnceAndOneArgumentPerSimpleCheck) {
  const std::vector<CheckCall> sample = Sample();
  const EncodedCall e = EncodeAll(std::nullopt, sample);
  // burst, daily, shape and the prefetching burst ('T'): four specs.
  EXPECT_EQ(e.args[1], "4");
  const size_t checks_at = 2 + 4 * 4;
  EXPECT_EQ(e.args[checks_at], "5");
  EXPECT_EQ(e.args[checks_at + 1], "1");                        // one: cost 1 of spec 1
  EXPECT_EQ(e.args[checks_at + 2], std::to_string(2 * 4 + 1));  // three: cost 3 of spec 1
  EXPECT_EQ(e.args[checks_at + 3], "c2");
  EXPECT_EQ(e.args[checks_at + 8], "p1");
  EXPECT_EQ(e.args[checks_at + 10], "0");  // a peek's cost is sent as 0
  EXPECT_EQ(e.args[2 + 3 * 4], "T");
}

TEST(CheckCodec, CostsTooLargeForLuaAreNotPacked) {
  CheckCall big{.keys = {"rl:{a}x"}, .limits = {{{'t', 1, 1, 1}, (int64_t{1} << 32) + 1}}};
  const std::vector<CheckCall> calls = {big};
  const EncodedCall e = EncodeAll(std::nullopt, calls);
  EXPECT_EQ(e.args[7], "c1");
  EXPECT_EQ(ReadArgs(e).checks[0].limits, big.limits);
}

TEST(CheckCodec, PrefetchOfOneIsAPlainTokenBucket) {
  CheckCall c{.keys = {"k"}, .limits = {{Spec(kBurst), 1}}};
  c.SetPrefetch(5);
  EXPECT_EQ(c.limits[0].spec.code, 'T');
  EXPECT_EQ(c.limits[0].cost, 5);
  c.SetPrefetch(1);
  EXPECT_EQ(c.limits[0].spec.code, 't');
  EXPECT_EQ(c.limits[0].cost, 1);
}

Reply Ints(std::vector<int64_t> v) {
  std::vector<Reply> e;
  for (int64_t x : v) e.push_back(Reply::Integer(x));
  return Reply::Array(std::move(e));
}

std::vector<const CheckCall*> Ptrs(const std::vector<CheckCall>& v) {
  std::vector<const CheckCall*> p;
  for (const CheckCall& c : v) p.push_back(&c);
  return p;
}

TEST(CheckCodec, DecodesEveryLimitOfEveryCheck) {
  const std::vector<CheckCall> checks = Sample();
  // one: allowed; three: denied; two: burst allowed, daily denied; peek of the
  // leaky bucket; prefetch: 6 tokens taken.
  StatusOr<std::vector<CheckAnswer>> a = Decode(
      Ints({1, 9, 0,       200'000,                                                            //
            0, 0, 400'000, 2'000'000, 1, 7, 0, 600'000, 0, 0, 5'000, 9'000, 1, 4, 0, 300'000,  //
            6, 0, 0,       2'000'000}),
      Ptrs(checks));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->size(), 5u);
  const CheckResult& one = (*a)[0].result;
  EXPECT_TRUE(one.overall.allowed);
  EXPECT_EQ(one.overall.remaining, 9);
  EXPECT_EQ(one.overall.limit, 10);
  EXPECT_EQ(one.overall.reset_after, microseconds(200'000));
  EXPECT_FALSE((*a)[1].result.overall.allowed);
  EXPECT_EQ((*a)[1].result.overall.retry_after, microseconds(400'000));
  const CheckResult& two = (*a)[2].result;
  ASSERT_EQ(two.decisions.size(), 2u);
  EXPECT_EQ(two.decisions[1].limit, 1000);
  EXPECT_FALSE(two.overall.allowed);
  EXPECT_EQ(two.overall.retry_after, microseconds(5'000));
  // The leaky bucket's delay is derived: reset_after - cost x interval, cost 0 for a peek.
  EXPECT_EQ((*a)[3].result.overall.delay, microseconds(300'000));
  EXPECT_EQ((*a)[4].tokens_taken, 6);
  EXPECT_EQ((*a)[0].tokens_taken, 0);
}

TEST(CheckCodec, ADeniedCheckHasNoDelay) {
  CheckCall c{.keys = {"k1", "k2"}, .limits = {{Spec(kShape), 1}, {Spec(kBurst), 1}}};
  StatusOr<std::vector<CheckAnswer>> a =
      Decode(Ints({1, 3, 0, 400'000, 0, 0, 100'000, 2'000'000}), Ptrs({c}));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0].result.decisions[0].delay, microseconds(0));
  StatusOr<std::vector<CheckAnswer>> allowed =
      Decode(Ints({1, 3, 0, 400'000, 1, 0, 0, 2'000'000}), Ptrs({c}));
  ASSERT_TRUE(allowed.ok());
  EXPECT_EQ((*allowed)[0].result.decisions[0].delay, microseconds(300'000));
}

// Microseconds since the epoch of a UTC date and time.
int64_t Utc(int y, int mo, int d, int h) {
  return (DaysFromCivil(y, mo, d) * 24 + h) * 3'600'000'000;
}

TEST(CheckCodec, ACalendarQuotaSendsBothWindowsAndTheirTwoKeys) {
  const Limit monthly =
      *Limit::CalendarQuota("monthly", 100, CalendarUnit::kMonth, "Europe/Berlin");
  // 2026-03-31 21:00 UTC: the last hour of March in Berlin (CEST).
  const CalendarCall cal = CalendarCallOf(monthly, Utc(2026, 3, 31, 21), 3);
  EXPECT_EQ(cal.call.spec, (WireLimit{'c', 100, Utc(2026, 3, 31, 22), Utc(2026, 4, 30, 22)}));
  EXPECT_EQ(cal.call.cost, 3);
  EXPECT_EQ(cal.start, Utc(2026, 2, 28, 23));
  EXPECT_EQ(cal.next_start, Utc(2026, 3, 31, 22));
  EXPECT_EQ(KeysPerLimit(cal.call.spec), 2u);
  EXPECT_EQ(KeysPerLimit(Spec(kDaily)), 1u);

  // Alone (packed), beside another limit, and peeked: the two keys follow
  // each other where the limit stands, and everything reads back.
  const std::vector<CheckCall> checks = {
      CheckCall{.keys = {"rl:{a}monthly@1", "rl:{a}monthly@2"}, .limits = {cal.call}},
      CheckCall{.keys = {"rl:{b}burst", "rl:{b}monthly@1", "rl:{b}monthly@2", "rl:{b}daily"},
                .limits = {{Spec(kBurst), 1}, cal.call, {Spec(kDaily), 1}}},
      CheckCall{.peek = true,
                .keys = {"rl:{c}monthly@1", "rl:{c}monthly@2"},
                .limits = {{cal.call.spec, 0}}},
  };
  const EncodedCall e = EncodeAll(std::nullopt, checks);
  EXPECT_EQ(e.keys.size(), 8u);
  EXPECT_EQ(e.args[2], "c");
  EXPECT_EQ(e.args[3], "100");
  EXPECT_EQ(e.args[4], std::to_string(Utc(2026, 3, 31, 22)));
  EXPECT_EQ(e.args[5], std::to_string(Utc(2026, 4, 30, 22)));
  ExpectReadsBack(e, checks);
  // The reply is 4 integers per limit, whatever its keys.
  StatusOr<std::vector<CheckAnswer>> a =
      Decode(Ints({1,     97,    0, 3'600'000'000, 1, 9, 0, 200'000, 0, 0,
                   5'000, 5'000, 1, 999,           0, 1, 1, 97,      0, 3'600'000'000}),
             Ptrs(checks));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)[0].result.overall.reset_after, microseconds(3'600'000'000));
  EXPECT_EQ((*a)[0].result.overall.limit, 100);
  EXPECT_FALSE((*a)[1].result.overall.allowed);
}

// A limit with a block period sends its block key ("<key>!b") in KEYS right
// after the limit's own key or keys: check.lua touches no undeclared key
// (in a Cluster, one the node may not serve while its slot migrates).
TEST(CheckCodec, ABlockPeriodSendsItsBlockKeyAfterTheLimitsKeys) {
  const Limit login = *Limit::FixedWindow("login", 5, std::chrono::minutes(1))
                           ->WithBlockFor(std::chrono::minutes(10));
  const Limit monthly = *(*Limit::CalendarQuota("monthly", 100, CalendarUnit::kMonth, "UTC"))
                             .WithBlockFor(std::chrono::hours(1));
  const CalendarCall cal = CalendarCallOf(monthly, Utc(2026, 3, 31, 21), 1);
  EXPECT_EQ(KeysPerLimit(Spec(login)), 2u);
  EXPECT_EQ(KeysPerLimit(cal.call.spec), 3u);
  const std::vector<CheckCall> checks = {
      CheckCall{.keys = {"rl:{a}login", "rl:{a}login!b"}, .limits = {{Spec(login), 1}}},
      CheckCall{.keys = {"rl:{b}burst", "rl:{b}monthly@1", "rl:{b}monthly@2", "rl:{b}monthly!b",
                         "rl:{b}login", "rl:{b}login!b"},
                .limits = {{Spec(kBurst), 1}, cal.call, {Spec(login), 2}}},
      CheckCall{
          .peek = true, .keys = {"rl:{c}login", "rl:{c}login!b"}, .limits = {{Spec(login), 0}}},
  };
  const EncodedCall e = EncodeAll(std::nullopt, checks);
  EXPECT_EQ(e.keys.size(), 10u);
  EXPECT_EQ(e.keys[1], "rl:{a}login!b");
  EXPECT_EQ(e.args[2], "f/600000000");
  ExpectReadsBack(e, checks);
}

TEST(CheckCodec, EveryErrorReply) {
  const std::vector<CheckCall> checks = {CheckCall{.keys = {"k"}, .limits = {{Spec(kBurst), 1}}}};
  struct Case {
    StatusOr<Reply> reply;
    StatusCode code;
    std::string_view says;
  };
  const Case cases[] = {
      {Status(Unavailable("connection lost")), StatusCode::kUnavailable, "connection lost"},
      {Status(DeadlineExceeded("late")), StatusCode::kDeadlineExceeded, "late"},
      {Reply::Error("ERR Error running script"), StatusCode::kInternal,
       "redis script error: ERR Error running script"},
      {Reply::Integer(1), StatusCode::kInternal, "expected an array of 4 integers"},
      {Reply::Nil(), StatusCode::kInternal, "expected an array of 4 integers"},
      {Ints({1, 2, 3}), StatusCode::kInternal, "expected an array of 4 integers"},
      {Ints({1, 2, 3, 4, 5}), StatusCode::kInternal, "expected an array of 4 integers"},
      {Reply::Array({Reply::Integer(1), Reply::String("2"), Reply::Integer(3), Reply::Integer(4)}),
       StatusCode::kInternal, "a non-integer element"},
      {Reply::Array({Reply::Integer(1), Reply::Integer(2), Reply::Nil(), Reply::Integer(4)}),
       StatusCode::kInternal, "a non-integer element"},
  };
  for (const Case& c : cases) {
    StatusOr<std::vector<CheckAnswer>> a = Decode(c.reply, Ptrs(checks));
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), c.code);
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << a.status().ToString();
  }
}

}  // namespace
}  // namespace ratelimit::store::lua
