// ConcurrencyStore: the memory store by a manual clock, the Redis store
// against a real redis-server (both time sources), with the same contract.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ratelimit/concurrency.h"
#include "ratelimit/redis_store.h"
#include "support/redis_server.h"

namespace ratelimit {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::RedisServer;

AcquireResult MustAcquire(ConcurrencyStore& s, std::string_view key, int64_t max,
                          std::chrono::microseconds ttl = seconds(30),
                          std::string_view name = "upload") {
  StatusOr<AcquireResult> r =
      s.AcquireSync({.key = key, .name = name, .max_in_flight = max, .lease_ttl = ttl});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : AcquireResult{};
}

// The contract every store keeps, by a manual clock.
void LeasesUpToTheLimit(ConcurrencyStore& s, ManualClock& clock) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    AcquireResult r = MustAcquire(s, "user:ada", 3, seconds(10));
    ASSERT_TRUE(r.acquired) << i;
    EXPECT_EQ(r.in_flight, i + 1);
    EXPECT_EQ(r.max_in_flight, 3);
    EXPECT_EQ(r.lease_id.size(), 32u);
    ids.push_back(r.lease_id);
  }
  EXPECT_NE(ids[0], ids[1]);
  clock.Advance(seconds(2));
  AcquireResult denied = MustAcquire(s, "user:ada", 3, seconds(10));
  EXPECT_FALSE(denied.acquired);
  EXPECT_TRUE(denied.lease_id.empty());
  EXPECT_EQ(denied.in_flight, 3);
  EXPECT_EQ(denied.retry_after, seconds(8));  // the oldest lease expires in 8 s
  // Another client and another name have capacity of their own.
  EXPECT_TRUE(MustAcquire(s, "user:bob", 3).acquired);
  EXPECT_TRUE(MustAcquire(s, "user:ada", 3, seconds(10), "search").acquired);
  // A release frees one place, once.
  EXPECT_TRUE(*s.ReleaseSync("user:ada", "upload", ids[1]));
  EXPECT_FALSE(*s.ReleaseSync("user:ada", "upload", ids[1]));
  EXPECT_FALSE(*s.ReleaseSync("user:ada", "search", ids[0]));  // wrong name: not held there
  AcquireResult again = MustAcquire(s, "user:ada", 3, seconds(10));
  EXPECT_TRUE(again.acquired);
  EXPECT_EQ(again.in_flight, 3);
  EXPECT_FALSE(MustAcquire(s, "user:ada", 3, seconds(10)).acquired);
  // Leases expire: a crashed holder does not keep capacity. ids[0] and ids[2]
  // were taken at t=0 and expire at t=10; `again` at t=2 expires at t=12.
  clock.Advance(seconds(8));
  AcquireResult after = MustAcquire(s, "user:ada", 3, seconds(10));
  EXPECT_TRUE(after.acquired);
  EXPECT_EQ(after.in_flight, 2);  // `again` and this one
  // A lower limit (a reloaded config) applies to what is held now.
  EXPECT_FALSE(MustAcquire(s, "user:ada", 2, seconds(10)).acquired);
  EXPECT_FALSE(*s.ReleaseSync("user:ada", "upload", ids[0]));  // expired and swept
}

// An expired lease is not held: releasing it says so, whether or not an
// acquire has swept it yet.
void ReleasingAnExpiredLeaseSaysNotHeld(ConcurrencyStore& s, ManualClock& clock) {
  const std::string a = MustAcquire(s, "user:eve", 3, seconds(10)).lease_id;
  const std::string b = MustAcquire(s, "user:eve", 3, seconds(20)).lease_id;
  const std::string c = MustAcquire(s, "user:eve", 3, seconds(20)).lease_id;
  clock.Advance(seconds(10));
  EXPECT_FALSE(*s.ReleaseSync("user:eve", "upload", a));  // expired at t=10, not swept
  EXPECT_FALSE(*s.ReleaseSync("user:eve", "upload", a));
  clock.Advance(seconds(10) - milliseconds(1));
  EXPECT_TRUE(*s.ReleaseSync("user:eve", "upload", b));  // 1 ms left
  clock.Advance(milliseconds(1));
  EXPECT_FALSE(*s.ReleaseSync("user:eve", "upload", c));
}

// A renewed lease expires `ttl` after the renewal, in its one place; an
// expired, released or unknown lease is not held, and a renewal does not
// take it again.
void RenewingMovesTheExpiry(ConcurrencyStore& s, ManualClock& clock) {
  const std::string a = MustAcquire(s, "user:kim", 1, seconds(10)).lease_id;
  ASSERT_FALSE(a.empty());
  clock.Advance(seconds(8));
  EXPECT_TRUE(*s.RenewSync("user:kim", "upload", a, seconds(10)));  // until t=18
  clock.Advance(seconds(9));  // t=17: past the first expiry, still held
  AcquireResult denied = MustAcquire(s, "user:kim", 1, seconds(10));
  EXPECT_FALSE(denied.acquired);
  EXPECT_EQ(denied.in_flight, 1);
  EXPECT_EQ(denied.retry_after, seconds(1));
  clock.Advance(seconds(1));  // t=18: expired, not swept yet
  EXPECT_FALSE(*s.RenewSync("user:kim", "upload", a, seconds(10)));
  EXPECT_FALSE(*s.ReleaseSync("user:kim", "upload", a));  // not revived by the renewal
  const std::string b = MustAcquire(s, "user:kim", 1, seconds(10)).lease_id;
  ASSERT_FALSE(b.empty());
  EXPECT_FALSE(*s.RenewSync("user:kim", "search", b, seconds(10)));  // not held there
  EXPECT_TRUE(*s.ReleaseSync("user:kim", "upload", b));
  EXPECT_FALSE(*s.RenewSync("user:kim", "upload", b, seconds(10)));  // released
  EXPECT_TRUE(MustAcquire(s, "user:kim", 1, seconds(10)).acquired);
  EXPECT_FALSE(*s.RenewSync("user:kim", "upload", "0123456789abcdef0123456789abcdef", seconds(10)));
  EXPECT_FALSE(*s.RenewSync("user:nobody", "upload", b, seconds(10)));
  EXPECT_EQ(s.RenewSync("user:kim", "upload", "a}b", seconds(10)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RenewSync("user:kim", "upload", b, std::chrono::microseconds(10)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RenewSync("", "upload", b, seconds(10)).status().code(),
            StatusCode::kInvalidArgument);
}

void RejectsBadInput(ConcurrencyStore& s) {
  auto code = [&](AcquireRequest r) { return s.AcquireSync(r).status().code(); };
  EXPECT_EQ(code({.key = "", .name = "n"}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.key = "k", .name = ""}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.key = "k", .name = "a b"}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.key = "k", .name = "n", .max_in_flight = 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.key = "k", .name = "n", .lease_ttl = std::chrono::microseconds(10)}),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.key = std::string(600, 'k'), .name = "n"}), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ReleaseSync("k", "n", "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ReleaseSync("k", "n", "a}b").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ReleaseSync("k", "n", std::string(65, 'a')).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MemoryConcurrencyStore, LeasesUpToTheLimit) {
  ManualClock clock;
  MemoryConcurrencyStore s({.clock = &clock});
  LeasesUpToTheLimit(s, clock);
}

TEST(MemoryConcurrencyStore, ReleasingAnExpiredLeaseSaysNotHeld) {
  ManualClock clock;
  MemoryConcurrencyStore s({.clock = &clock});
  ReleasingAnExpiredLeaseSaysNotHeld(s, clock);
}

TEST(MemoryConcurrencyStore, RenewingMovesTheExpiry) {
  ManualClock clock;
  MemoryConcurrencyStore s({.clock = &clock});
  RenewingMovesTheExpiry(s, clock);
}

TEST(MemoryConcurrencyStore, RejectsBadInput) {
  MemoryConcurrencyStore s;
  RejectsBadInput(s);
}

TEST(MemoryConcurrencyStore, BoundedAndSwept) {
  ManualClock clock;
  MemoryConcurrencyStore s({.max_keys = 2, .clock = &clock});
  EXPECT_TRUE(MustAcquire(s, "a", 1, seconds(1)).acquired);
  EXPECT_TRUE(MustAcquire(s, "b", 1, seconds(5)).acquired);
  StatusOr<AcquireResult> full = s.AcquireSync({.key = "c", .name = "upload"});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  clock.Advance(seconds(1));  // a's lease expired: its place is reused
  EXPECT_TRUE(MustAcquire(s, "c", 1).acquired);
  EXPECT_EQ(s.InFlight("b", "upload"), 1);
  clock.Advance(seconds(4));
  EXPECT_EQ(s.InFlight("b", "upload"), 0);
  EXPECT_EQ(s.Sweep(), 1u);  // b's
}

// max_keys bounds leases, not keys: one key cannot hold max_in_flight
// leases past it (with max_keys (key, name) pairs, each of up to 1,000,000
// leases, memory had no bound).
TEST(MemoryConcurrencyStore, EveryLeaseCountsAgainstMaxKeys) {
  ManualClock clock;
  MemoryConcurrencyStore s({.max_keys = 5, .clock = &clock});
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(MustAcquire(s, "big", 10).lease_id);
  EXPECT_EQ(s.AcquireSync({.key = "big", .name = "upload", .max_in_flight = 10}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(s.AcquireSync({.key = "other", .name = "upload"}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(s.InFlight("big", "upload"), 5);
  // A key at its own limit is still denied, not failed: that needs no place.
  AcquireResult denied = MustAcquire(s, "big", 5);
  EXPECT_FALSE(denied.acquired);
  EXPECT_EQ(denied.in_flight, 5);
  EXPECT_TRUE(*s.ReleaseSync("big", "upload", ids[0]));
  EXPECT_TRUE(MustAcquire(s, "other", 1).acquired);  // the freed place
}

// A store full of expired leases takes a new key, and reclaims a few
// leases for it, not the whole table: the sweep still finds most of them.
TEST(MemoryConcurrencyStore, AFullStoreOfExpiredLeasesIsReclaimedALittleAtATime) {
  ManualClock clock;
  MemoryConcurrencyStore s({.max_keys = 1000, .clock = &clock});
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(MustAcquire(s, "k" + std::to_string(i), 1).acquired);
  EXPECT_EQ(s.AcquireSync({.key = "new", .name = "upload"}).status().code(),
            StatusCode::kResourceExhausted);
  clock.Advance(seconds(30));  // every lease expired
  EXPECT_TRUE(MustAcquire(s, "new", 1).acquired);
  const size_t left = s.Sweep();
  EXPECT_GE(left, 900u);  // an Acquire reclaims a few dozen at most
  EXPECT_LT(left, 1000u);
  EXPECT_EQ(s.InFlight("new", "upload"), 1);
  EXPECT_EQ(s.Sweep(), 0u);
}

// A configured route's per: route limit (route_wide) is taken even when other
// keys' live leases fill the store: ad-hoc leases cannot turn the route's cap
// into "admitted without a lease". Its own limit still holds.
TEST(MemoryConcurrencyStore, ARouteWideLimitIsTakenInAFullStore) {
  ManualClock clock;
  MemoryConcurrencyStore s({.max_keys = 3, .clock = &clock});
  for (const char* key : {"d:a", "d:b", "d:c"}) ASSERT_TRUE(MustAcquire(s, key, 1).acquired);
  const AcquireRequest whole{
      .key = "~all", .name = "export", .max_in_flight = 2, .route_wide = true};
  EXPECT_EQ(s.AcquireSync({.key = "~all", .name = "export", .max_in_flight = 2}).status().code(),
            StatusCode::kResourceExhausted);  // without the flag: full
  StatusOr<AcquireResult> first = s.AcquireSync(whole);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->acquired);
  EXPECT_TRUE(s.AcquireSync(whole)->acquired);
  StatusOr<AcquireResult> third = s.AcquireSync(whole);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->acquired);
  EXPECT_EQ(third->in_flight, 2);
  // Its leases are held leases too: with one given back, 4 are held, and a
  // key of anyone else's is still refused.
  EXPECT_TRUE(*s.ReleaseSync("~all", "export", first->lease_id));
  EXPECT_EQ(s.AcquireSync({.key = "d:d", .name = "upload"}).status().code(),
            StatusCode::kResourceExhausted);
}

// Many leases on one key: count, earliest expiry and release by id stay exact.
TEST(MemoryConcurrencyStore, ManyLeasesOnOneKey) {
  ManualClock clock;
  MemoryConcurrencyStore s({.clock = &clock});
  constexpr int kLeases = 20'000;
  std::vector<std::string> ids;
  for (int i = 0; i < kLeases; ++i) {
    AcquireResult r = MustAcquire(s, "k", kLeases, seconds(100));
    ASSERT_TRUE(r.acquired) << i;
    ASSERT_EQ(r.in_flight, i + 1);
    ids.push_back(r.lease_id);
    clock.Advance(milliseconds(1));  // lease i expires at 100 s + i ms
  }
  for (int i = 0; i < kLeases; i += 2) ASSERT_TRUE(*s.ReleaseSync("k", "upload", ids[i])) << i;
  EXPECT_FALSE(*s.ReleaseSync("k", "upload", ids[0]));
  EXPECT_FALSE(*s.ReleaseSync("k", "search", ids[1]));  // another name holds none of them
  EXPECT_EQ(s.InFlight("k", "upload"), kLeases / 2);
  // Now t = 20 s. At t = 100.5 s the odd leases up to 499 have expired.
  clock.Advance(milliseconds(80'500));
  EXPECT_EQ(s.InFlight("k", "upload"), kLeases / 2 - 250);
  AcquireResult denied = MustAcquire(s, "k", kLeases / 2 - 250, seconds(100));
  EXPECT_FALSE(denied.acquired);
  EXPECT_EQ(denied.retry_after, milliseconds(1));         // lease 501 expires at 100.501 s
  EXPECT_FALSE(*s.ReleaseSync("k", "upload", ids[499]));  // expired
  EXPECT_TRUE(*s.ReleaseSync("k", "upload", ids[501]));
  EXPECT_EQ(s.InFlight("k", "upload"), kLeases / 2 - 251);
}

// Sweep drops every expired lease, a chunk at a time, and frees their places
// (counted by lease) for anyone; live leases stay.
TEST(MemoryConcurrencyStore, SweepDropsEveryExpiredLeaseAndFreesTheirPlaces) {
  ManualClock clock;
  MemoryConcurrencyStore s({.max_keys = 5000, .clock = &clock});
  for (int i = 0; i < 3000; ++i) ASSERT_TRUE(MustAcquire(s, "big", 3000, seconds(1)).acquired);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(MustAcquire(s, "k" + std::to_string(i), 1, seconds(1)).acquired);
  }
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(MustAcquire(s, "live" + std::to_string(i), 1, seconds(3600)).acquired);
  }
  clock.Advance(seconds(1));
  EXPECT_EQ(s.Sweep(), 4000u);
  EXPECT_EQ(s.Sweep(), 0u);
  EXPECT_EQ(s.InFlight("big", "upload"), 0);
  EXPECT_EQ(s.InFlight("live499", "upload"), 1);
  for (int i = 0; i < 4500; ++i) ASSERT_TRUE(MustAcquire(s, "next", 5000).acquired) << i;
  EXPECT_EQ(s.AcquireSync({.key = "next", .name = "upload", .max_in_flight = 5000}).status().code(),
            StatusCode::kResourceExhausted);
}

// The daemon's sweep (ConcurrencyStore::SweepSome): a mass expiry is dropped
// a budget per call, each call saying whether expired leases are left, so
// its I/O thread serves requests between calls. N expired leases with a
// budget of B take ceil(N / B) calls, N a multiple of B too (`more` is exact).
TEST(MemoryConcurrencyStore, SweepSomeDropsABudgetPerCallUntilNoneIsLeft) {
  for (const int expired : {1000, 1024}) {
    ManualClock clock;
    MemoryConcurrencyStore s({.clock = &clock});
    for (int i = 0; i < expired / 2; ++i) {
      ASSERT_TRUE(MustAcquire(s, "big", expired, seconds(1)).acquired);
      ASSERT_TRUE(MustAcquire(s, "k" + std::to_string(i), 1, seconds(1)).acquired);
    }
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(MustAcquire(s, "live", 10, seconds(3600)).acquired);
    EXPECT_FALSE(s.SweepSome(64).more);  // nothing expired yet
    clock.Advance(seconds(1));
    constexpr size_t kBudget = 64;
    size_t calls = 0, dropped = 0;
    for (bool more = true; more && calls < 100;) {
      const ConcurrencyStore::SweepProgress p = s.SweepSome(kBudget);
      ++calls;
      dropped += p.dropped;
      more = p.more;
      EXPECT_EQ(p.dropped, more ? kBudget : (expired - 1) % kBudget + 1) << calls;
    }
    EXPECT_EQ(calls, (expired + kBudget - 1) / kBudget) << expired;
    EXPECT_EQ(dropped, static_cast<size_t>(expired));
    const ConcurrencyStore::SweepProgress after = s.SweepSome(kBudget);
    EXPECT_EQ(after.dropped, 0u);
    EXPECT_FALSE(after.more);
    EXPECT_EQ(s.InFlight("live", "upload"), 10);
    EXPECT_EQ(s.InFlight("big", "upload"), 0);
  }
}

TEST(MemoryConcurrencyStore, NeverMoreThanTheLimitUnderContention) {
  MemoryConcurrencyStore s;
  std::atomic<int> held{0}, peak{0}, acquired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        AcquireResult r = MustAcquire(s, "k", 3);
        if (!r.acquired) continue;
        const int now = held.fetch_add(1) + 1;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        acquired.fetch_add(1);
        held.fetch_sub(1);
        EXPECT_TRUE(*s.ReleaseSync("k", "upload", r.lease_id));
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), 3);
  EXPECT_GT(acquired.load(), 0);
  EXPECT_EQ(s.InFlight("k", "upload"), 0);
}

std::unique_ptr<RedisConcurrencyStore> MustCreate(RedisConcurrencyStore::Options o) {
  auto s = RedisConcurrencyStore::Create(std::move(o));
  if (!s.ok()) throw std::runtime_error(s.status().ToString());
  return *std::move(s);
}

class RedisConcurrencyTest : public ::testing::Test {
 protected:
  RedisServer server_;
  ManualClock clock_;
  std::unique_ptr<RedisConcurrencyStore> local_ =
      MustCreate({.url = server_.url(),
                  .time_source = RedisConcurrencyStore::TimeSource::kLocal,
                  .clock = &clock_});
  std::unique_ptr<RedisConcurrencyStore> store_ = MustCreate({.url = server_.url()});
};

TEST_F(RedisConcurrencyTest, LeasesUpToTheLimit) { LeasesUpToTheLimit(*local_, clock_); }

TEST_F(RedisConcurrencyTest, ReleasingAnExpiredLeaseSaysNotHeld) {
  ReleasingAnExpiredLeaseSaysNotHeld(*local_, clock_);
  // By Redis's own clock (TIME in the script), as the default time source.
  const std::string id = MustAcquire(*store_, "k", 2, milliseconds(10)).lease_id;
  ASSERT_FALSE(id.empty());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(*store_->ReleaseSync("k", "upload", id));
  const std::string held = MustAcquire(*store_, "k", 2, seconds(30)).lease_id;
  EXPECT_TRUE(*store_->ReleaseSync("k", "upload", held));
}

TEST_F(RedisConcurrencyTest, RenewingMovesTheExpiry) {
  RenewingMovesTheExpiry(*local_, clock_);
  // By Redis's own clock: a lease of 200 ms renewed every 50 ms is held
  // after 300 ms; not renewed any more, it expires.
  const std::string id = MustAcquire(*store_, "k", 1, milliseconds(200)).lease_id;
  ASSERT_FALSE(id.empty());
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(*store_->RenewSync("k", "upload", id, milliseconds(200))) << i;
  }
  EXPECT_FALSE(MustAcquire(*store_, "k", 1, milliseconds(200)).acquired);
  std::this_thread::sleep_for(milliseconds(250));
  EXPECT_FALSE(*store_->RenewSync("k", "upload", id, milliseconds(200)));
  EXPECT_TRUE(MustAcquire(*store_, "k", 1, milliseconds(200)).acquired);
  // The key lives as long as its renewed lease (plus a second).
  const std::string held = MustAcquire(*store_, "r", 1, milliseconds(500)).lease_id;
  ASSERT_TRUE(*store_->RenewSync("r", "upload", held, seconds(20)));
  const int64_t pttl = std::stoll(server_.Cli("PTTL", store_->KeyFor("r", "upload")));
  EXPECT_GT(pttl, 20'000);
  EXPECT_LE(pttl, 21'000);
}

TEST_F(RedisConcurrencyTest, RejectsBadInput) { RejectsBadInput(*store_); }

TEST_F(RedisConcurrencyTest, KeysShareTheClientsHashTagAndExpire) {
  const std::string key = store_->KeyFor("user:{ada}", "upload");
  EXPECT_EQ(key, "rl:{user:%7bada%7d}~c:upload");
  Limit l = *Limit::TokenBucket("upload", 1, 1);
  auto rate = RedisStore::Create({.url = server_.url()});
  ASSERT_TRUE(rate.ok());
  const std::string rate_key = (*rate)->KeyFor("user:{ada}", l);
  EXPECT_EQ(key.substr(0, key.find('}') + 1), rate_key.substr(0, rate_key.find('}') + 1));

  AcquireResult r = MustAcquire(*store_, "user:{ada}", 2, milliseconds(1500));
  ASSERT_TRUE(r.acquired);
  EXPECT_EQ(server_.Cli("ZCARD", key), "1");
  EXPECT_EQ(server_.Cli("ZRANGE", key, "0", "-1"), r.lease_id);
  // The key lives until its last lease expires plus a second, no longer.
  const int64_t pttl = std::stoll(server_.Cli("PTTL", key));
  EXPECT_GT(pttl, 2000);
  EXPECT_LE(pttl, 2500);
}

TEST_F(RedisConcurrencyTest, LeasesExpireByRedisTime) {
  // Real time: a holder that never releases (a crashed instance) frees its
  // places after lease_ttl.
  ASSERT_TRUE(MustAcquire(*store_, "k", 2, milliseconds(300)).acquired);
  ASSERT_TRUE(MustAcquire(*store_, "k", 2, milliseconds(300)).acquired);
  AcquireResult denied = MustAcquire(*store_, "k", 2, milliseconds(300));
  ASSERT_FALSE(denied.acquired);
  EXPECT_GT(denied.retry_after.count(), 0);
  EXPECT_LE(denied.retry_after, milliseconds(300));
  std::this_thread::sleep_for(milliseconds(350));
  AcquireResult after = MustAcquire(*store_, "k", 2, milliseconds(300));
  EXPECT_TRUE(after.acquired);
  EXPECT_EQ(after.in_flight, 1);
}

TEST_F(RedisConcurrencyTest, TwoStoresShareTheLimitAtomically) {
  auto other = MustCreate({.url = server_.url(), .connections = 2});
  std::atomic<int> acquired{0};
  std::vector<std::thread> threads;
  for (ConcurrencyStore* s : {static_cast<ConcurrencyStore*>(store_.get()),
                              static_cast<ConcurrencyStore*>(other.get())}) {
    threads.emplace_back([s, &acquired] {
      for (int i = 0; i < 20; ++i) acquired += MustAcquire(*s, "shared", 5).acquired ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(acquired.load(), 5);
  EXPECT_EQ(server_.Cli("ZCARD", store_->KeyFor("shared", "upload")), "5");
}

TEST_F(RedisConcurrencyTest, AnotherTypeUnderTheKeyStartsFresh) {
  server_.Cli("SET", store_->KeyFor("k", "upload"), "junk");
  EXPECT_TRUE(MustAcquire(*store_, "k", 1).acquired);
}

// An acquire answered too late has failed, but Redis runs its script all
// the same once it gets to it (here: writes paused past the deadline, the
// connection kept: the URL's command timeout is long, as against a slow
// Redis). The ZREM sent behind it takes the lease back: the place is free,
// not held for lease_ttl.
TEST(RedisConcurrencyLate, AnAcquireThatTimedOutHoldsNoLease) {
  RedisServer server;
  auto s = MustCreate({.url = server.url() + "?command_timeout_ms=5000",
                       .deadline = milliseconds(50),
                       .breaker = {.failure_threshold = 100}});
  ASSERT_TRUE(MustAcquire(*s, "warm-up", 1).acquired);  // connected, script loaded
  ASSERT_EQ(server.Cli("CONFIG", "RESETSTAT"), "OK");
  ASSERT_EQ(server.Cli("CLIENT", "PAUSE", "10000", "WRITE"), "OK");
  StatusOr<AcquireResult> late =
      s->AcquireSync({.key = "k", .name = "upload", .max_in_flight = 1, .lease_ttl = seconds(30)});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().ToString();
  ASSERT_EQ(server.Cli("CLIENT", "UNPAUSE"), "OK");
  // The script ran, and the ZREM after it.
  const auto give_up = std::chrono::steady_clock::now() + seconds(2);
  while (server.Cli("INFO", "commandstats").find("cmdstat_zrem:calls=1") == std::string::npos &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const std::string stats = server.Cli("INFO", "commandstats");
  EXPECT_NE(stats.find("cmdstat_evalsha:calls=1"), std::string::npos) << stats;
  EXPECT_EQ(server.Cli("ZCARD", s->KeyFor("k", "upload")), "0");
  AcquireResult next = MustAcquire(*s, "k", 1);
  EXPECT_TRUE(next.acquired);
  EXPECT_EQ(next.in_flight, 1);
}

TEST(RedisConcurrencyDown, FailsFastThenTheBreakerOpens) {
  RedisServer server;
  auto s = MustCreate({.url = server.url(),
                       .deadline = milliseconds(100),
                       .breaker = {.failure_threshold = 2, .open_for = seconds(10)}});
  ASSERT_TRUE(MustAcquire(*s, "k", 1).acquired);
  server.Kill();
  for (int i = 0; i < 2; ++i) {
    StatusOr<AcquireResult> r = s->AcquireSync({.key = "k", .name = "upload"});
    EXPECT_FALSE(r.ok());
  }
  EXPECT_EQ(s->breaker_state(), CircuitBreaker::State::kOpen);
  StatusOr<AcquireResult> r = s->AcquireSync({.key = "k", .name = "upload"});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(s->ReleaseSync("k", "upload", "abc").ok());
}

}  // namespace
}  // namespace ratelimit
