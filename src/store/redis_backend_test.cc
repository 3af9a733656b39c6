// RedisBackend on a real Redis and a real Cluster: one node and a cluster
// behind the same calls (the store code asks neither which it is), the breaker
// per node and its status, a redacted URL, and the drain on shutdown.
#include "store/redis_backend.h"

#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "redis/slot.h"
#include "support/redis_cluster.h"
#include "support/redis_server.h"

namespace ratelimit::store {
namespace {

using std::chrono::milliseconds;

constexpr std::string_view kEcho = "return {KEYS[1], ARGV[1]}";

std::unique_ptr<RedisBackend> MustCreate(RedisConnectionOptions o) {
  auto b = RedisBackend::Create(o, kEcho);
  if (!b.ok()) throw std::runtime_error(b.status().ToString());
  return *std::move(b);
}

StatusOr<redis::Reply> GuardedEvalSync(RedisBackend& b, std::string_view key,
                                       std::string_view arg) {
  std::promise<StatusOr<redis::Reply>> p;
  const std::string_view keys[] = {key};
  const std::string_view args[] = {arg};
  b.GuardedEval(keys, args, [&p](StatusOr<redis::Reply> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

StatusOr<redis::Reply> GuardedExecuteSync(RedisBackend& b, std::vector<std::string_view> args) {
  std::promise<StatusOr<redis::Reply>> p;
  b.GuardedExecute(args, [&p](StatusOr<redis::Reply> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

TEST(RedisBackend, OneNodeRunsTheScriptAndCommandsOnSlotZero) {
  testing::RedisServer server;
  auto b = MustCreate({.url = server.url()});
  EXPECT_FALSE(b->sharded());
  EXPECT_EQ(b->SlotOf("rl:{user:ada}burst"), 0);                       // one node: no hashing
  StatusOr<redis::Reply> r = GuardedEvalSync(*b, "rl:{a}x", "hello");  // NOSCRIPT -> load, retry
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->elements.size(), 2u);
  EXPECT_EQ(r->elements[1].str, "hello");
  ASSERT_TRUE(GuardedExecuteSync(*b, {"SET", "rl:{a}y", "1"}).ok());
  EXPECT_EQ(server.Cli("GET", "rl:{a}y"), "1");
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kClosed);
  EXPECT_EQ(b->calls_out(), 0);
}

TEST(RedisBackend, ADeadNodeOpensItsBreakerAndTheStatusNamesIt) {
  testing::RedisServer server;
  auto b = MustCreate({.url = server.url(),
                       .deadline = milliseconds(50),
                       .breaker = {.failure_threshold = 2, .open_for = milliseconds(10'000)}});
  ASSERT_TRUE(GuardedExecuteSync(*b, {"SET", "k", "1"}).ok());
  server.Kill();
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(GuardedExecuteSync(*b, {"GET", "k"}).ok());
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kOpen);
  StatusOr<RedisBackend::Pass> refused = b->Admit(0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("redis " + b->url_for_logs()), std::string::npos)
      << refused.status().ToString();
}

// A half-open breaker's probe that our own max_pending refuses (the node
// gave no verdict) goes back: the next call probes, instead of every later
// call being refused as if the probe were still out. The breaker's clock is
// manual, so no lapse (probe_timeout) can hide a lost probe.
TEST(RedisBackend, AProbeRefusedByMaxPendingIsGivenBack) {
  testing::RedisServer server;
  ManualClock clock;
  auto b = MustCreate(
      {.url = server.url(),
       .deadline = milliseconds(100),
       .max_pending = 1,
       .breaker = {.failure_threshold = 1, .open_for = milliseconds(10), .clock = &clock}});
  ASSERT_TRUE(GuardedExecuteSync(*b, {"SET", "k", "1"}).ok());
  server.Pause();
  EXPECT_FALSE(GuardedExecuteSync(*b, {"GET", "k"}).ok());  // times out: open
  ASSERT_EQ(b->breaker_state(), CircuitBreaker::State::kOpen);
  // An unguarded command fills max_pending; then the probe is refused.
  std::promise<void> filler;
  const std::string_view get[] = {"GET", "k"};
  b->Execute(get, [&filler](StatusOr<redis::Reply>) { filler.set_value(); });
  clock.Advance(milliseconds(10));
  StatusOr<redis::Reply> probe = GuardedExecuteSync(*b, {"GET", "k"});
  ASSERT_FALSE(probe.ok());
  EXPECT_EQ(probe.status().code(), StatusCode::kResourceExhausted) << probe.status().ToString();
  server.Resume();
  filler.get_future().wait();
  // Whatever the filler did to the connection, wait until it serves again
  // without going through the breaker.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < give_up) {
    std::promise<bool> ok;
    b->Execute(get, [&ok](StatusOr<redis::Reply> r) { ok.set_value(r.ok()); });
    if (ok.get_future().get()) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  StatusOr<redis::Reply> next = GuardedExecuteSync(*b, {"GET", "k"});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kClosed);
}

TEST(RedisBackend, TheUrlForLogsHasNoPassword) {
  testing::RedisServer server;
  const std::string url = server.url();
  auto b = MustCreate({.url = "redis://ada:s3cret@" + url.substr(url.find("//") + 2)});
  EXPECT_EQ(b->url_for_logs().find("s3cret"), std::string::npos) << b->url_for_logs();
  EXPECT_NE(b->url_for_logs().find("***"), std::string::npos) << b->url_for_logs();
}

TEST(RedisBackend, ShutdownCallsBackOnceNoCallIsOut) {
  testing::RedisServer server;
  auto b = MustCreate({.url = server.url()});
  ASSERT_TRUE(GuardedExecuteSync(*b, {"SET", "k", "1"}).ok());
  std::promise<void> done;
  b->Shutdown([] { return true; }, [&done] { done.set_value(); });
  EXPECT_EQ(done.get_future().wait_for(std::chrono::seconds(2)), std::future_status::ready);
  EXPECT_FALSE(GuardedExecuteSync(*b, {"GET", "k"}).ok());  // closed: fails at once
}

TEST(RedisBackend, AClusterIsShardedAndEachSlotGoesToItsMaster) {
  testing::RedisCluster cluster;
  auto b = MustCreate({.url = cluster.url(), .deadline = milliseconds(2000)});
  EXPECT_TRUE(b->sharded());
  for (std::string_view key : {"rl:{a}x", "rl:{b}x", "rl:{c}x", "rl:{d}x"}) {
    EXPECT_EQ(b->SlotOf(key), redis::KeySlot(key));
    StatusOr<redis::Reply> r = GuardedEvalSync(*b, key, "v");
    ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
    ASSERT_TRUE(GuardedExecuteSync(*b, {"SET", key, "1"}).ok()) << key;
  }
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kClosed);
  EXPECT_EQ(b->url_for_logs().rfind("redis+cluster://", 0), 0u) << b->url_for_logs();
}

}  // namespace
}  // namespace ratelimit::store
