// OverrideStore: the memory one, and the Redis one on a real Redis and a real
// Cluster: two stores on one Redis see each other's records and hear each
// other's changes; a restarted Redis is re-subscribed and says "read again".
#include "ratelimit/override_store.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "support/redis_cluster.h"
#include "support/redis_server.h"

namespace ratelimit {
namespace {

using namespace std::chrono_literals;

int64_t PutSync(OverrideStore& s, const std::string& client, const std::string& value) {
  std::promise<StatusOr<int64_t>> p;
  s.Put(client, value, [&p](StatusOr<int64_t> v) { p.set_value(std::move(v)); });
  StatusOr<int64_t> v = p.get_future().get();
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *v;
}

bool RemoveSync(OverrideStore& s, const std::string& client, std::optional<std::string> if_value) {
  std::promise<StatusOr<bool>> p;
  s.Remove(client, std::move(if_value), [&p](StatusOr<bool> v) { p.set_value(std::move(v)); });
  StatusOr<bool> v = p.get_future().get();
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *v;
}

OverrideSet ReadSync(OverrideStore& s) {
  std::promise<StatusOr<OverrideSet>> p;
  s.ReadAll([&p](StatusOr<OverrideSet> v) { p.set_value(std::move(v)); });
  StatusOr<OverrideSet> v = p.get_future().get();
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return *std::move(v);
}

// What a watcher heard.
struct Heard {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> versions;

  void Add(int64_t v) {
    std::lock_guard lock(mu);
    versions.push_back(v);
    cv.notify_all();
  }
  // Waits until `v` was heard; false after `patience`.
  bool WaitFor(int64_t v, std::chrono::milliseconds patience = 2s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, patience, [&] {
      return std::find(versions.begin(), versions.end(), v) != versions.end();
    });
  }
  size_t Count(int64_t v) {
    std::lock_guard lock(mu);
    return static_cast<size_t>(std::count(versions.begin(), versions.end(), v));
  }
};

// The contract every store keeps, on one store.
void ExpectTheContract(OverrideStore& s) {
  const int64_t v0 = ReadSync(s).version;
  EXPECT_EQ(PutSync(s, "k:acme", "one"), v0 + 1);
  EXPECT_EQ(PutSync(s, "d:job-7", "two"), v0 + 2);
  OverrideSet set = ReadSync(s);
  EXPECT_EQ(set.version, v0 + 2);
  ASSERT_EQ(set.records.size(), 2u);
  // A conditional removal leaves a record that changed meanwhile.
  EXPECT_FALSE(RemoveSync(s, "k:acme", "an older value"));
  EXPECT_EQ(ReadSync(s).version, v0 + 2);
  EXPECT_TRUE(RemoveSync(s, "k:acme", "one"));
  EXPECT_FALSE(RemoveSync(s, "k:acme", std::nullopt));
  EXPECT_TRUE(RemoveSync(s, "d:job-7", std::nullopt));
  set = ReadSync(s);
  EXPECT_EQ(set.version, v0 + 4);
  EXPECT_TRUE(set.records.empty());
}

TEST(MemoryOverrideStore, KeepsRecordsAndAnnouncesEachChange) {
  auto s = MakeMemoryOverrideStore();
  EXPECT_FALSE(s->shared());
  Heard heard;
  s->Watch([&heard](int64_t v) { heard.Add(v); });
  ExpectTheContract(*s);
  EXPECT_TRUE(heard.WaitFor(4, 0ms));  // at once, before the call returned
  EXPECT_EQ(heard.Count(-1), 0u);
}

std::unique_ptr<OverrideStore> MustOpen(const std::string& url, std::string prefix = "rl:") {
  auto s = MakeRedisOverrideStore({.url = url, .key_prefix = std::move(prefix)});
  if (!s.ok()) throw std::runtime_error(s.status().ToString());
  return *std::move(s);
}

TEST(RedisOverrideStore, TwoStoresShareRecordsAndHearEachOther) {
  testing::RedisServer server;
  auto a = MustOpen(server.url());
  auto b = MustOpen(server.url());
  EXPECT_TRUE(a->shared());
  Heard heard_b;
  b->Watch([&heard_b](int64_t v) { heard_b.Add(v); });
  ASSERT_TRUE(heard_b.WaitFor(-1)) << "no subscription";
  ExpectTheContract(*a);
  EXPECT_TRUE(heard_b.WaitFor(4));
  const int64_t v = PutSync(*a, "k:acme", "{\"plan\":\"pro\"}");
  ASSERT_TRUE(heard_b.WaitFor(v));
  OverrideSet seen = ReadSync(*b);
  ASSERT_EQ(seen.records.size(), 1u);
  EXPECT_EQ(seen.records[0].client, "k:acme");
  EXPECT_EQ(seen.records[0].value, "{\"plan\":\"pro\"}");
  // The keys the header names, one hash tag.
  EXPECT_EQ(server.Cli("HGET", "rl:{%overrides}", "k:acme"), "{\"plan\":\"pro\"}");
  EXPECT_EQ(server.Cli("GET", "rl:{%overrides}v"), std::to_string(v));
}

TEST(RedisOverrideStore, ARestartedRedisIsSubscribedAgainAndSaysReadAgain) {
  testing::RedisServer server({.args = {"--appendonly", "yes"}});
  auto a = MustOpen(server.url());
  Heard heard;
  a->Watch([&heard](int64_t v) { heard.Add(v); });
  ASSERT_TRUE(heard.WaitFor(-1));
  const int64_t v = PutSync(*a, "k:acme", "x");
  ASSERT_TRUE(heard.WaitFor(v));
  server.Restart();
  // The second -1: subscribed again (whatever happened meanwhile is unknown).
  std::unique_lock lock(heard.mu);
  ASSERT_TRUE(heard.cv.wait_for(
      lock, 5s, [&] { return std::count(heard.versions.begin(), heard.versions.end(), -1) >= 2; }));
  lock.unlock();
  EXPECT_EQ(ReadSync(*a).records.size(), 1u);  // kept by Redis (appendonly)
}

TEST(RedisOverrideStore, ACluster) {
  testing::RedisCluster cluster;
  auto a = MustOpen(cluster.url());
  auto b = MustOpen(cluster.url());
  Heard heard_b;
  b->Watch([&heard_b](int64_t v) { heard_b.Add(v); });
  ASSERT_TRUE(heard_b.WaitFor(-1, 5s)) << "no subscription";
  ExpectTheContract(*a);
  EXPECT_TRUE(heard_b.WaitFor(4));
  EXPECT_EQ(ReadSync(*b).version, 4);
}

}  // namespace
}  // namespace ratelimit
