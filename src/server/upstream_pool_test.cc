// UpstreamPool without sockets: a fake connection that counts how many are
// alive stands in for the gateway's UpstreamConnection. The bounds
// (max_idle, max_active), the order connections are reused in, and that the
// pool holds under threads (this test runs under TSan: label concurrency).
#include "server/upstream_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace ratelimit::server {
namespace {

std::atomic<int> g_alive{0};

struct FakeConn {
  explicit FakeConn(int i) : id(i) { g_alive.fetch_add(1); }
  ~FakeConn() { g_alive.fetch_sub(1); }
  FakeConn(const FakeConn&) = delete;
  FakeConn& operator=(const FakeConn&) = delete;
  int id;
};

class UpstreamPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { g_alive = 0; }
};

TEST_F(UpstreamPoolTest, EmptyPoolHasNothingIdle) {
  UpstreamPool<FakeConn> pool(4, 4);
  EXPECT_EQ(pool.TakeIdle(), nullptr);
  EXPECT_EQ(pool.idle(), 0u);
}

TEST_F(UpstreamPoolTest, AConnectionGivenBackIsReused) {
  UpstreamPool<FakeConn> pool(4, 4);
  pool.GiveBack(std::make_unique<FakeConn>(7));
  EXPECT_EQ(pool.idle(), 1u);
  std::unique_ptr<FakeConn> c = pool.TakeIdle();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->id, 7);
  EXPECT_EQ(pool.TakeIdle(), nullptr);  // taken means gone from the pool
}

TEST_F(UpstreamPoolTest, TheLastGivenBackIsTakenFirst) {
  UpstreamPool<FakeConn> pool(4, 4);
  for (int i = 1; i <= 3; ++i) pool.GiveBack(std::make_unique<FakeConn>(i));
  EXPECT_EQ(pool.TakeIdle()->id, 3);
  EXPECT_EQ(pool.TakeIdle()->id, 2);
  EXPECT_EQ(pool.TakeIdle()->id, 1);
}

// The gateway drops an idle connection the upstream wrote to or closed: out
// of the pool whatever its place; null once an exchange has taken it.
TEST_F(UpstreamPoolTest, TakeIfRemovesTheMatchingIdleConnectionOnly) {
  UpstreamPool<FakeConn> pool(4, 4);
  for (int i = 1; i <= 3; ++i) pool.GiveBack(std::make_unique<FakeConn>(i));
  std::unique_ptr<FakeConn> two = pool.TakeIf([](const FakeConn& c) { return c.id == 2; });
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->id, 2);
  EXPECT_EQ(pool.idle(), 2u);
  EXPECT_EQ(pool.TakeIf([](const FakeConn& c) { return c.id == 2; }), nullptr);
  EXPECT_EQ(pool.TakeIdle()->id, 3);
  EXPECT_EQ(pool.TakeIdle()->id, 1);
}

TEST_F(UpstreamPoolTest, AtMostMaxIdleAreKeptTheRestAreClosed) {
  UpstreamPool<FakeConn> pool(/*max_idle=*/2, /*max_active=*/8);
  for (int i = 1; i <= 5; ++i) pool.GiveBack(std::make_unique<FakeConn>(i));
  EXPECT_EQ(pool.idle(), 2u);
  EXPECT_EQ(g_alive.load(), 2);  // the three beyond max_idle were dropped
  EXPECT_EQ(pool.TakeIdle()->id, 2);
  EXPECT_EQ(pool.TakeIdle()->id, 1);
}

TEST_F(UpstreamPoolTest, MaxIdleZeroKeepsNothing) {
  UpstreamPool<FakeConn> pool(0, 8);
  pool.GiveBack(std::make_unique<FakeConn>(1));
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_EQ(g_alive.load(), 0);
}

TEST_F(UpstreamPoolTest, CloseIdleDropsEveryIdleConnection) {
  UpstreamPool<FakeConn> pool(4, 4);
  for (int i = 1; i <= 3; ++i) pool.GiveBack(std::make_unique<FakeConn>(i));
  pool.CloseIdle();
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_EQ(g_alive.load(), 0);
  EXPECT_EQ(pool.TakeIdle(), nullptr);
}

TEST_F(UpstreamPoolTest, AtMostMaxActiveExchangesAtOnce) {
  UpstreamPool<FakeConn> pool(4, /*max_active=*/2);
  EXPECT_TRUE(pool.TryStart());
  EXPECT_TRUE(pool.TryStart());
  EXPECT_FALSE(pool.TryStart());  // the gateway answers 503
  EXPECT_EQ(pool.active(), 2u);   // a refusal takes no place
  pool.Finish();
  EXPECT_TRUE(pool.TryStart());  // a finished exchange frees its place
  EXPECT_FALSE(pool.TryStart());
}

TEST_F(UpstreamPoolTest, ThreadsNeverExceedTheBoundsNorLoseAConnection) {
  constexpr size_t kMaxActive = 3;
  constexpr size_t kMaxIdle = 2;
  UpstreamPool<FakeConn> pool(kMaxIdle, kMaxActive);
  std::atomic<int> inside{0}, most{0}, made{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (!pool.TryStart()) continue;
        const int now = inside.fetch_add(1) + 1;
        for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
        }
        std::unique_ptr<FakeConn> c = pool.TakeIdle();
        if (c == nullptr) c = std::make_unique<FakeConn>(made.fetch_add(1));
        pool.GiveBack(std::move(c));
        inside.fetch_sub(1);
        pool.Finish();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(most.load(), static_cast<int>(kMaxActive));
  EXPECT_EQ(pool.active(), 0u);
  EXPECT_LE(pool.idle(), kMaxIdle);
  EXPECT_EQ(g_alive.load(), static_cast<int>(pool.idle()));  // no connection leaked
  EXPECT_GE(made.load(), 1);
}

}  // namespace
}  // namespace ratelimit::server
