// RedisBackend on a real Redis and a real Cluster: one node and a cluster
// behind the same calls (the store code asks neither which it is), the breaker
// per node and its status (a node's "cannot serve now" errors count against
// it), a redacted URL, and the drain on shutdown.
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

std::unique_ptr<RedisBackend> MustCreate(RedisConnectionOptions o,
                                         std::string_view script = kEcho) {
  auto b = RedisBackend::Create(o, script);
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
  // A call counts until its callback has returned, a moment after it handed
  // the reply to the waiting test thread.
  for (int i = 0; i < 1000 && b->calls_out() != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
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

// Error replies by which the node says it cannot serve now count against
// the breaker as timeouts do, and reach the caller as kUnavailable (cause
// "refused"); an answer about the call itself (WRONGTYPE, a script's own
// error) shows the node serving.
TEST(RedisBackend, ANodeThatCannotServeNowFailsTheCall) {
  for (std::string_view e :
       {"LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "CLUSTERDOWN The cluster is down",
        "READONLY You can't write against a read only replica."}) {
    CircuitBreaker breaker({.failure_threshold = 2, .open_for = milliseconds(10'000)});
    const RedisBackend::Pass pass{.breaker = &breaker};
    RedisBackend::Report(pass, redis::Reply::Error(std::string(e)));
    EXPECT_EQ(breaker.state(), CircuitBreaker::State::kClosed) << e;
    RedisBackend::Report(pass, redis::Reply::Error(std::string(e)));
    EXPECT_EQ(breaker.state(), CircuitBreaker::State::kOpen) << e;
    StatusOr<redis::Reply> judged = RedisBackend::Judged(redis::Reply::Error(std::string(e)));
    ASSERT_FALSE(judged.ok()) << e;
    EXPECT_EQ(judged.status().code(), StatusCode::kUnavailable) << e;
    EXPECT_EQ(CauseOf(judged.status()), FailureCause::kRefused) << e;
    EXPECT_NE(judged.status().message().find(e), std::string::npos) << judged.status().ToString();
  }
  CircuitBreaker breaker({.failure_threshold = 1, .open_for = milliseconds(10'000)});
  const RedisBackend::Pass pass{.breaker = &breaker};
  for (std::string_view e : {"WRONGTYPE Operation against a key holding the wrong kind of value",
                             "ERR Error running script (call to f_0123): @user_script:1: boom",
                             "BUSYKEY Target key name already exists."}) {
    RedisBackend::Report(pass, redis::Reply::Error(std::string(e)));
    EXPECT_EQ(breaker.state(), CircuitBreaker::State::kClosed) << e;
    StatusOr<redis::Reply> judged = RedisBackend::Judged(redis::Reply::Error(std::string(e)));
    ASSERT_TRUE(judged.ok()) << e;
    EXPECT_EQ(judged->str, e);
  }
}

// A node the URL names that became a replica (REPLICAOF: a failover demoted
// it) refuses writes, a command's or a script's, with -READONLY; a replica
// cut off from its master under replica-serve-stale-data no refuses reads too
// with -MASTERDOWN. Neither ran the call: each fails it (kUnavailable with
// the node's word) and counts towards opening the node's breaker.
TEST(RedisBackend, AReplicaThatCannotServeFailsTheCallAndOpensTheBreaker) {
  testing::RedisServer master({.args = {"--repl-diskless-sync-delay", "0"}});
  testing::RedisServer replica;
  ASSERT_EQ(replica.Cli("REPLICAOF", "127.0.0.1", std::to_string(master.port())), "OK");
  for (int i = 0; i < 500 && replica.Cli("ROLE").find("connected") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_NE(replica.Cli("ROLE").find("connected"), std::string::npos) << replica.Cli("ROLE");
  const RedisConnectionOptions options = {
      .url = replica.url(),
      .deadline = milliseconds(1000),
      .breaker = {.failure_threshold = 2, .open_for = milliseconds(10'000)}};
  auto b = MustCreate(options, "return redis.call('INCR', KEYS[1])");
  StatusOr<redis::Reply> set = GuardedExecuteSync(*b, {"SET", "k", "1"});
  ASSERT_FALSE(set.ok()) << set->DebugString();
  EXPECT_EQ(set.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(set.status().message().find("READONLY"), std::string::npos) << set.status().ToString();
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kClosed);  // one failure of two
  StatusOr<redis::Reply> script = GuardedEvalSync(*b, "k", "");
  ASSERT_FALSE(script.ok()) << script->DebugString();
  EXPECT_EQ(script.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(script.status().message().find("READONLY"), std::string::npos)
      << script.status().ToString();
  EXPECT_EQ(b->breaker_state(), CircuitBreaker::State::kOpen);
  EXPECT_EQ(CauseOf(GuardedExecuteSync(*b, {"GET", "k"}).status()), FailureCause::kBreakerOpen);

  ASSERT_EQ(replica.Cli("CONFIG", "SET", "replica-serve-stale-data", "no"), "OK");
  master.Kill();
  for (int i = 0; i < 500 && !replica.Cli("GET", "k").starts_with("MASTERDOWN"); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(replica.Cli("GET", "k").starts_with("MASTERDOWN")) << replica.Cli("GET", "k");
  auto stale = MustCreate(options);
  for (int i = 0; i < 2; ++i) {
    StatusOr<redis::Reply> get = GuardedExecuteSync(*stale, {"GET", "k"});
    ASSERT_FALSE(get.ok()) << get->DebugString();
    EXPECT_EQ(get.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(get.status().message().find("MASTERDOWN"), std::string::npos)
        << get.status().ToString();
  }
  EXPECT_EQ(stale->breaker_state(), CircuitBreaker::State::kOpen);
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
