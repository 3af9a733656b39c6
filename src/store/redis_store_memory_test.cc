// Redis memory per key at 1,000,000 token-bucket keys (issue target: <= 120
// bytes, TTL included). Not run under sanitizers: it measures, it is slow there.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "ratelimit/redis_store.h"
#include "support/redis_server.h"

namespace ratelimit {
namespace {

using std::chrono::milliseconds;
using testing::RedisServer;

// Memory per key in Redis, measured from used_memory (TTL included).
TEST(RedisStoreMemory, TokenBucketKeysAreSmall) {
  RedisServer server;
  auto store = *RedisStore::Create(
      {.url = server.url(), .deadline = std::chrono::seconds(5), .max_batch = 64});
  Limit l = *Limit::TokenBucket("b", 10, 0.01);  // long TTL: nothing expires during the test
  auto used_memory = [&] {
    std::string info = server.Cli("INFO", "memory");
    auto p = info.find("used_memory:");
    return std::stol(info.substr(p + 12));
  };
  const long before = used_memory();
  constexpr int kKeys = 1'000'000;
  std::atomic<int> done{0}, failures{0};
  std::vector<std::string> keys;
  keys.reserve(kKeys);
  for (int i = 0; i < kKeys; ++i)
    keys.push_back("u:" + std::to_string(i));  // "u:0" .. "u:999999": keys rl:{u:123456}b
  for (int i = 0; i < kKeys; ++i) {
    LimitCheck c[] = {{&l, 1}};
    store->Check({keys[i], c}, [&](StatusOr<CheckResult> r) {
      if (!r.ok() && failures.fetch_add(1) == 0) {
        std::printf("first failure: %s\n", r.status().ToString().c_str());
      }
      done.fetch_add(1);
    });
    while (store->pending() > 5000) std::this_thread::yield();
  }
  while (done.load() < kKeys) std::this_thread::sleep_for(milliseconds(5));
  const long after = used_memory();
  ASSERT_EQ(failures.load(), 0);
  ASSERT_EQ(server.Cli("DBSIZE"), std::to_string(kKeys));
  const double per_key = static_cast<double>(after - before) / kKeys;
  RecordProperty("redis_bytes_per_key", std::to_string(per_key));
  std::printf("redis used_memory per token-bucket key: %.1f bytes (%d keys like %s)\n", per_key,
              kKeys, store->KeyFor(keys[0], l).c_str());
  EXPECT_LE(per_key, 120.0);
}

}  // namespace
}  // namespace ratelimit
