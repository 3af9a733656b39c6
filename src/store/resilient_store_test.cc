// The failure policy, on a store that fails on demand (a fake: this tests
// the policy, not Redis) and a manual clock for the local fallback.
#include "store/resilient_store.h"

#include <gtest/gtest.h>

#include <vector>

namespace ratelimit {
namespace {

using std::chrono::seconds;

// A store whose every call fails with `status` while it is set, and asks a
// MemoryStore otherwise.
class FlakyStore final : public Store {
 public:
  explicit FlakyStore(const Clock* clock) : memory_(MemoryStore::Options{.clock = clock}) {}
  Status status = Status::Ok();
  int calls = 0;

  void Check(const CheckRequest& r, CheckCallback done) override {
    ++calls;
    if (!status.ok()) return done(status);
    memory_.Check(r, std::move(done));
  }
  void Peek(const CheckRequest& r, CheckCallback done) override {
    if (!status.ok()) return done(status);
    memory_.Peek(r, std::move(done));
  }
  void Reset(std::string_view key, std::span<const Limit* const> limits,
             ResetCallback done) override {
    memory_.Reset(key, limits, std::move(done));
  }
  void Settle(const SettleRequest& r, CheckCallback done) override {
    if (!status.ok()) return done(status);
    memory_.Settle(r, std::move(done));
  }
  bool remote() const override { return true; }
  CircuitBreaker::State breaker_state() const override { return CircuitBreaker::State::kOpen; }

 private:
  MemoryStore memory_;
};

class FlakyConcurrencyStore final : public ConcurrencyStore {
 public:
  Status status = Unavailable("redis down");
  void Acquire(const AcquireRequest&, AcquireCallback done) override { done(status); }
  void Release(std::string_view, std::string_view, std::string_view,
               ReleaseCallback done) override {
    done(status);
  }
  void Renew(std::string_view, std::string_view, std::string_view, std::chrono::microseconds,
             RenewCallback done) override {
    done(status);
  }
};

class ResilientStoreTest : public testing::Test {
 protected:
  ResilientStoreTest() {
    auto flaky = std::make_shared<FlakyStore>(&clock_);
    flaky_ = flaky.get();
    store_ = std::make_unique<ResilientStore>(
        flaky, ResilientStore::Options{.local_max_keys = 2,
                                       .clock = &clock_,
                                       .on_failure = [this](const Status& s, FailureMode m) {
                                         failures_.push_back({s.code(), m});
                                       }});
  }

  StatusOr<CheckResult> Check(std::string_view key, FailureMode mode, int instances = 1,
                              int64_t cost = 1) {
    LimitCheck checks[] = {{&limit_, cost}};
    return store_->CheckSync({.key = key, .checks = checks, .on_failure = {mode, instances}});
  }

  ManualClock clock_;
  FlakyStore* flaky_ = nullptr;
  std::unique_ptr<ResilientStore> store_;
  std::vector<std::pair<StatusCode, FailureMode>> failures_;
  Limit limit_ = *Limit::TokenBucket("burst", 10, 1);
};

TEST_F(ResilientStoreTest, AHealthyStoreDecidesAlone) {
  StatusOr<CheckResult> r = Check("a", FailureMode::kClosed);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->overall.allowed);
  EXPECT_EQ(r->overall.remaining, 9);
  EXPECT_FALSE(r->degraded);
  EXPECT_TRUE(failures_.empty());
}

TEST_F(ResilientStoreTest, OpenAllowsDegraded) {
  flaky_->status = Unavailable("redis down");
  StatusOr<CheckResult> r = Check("a", FailureMode::kOpen);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->overall.allowed);
  EXPECT_EQ(r->overall.remaining, 10);  // unknown: the limit
  EXPECT_TRUE(r->degraded);
  EXPECT_FALSE(r->failed_closed);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_EQ(failures_[0].first, StatusCode::kUnavailable);
  EXPECT_EQ(failures_[0].second, FailureMode::kOpen);
}

TEST_F(ResilientStoreTest, ClosedDeniesForASecond) {
  flaky_->status = DeadlineExceeded("late");
  StatusOr<CheckResult> r = Check("a", FailureMode::kClosed);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->overall.allowed);
  EXPECT_TRUE(r->degraded);
  EXPECT_TRUE(r->failed_closed);
  EXPECT_EQ(r->overall.retry_after, seconds(1));
  EXPECT_EQ(r->overall.remaining, 0);
}

TEST_F(ResilientStoreTest, ErrorReportsTheFailureToTheCaller) {
  flaky_->status = ResourceExhausted("overloaded");
  StatusOr<CheckResult> r = Check("a", FailureMode::kError);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsStoreFailure(r.status()));
  ASSERT_EQ(failures_.size(), 1u);  // counted all the same
  EXPECT_EQ(failures_[0].second, FailureMode::kError);
}

TEST_F(ResilientStoreTest, InvalidArgumentIsNeitherDecidedNorCounted) {
  flaky_->status = InvalidArgument("key too long");
  StatusOr<CheckResult> r = Check("a", FailureMode::kOpen);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsStoreFailure(r.status()));
  EXPECT_TRUE(failures_.empty());
}

TEST_F(ResilientStoreTest, LocalDividesTheLimitAndRefillsOnTheClock) {
  flaky_->status = Internal("bad reply");
  int allowed = 0;
  for (int i = 0; i < 10; ++i) {
    StatusOr<CheckResult> r = Check("a", FailureMode::kLocal, /*instances=*/4);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->degraded);
    EXPECT_FALSE(r->failed_closed);
    allowed += r->overall.allowed ? 1 : 0;
  }
  EXPECT_EQ(allowed, 3);  // ceil(10 / 4)
  // The refill is divided too: 1/4 token a second, so one more in 4 s.
  clock_.Advance(seconds(3));
  EXPECT_FALSE(Check("a", FailureMode::kLocal, 4)->overall.allowed);
  clock_.Advance(seconds(1));
  EXPECT_TRUE(Check("a", FailureMode::kLocal, 4)->overall.allowed);
}

// A cost above the instance's share (10 / 4 -> 3, at 1/4 a second): the
// share now, the rest (7) a debt the share's refill pays first. The next
// cost-10 request waits for 10 tokens at 1/4 a second, 40 s, as the 4
// instances together then take the limit's 1 a second; clipped to the
// share it would wait 12 s (and the instances take 4 times the limit).
TEST_F(ResilientStoreTest, LocalBooksACostAboveTheShareAsADebt) {
  flaky_->status = Unavailable("redis down");
  StatusOr<CheckResult> first = Check("a", FailureMode::kLocal, 4, /*cost=*/10);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->overall.allowed);
  EXPECT_TRUE(first->degraded);
  EXPECT_EQ(first->overall.remaining, 0);
  EXPECT_EQ(first->overall.reset_after, seconds(40));  // full again: 10 tokens at 1/4 a second
  clock_.Advance(seconds(12));
  EXPECT_FALSE(Check("a", FailureMode::kLocal, 4, 10)->overall.allowed);
  EXPECT_FALSE(Check("a", FailureMode::kLocal, 4, 1)->overall.allowed);  // the debt comes first
  clock_.Advance(seconds(27));
  StatusOr<CheckResult> early = Check("a", FailureMode::kLocal, 4, 10);
  EXPECT_FALSE(early->overall.allowed);
  EXPECT_EQ(early->overall.retry_after, seconds(1));
  clock_.Advance(seconds(1));
  EXPECT_TRUE(Check("a", FailureMode::kLocal, 4, 10)->overall.allowed);
  // Within the share, nothing is owed.
  EXPECT_TRUE(Check("b", FailureMode::kLocal, 4, 3)->overall.allowed);
  clock_.Advance(seconds(4));
  EXPECT_TRUE(Check("b", FailureMode::kLocal, 4, 1)->overall.allowed);
}

// A window's count cannot carry a debt into the next window: a cost above
// the share (10 / 4 -> 3 a minute) is refused, nothing taken, while the
// store is down; within the share the window decides as usual.
TEST_F(ResilientStoreTest, LocalRefusesACostAboveTheShareOfAWindow) {
  flaky_->status = Unavailable("redis down");
  Limit window = *Limit::FixedWindow("w", 10, seconds(60));
  auto check = [&](int64_t cost) {
    LimitCheck checks[] = {{&window, cost}};
    return store_->CheckSync(
        {.key = "a", .checks = checks, .on_failure = {FailureMode::kLocal, 4}});
  };
  StatusOr<CheckResult> big = check(4);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->overall.allowed);
  EXPECT_TRUE(big->degraded);
  EXPECT_EQ(big->overall.retry_after, seconds(1));
  EXPECT_EQ(big->overall.limit, 3);
  StatusOr<CheckResult> fits = check(3);
  EXPECT_TRUE(fits->overall.allowed);
  EXPECT_EQ(fits->overall.remaining, 0);
}

TEST_F(ResilientStoreTest, LocalIsBoundedAndLetsNewClientsThroughWhenFull) {
  flaky_->status = Unavailable("redis down");
  EXPECT_TRUE(Check("a", FailureMode::kLocal)->overall.allowed);
  EXPECT_TRUE(Check("b", FailureMode::kLocal)->overall.allowed);
  for (int i = 0; i < 20; ++i) {
    StatusOr<CheckResult> r = Check("flood" + std::to_string(i), FailureMode::kLocal);
    EXPECT_TRUE(r->overall.allowed);
    EXPECT_TRUE(r->degraded);
  }
  EXPECT_EQ(store_->local_store().size(), 2u);
}

TEST_F(ResilientStoreTest, ForwardsWhatTheStoreTells) {
  EXPECT_TRUE(store_->remote());
  EXPECT_EQ(store_->breaker_state(), CircuitBreaker::State::kOpen);
  EXPECT_TRUE(store_->decides_failures());
  // Peek reports failures as they are, whatever the mode.
  flaky_->status = Unavailable("redis down");
  LimitCheck checks[] = {{&limit_, 0}};
  StatusOr<CheckResult> p =
      store_->PeekSync({.key = "a", .checks = checks, .on_failure = {FailureMode::kOpen, 1}});
  EXPECT_FALSE(p.ok());
}

TEST(ResilientStore, ScaledDividesCountAndRate) {
  Limit tb = *Limit::TokenBucket("tb", 10, 4);
  Limit s = ResilientStore::Scaled(tb, 3);
  EXPECT_EQ(s.limit(), 4);
  EXPECT_NEAR(s.refill_per_second(), 4.0 / 3, 1e-3);
  Limit fw = *Limit::FixedWindow("fw", 2, seconds(60));
  EXPECT_EQ(ResilientStore::Scaled(fw, 5).limit(), 1);
  EXPECT_EQ(ResilientStore::Scaled(fw, 1), fw);
}

TEST(ResilientConcurrencyStore, FailureModes) {
  FlakyConcurrencyStore down;
  ManualClock clock;
  std::vector<FailureMode> seen;
  ResilientConcurrencyStore s(
      &down,
      {.clock = &clock, .on_failure = [&](const Status&, FailureMode m) { seen.push_back(m); }});
  auto acquire = [&](FailureMode m) {
    return s.AcquireSync({.key = "user:ada",
                          .name = "upload",
                          .max_in_flight = 3,
                          .lease_ttl = seconds(30),
                          .on_failure = {m, /*expected_instances=*/2}});
  };
  StatusOr<AcquireResult> open = acquire(FailureMode::kOpen);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->acquired);
  EXPECT_TRUE(open->lease_id.empty());
  EXPECT_TRUE(open->degraded);
  StatusOr<AcquireResult> closed = acquire(FailureMode::kClosed);
  EXPECT_FALSE(closed->acquired);
  EXPECT_TRUE(closed->failed_closed);
  EXPECT_FALSE(acquire(FailureMode::kError).ok());
  // local: 3 over 2 instances -> 2 here.
  StatusOr<AcquireResult> a = acquire(FailureMode::kLocal);
  StatusOr<AcquireResult> b = acquire(FailureMode::kLocal);
  StatusOr<AcquireResult> c = acquire(FailureMode::kLocal);
  EXPECT_TRUE(a->acquired && b->acquired);
  EXPECT_FALSE(c->acquired);
  EXPECT_TRUE(c->degraded);
  EXPECT_TRUE(a->lease_id.starts_with(kLocalLeasePrefix));
  // Its lease goes back to the local store, and frees a place.
  EXPECT_TRUE(*s.ReleaseSync("user:ada", "upload", a->lease_id));
  EXPECT_TRUE(acquire(FailureMode::kLocal)->acquired);
  EXPECT_EQ(seen.size(), 7u);
  // A local lease is renewed there too: b, taken at t=0 for 30 s and renewed
  // at t=20, is still held at t=40, when the one taken after a's release
  // (at t=0 as well) has expired.
  clock.Advance(seconds(20));
  EXPECT_TRUE(*s.RenewSync("user:ada", "upload", b->lease_id, seconds(30)));
  clock.Advance(seconds(20));
  EXPECT_EQ(acquire(FailureMode::kLocal)->in_flight, 2);
  // Another lease's renewal is the store's, and its failure the caller's:
  // no failure mode, nothing reported.
  EXPECT_EQ(s.RenewSync("user:ada", "upload", "abcdef", seconds(30)).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(seen.size(), 8u);
  // Detached (shutdown): acquires fail by the mode, releases are refused.
  s.Detach();
  EXPECT_TRUE(acquire(FailureMode::kOpen)->acquired);
  EXPECT_FALSE(s.ReleaseSync("user:ada", "upload", "abcdef").ok());
  EXPECT_FALSE(s.RenewSync("user:ada", "upload", "abcdef", seconds(30)).ok());
}

// A settlement decides nothing: on a failure, mode local puts the difference
// on the local fallback (where this instance decides meanwhile); the other
// modes hand the failure back, counted, and nothing is applied anywhere.
TEST_F(ResilientStoreTest, SettleGoesToTheStoreThenToTheLocalFallbackOnly) {
  LimitSettle s[] = {{&limit_, 3}};
  StatusOr<CheckResult> ok = store_->SettleSync({.key = "a", .settlements = s});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_FALSE(ok->degraded);
  EXPECT_EQ(ok->overall.remaining, 7);  // the healthy store took 3

  flaky_->status = Unavailable("redis down");
  for (FailureMode mode : {FailureMode::kOpen, FailureMode::kClosed, FailureMode::kError}) {
    StatusOr<CheckResult> r =
        store_->SettleSync({.key = "b", .settlements = s, .on_failure = {mode, 1}});
    ASSERT_FALSE(r.ok()) << FailureModeName(mode);
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(failures_.size(), 3u);
  // Nothing reached the local fallback: a local check of "b" finds it full.
  EXPECT_EQ(Check("b", FailureMode::kLocal)->overall.remaining, 9);

  LimitSettle refund[] = {{&limit_, -1}};
  StatusOr<CheckResult> local = store_->SettleSync(
      {.key = "b", .settlements = refund, .on_failure = {FailureMode::kLocal, 1}});
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_TRUE(local->degraded);
  EXPECT_EQ(local->overall.remaining, 10);  // the local check's token given back
}

}  // namespace
}  // namespace ratelimit
