// RedisStore over redis+sentinel:// on a real Sentinel deployment (one
// master, one replica, three sentinels: tests/support/redis_sentinel.h):
// discovery with separate passwords for sentinels and data nodes, exact
// decisions under concurrency, a master demoted by hand (REPLICAOF, no
// sentinel failover) and the sentinels' own failover seen by the client.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "ratelimit/redis_store.h"
#include "redis/io_thread.h"
#include "redis/sentinel_client.h"
#include "support/fake_tcp_server.h"
#include "support/redis_sentinel.h"
#include "support/redis_server.h"

namespace ratelimit {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::RedisSentinel;

std::unique_ptr<RedisStore> MustCreate(RedisStore::Options o) {
  auto s = RedisStore::Create(std::move(o));
  if (!s.ok()) throw std::runtime_error(s.status().ToString());
  return *std::move(s);
}

// Checks `key` on a bucket of `capacity` until one is answered by Redis (the
// client has found the master); false after 10 s.
bool WaitUntilAnswered(RedisStore& store, const std::string& key) {
  Limit l = *Limit::TokenBucket("w", 1'000'000, 1'000);
  const auto give_up = Clock::now() + seconds(10);
  while (Clock::now() < give_up) {
    LimitCheck c[] = {{&l, 1}};
    if (store.CheckSync({key, c}).ok()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

// `n` concurrent checks on a fresh key of a bucket of `capacity` (refilling
// one per hour), from 8 threads: how many were allowed, and how many failed.
std::pair<int, int> Burst(RedisStore& store, const std::string& key, int n, int capacity) {
  Limit l = *Limit::TokenBucket("cap", capacity, 1.0 / 3600);
  std::atomic<int> allowed{0}, failed{0}, next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      while (next.fetch_add(1) < n) {
        LimitCheck c[] = {{&l, 1}};
        StatusOr<CheckResult> r = store.CheckSync({key, c});
        if (!r.ok()) {
          ++failed;
        } else if (r->overall.allowed) {
          ++allowed;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return {allowed.load(), failed.load()};
}

TEST(SentinelStore, DiscoversTheMasterWithSeparatePasswordsAndDecidesExactly) {
  RedisSentinel s({.password = "data-pw", .sentinel_password = "sentinel-pw"});
  auto store = MustCreate({.url = s.url(), .deadline = seconds(1)});
  ASSERT_TRUE(WaitUntilAnswered(*store, "warm-up"));
  const uint64_t failures_before = store->stats().failures;  // checks before discovery
  const auto [allowed, failed] = Burst(*store, "burst", 200, 10);
  EXPECT_EQ(allowed, 10);
  EXPECT_EQ(failed, 0);
  // The keys are on the master (and replicated), never written to a replica.
  Limit l = *Limit::TokenBucket("cap", 10, 1.0 / 3600);
  EXPECT_EQ(s.Cli(s.data(0), {"EXISTS", store->KeyFor("burst", l)}), "1");
  EXPECT_EQ(store->stats().failures, failures_before);
}

// The store's on_redis_event lines, kept for a test to read.
struct Events {
  std::mutex mu;
  std::vector<std::pair<bool, std::string>> lines;  // (warning, message)

  std::function<void(bool, std::string_view)> Hook() {
    return [this](bool warning, std::string_view message) {
      std::lock_guard lock(mu);
      lines.emplace_back(warning, std::string(message));
    };
  }
  // How many lines (warnings only, if `warning`) contain `text`.
  int Count(std::string_view text, bool warning = false) {
    std::lock_guard lock(mu);
    return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const auto& l) {
      return (!warning || l.first) && l.second.find(text) != std::string::npos;
    }));
  }
};

// A check's failure while the client knows no master: the reason the last
// discovery found none (each sentinel's), in the status and in a log line.
std::string FailureWithoutAMaster(const std::string& url, Events& events) {
  auto store =
      MustCreate({.url = url, .deadline = milliseconds(200), .on_redis_event = events.Hook()});
  Limit l = *Limit::TokenBucket("w", 10, 1);
  LimitCheck c[] = {{&l, 1}};
  std::this_thread::sleep_for(milliseconds(300));
  StatusOr<CheckResult> r = store->CheckSync({"k", c});
  if (r.ok()) return "answered";
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  return r.status().ToString();
}

TEST(SentinelStore, WrongSentinelPasswordFindsNoMaster) {
  RedisSentinel s({.sentinel_password = "sentinel-pw"});
  std::string url = s.url();
  url.replace(url.find("sentinel-pw"), 11, "wrong");
  Events events;
  const std::string failure = FailureWithoutAMaster(url, events);
  EXPECT_NE(failure.find("no master of 'main' known yet"), std::string::npos) << failure;
  EXPECT_NE(failure.find("AUTH/SELECT failed: WRONGPASS"), std::string::npos) << failure;
  EXPECT_GE(events.Count("WRONGPASS", /*warning=*/true), 1);
}

TEST(SentinelStore, UnknownMasterNameIsSaid) {
  RedisSentinel s;
  std::string url = s.url();
  url.replace(url.rfind("/main"), 5, "/nosuch");
  Events events;
  const std::string failure = FailureWithoutAMaster(url, events);
  const std::string unknown = "does not know the master name 'nosuch'";
  EXPECT_NE(failure.find(unknown), std::string::npos) << failure;
  EXPECT_GE(events.Count(unknown, /*warning=*/true), 1);
  // Repeated word for word: logged once (per 10 s), though discovery runs
  // every check interval and on every call.
  EXPECT_EQ(events.Count(unknown), 1);
}

// Least-privilege ACL users: on the data nodes, one without ROLE
// (-@dangerous takes it away): the sentinels' answer is taken unchecked,
// with one warning, and the store decides as with any user; on the
// sentinels, one with just the commands docs/configuration.md lists.
TEST(SentinelStore, AUserWithoutRoleStillFindsTheMaster) {
  RedisSentinel s;
  for (size_t i = 0; i < s.sentinels(); ++i) {
    ASSERT_EQ(s.Cli(s.sentinel(i), {"ACL", "SETUSER", "rls", "on", ">spw", "&+switch-master",
                                    "+sentinel|get-master-addr-by-name", "+subscribe", "+ping"}),
              "OK");
  }
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(
        s.Cli(s.data(i), {"ACL", "SETUSER", "rl", "on", ">pw", "~*", "&*", "+@all", "-@dangerous"}),
        "OK");
    ASSERT_NE(s.Cli(s.data(i), {"ACL", "DRYRUN", "rl", "ROLE"}), "OK");  // not permitted
  }
  std::string url = s.url();
  url.insert(std::string_view("redis+sentinel://").size(), "rl:pw@");
  url += "?sentinel_user=rls&sentinel_password=spw";
  Events events;
  auto store = MustCreate({.url = url, .deadline = seconds(1), .on_redis_event = events.Hook()});
  ASSERT_TRUE(WaitUntilAnswered(*store, "warm-up"));
  const auto [allowed, failed] = Burst(*store, "burst", 100, 10);
  EXPECT_EQ(allowed, 10);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(events.Count("ROLE is not permitted", /*warning=*/true), 1);
  const std::string master = "127.0.0.1:" + std::to_string(s.data(0).port());
  EXPECT_EQ(events.Count("master 'main' is " + master + " (found)"), 1);
}

// A SentinelClient on `s` that has found its first master (node 0).
std::unique_ptr<redis::SentinelClient> ConnectedClient(RedisSentinel& s, redis::IoThread& io) {
  auto client = *redis::SentinelClient::Create(io.executor(), *redis::ParseSentinelUrl(s.url()));
  const auto give_up = Clock::now() + seconds(5);
  while (client->NodeForSlot(0) < 0 && Clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  return client;
}

// The master demoted by hand: the replica made master (REPLICAOF NO ONE), the
// old master its replica. The sentinels still name the old master; its
// -READONLY makes the client ask again, follow ROLE to the new master, and
// decide there: a few failed checks, never failure until restart. The
// sentinels' down-after is 5 s, so within the test they do nothing.
TEST(SentinelStore, ReadOnlyFromADemotedMasterLeadsToRediscovery) {
  RedisSentinel s({.down_after = milliseconds(5000)});
  redis::IoThread io;
  auto client = ConnectedClient(s, io);
  // One failed call opens a node's breaker: the demoted master's opens.
  auto store = MustCreate(
      {.url = s.url(), .deadline = milliseconds(200), .breaker = {.failure_threshold = 1}});
  ASSERT_TRUE(WaitUntilAnswered(*store, "warm-up"));
  Limit l = *Limit::TokenBucket("b", 1'000'000, 1'000);

  auto set = [&] {
    std::promise<StatusOr<redis::Reply>> p;
    std::string_view args[] = {"SET", "probe", "1"};
    client->Execute(
        args, [&](StatusOr<redis::Reply> r) { p.set_value(std::move(r)); }, seconds(1));
    return p.get_future().get();
  };
  ASSERT_TRUE(set().ok());  // the client has found the master

  ASSERT_EQ(s.Cli(s.data(1), {"REPLICAOF", "NO", "ONE"}), "OK");
  ASSERT_EQ(s.Cli(s.data(0), {"REPLICAOF", "127.0.0.1", std::to_string(s.data(1).port())}), "OK");
  const auto t_demoted = Clock::now();
  EXPECT_EQ(s.MasterIndex(), 0u);  // the sentinels have not noticed

  // The client's own connection stays up (REPLICAOF keeps clients): its next
  // write meets -READONLY, fails as unavailable, and the client looks again.
  StatusOr<redis::Reply> readonly = set();
  ASSERT_FALSE(readonly.ok()) << readonly->DebugString();
  EXPECT_NE(readonly.status().message().find("READONLY"), std::string::npos)
      << readonly.status().ToString();
  const std::string promoted = "127.0.0.1:" + std::to_string(s.data(1).port());
  while (client->master() != promoted && Clock::now() < t_demoted + seconds(1)) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(client->master(), promoted);
  EXPECT_TRUE(set().ok());

  int failed = 0;
  Clock::time_point t_resumed{};
  int ok_in_a_row = 0;
  for (int i = 0; i < 2000 && ok_in_a_row < 50; ++i) {
    LimitCheck c[] = {{&l, 1}};
    StatusOr<CheckResult> r = store->CheckSync({"after", c});
    if (r.ok()) {
      if (ok_in_a_row++ == 0) t_resumed = Clock::now();
    } else {
      ++failed;
      ok_in_a_row = 0;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  const double resumed_ms =
      std::chrono::duration<double, std::milli>(t_resumed - t_demoted).count();
  std::printf("SENTINEL readonly failed_checks=%d resumed_after_ms=%.1f\n", failed, resumed_ms);
  ASSERT_EQ(ok_in_a_row, 50) << "decisions never resumed";
  EXPECT_LT(resumed_ms, 1000.0);
  EXPECT_GT(failed, 0);
  // The old master's breaker, opened by its READONLY, is asked no more: the
  // store reads closed (the gauge, /readyz) while every check succeeds.
  EXPECT_EQ(store->breaker_state(), CircuitBreaker::State::kClosed);
  // The decisions are the new master's: the key is there, written by the script.
  EXPECT_EQ(s.Cli(s.data(1), {"EXISTS", store->KeyFor("after", l)}), "1");
  EXPECT_EQ(s.MasterIndex(), 0u);  // still the sentinels' old answer: it was ours
}

// A +switch-master is trusted for the master it names, once ROLE confirms
// it, before the sentinels are asked again: the one asked first may not have
// caught up, and may name an old master that still takes writes. Here the
// announcement comes from a plain Redis listed first among the sentinels (it
// relays PUBLISH and answers no SENTINEL command, so discovery moves on to
// the real ones) and names the replica made master by hand, which the
// sentinels still take for a replica. A later discovery does not go back to
// the old master, though it still says `master` and every sentinel names it
// (as in a planned failover, before the old master is demoted and the
// other sentinels hear of the switch).
TEST(SentinelStore, AnAnnouncedMasterIsVerifiedAndTakenBeforeTheSentinelsCatchUp) {
  RedisSentinel s({.down_after = milliseconds(5000)});
  testing::RedisServer relay;
  std::string url = s.url();
  url.insert(std::string_view("redis+sentinel://").size(),
             "127.0.0.1:" + std::to_string(relay.port()) + ",");
  redis::IoThread io;
  auto client = *redis::SentinelClient::Create(io.executor(), *redis::ParseSentinelUrl(url));
  const std::string old_master = "127.0.0.1:" + std::to_string(s.data(0).port());
  const std::string promoted = "127.0.0.1:" + std::to_string(s.data(1).port());
  auto wait_for = [&](const std::string& master, milliseconds patience) {
    const auto give_up = Clock::now() + patience;
    while (client->master() != master && Clock::now() < give_up) {
      std::this_thread::sleep_for(milliseconds(2));
    }
    return client->master() == master;
  };
  ASSERT_TRUE(wait_for(old_master, seconds(5)));

  ASSERT_EQ(s.Cli(s.data(1), {"REPLICAOF", "NO", "ONE"}), "OK");  // both masters now
  const std::string message = s.options().master_name + " 127.0.0.1 " +
                              std::to_string(s.data(0).port()) + " 127.0.0.1 " +
                              std::to_string(s.data(1).port());
  // Published until the client's subscription (on the relay, the first
  // "sentinel") hears it.
  const auto give_up = Clock::now() + seconds(5);
  while (relay.Cli("PUBLISH", "+switch-master", message) != "1" && Clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(wait_for(promoted, seconds(2))) << "still on " << client->master();
  EXPECT_EQ(s.MasterIndex(), 0u);  // the sentinels still name the old master
  const uint64_t discoveries = client->discoveries();
  client->RequestRefresh();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(client->master(), promoted);
  EXPECT_EQ(client->discoveries(), discoveries);  // it ran, and adopted nothing
}

// A +switch-master heard while a discovery is under way is followed as soon
// as that discovery ends, not after min_discovery_interval (here 10 s). The
// discovery is slowed by a "sentinel" that never answers (2 s), listed
// between the relay (subscribed to, as the first) and the real ones.
TEST(SentinelStore, AnAnnouncementDuringADiscoveryIsFollowedAtOnce) {
  RedisSentinel s({.down_after = milliseconds(5000)});
  testing::RedisServer relay;
  testing::FakeTcpServer silent(
      [](int fd) { testing::FakeTcpServer::WaitForClose(fd, seconds(3)); });
  std::string url = s.url();
  url.insert(std::string_view("redis+sentinel://").size(),
             "127.0.0.1:" + std::to_string(relay.port()) +
                 ",127.0.0.1:" + std::to_string(silent.port()) + ",");
  redis::SentinelOptions o = *redis::ParseSentinelUrl(url);
  o.sentinel.command_timeout = seconds(2);
  o.min_discovery_interval = seconds(10);
  ASSERT_EQ(s.Cli(s.data(1), {"REPLICAOF", "NO", "ONE"}), "OK");  // both masters now
  redis::IoThread io;
  const auto start = Clock::now();
  auto client = *redis::SentinelClient::Create(io.executor(), std::move(o));
  const std::string message = s.options().master_name + " 127.0.0.1 " +
                              std::to_string(s.data(0).port()) + " 127.0.0.1 " +
                              std::to_string(s.data(1).port());
  while (relay.Cli("PUBLISH", "+switch-master", message) != "1" &&
         Clock::now() < start + seconds(1)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_LT(Clock::now(), start + seconds(1));  // heard during the first discovery
  const std::string promoted = "127.0.0.1:" + std::to_string(s.data(1).port());
  while (client->master() != promoted && Clock::now() < start + seconds(6)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(client->master(), promoted);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  EXPECT_LT(ms, 4000.0);  // the slow discovery (2 s) and the announced master's ROLE
}

// Kills the master (and before it `sentinel`, if >= 0), waits for the
// sentinels' new master, then for `client` to use it (at most `patience`).
// Returns the milliseconds from the sentinels' agreement to the client's switch.
double KillMasterAndFollow(RedisSentinel& s, redis::SentinelClient& client, int sentinel,
                           milliseconds patience) {
  if (sentinel >= 0) s.sentinel(static_cast<size_t>(sentinel)).Kill();
  s.data(0).Kill();
  const size_t promoted = s.WaitForNewMaster(0);
  const auto t_switch = Clock::now();
  const std::string want = "127.0.0.1:" + std::to_string(s.data(promoted).port());
  while (client.master() != want && Clock::now() < t_switch + patience) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(client.master(), want);
  return std::chrono::duration<double, std::milli>(Clock::now() - t_switch).count();
}

// The sentinels' own failover: the master killed, the replica promoted, the
// client told by +switch-master; the new master is a new node id.
TEST(SentinelStore, FollowsTheSentinelsFailover) {
  RedisSentinel s({.down_after = milliseconds(1000)});
  redis::IoThread io;
  auto client = ConnectedClient(s, io);
  ASSERT_EQ(client->NodeForSlot(0), 0);
  EXPECT_EQ(client->master(), "127.0.0.1:" + std::to_string(s.data(0).port()));
  const double ms = KillMasterAndFollow(s, *client, -1, seconds(2));
  std::printf("SENTINEL client followed the switch %.1f ms after the sentinels agreed\n", ms);
  EXPECT_EQ(client->NodeForSlot(0), 1);
  EXPECT_LT(ms, 1000.0);
}

// The subscribed sentinel (the first) dies, then the master: a client that
// sends nothing learns of the failover only through a new subscription, on
// another sentinel (within a check interval, 1 s).
TEST(SentinelStore, ResubscribesWhenTheSubscribedSentinelDies) {
  RedisSentinel s({.down_after = milliseconds(1000)});
  redis::IoThread io;
  auto client = ConnectedClient(s, io);
  ASSERT_EQ(client->NodeForSlot(0), 0);
  const double ms = KillMasterAndFollow(s, *client, 0, seconds(3));
  std::printf("SENTINEL resubscribed: new master seen %.1f ms after the sentinels agreed\n", ms);
  EXPECT_LT(ms, 2000.0);
}

}  // namespace
}  // namespace ratelimit
