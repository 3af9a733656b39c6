// Issue 21 end to end, with two ratelimitd instances on one real Redis:
// block periods (a denial blocks the client on every instance until the
// block ends or an admin lifts it), and decision-API reservations settled
// on either instance, concurrently, with the total charged exact.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "json_calls.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// `store`: a store section ("store: {...}\n"), or none.
std::string Config(const std::string& store = "") {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            store +
                "limits:\n"
                "  login: {algorithm: fixed_window, limit: 5, window: 1s, block_for: 3s}\n"
                "  tokens: {algorithm: token_bucket, capacity: 100000, refill_per_second: 0.01}\n");
  return dir + "/c.yaml";
}

HttpResponse Check(const Daemon& d, const std::string& body) {
  return Http(d.port(), "POST", "/v1/check", {{"Content-Type", "application/json"}}, body);
}

TEST(SettleDaemon, ABlockHoldsOnEveryInstanceUntilItEndsOrIsLifted) {
  ratelimit::testing::RedisServer redis;
  const std::string config = Config();
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();
  const std::string login = R"({"key": "mallory", "limit": "login"})";
  // Until the first denial (5 a second; a window edge may let a few more through).
  auto exceed = [&] {
    for (int i = 0; i < 12; ++i) {
      HttpResponse r = Check(a, login);
      if (r.status == 429) return r;
      EXPECT_EQ(r.status, 200) << r.body;
    }
    return HttpResponse{};
  };
  HttpResponse denied = exceed();
  ASSERT_EQ(denied.status, 429) << denied.body;
  EXPECT_EQ(denied.Header("Retry-After"), "3");  // the block's end, not the window's
  // The other instance: blocked too, through Redis.
  HttpResponse other = Check(b, login);
  EXPECT_EQ(other.status, 429);
  EXPECT_GT(Body(other)["retry_after_ms"].get<int64_t>(), 1000) << other.body;
  // The admin API of either instance shows it.
  HttpResponse shown = Http(b.admin_port(), "GET", "/v1/clients/d:mallory/blocks");
  ASSERT_EQ(shown.status, 200) << shown.body;
  json blocks = Body(shown)["blocks"];
  ASSERT_EQ(blocks.size(), 1u) << shown.body;
  EXPECT_EQ(blocks[0]["limit"], "login");
  EXPECT_EQ(blocks[0]["block_for_ms"], 3000);
  EXPECT_GT(blocks[0]["remaining_ms"].get<int64_t>(), 1000);
  // A new window has room, but the block stands, on both.
  std::this_thread::sleep_for(milliseconds(1100));
  EXPECT_EQ(Check(a, login).status, 429);
  EXPECT_EQ(Check(b, login).status, 429);
  // Lifted on one instance, gone for all: the new window lets it in.
  HttpResponse lifted = Http(b.admin_port(), "DELETE", "/v1/clients/d:mallory/blocks");
  ASSERT_EQ(lifted.status, 200) << lifted.body;
  EXPECT_EQ(Body(lifted)["lifted"], json::array({"login"}));
  EXPECT_EQ(Body(Http(a.admin_port(), "GET", "/v1/clients/d:mallory/blocks"))["blocks"].size(), 0u);
  EXPECT_EQ(Check(a, login).status, 200);
  // Blocked again, and left to end by itself: 3 s later the client is back.
  ASSERT_EQ(exceed().status, 429);
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(Check(b, login).status, 429);
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(Check(b, login).status, 200);
}

// Reserve 100 on one instance, settle the actual cost (1..300) on the other,
// 200 requests from 8 threads: the bucket ends exactly the sum of the
// actual costs below its capacity.
TEST(SettleDaemon, ReservationsSettledOnEitherInstanceAddUpExactly) {
  ratelimit::testing::RedisServer redis;
  const std::string config = Config();
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();
  const std::string reserve =
      R"({"key": "llm:acme", "cost": 100, "limit": "tokens", "reserve": true})";
  std::atomic<int64_t> total{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < 200; i += 8) {
        const Daemon& checker = i % 2 == 0 ? a : b;
        const Daemon& settler = i % 2 == 0 ? b : a;
        HttpResponse c = Check(checker, reserve);
        json cj = Body(c);
        if (c.status != 200 || !cj.contains("reservation")) {
          ++failures;
          continue;
        }
        const int64_t actual = 1 + (i * 37) % 300;
        const json s = {{"reservation", cj["reservation"]["id"]}, {"cost", actual}};
        HttpResponse r = Http(settler.port(), "POST", "/v1/settle",
                              {{"Content-Type", "application/json"}}, s.dump());
        if (r.status != 200) {
          ++failures;
          continue;
        }
        total += actual;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0) << a.Log() << b.Log();
  int64_t expected = 0;
  for (int i = 0; i < 200; ++i) expected += 1 + (i * 37) % 300;
  EXPECT_EQ(total.load(), expected);
  HttpResponse peek = Check(a, R"({"key": "llm:acme", "cost": 0, "limit": "tokens"})");
  EXPECT_EQ(Body(peek)["remaining"].get<int64_t>(), 100000 - expected) << peek.body;
}

// Redis loses the secret (FLUSHALL; an empty restart alike). An instance
// that held one offers it again when it next signs (a second or more after
// it last asked), so that an instance that never asked takes the same one
// and settles reservations made before; an instance whose secret verifies
// no id asks Redis again, takes the one another instance set meanwhile, and
// still accepts its old one.
TEST(SettleDaemon, ReservationsStillSettleOnEitherInstanceAfterRedisLostTheSecret) {
  ratelimit::testing::RedisServer redis;
  const std::string config = Config();
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();
  auto reserve = [](const Daemon& d) {
    HttpResponse c = Check(d, R"({"key": "k", "cost": 10, "limit": "tokens", "reserve": true})");
    EXPECT_EQ(c.status, 200) << c.body;
    return c.status == 200 ? Body(c)["reservation"]["id"].get<std::string>() : std::string();
  };
  // The settlement's status, and its body and both logs if it is not 200.
  auto settle = [&](const Daemon& d, const std::string& id) {
    HttpResponse r = Http(d.port(), "POST", "/v1/settle", {{"Content-Type", "application/json"}},
                          json{{"reservation", id}, {"cost", 5}}.dump());
    if (r.status != 200) ADD_FAILURE() << r.status << " " << r.body << a.Log() << b.Log();
    return r.status;
  };
  const std::string before = reserve(a);  // a sets the secret
  ASSERT_EQ(redis.Cli("FLUSHALL"), "OK");
  std::this_thread::sleep_for(milliseconds(1100));
  const std::string again = reserve(a);  // a offers its secret again: Redis holds it
  const std::string on_b = reserve(b);   // b's first: the same secret
  EXPECT_EQ(settle(b, before), 200);
  EXPECT_EQ(settle(a, on_b), 200);

  // Lost again, and an instance that never asked sets a new one first.
  ASSERT_EQ(redis.Cli("FLUSHALL"), "OK");
  Daemon c({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(c.started()) << c.Log();
  const std::string on_c = reserve(c);
  EXPECT_EQ(settle(a, on_c), 200);        // a asks again, takes c's
  EXPECT_EQ(settle(a, again), 200);       // and still accepts its old one
  EXPECT_EQ(settle(c, reserve(a)), 200);  // a signs with c's now
  std::string forged = reserve(c);
  forged[10] = forged[10] == 'A' ? 'B' : 'A';
  HttpResponse refused =
      Http(a.port(), "POST", "/v1/settle", {}, json{{"reservation", forged}, {"cost", 5}}.dump());
  EXPECT_EQ(refused.status, 400) << refused.body;
}

TEST(SettleDaemon, AReservationSettlesOnceBeforeItExpiresAndCannotBeForged) {
  ratelimit::testing::RedisServer redis;
  const std::string config = Config();
  Daemon a({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started()) << a.Log();
  HttpResponse c = Check(a, R"({"key": "k", "cost": 1000, "limit": "tokens", "reserve": true})");
  ASSERT_EQ(c.status, 200) << c.body;
  const json res = Body(c)["reservation"];
  EXPECT_EQ(res["cost"], 1000);
  EXPECT_EQ(res["expires_in_ms"], 300000);
  const std::string id = res["id"];
  auto settle = [&](const std::string& rid, int64_t cost) {
    return Http(a.port(), "POST", "/v1/settle", {{"Content-Type", "application/json"}},
                json{{"reservation", rid}, {"cost", cost}}.dump());
  };
  HttpResponse first = settle(id, 250);  // a refund of 750
  ASSERT_EQ(first.status, 200) << first.body;
  const json fj = Body(first);
  EXPECT_EQ(fj["reserved"], 1000);
  EXPECT_EQ(fj["difference"], -750);
  EXPECT_EQ(fj["state"]["remaining"], 100000 - 250);
  HttpResponse again = settle(id, 0);
  EXPECT_EQ(again.status, 409);
  EXPECT_NE(again.body.find("settled already"), std::string::npos) << again.body;
  std::string forged = id;
  forged[10] = forged[10] == 'A' ? 'B' : 'A';
  EXPECT_EQ(settle(forged, 0).status, 400);
  // Expired: it stands at its reserved cost.
  HttpResponse quick = Check(
      a, R"({"key": "k", "cost": 10, "limit": "tokens", "reserve": true, "reserve_ttl": "1ms"})");
  ASSERT_EQ(quick.status, 200) << quick.body;
  std::this_thread::sleep_for(milliseconds(5));
  HttpResponse late = settle(Body(quick)["reservation"]["id"], 0);
  EXPECT_EQ(late.status, 409);
  EXPECT_NE(late.body.find("reserved cost"), std::string::npos) << late.body;
  // A debit past the bucket: a debt, and checks wait for it.
  HttpResponse big =
      Check(a, R"({"key": "d", "cost": 100000, "limit": "tokens", "reserve": true})");
  ASSERT_EQ(big.status, 200);
  HttpResponse debt = settle(Body(big)["reservation"]["id"], 100500);
  ASSERT_EQ(debt.status, 200) << debt.body;
  EXPECT_FALSE(Body(debt)["state"]["allowed"].get<bool>());
  HttpResponse waits = Check(a, R"({"key": "d", "limit": "tokens"})");
  EXPECT_EQ(waits.status, 429);
  EXPECT_EQ(waits.Header("Retry-After"), "50100");  // 501 tokens at 100 s each
  EXPECT_EQ(Http(a.port(), "POST", "/v1/check/batch", {},
                 R"({"checks": [{"key": "k", "limit": "tokens", "reserve": true}]})")
                    .body.find("'reserve' is for POST /v1/check only") != std::string::npos,
            true);
}

// With failure_mode local, a settlement Redis could not take went to the
// instance's local fallback, and its once-mark with it: Redis, back with its
// state (AOF), settled the same reservation again. A settlement corrects
// what the check took from Redis, and the fallback took nothing: it is now
// refused (503, Retry-After) until Redis takes it, once.
TEST(SettleDaemon, ASettlementAppliedLocallyIsNotAppliedAgainOnceRedisIsBack) {
  ratelimit::testing::RedisServer redis({.args = {"--appendonly", "yes"}});
  Daemon a({"--config", Config("store: {type: redis, url: \"" + redis.url() +
                               "\", failure_mode: local, reconnect_max_backoff: 200ms}\n")});
  ASSERT_TRUE(a.started()) << a.Log();
  HttpResponse c = Check(a, R"({"key": "k", "cost": 4000, "limit": "tokens", "reserve": true})");
  ASSERT_EQ(c.status, 200) << c.body;
  const std::string settle =
      json{{"reservation", Body(c)["reservation"]["id"]}, {"cost", 0}}.dump();
  auto settled = [&] {
    return Http(a.port(), "POST", "/v1/settle", {{"Content-Type", "application/json"}}, settle);
  };
  redis.Stop();
  HttpResponse down = settled();
  EXPECT_EQ(down.status, 503) << down.body;
  EXPECT_EQ(down.Header("Retry-After"), "1");
  redis.Restart();  // its state kept (AOF): the reservation's 4000 still taken
  // Until the instance decides on Redis again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (Body(Check(a, R"({"key": "probe", "limit": "tokens"})"))["degraded"].get<bool>()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << a.Log();
    std::this_thread::sleep_for(milliseconds(50));
  }
  HttpResponse back = settled();  // the caller's retry: applied on Redis, once
  ASSERT_EQ(back.status, 200) << back.body << a.Log();
  EXPECT_FALSE(Body(back)["state"]["degraded"].get<bool>()) << back.body;
  EXPECT_EQ(Body(back)["difference"], -4000);
  EXPECT_EQ(Body(back)["state"]["remaining"], 100000) << back.body;
  HttpResponse again = settled();
  EXPECT_EQ(again.status, 409) << again.body;
  EXPECT_NE(again.body.find("settled already"), std::string::npos) << again.body;
}

// Reservation ids were refused past 8192 characters, but a key may be up to
// store.max_key_length (65536) long and a check may name inline limits: a
// reservation on an 8192-byte key was issued and could never be settled
// (400 "not a reservation this deployment issued"). Now every id that fits in
// a settle body settles, and a check whose id would not fit is refused (400)
// before anything is taken.
TEST(DecisionApi, AReservationWithTheLongestKeySettles) {
  ratelimit::testing::RedisServer redis;
  Daemon a({"--config", Config("store: {max_key_length: 65536}\n"), "--redis", redis.url()});
  ASSERT_TRUE(a.started()) << a.Log();
  json limits = json::array({"tokens"});
  for (int i = 0; i < 15; ++i) {  // 16 limits: the most a check names
    limits.push_back({{"name", "t" + std::to_string(i)},
                      {"algorithm", "token_bucket"},
                      {"capacity", 100000},
                      {"refill_per_second", 1}});
  }
  const std::string key(8192, 'k');
  HttpResponse c =
      Check(a, json{{"key", key}, {"cost", 1000}, {"limits", limits}, {"reserve", true}}.dump());
  ASSERT_EQ(c.status, 200) << c.body.substr(0, 500);
  const std::string id = Body(c)["reservation"]["id"];
  EXPECT_GT(id.size(), 8192u);
  HttpResponse settled =
      Http(a.port(), "POST", "/v1/settle", {{"Content-Type", "application/json"}},
           json{{"reservation", id}, {"cost", 250}}.dump());
  ASSERT_EQ(settled.status, 200) << settled.body.substr(0, 500);
  EXPECT_EQ(Body(settled)["difference"], -750);
  EXPECT_EQ(Body(settled)["state"]["remaining"], 100000 - 250);
  // A key whose id a 64 KiB settle body cannot carry: refused, nothing taken.
  const std::string longest(49500, 'x');
  HttpResponse refused = Check(
      a, json{{"key", longest}, {"cost", 1000}, {"limit", "tokens"}, {"reserve", true}}.dump());
  EXPECT_EQ(refused.status, 400);
  EXPECT_NE(refused.body.find("server.max_body_bytes (65536)"), std::string::npos)
      << refused.body.substr(0, 500);
  HttpResponse after = Check(a, json{{"key", longest}, {"limit", "tokens"}}.dump());
  ASSERT_EQ(after.status, 200);
  EXPECT_EQ(Body(after)["remaining"], 100000 - 1);
}

}  // namespace
}  // namespace rltest
