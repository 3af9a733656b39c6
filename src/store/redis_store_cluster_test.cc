// RedisStore on a real Redis Cluster (3 masters + 3 replicas, started by
// tests/support/redis_cluster.h): placement, a master failover under load, and
// a slot migration under load with exact decisions.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "ratelimit/redis_store.h"
#include "redis/slot.h"
#include "support/redis_cluster.h"

namespace ratelimit {
namespace {

using Clock = std::chrono::steady_clock;
using redis::KeySlot;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::RedisCluster;

std::unique_ptr<RedisStore> MustCreate(RedisStore::Options o) {
  auto s = RedisStore::Create(std::move(o));
  if (!s.ok()) throw std::runtime_error(s.status().ToString());
  return *std::move(s);
}

// One check of `l` for each client, all submitted before any answer is
// awaited (in this order); each must be allowed with `remaining` left.
void CheckAllAtOnce(RedisStore& store, const Limit& l, const std::vector<std::string>& clients,
                    int64_t remaining) {
  std::promise<void> all_done;
  std::atomic<size_t> left{clients.size()};
  std::atomic<int> wrong{0};
  LimitCheck c[] = {{&l, 1}};
  for (const std::string& client : clients) {
    store.Check({client, c}, [&](StatusOr<CheckResult> r) {
      if (!r.ok() || !r->overall.allowed || r->overall.remaining != remaining) {
        if (wrong.fetch_add(1) == 0) {
          ADD_FAILURE() << (r.ok() ? "remaining " + std::to_string(r->overall.remaining)
                                   : r.status().ToString());
        }
      }
      if (left.fetch_sub(1) == 1) all_done.set_value();
    });
  }
  ASSERT_EQ(all_done.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(wrong.load(), 0);
}

class RedisStoreClusterTest : public ::testing::Test {
 protected:
  RedisCluster cluster_;
};

TEST_F(RedisStoreClusterTest, ClientsSpreadOverAllMasters) {
  auto store = MustCreate({.url = cluster_.url(), .deadline = seconds(2)});
  Limit l = *Limit::TokenBucket("b", 10, 1);
  for (int i = 0; i < 100; ++i) {
    LimitCheck c[] = {{&l, 1}};
    StatusOr<CheckResult> r = store->CheckSync({"client-" + std::to_string(i), c});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->overall.allowed);
  }
  std::vector<size_t> masters = cluster_.Masters();
  ASSERT_EQ(masters.size(), 3u);
  int total = 0;
  for (size_t m : masters) {
    const int keys = std::stoi(cluster_.node(m).Cli("DBSIZE"));
    EXPECT_GT(keys, 10) << "master " << cluster_.node(m).port();
    total += keys;
  }
  EXPECT_EQ(total, 100);
  // Each key lives on the master of its slot.
  const std::string key = store->KeyFor("client-7", l);
  EXPECT_EQ(cluster_.node(cluster_.MasterOfSlot(KeySlot(key))).Cli("EXISTS", key), "1");
  EXPECT_EQ(store->stats().failures, 0u);
}

TEST_F(RedisStoreClusterTest, BracesInAClientKeyCannotPickASlot) {
  auto store = MustCreate({.url = cluster_.url(), .deadline = seconds(2)});
  Limit l = *Limit::TokenBucket("b", 3, 0.001);
  const std::string victim = store->KeyFor("victim", l);
  const std::string attacker = store->KeyFor("{victim}", l);
  EXPECT_NE(victim, attacker);
  EXPECT_NE(KeySlot(victim), KeySlot(attacker));
  LimitCheck c[] = {{&l, 3}};
  ASSERT_TRUE(store->CheckSync({"{victim}", c})->overall.allowed);  // the attacker spends all
  StatusOr<CheckResult> v = store->CheckSync({"victim", c});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->overall.allowed);  // the victim's own bucket is untouched
  for (const std::string& k : {victim, attacker}) {
    EXPECT_EQ(cluster_.node(cluster_.MasterOfSlot(KeySlot(k))).Cli("EXISTS", k), "1") << k;
  }
}

TEST_F(RedisStoreClusterTest, ResetDeletesTheClientsKeys) {
  auto store = MustCreate({.url = cluster_.url(), .deadline = seconds(2)});
  Limit l = *Limit::TokenBucket("b", 2, 0.001);
  LimitCheck c[] = {{&l, 2}};
  ASSERT_TRUE(store->CheckSync({"r", c})->overall.allowed);
  ASSERT_FALSE(store->CheckSync({"r", c})->overall.allowed);
  const Limit* limits[] = {&l};
  std::promise<Status> done;
  store->Reset("r", limits, [&](Status s) { done.set_value(s); });
  ASSERT_TRUE(done.get_future().get().ok());
  EXPECT_TRUE(store->CheckSync({"r", c})->overall.allowed);
}

// A Cluster (node calls across slots, the default) keys a window limit's
// state by its window as one Redis does: a window that grows from a minute to
// an hour starts from fresh counts instead of counting in the minute's index
// read as an hour's (a window thousands of years away).
TEST_F(RedisStoreClusterTest, AWindowThatGrowsStartsFromFreshCounts) {
  ManualClock clock(int64_t{472'223} * 3'600'000'000 + 5 * 60'000'000);
  auto store = MustCreate({.url = cluster_.url(),
                           .deadline = seconds(2),
                           .time_source = RedisStore::TimeSource::kLocal,
                           .clock = &clock});
  std::vector<std::string> clients;
  for (int i = 0; i < 60; ++i) clients.push_back("grow-" + std::to_string(i));
  CheckAllAtOnce(*store, *Limit::FixedWindow("w", 10, std::chrono::minutes(1)), clients, 9);
  const Limit hourly = *Limit::FixedWindow("w", 100, std::chrono::hours(1));
  CheckAllAtOnce(*store, hourly, clients, 99);
  const std::string key = store->KeyFor(clients[0], hourly);
  EXPECT_EQ(key, "rl:{grow-0}w:1h");
  EXPECT_LE(std::stoll(cluster_.node(cluster_.MasterOfSlot(KeySlot(key))).Cli("PTTL", key)),
            55 * 60'000 + 1'000);
}

// One check's outcome, for the load tests.
struct Sample {
  double at_s;  // since the test's start
  bool affected;
  bool ok;
  bool allowed;
  double latency_ms;
};

// Failover on a cluster with a 1 s node timeout. Redis' own failover takes
// the node timeout, plus up to half of it before the first unanswered ping
// is sent, plus gossip to reach the failure quorum, plus the replica's
// election delay (500 ms + 0..500 ms, rank 0 with one replica per master):
// about 1.5 x node timeout + 1.1 s at worst. With 2 s that is up to 4.1 s,
// beyond node timeout + 2 s; with 1 s it is about 2.6 s, within 3 s.
class RedisStoreClusterFailover : public ::testing::Test {
 protected:
  RedisCluster cluster_{{.node_timeout = milliseconds(1000)}};
};

TEST_F(RedisStoreClusterFailover, UnderLoad) {
  const milliseconds deadline(200);
  auto store = MustCreate({.url = cluster_.url(), .deadline = deadline});
  Limit l = *Limit::TokenBucket("b", 1'000'000'000, 1'000'000);
  std::vector<std::string> clients;
  for (int i = 0; i < 120; ++i) clients.push_back("c" + std::to_string(i));
  const size_t victim = cluster_.MasterOfSlot(KeySlot(store->KeyFor(clients[0], l)));
  std::vector<bool> affected;
  for (const std::string& c : clients) {
    affected.push_back(cluster_.MasterOfSlot(KeySlot(store->KeyFor(c, l))) == victim);
  }

  const auto start = Clock::now();
  auto since = [&](Clock::time_point t) {
    return std::chrono::duration<double>(t - start).count();
  };
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Sample> samples;
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Sample> mine;
      for (size_t i = static_cast<size_t>(t); !stop; i += 3) {
        const size_t c = i % clients.size();
        LimitCheck check[] = {{&l, 1}};
        const auto t0 = Clock::now();
        StatusOr<CheckResult> r = store->CheckSync({clients[c], check});
        const auto t1 = Clock::now();
        mine.push_back({since(t0), affected[c], r.ok(), r.ok() && r->overall.allowed,
                        std::chrono::duration<double, std::milli>(t1 - t0).count()});
        std::this_thread::sleep_for(milliseconds(2));
      }
      std::lock_guard lock(mu);
      samples.insert(samples.end(), mine.begin(), mine.end());
    });
  }
  std::this_thread::sleep_for(seconds(2));
  const double killed_at = since(Clock::now());
  cluster_.node(victim).Kill();
  // Failure detection (node timeout) + election take 2-3 s; keep the load on
  // for 6 s so that resumption is measured, not assumed. Meanwhile note
  // when the cluster itself has promoted a replica for the victim's slots.
  const uint16_t victim_slot = KeySlot(store->KeyFor(clients[0], l));
  double promoted_at = -1;
  while (since(Clock::now()) < killed_at + 6) {
    if (promoted_at < 0) {
      try {
        if (victim != cluster_.MasterOfSlot(victim_slot)) promoted_at = since(Clock::now());
      } catch (const std::exception&) {
        // no live master for the slot yet
      }
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  stop = true;
  for (auto& th : threads) th.join();

  std::sort(samples.begin(), samples.end(),
            [](const Sample& a, const Sample& b) { return a.at_s < b.at_s; });
  double last_failure = killed_at;
  int failures = 0, after_ok = 0;
  double max_latency = 0;
  for (const Sample& s : samples) {
    max_latency = std::max(max_latency, s.latency_ms);
    if (!s.ok && s.at_s >= killed_at) {
      ++failures;
      if (s.affected) last_failure = std::max(last_failure, s.at_s);
    }
    if (!s.ok && s.at_s + s.latency_ms / 1000 < killed_at) {
      ADD_FAILURE() << "a check failed before the kill, at " << s.at_s << " s";
    }
  }
  for (const Sample& s : samples) {
    if (s.affected && s.ok && s.at_s > last_failure) ++after_ok;
  }
  const double resume_s = last_failure - killed_at;
  std::cout << "[ failover ] checks " << samples.size() << ", failed after kill " << failures
            << ", replica promoted " << promoted_at - killed_at << " s after SIGKILL"
            << ", victim's slots resumed " << resume_s << " s after SIGKILL ("
            << last_failure - promoted_at << " s after the promotion), max latency " << max_latency
            << " ms (deadline " << deadline.count() << " ms)\n";
  RecordProperty("resume_ms", static_cast<int>(resume_s * 1000));
  ASSERT_GT(promoted_at, 0) << "the cluster did not promote a replica";
  // Our part: decisions resume soon after the cluster has a new master.
  EXPECT_LE(last_failure - promoted_at, 1.0);
  // The bound: decisions resume within node timeout + 2 s of the
  // SIGKILL. Measured kill -> resume 1.67-2.72 s in 10 consecutive runs on a
  // loaded 2-core machine (node timeout 1 s; promotion -> resume under 0.1 s).
  EXPECT_LE(resume_s, std::chrono::duration<double>(cluster_.options().node_timeout).count() + 2);
  EXPECT_GT(after_ok, 100) << "decisions for the failed master's slots did not resume";
  // Every check is answered within its deadline (plus scheduling slack on a shared machine).
  EXPECT_LT(max_latency, deadline.count() + 300.0);
  EXPECT_TRUE(cluster_.IsMaster(cluster_.MasterOfSlot(KeySlot(store->KeyFor(clients[0], l)))));
}

// Checks the store sends at once for N clients on a master (distinct slots)
// share its script calls (node calls), every state lands on its slot's master
// exactly once, and after a slot moved behind the store's back the node call
// that still names its key is refused before it wrote anything and its
// checks are sent again per slot (ratelimit_redis_resent_checks_total).
// 120 clients' checks of `l` (10, then one per 1000 s) share a call per
// master; then one client's slot moves and the call naming it is sent again.
void NodeCallsAcrossSlots(RedisCluster& cluster_, const Limit& l) {
  auto store =
      MustCreate({.url = cluster_.url(), .deadline = seconds(2), .max_calls_in_flight = 1});
  constexpr int kClients = 120;
  std::vector<std::string> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back("node-call-" + std::to_string(i));
  // All at once: with one call out at a time, the rest queue behind the
  // first and leave as one call per master (at most max_batch checks each).
  // clients[0] (whose slot moves below) goes last: the first check may leave
  // alone, as a call of one slot (which MOVED redirects, nothing resent).
  const std::vector<std::string> last_first(clients.rbegin(), clients.rend());
  auto round = [&](int expect_remaining) {
    CheckAllAtOnce(*store, l, last_first, expect_remaining);
  };
  {  // The slot map comes with the first call; until then checks go per slot.
    LimitCheck c[] = {{&l, 1}};
    ASSERT_TRUE(store->CheckSync({"node-call-warm-up", c}).ok());
  }
  const StoreStats before = store->stats();
  round(9);
  StoreStats first = store->stats();
  first.checks -= before.checks;
  first.script_calls -= before.script_calls;
  std::set<uint16_t> slots;
  for (const std::string& c : clients) slots.insert(KeySlot(store->KeyFor(c, l)));
  std::cout << "[ node calls ] " << kClients << " checks of " << slots.size() << " slots in "
            << first.script_calls << " script calls\n";
  EXPECT_EQ(first.checks, static_cast<uint64_t>(kClients));
  EXPECT_LE(first.script_calls, 12u) << "checks of different slots did not share calls";
  EXPECT_EQ(first.resent, 0u);

  // Move the first client's slot to another master; the store's map still
  // names the old one.
  const std::string moved_key = store->KeyFor(clients[0], l);
  const uint16_t slot = KeySlot(moved_key);
  const size_t from = cluster_.MasterOfSlot(slot);
  size_t to = from;
  for (size_t m : cluster_.Masters()) {
    if (m != from) to = m;
  }
  cluster_.BeginMigration(slot, from, to);
  ASSERT_GE(cluster_.MigrateKeys(slot, from, to), 1);
  cluster_.FinishMigration(slot, to);
  round(8);  // exactly one more token each: nothing taken twice, nothing lost
  const StoreStats second = store->stats();
  std::cout << "[ node calls ] after the move: "
            << second.script_calls - before.script_calls - first.script_calls << " script calls, "
            << second.resent << " checks sent again\n";
  EXPECT_GE(second.resent, 1u) << "the call naming the moved key was not refused";
  EXPECT_EQ(second.failures, 0u);
  // Each state is where its slot lives now, with two tokens taken.
  for (const std::string& c : clients) {
    const std::string key = store->KeyFor(c, l);
    EXPECT_EQ(cluster_.node(cluster_.MasterOfSlot(KeySlot(key))).Cli("EXISTS", key), "1") << key;
  }
  EXPECT_EQ(cluster_.node(from).Cli("CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)), "0");
  EXPECT_EQ(cluster_.node(to).Cli("EXISTS", moved_key), "1");
}

TEST_F(RedisStoreClusterTest, NodeCallsShareACallAcrossSlotsAndResendWhenASlotMoved) {
  NodeCallsAcrossSlots(cluster_, *Limit::TokenBucket("b", 10, 0.001));
}

// A block period's key is read first with the others (check.lua's node mode):
// its checks share node calls too, and are sent again alike.
TEST_F(RedisStoreClusterTest, NodeCallsWithABlockPeriodShareACallAndResend) {
  NodeCallsAcrossSlots(cluster_,
                       *Limit::TokenBucket("b", 10, 0.001)->WithBlockFor(std::chrono::hours(1)));
}

// A manual failover (CLUSTER FAILOVER TAKEOVER: the old master becomes a
// replica, as in a rolling upgrade): node calls that still go to it are refused
// (READONLY) before anything ran and are sent again per slot, where MOVED
// leads to the new master. Every check is answered, exactly once.
TEST_F(RedisStoreClusterTest, NodeCallsToADemotedMasterAreSentAgain) {
  auto store =
      MustCreate({.url = cluster_.url(), .deadline = seconds(2), .max_calls_in_flight = 1});
  Limit l = *Limit::TokenBucket("b", 10, 0.001);
  {
    LimitCheck c[] = {{&l, 1}};
    ASSERT_TRUE(store->CheckSync({"demote-warm-up", c}).ok());  // the slot map
  }
  const size_t old_master = cluster_.MasterOfSlot(KeySlot(store->KeyFor("demote-0", l)));
  const std::string port = std::to_string(cluster_.node(old_master).port());
  size_t replica = cluster_.size();
  for (size_t i = 0; i < cluster_.size(); ++i) {
    if (i != old_master &&
        cluster_.node(i).Cli("INFO", "replication").find("master_port:" + port) !=
            std::string::npos) {
      replica = i;
    }
  }
  ASSERT_LT(replica, cluster_.size()) << "no replica of master " << port;
  // TAKEOVER: without the old master's consent or the other masters' votes
  // (a plain CLUSTER FAILOVER did not complete within 15 s in this harness).
  ASSERT_EQ(cluster_.node(replica).Cli("CLUSTER", "FAILOVER", "TAKEOVER"), "OK");
  const auto give_up = Clock::now() + seconds(15);
  while ((!cluster_.IsMaster(replica) || cluster_.IsMaster(old_master)) && Clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(cluster_.IsMaster(replica));
  ASSERT_FALSE(cluster_.IsMaster(old_master));

  std::vector<std::string> clients;
  for (int i = 0; i < 90; ++i) clients.push_back("demote-" + std::to_string(i));
  CheckAllAtOnce(*store, l, clients, 9);
  std::cout << "[ node calls ] after the failover: " << store->stats().resent
            << " checks sent again\n";
  EXPECT_GE(store->stats().resent, 1u) << "no node call went to the demoted master";
}

// Two threads check one client of `l` (100, then one per 1000 s) while its
// slot moves to another master: every check is answered, 100 exactly are
// allowed, and the state ends on the new master. `served_in_ask_phase`:
// checks are also decided between MIGRATE and SETSLOT NODE.
void SlotMigrationUnderLoad(RedisCluster& cluster_, const Limit& l, bool served_in_ask_phase) {
  auto store = MustCreate({.url = cluster_.url(), .deadline = milliseconds(1000)});
  const std::string client = "mover";
  const std::string key = store->KeyFor(client, l);
  const uint16_t slot = KeySlot(key);
  const size_t from = cluster_.MasterOfSlot(slot);
  size_t to = from;
  for (size_t m : cluster_.Masters()) {
    if (m != from) to = m;
  }
  ASSERT_NE(from, to);
  // A second client in the same slot (same hash tag) keeps the slot non-empty.
  std::atomic<bool> stop{false};
  std::atomic<int> allowed{0}, denied{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      while (!stop) {
        LimitCheck c[] = {{&l, 1}};
        StatusOr<CheckResult> r = store->CheckSync({client, c});
        if (!r.ok()) {
          ++failed;
          ADD_FAILURE() << r.status().ToString();
        } else if (r->overall.allowed) {
          ++allowed;
        } else {
          ++denied;
        }
        std::this_thread::sleep_for(milliseconds(12));
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(150));
  cluster_.BeginMigration(slot, from, to);
  std::this_thread::sleep_for(milliseconds(150));  // the key is still on `from`
  const int at_migrate = allowed.load();
  EXPECT_EQ(cluster_.MigrateKeys(slot, from, to), 1);
  std::this_thread::sleep_for(milliseconds(150));  // served on `to` after ASK
  const int at_finish = allowed.load();
  cluster_.FinishMigration(slot, to);
  std::this_thread::sleep_for(milliseconds(700));  // MOVED, then the new map
  stop = true;
  for (auto& th : threads) th.join();
  std::cout << "[ migration ] allowed " << allowed << " (" << at_migrate << " before MIGRATE, "
            << at_finish << " before SETSLOT NODE), denied " << denied << ", failed " << failed
            << "\n";
  EXPECT_EQ(allowed.load(), 100);
  EXPECT_GT(denied.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LT(at_finish, 100) << "the load should span the migration";
  if (served_in_ask_phase) {
    EXPECT_GT(at_finish, at_migrate) << "no check was served during the ASK phase";
  }
  EXPECT_EQ(cluster_.node(to).Cli("EXISTS", key), "1");
  EXPECT_EQ(cluster_.node(from).Cli("CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)), "0");
}

TEST_F(RedisStoreClusterTest, SlotMigrationUnderLoadKeepsDecisionsExact) {
  SlotMigrationUnderLoad(cluster_, *Limit::TokenBucket("b", 100, 0.001),
                         /*served_in_ask_phase=*/true);
}

// The same with a block period: its block key ("<key>!b", absent until the
// first denial) is in the call's KEYS like the state's key, so Redis routes
// the call by both (ASK, TRYAGAIN) and the script never meets a key the node
// does not serve halfway through a batch.
TEST_F(RedisStoreClusterTest, SlotMigrationUnderLoadKeepsDecisionsExactWithABlockPeriod) {
  // While the slot migrates, one of the two keys (the block key: absent
  // until a denial) is missing wherever the call goes: Redis answers
  // TRYAGAIN, which the client retries within the deadline, until SETSLOT
  // NODE. Slower then, but never half a batch.
  SlotMigrationUnderLoad(cluster_,
                         *Limit::TokenBucket("b", 100, 0.001)->WithBlockFor(std::chrono::hours(1)),
                         /*served_in_ask_phase=*/false);
}

// Checks that fail before the first slot map count on the backend's stand-in
// breaker for unknown nodes, which nothing asks again once the map is known:
// breaker_state() (the ratelimit_store_breaker_state gauge, /readyz's
// "breaker") must not keep reading "open" from it while every check succeeds.
TEST_F(RedisStoreClusterTest, TheBreakerStateClosesOnceTheMapArrives) {
  for (size_t i = 0; i < cluster_.size(); ++i) cluster_.node(i).Pause();
  auto store = MustCreate({.url = cluster_.url(), .deadline = milliseconds(50)});
  Limit l = *Limit::TokenBucket("b", 1000, 1000);
  LimitCheck c[] = {{&l, 1}};
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(store->CheckSync({"k", c}).ok());
  EXPECT_EQ(store->breaker_state(), CircuitBreaker::State::kOpen);
  for (size_t i = 0; i < cluster_.size(); ++i) cluster_.node(i).Resume();
  // The first checks after the breaker's open time ask for the map.
  bool ok = false;
  for (int i = 0; i < 300 && !ok; ++i) {
    ok = store->CheckSync({"k", c}).ok();
    if (!ok) std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(ok);
  EXPECT_EQ(store->breaker_state(), CircuitBreaker::State::kClosed)
      << "every check succeeds, the gauge still says " << BreakerStateName(store->breaker_state());
}

}  // namespace
}  // namespace ratelimit
