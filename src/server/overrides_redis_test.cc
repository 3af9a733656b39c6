// Overrides of two instances on one real Redis, their backstop re-read
// (refresh_interval) 60 s away: what they hear on the channel is all that
// moves them. A change after Redis lost the overrides' version key
// (FLUSHALL, a restart without persistence, an eviction) publishes a
// version that restarts at 1: it still reaches the other instance.
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "ratelimit/override_store.h"
#include "server/overrides.h"
#include "support/redis_server.h"

namespace ratelimit::server {
namespace {

using namespace std::chrono_literals;

struct Instances {
  ratelimit::testing::RedisServer redis;
  boost::asio::io_context ioc;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work =
      boost::asio::make_work_guard(ioc);
  std::thread runner{[this] { ioc.run(); }};
  std::unique_ptr<Overrides> a = Make(), b = Make();

  Instances() {
    a->Start(ioc.get_executor());
    b->Start(ioc.get_executor());
  }
  ~Instances() {
    work.reset();
    ioc.stop();
    runner.join();
    a.reset();
    b.reset();
  }
  std::unique_ptr<Overrides> Make() {
    StatusOr<std::unique_ptr<OverrideStore>> store = MakeRedisOverrideStore({.url = redis.url()});
    if (!store.ok()) throw std::runtime_error(store.status().ToString());
    return std::make_unique<Overrides>(*std::move(store), Clock::System(),
                                       Overrides::Options{.refresh_interval = 60s});
  }
  // A plan override for `client` through `o`: the version it stored.
  static int64_t Put(Overrides& o, const std::string& client) {
    ClientOverride c;
    c.client = client;
    c.plan = "pro";
    std::promise<StatusOr<Overrides::Stored>> done;
    o.Put(std::move(c), [&done](StatusOr<Overrides::Stored> r) { done.set_value(std::move(r)); });
    StatusOr<Overrides::Stored> r = done.get_future().get();
    if (!r.ok()) throw std::runtime_error(r.status().ToString());
    return r->version;
  }
  // How long until `o` applies an override for `client`, up to `patience`.
  static std::chrono::steady_clock::duration Until(const Overrides& o, const std::string& client,
                                                   std::chrono::milliseconds patience) {
    const auto start = std::chrono::steady_clock::now();
    while (o.table()->Find(client, 0) == nullptr &&
           std::chrono::steady_clock::now() - start < patience) {
      std::this_thread::sleep_for(2ms);
    }
    return std::chrono::steady_clock::now() - start;
  }
};

TEST(OverridesOnRedis, APutAfterFlushallReachesTheOtherInstance) {
  Instances i;
  EXPECT_EQ(Instances::Put(*i.a, "k:first"), 1);
  ASSERT_LT(Instances::Until(*i.b, "k:first", 3000ms), 3s);
  ASSERT_EQ(i.b->table()->version(), 1);
  i.redis.Cli("FLUSHALL");  // the hash and its version are gone
  EXPECT_EQ(Instances::Put(*i.a, "k:second"), 1) << "the version restarted";
  EXPECT_LT(Instances::Until(*i.b, "k:second", 3000ms), 1s)
      << "the other instance did not act on version 1 (it had 1 before)";
  EXPECT_EQ(i.b->table()->Find("k:first", 0), nullptr);
}

}  // namespace
}  // namespace ratelimit::server
