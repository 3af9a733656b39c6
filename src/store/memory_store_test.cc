// MemoryStore: isolation, all-or-nothing, expiry, bounds, and exactness under threads.
#include "ratelimit/memory_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ratelimit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class MemoryStoreTest : public ::testing::Test {
 protected:
  ManualClock clock_;
  MemoryStore store_{{.clock = &clock_}};
  Limit burst_ = *Limit::TokenBucket("burst", 5, 1);
  Limit daily_ = *Limit::FixedWindow("daily", 7, std::chrono::hours(24));

  Decision Check(std::string_view key, const Limit& l, int64_t cost = 1) {
    LimitCheck c[] = {{&l, cost}};
    StatusOr<CheckResult> r = store_.CheckSync({key, c});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->overall : Decision{};
  }
};

TEST_F(MemoryStoreTest, KeysAreIsolated) {
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Check("a", burst_).allowed);
  EXPECT_FALSE(Check("a", burst_).allowed);
  Decision b = Check("b", burst_);
  EXPECT_TRUE(b.allowed);
  EXPECT_EQ(b.remaining, 4);
  // Same key, another limit: its own state.
  EXPECT_TRUE(Check("a", daily_).allowed);
}

// Limits whose identities once collided (token bucket "b", fixed window
// "c": see Limit::identity_hash) keep their own state on one client key.
TEST_F(MemoryStoreTest, LimitsOfOneKeyKeepTheirOwnState) {
  const Limit b = *Limit::TokenBucket("b", 7, 2);
  const Limit c = *Limit::FixedWindow("c", 9, seconds(60));
  EXPECT_EQ(Check("k", b, 4).remaining, 3);
  EXPECT_EQ(Check("k", c, 2).remaining, 7);
  EXPECT_EQ(Check("k", b, 1).remaining, 2);
  EXPECT_EQ(Check("k", c, 1).remaining, 6);
}

// A window limit's state is its counts per window, read by the limit's
// window: a limit whose window changes (a reload, an override) is another
// state and starts from fresh counts (docs/admin.md). The state kept only
// its expiry and counts, and the new window re-derived the window from the
// expiry: an hour's 30 read as a minute's 59 minutes ahead (denied for
// 3300 s), a sliding hour's for 6762 s.
TEST_F(MemoryStoreTest, AWindowThatShrinksStartsFromFreshCounts) {
  using std::chrono::hours;
  using std::chrono::minutes;
  clock_.Set(int64_t{472'223} * 3'600'000'000 + 5 * 60'000'000);  // 23:05 UTC
  const Limit hourly = *Limit::FixedWindow("w", 100, hours(1));
  ASSERT_TRUE(store_.DecideOne("k", hourly, 30)->allowed);
  Decision d = *store_.DecideOne("k", *Limit::FixedWindow("w", 10, minutes(1)), 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 9);
  EXPECT_EQ(d.reset_after, minutes(1));
  // The hour's state is its own still: the same window again finds its count.
  EXPECT_EQ(store_.DecideOne("k", hourly, 1)->remaining, 69);

  ASSERT_TRUE(store_.DecideOne("s", *Limit::SlidingWindow("w", 100, hours(1)), 30)->allowed);
  d = *store_.DecideOne("s", *Limit::SlidingWindow("w", 10, minutes(1)), 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 9);
  EXPECT_EQ(d.retry_after, std::chrono::microseconds(0));
}

// The other way: a minute's count that ends on the hour was read as the
// hour's (10 of the minute's 10, 89 of 100 left instead of 99).
TEST_F(MemoryStoreTest, AWindowThatGrowsStartsFromFreshCounts) {
  using std::chrono::hours;
  using std::chrono::minutes;
  clock_.Set(int64_t{472'223} * 3'600'000'000 + int64_t{59} * 60'000'000 + 30'000'000);  // 23:59:30
  ASSERT_TRUE(store_.DecideOne("k", *Limit::FixedWindow("w", 10, minutes(1)), 10)->allowed);
  Decision d = *store_.DecideOne("k", *Limit::FixedWindow("w", 100, hours(1)), 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 99);
  EXPECT_EQ(d.reset_after, seconds(30));
}

// Epoch and calendar windows, and calendar windows of another unit, are
// other states too (docs/configuration.md: "starts its counts afresh"). An
// epoch day's 500 were read as the next UTC day's: 499 left that day, and
// the day after still 498; a day's count on the 1st as the month's.
TEST_F(MemoryStoreTest, EpochAndCalendarWindowsKeepTheirOwnCounts) {
  const int64_t kDay = 86'400'000'000;
  clock_.Set(1'700'000'000'000'000);  // 2023-11-14 22:13:20 UTC
  const Limit epoch = *Limit::FixedWindow("daily", 1000, std::chrono::hours(24));
  const Limit calendar = *Limit::CalendarQuota("daily", 1000, CalendarUnit::kDay, "UTC");
  ASSERT_TRUE(store_.DecideOne("k", epoch, 500)->allowed);
  EXPECT_EQ(store_.DecideOne("k", calendar, 1)->remaining, 999);
  clock_.Advance(std::chrono::microseconds(kDay));
  EXPECT_EQ(store_.DecideOne("k", calendar, 1)->remaining, 999);
  // Calendar to epoch: the same UTC day, yet another state.
  ASSERT_TRUE(store_.DecideOne("c", calendar, 500)->allowed);
  EXPECT_EQ(store_.DecideOne("c", epoch, 1)->remaining, 999);
  // A day to a month on the 1st, when both windows start at one time.
  clock_.Set(int64_t{1'772'323'200} * 1'000'000 + 3'600'000'000);  // 2026-03-01 01:00 UTC
  const Limit monthly = *Limit::CalendarQuota("daily", 1000, CalendarUnit::kMonth, "UTC");
  ASSERT_TRUE(store_.DecideOne("m", calendar, 500)->allowed);
  EXPECT_EQ(store_.DecideOne("m", monthly, 1)->remaining, 999);
}

TEST_F(MemoryStoreTest, SeveralLimitsAreAllOrNothing) {
  LimitCheck both[] = {{&burst_, 1}, {&daily_, 1}};
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(store_.CheckSync({"ada", both})->overall.allowed);
  // burst is empty: denied, and daily must not be consumed.
  StatusOr<CheckResult> r = store_.CheckSync({"ada", both});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->overall.allowed);
  EXPECT_FALSE(r->decisions[0].allowed);
  EXPECT_TRUE(r->decisions[1].allowed);
  EXPECT_EQ(r->overall.limit, 5);
  LimitCheck daily_only[] = {{&daily_, 0}};
  EXPECT_EQ(store_.PeekSync({"ada", daily_only})->overall.remaining, 2);
  // The overall numbers of an allowed request are those of the tightest limit.
  clock_.Advance(seconds(10));
  r = store_.CheckSync({"ada", both});
  EXPECT_TRUE(r->overall.allowed);
  EXPECT_EQ(r->overall.limit, 7);
  EXPECT_EQ(r->overall.remaining, 1);
}

TEST_F(MemoryStoreTest, IdleKeysExpireAndAreSwept) {
  Limit sliding = *Limit::SlidingWindow("sw", 3, seconds(1));
  Limit log = *Limit::SlidingLog("log", 3, seconds(1));
  Check("a", burst_, 3);
  Check("b", sliding);
  Check("c", log);
  EXPECT_EQ(store_.size(), 3u);
  EXPECT_EQ(store_.Sweep(), 0u);
  clock_.Advance(seconds(3));  // burst refilled (3 s at 1/s), windows over
  EXPECT_EQ(store_.Sweep(), 3u);
  EXPECT_EQ(store_.size(), 0u);
  EXPECT_EQ(Check("a", burst_).remaining, 4);  // a full bucket again
}

// The daemon sweeps a part at a time (Store::SweepPart): the parts are
// disjoint and together the whole store, whatever their count against the
// shards' (64 here).
TEST_F(MemoryStoreTest, SweepPartsTogetherSweepTheWholeStoreOnce) {
  for (size_t parts : {size_t{1}, size_t{5}, size_t{64}, size_t{100}}) {
    for (int i = 0; i < 1000; ++i) Check("p" + std::to_string(i), burst_);
    ASSERT_EQ(store_.size(), 1000u);
    for (size_t part = 0; part < parts; ++part) EXPECT_EQ(store_.SweepPart(part, parts), 0u);
    clock_.Advance(seconds(3));  // every bucket full again
    size_t dropped = 0;
    for (size_t part = 0; part < parts; ++part) {
      const size_t n = store_.SweepPart(part, parts);
      // A part is a part: with 1,000 keys over 64 shards, none holds them all.
      if (parts > 1) {
        EXPECT_LT(n, 1000u) << parts;
      }
      dropped += n;
      EXPECT_EQ(store_.size(), 1000u - dropped);
    }
    EXPECT_EQ(dropped, 1000u) << parts;
    EXPECT_EQ(store_.Sweep(), 0u);
  }
}

// A sweep shrinks a table only when under a sixteenth of it is live (after a
// flood went away), not under a quarter: a shard whose clients come and go
// holds, besides its live keys, those gone since its last rebuild, and cut to
// four times its live keys it grew back by rebuilds on the request path
// (docs/performance.md, the memory store's sweep).
TEST(MemoryStoreShrink, ASweepShrinksATableOnlyWhenUnderASixteenthIsLive) {
  const Limit daily = *Limit::FixedWindow("daily", 7, std::chrono::hours(24));
  const Limit burst = *Limit::TokenBucket("burst", 5, 1);  // fresh again 1 s after a decision
  for (const int live : {100, 300}) {
    ManualClock clock;
    MemoryStore store({.shards = 1, .clock = &clock});
    const size_t empty = store.MemoryUsage();  // a table of 8 slots
    auto slots = [&] { return (store.MemoryUsage() - empty) / 32 + 8; };
    for (int i = 0; i < live; ++i)
      ASSERT_TRUE(store.DecideOne("d" + std::to_string(i), daily, 1).ok());
    for (int i = 0; slots() < 2000; ++i)
      ASSERT_TRUE(store.DecideOne("b" + std::to_string(i), burst, 1).ok());
    const size_t cap = slots();  // 2,296 (grown by half from 8)
    clock.Advance(seconds(2));   // the burst keys are fresh: only `live` keys are left
    store.Sweep();
    EXPECT_EQ(store.size(), static_cast<size_t>(live));
    if (live * 16 < static_cast<int>(cap)) {
      EXPECT_LE(slots() * 4, cap) << live;  // shrunk, to at least a quarter live
      EXPECT_GE(slots(), static_cast<size_t>(live)) << live;
    } else {
      EXPECT_EQ(slots(), cap) << live;  // 300 of 2,296 live: kept
    }
    EXPECT_EQ(store.DecideOne("d0", daily, 1)->remaining, 5);  // the live state kept
  }
}

TEST_F(MemoryStoreTest, PeekNeverCreatesState) {
  LimitCheck c[] = {{&burst_, 1}};
  StatusOr<CheckResult> r = store_.PeekSync({"nobody", c});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->overall.remaining, 5);
  EXPECT_EQ(store_.size(), 0u);
}

TEST_F(MemoryStoreTest, ResetGivesAFullBucket) {
  for (int i = 0; i < 5; ++i) Check("a", burst_);
  const Limit* limits[] = {&burst_};
  EXPECT_TRUE(store_.ResetSync("a", limits).ok());
  EXPECT_EQ(Check("a", burst_).remaining, 4);
}

TEST_F(MemoryStoreTest, BadRequestsAreErrorsNotDecisions) {
  LimitCheck too_costly[] = {{&burst_, 6}};
  EXPECT_EQ(store_.CheckSync({"a", too_costly}).status().code(), StatusCode::kInvalidArgument);
  LimitCheck ok[] = {{&burst_, 1}};
  EXPECT_EQ(store_.CheckSync({"", ok}).status().code(), StatusCode::kInvalidArgument);
  std::string huge(kDefaultMaxKeyLength + 1, 'k');
  EXPECT_EQ(store_.CheckSync({huge, ok}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.DecideOne(huge, burst_, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.CheckSync({"a", {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_.size(), 0u);
}

TEST(MemoryStoreBounds, AFloodOfNewKeysNeverEvictsAnExistingClient) {
  ManualClock clock;
  MemoryStore store({.shards = 4, .max_keys = 1000, .clock = &clock});
  Limit l = *Limit::TokenBucket("b", 3, 0.001);  // refills very slowly
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.DecideOne("victim", l, 1)->allowed);
  ASSERT_FALSE(store.DecideOne("victim", l, 1)->allowed);
  int refused = 0;
  for (int i = 0; i < 5000; ++i) {
    StatusOr<Decision> d = store.DecideOne("flood-" + std::to_string(i), l, 1);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  EXPECT_EQ(refused, 5000 - 999);
  EXPECT_LE(store.size(), 1000u);
  EXPECT_FALSE(store.DecideOne("victim", l, 1)->allowed) << "the victim's limit was reset";
}

// A request over several limits that needs a new key in a full store: the
// expired keys are dropped (a rebuild of the shard that holds the request's
// other, existing slot), and the request is decided again on what is left.
TEST(MemoryStoreBounds, SeveralLimitsAdmitANewKeyByDroppingExpiredOnes) {
  ManualClock clock;
  MemoryStore store({.shards = 1, .max_keys = 3, .clock = &clock});
  const Limit brief = *Limit::TokenBucket("brief", 1, 1000);  // fresh again 1 ms on
  const Limit lasting = *Limit::TokenBucket("lasting", 10, 1);
  const Limit other = *Limit::FixedWindow("other", 5, seconds(60));
  LimitCheck b[] = {{&brief, 1}};
  LimitCheck l[] = {{&lasting, 1}};
  LimitCheck both[] = {{&lasting, 1}, {&other, 1}};
  ASSERT_TRUE(store.CheckSync({"old1", b})->overall.allowed);
  ASSERT_TRUE(store.CheckSync({"old2", b})->overall.allowed);
  ASSERT_TRUE(store.CheckSync({"a", l})->overall.allowed);
  ASSERT_EQ(store.size(), 3u);
  clock.Advance(milliseconds(10));  // old1 and old2 expire; a's state lasts
  StatusOr<CheckResult> r = store.CheckSync({"a", both});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->overall.allowed);
  EXPECT_EQ(r->decisions[0].remaining, 8);  // a's earlier token is still taken
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.CheckSync({"a", l})->overall.remaining, 7);  // and the slot is thawed
  // No expired key left to drop: two new keys do not fit.
  EXPECT_EQ(store.CheckSync({"b", both}).status().code(), StatusCode::kResourceExhausted);
}

// A full store looks for expired keys in a shard at most every 10 ms
// (memory_store.cc, Admit): a flood of new keys at the bound must not copy
// the shard's table once per refused key. A key that expired in between
// makes room at the next look.
TEST(MemoryStoreBounds, AFullShardLooksForExpiredKeysAtMostEvery10ms) {
  ManualClock clock;
  MemoryStore store({.shards = 1, .max_keys = 3, .clock = &clock});
  const Limit brief = *Limit::TokenBucket("brief", 1, 1000);  // fresh again 1 ms on
  const Limit lasting = *Limit::TokenBucket("lasting", 10, 1);
  ASSERT_TRUE(store.DecideOne("old1", brief, 1)->allowed);
  ASSERT_TRUE(store.DecideOne("old2", brief, 1)->allowed);
  ASSERT_TRUE(store.DecideOne("a", lasting, 1)->allowed);
  EXPECT_EQ(store.DecideOne("x", lasting, 1).status().code(), StatusCode::kResourceExhausted);
  clock.Advance(milliseconds(2));  // old1 and old2 expire, 2 ms after the last look
  EXPECT_EQ(store.DecideOne("y", lasting, 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.DecideOne("a", lasting, 1)->allowed) << "existing keys are decided";
  clock.Advance(milliseconds(8));  // 10 ms after the look that found nothing
  StatusOr<Decision> y = store.DecideOne("y", lasting, 1);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(y->remaining, 9);
  EXPECT_EQ(store.size(), 2u);
}

// A settlement made once (a decision-API reservation's nonce) is remembered
// until its once_ttl ends: an entry against max_keys like any other. With
// max_keys 50, the 51st mark is refused with an error that says the store
// is full, nothing applied (the bucket keeps its debt), and a mark that
// ended makes room again. The marks were not counted: 30,000 such
// settlements all succeeded, ~130 bytes each.
TEST(MemoryStore, OnceMarksCountAgainstMaxKeys) {
  ManualClock clock;
  MemoryStore store({.max_keys = 50, .clock = &clock});
  const Limit tokens = *Limit::TokenBucket("tokens", 1000, 1);
  const LimitSettle refund[] = {{&tokens, -1}};  // a full bucket stays full: no state kept
  auto settle = [&](int i) {
    const std::string id = "nonce-" + std::to_string(i);
    return store.SettleSync(
        {.key = "k", .settlements = refund, .once = id, .once_ttl = std::chrono::hours(1)});
  };
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(settle(i).ok()) << i;
  EXPECT_EQ(store.size(), 50u);
  StatusOr<CheckResult> full = settle(50);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("full"), std::string::npos) << full.status().message();
  // A mark still remembered answers as ever; a new client's check is refused.
  StatusOr<CheckResult> again = settle(7);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->already_settled);
  EXPECT_FALSE(store.DecideOne("other", tokens, 1).ok());
  // Nothing of the refused settlement was applied: a debit of 5 with it is
  // refused too, and the bucket is untouched.
  const LimitSettle debit[] = {{&tokens, 5}};
  EXPECT_FALSE(store
                   .SettleSync({.key = "k",
                                .settlements = debit,
                                .once = "nonce-x",
                                .once_ttl = std::chrono::hours(1)})
                   .ok());
  const LimitCheck peek[] = {{&tokens, 0}};
  StatusOr<CheckResult> state = store.PeekSync({.key = "k", .checks = peek});
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->decisions[0].remaining, 1000);
  // Once the marks end, their entries go, and new ones are admitted.
  clock.Advance(std::chrono::hours(1));
  EXPECT_TRUE(settle(51).ok());
  EXPECT_LE(store.size(), 50u);
}

// A block (up to 366 days) outlives the state whose denial started it, so
// it is an entry of its own against max_keys and in MemoryUsage(): a flood
// of clients that each get blocked fills the store as far as their states
// would, no further, and then new clients are refused as in any full store.
// A denial that finds no room for its block still denies. Blocks were not
// counted: 10,000 stood in a store of 1,000 keys, no client refused, none of
// them in MemoryUsage().
TEST(MemoryStoreBounds, BlocksCountAgainstMaxKeysAndInMemoryUsage) {
  ManualClock clock;
  MemoryStore store({.max_keys = 1000, .clock = &clock});
  const Limit login =
      *Limit::FixedWindow("login", 1, seconds(1))->WithBlockFor(std::chrono::minutes(10));
  const Limit* limits[] = {&login};
  const size_t empty = store.MemoryUsage();
  int refused = 0, blocked = 0, second_allowed = 0;
  for (int i = 0; i < 10'000; ++i) {
    if (i > 0 && i % 500 == 0) clock.Advance(seconds(1));  // the states expire, blocks stay
    const std::string key = "client-" + std::to_string(i);
    StatusOr<Decision> first = store.DecideOne(key, login, 1);
    if (!first.ok()) {
      EXPECT_EQ(first.status().code(), StatusCode::kResourceExhausted);
      ++refused;
      continue;
    }
    StatusOr<Decision> second = store.DecideOne(key, login, 1);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    second_allowed += second->allowed ? 1 : 0;
    blocked += second->retry_after == std::chrono::minutes(10) ? 1 : 0;
  }
  EXPECT_EQ(second_allowed, 0) << "a client over its limit was let through";
  EXPECT_GT(refused, 0);
  EXPECT_GT(blocked, 500);
  EXPECT_LE(store.size(), 1000u);
  int in_force = 0;
  for (int i = 0; i < 10'000; ++i) {
    store.Blocks("client-" + std::to_string(i), limits,
                 [&](StatusOr<std::vector<std::chrono::microseconds>> b) {
                   ASSERT_TRUE(b.ok());
                   in_force += b->at(0).count() > 0 ? 1 : 0;
                 });
  }
  EXPECT_EQ(in_force, blocked);
  EXPECT_LE(in_force, 1000);
  EXPECT_GE(store.MemoryUsage() - empty, static_cast<size_t>(in_force) * 32);
  // Once the blocks end, their entries go, and new clients are admitted.
  clock.Advance(std::chrono::minutes(10));
  EXPECT_TRUE(store.DecideOne("late", login, 1)->allowed);
  store.Sweep();
  EXPECT_EQ(store.size(), 1u);
}

TEST(MemoryStoreBounds, MemoryPerKeyIsSmall) {
  MemoryStore store;
  Limit l = *Limit::TokenBucket("b", 10, 5);
  constexpr int kKeys = 200'000;
  for (int i = 0; i < kKeys; ++i)
    ASSERT_TRUE(store.DecideOne("user:" + std::to_string(i), l, 1).ok());
  const double per_key = static_cast<double>(store.MemoryUsage()) / kKeys;
  EXPECT_LE(per_key, 64.0);
  RecordProperty("bytes_per_key", std::to_string(per_key));
}

// Many threads hammer one key: exactly the capacity is allowed.
TEST(MemoryStoreConcurrency, ExactlyTheCapacityUnderContention) {
  ManualClock clock;  // time stands still: no refill during the test
  MemoryStore store({.clock = &clock});
  Limit l = *Limit::TokenBucket("b", 1000, 1);
  Limit w = *Limit::FixedWindow("w", 1500, seconds(60));
  std::atomic<int> allowed{0}, allowed_multi{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      LimitCheck both[] = {{&l, 1}, {&w, 1}};
      for (int i = 0; i < 500; ++i) {
        if (store.DecideOne("hot", l, 1)->allowed) allowed.fetch_add(1);
        if (store.CheckSync({"hot2", both})->overall.allowed) allowed_multi.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 1000);
  EXPECT_EQ(allowed_multi.load(), 1000);
}

TEST(MemoryStoreConcurrency, ManyKeysManyThreads) {
  ManualClock clock;
  MemoryStore store({.shards = 8, .clock = &clock});
  Limit l = *Limit::FixedWindow("w", 10, seconds(60));
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20'000; ++i) {
        if (store.DecideOne("k" + std::to_string(i % 1000), l, 1)->allowed) allowed.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 1000 * 10);
  EXPECT_EQ(store.size(), 1000u);
}

// The lock-free single-limit path and the locked all-or-nothing path on the
// SAME slot: every token is taken once, and the window counts exactly what
// the multi-limit requests took.
TEST(MemoryStoreConcurrency, LockFreeAndLockedDecisionsOnOneSlotAreExact) {
  ManualClock clock;
  MemoryStore store({.clock = &clock});
  Limit l = *Limit::TokenBucket("b", 30'000, 1);
  Limit w = *Limit::FixedWindow("w", 20'000, seconds(60));
  std::atomic<int> single{0}, multi{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      LimitCheck both[] = {{&l, 1}, {&w, 1}};
      for (int i = 0; i < 20'000; ++i) {
        if (t % 2 == 0) {
          if (store.DecideOne("hot", l, 1)->allowed) single.fetch_add(1);
        } else if (store.CheckSync({"hot", both})->overall.allowed) {
          multi.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(single.load() + multi.load(), 30'000);
  EXPECT_LE(multi.load(), 20'000);
  LimitCheck wc[] = {{&w, 1}};
  EXPECT_EQ(store.PeekSync({"hot", wc})->overall.remaining, 20'000 - multi.load());
}

// Window states (two counters and the expiry in one compare-and-swap).
TEST(MemoryStoreConcurrency, WindowsAreExactUnderContention) {
  ManualClock clock;
  MemoryStore store({.clock = &clock});
  const Limit limits[] = {*Limit::FixedWindow("f", 700, seconds(60)),
                          *Limit::SlidingWindow("s", 900, seconds(60)),
                          *Limit::CalendarQuota("c", 800, CalendarUnit::kDay, "UTC")};
  for (const Limit& l : limits) {
    std::atomic<int> allowed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 500; ++i) allowed.fetch_add(store.DecideOne("k", l, 1)->allowed);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(allowed.load(), l.limit()) << l.name();
  }
}

// Settlements (locked) and decisions (lock-free) on one bucket: with time
// standing still, a GCRA state adds up every unit exactly.
TEST(MemoryStoreConcurrency, SettlementsAndDecisionsOnOneSlotAddUp) {
  ManualClock clock;
  MemoryStore store({.clock = &clock});
  Limit l = *Limit::TokenBucket("b", 1'000'000, 1);
  std::atomic<int64_t> taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const LimitSettle s[] = {{&l, 3}};
      for (int i = 0; i < 20'000; ++i) {
        if (t % 2 == 0) {
          taken.fetch_add(store.DecideOne("k", l, 1)->allowed ? 1 : 0);
        } else {
          ASSERT_TRUE(store.SettleSync({"k", s}).ok());
          taken.fetch_add(3);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  LimitCheck c[] = {{&l, 1}};
  EXPECT_EQ(store.PeekSync({"k", c})->overall.remaining, 1'000'000 - taken.load());
}

// Tables rebuilt (growth, sweeps) and slots erased (resets) while lock-free
// decisions run on held keys: no decision is lost or counted twice, and no
// thread reads a freed table (ASan, TSan).
TEST(MemoryStoreConcurrency, DecisionsStayExactWhileTablesAreRebuilt) {
  ManualClock clock;
  MemoryStore store({.shards = 4, .clock = &clock});
  Limit held = *Limit::TokenBucket("held", 100, 1);
  Limit churn = *Limit::TokenBucket("churn", 5, 1);
  constexpr int kHot = 20;
  std::atomic<int> allowed{0};
  std::atomic<bool> stop{false};
  std::thread churner([&] {
    int i = 0;
    while (!stop.load()) {
      const std::string k = "new:" + std::to_string(i++);
      ASSERT_TRUE(store.DecideOne(k, churn, 1).ok());  // new keys: the tables grow
      if (i % 500 == 0) {
        const Limit* ls[] = {&churn};
        for (int j = i - 500; j < i; j += 2) {  // tombstones
          ASSERT_TRUE(store.ResetSync("new:" + std::to_string(j), ls).ok());
        }
        store.Sweep();  // rebuilds the tables with tombstones
      }
    }
  });
  std::vector<std::thread> deciders;
  for (int t = 0; t < 2; ++t) {
    deciders.emplace_back([&] {
      for (int round = 0; round < 1'000; ++round) {
        for (int k = 0; k < kHot; ++k) {
          allowed.fetch_add(store.DecideOne("hot:" + std::to_string(k), held, 1)->allowed);
        }
      }
    });
  }
  for (auto& t : deciders) t.join();
  stop = true;
  churner.join();
  EXPECT_EQ(allowed.load(), kHot * 100);
}

}  // namespace
}  // namespace ratelimit
