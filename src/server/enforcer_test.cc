#include "server/enforcer.h"

#include <gtest/gtest.h>

namespace ratelimit::server {
namespace {

using policy::FailureMode;

// A store that cannot decide: every call fails with `status`.
class FailingStore final : public Store {
 public:
  explicit FailingStore(Status status) : status_(std::move(status)) {}
  void Check(const CheckRequest&, CheckCallback done) override { done(status_); }
  void Peek(const CheckRequest&, CheckCallback done) override { done(status_); }
  void Reset(std::string_view, std::span<const Limit* const>, ResetCallback done) override {
    done(status_);
  }

 private:
  Status status_;
};

GroupOutcome Decide(Enforcer& e, const Limit& limit, FailureMode mode, int instances = 1) {
  LimitCheck checks[] = {{&limit, 1}};
  policy::StoreConfig sc;
  sc.expected_instances = instances;
  GroupOutcome out;
  e.DecideGroup("user:ada", checks, mode, sc, [&](GroupOutcome g) { out = std::move(g); });
  return out;
}

TEST(Enforcer, FailOpenAllowsDegraded) {
  Enforcer e(std::make_shared<FailingStore>(Unavailable("redis down")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kOpen);
  EXPECT_TRUE(g.error.ok());
  EXPECT_TRUE(g.degraded);
  EXPECT_FALSE(g.failed_closed);
  EXPECT_TRUE(g.result.overall.allowed);
}

TEST(Enforcer, FailClosedBlocksDegraded) {
  Enforcer e(std::make_shared<FailingStore>(DeadlineExceeded("late")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kClosed);
  EXPECT_TRUE(g.degraded);
  EXPECT_TRUE(g.failed_closed);
  EXPECT_FALSE(g.result.overall.allowed);
}

TEST(Enforcer, FailLocalUsesTheScaledLimit) {
  Enforcer e(std::make_shared<FailingStore>(ResourceExhausted("full")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  int allowed = 0;
  for (int i = 0; i < 10; ++i) {
    GroupOutcome g = Decide(e, l, FailureMode::kLocal, /*instances=*/4);
    EXPECT_TRUE(g.degraded);
    allowed += g.result.overall.allowed ? 1 : 0;
  }
  EXPECT_EQ(allowed, 3);  // ceil(10 / 4)
}

// The local fallback's memory is bounded by local_max_keys: once full, a new
// client is let through (degraded) without taking memory, and a client that
// already has state there keeps being limited (never evicted by the flood).
TEST(Enforcer, FailLocalIsBoundedByLocalMaxKeys) {
  Enforcer e(std::make_shared<FailingStore>(Unavailable("redis down")), /*local_max_keys=*/2);
  Limit l = *Limit::TokenBucket("burst", 2, 0.001);
  LimitCheck checks[] = {{&l, 1}};
  auto decide = [&](const std::string& key) {
    GroupOutcome out;
    e.DecideGroup(key, checks, FailureMode::kLocal, policy::StoreConfig{},
                  [&](GroupOutcome g) { out = std::move(g); });
    EXPECT_TRUE(out.degraded);
    return out.result.overall.allowed;
  };
  EXPECT_TRUE(decide("a"));
  EXPECT_TRUE(decide("a"));
  EXPECT_FALSE(decide("a"));
  EXPECT_TRUE(decide("b"));
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(decide("flood" + std::to_string(i)));
  EXPECT_EQ(e.local_store().size(), 2u);
  EXPECT_FALSE(decide("a"));
  EXPECT_TRUE(decide("b"));
  EXPECT_FALSE(decide("b"));
}

TEST(Enforcer, InvalidArgumentIsTheRequestsFault) {
  Enforcer e(std::make_shared<FailingStore>(InvalidArgument("key too long")), 100);
  Limit l = *Limit::TokenBucket("burst", 10, 1);
  GroupOutcome g = Decide(e, l, FailureMode::kOpen);
  EXPECT_FALSE(g.error.ok());
  EXPECT_EQ(g.error.message(), "key too long");
}

TEST(Enforcer, Scaled) {
  Limit tb = *Limit::TokenBucket("tb", 10, 4);
  Limit s = Enforcer::Scaled(tb, 3);
  EXPECT_EQ(s.limit(), 4);
  EXPECT_NEAR(s.refill_per_second(), 4.0 / 3, 1e-3);
  Limit fw = *Limit::FixedWindow("fw", 2, std::chrono::seconds(60));
  EXPECT_EQ(Enforcer::Scaled(fw, 5).limit(), 1);  // at least 1
  EXPECT_EQ(Enforcer::Scaled(fw, 5).window(), fw.window());
  EXPECT_EQ(Enforcer::Scaled(fw, 1), fw);
  Limit lb = *Limit::LeakyBucket("lb", 20, 6);
  Limit ls = Enforcer::Scaled(lb, 3);
  EXPECT_EQ(ls.algorithm(), Algorithm::kLeakyBucket);
  EXPECT_EQ(ls.limit(), 7);
  EXPECT_NEAR(ls.refill_per_second(), 2.0, 1e-3);
}

}  // namespace
}  // namespace ratelimit::server
