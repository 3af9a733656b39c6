// Metered gateway costs (issue 21 D) with two ratelimitd instances on one
// real Redis: 200 concurrent streamed requests, each reserving 1,000 tokens
// and reporting 200..2,000 in its last SSE event, half through each
// instance; what the bucket was charged is the sum of the usages exactly.
// (The bucket refills 0.01 token a second: a run of under 100 s leaves the
// whole-number count unchanged.)
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "support/redis_server.h"
#include "support/sse_upstream.h"

namespace rltest {
namespace {

using nlohmann::json;

// ratelimit_settlements_total{outcome} of one instance, or -1.
int64_t Settlements(const Daemon& d, const std::string& outcome) {
  HttpResponse m = Http(d.admin_port(), "GET", "/metrics");
  const std::string key = "ratelimit_settlements_total{outcome=\"" + outcome + "\"} ";
  const size_t at = m.body.find(key);
  return at == std::string::npos ? -1 : std::atoll(m.body.c_str() + at + key.size());
}

TEST(MeteredDaemon, TwoInstancesSettle200ConcurrentStreamsExactly) {
  ratelimit::testing::RedisServer redis;
  ratelimit::testing::SseUpstream upstream;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "server:\n  upstream: " + upstream.url() +
                "\n"
                "limits:\n"
                "  tokens: {algorithm: token_bucket, capacity: 300000, refill_per_second: 0.01}\n"
                "routes:\n"
                "  - name: chat\n    path: /sse\n    limits: [tokens]\n"
                "    cost: {reserve: 1000, settle_from: sse_last_event, "
                "field: usage.total_tokens}\n");
  Daemon a({"--config", dir + "/c.yaml", "--redis", redis.url()});
  Daemon b({"--config", dir + "/c.yaml", "--redis", redis.url()});
  ASSERT_TRUE(a.started()) << a.Log();
  ASSERT_TRUE(b.started()) << b.Log();

  constexpr int kRequests = 200;
  std::vector<int64_t> usage(kRequests);
  std::mt19937 rng(21);
  std::uniform_int_distribution<int64_t> pick(200, 2000);
  int64_t sum = 0;
  for (int64_t& u : usage) sum += (u = pick(rng));
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      const Daemon& d = i % 2 == 0 ? a : b;
      HttpResponse r = Http(d.port(), "GET", "/sse", {{"X-Usage", std::to_string(usage[i])}});
      const std::string last = "\"total_tokens\":" + std::to_string(usage[i]) + "}}";
      if (r.status == 200 && r.body.find(last) != std::string::npos &&
          r.body.ends_with("data: [DONE]\n\n")) {
        ok.fetch_add(1);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  ASSERT_EQ(ok.load(), kRequests);

  // Each instance counts its own settlements; together, every request.
  auto settled = [](const Daemon& d) { return Settlements(d, "settled"); };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (settled(a) + settled(b) < kRequests && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(settled(a) + settled(b), kRequests);
  HttpResponse s = Http(a.admin_port(), "GET", "/v1/clients/ip:127.0.0.1/state");
  ASSERT_EQ(s.status, 200) << s.body;
  json j = json::parse(s.body);
  EXPECT_EQ(j["limits"][0]["remaining"].get<int64_t>(), 300'000 - sum) << s.body;
}

// A request the route's concurrency limit refuses (429) never reached the
// upstream: its reservation is given back (outcome not_forwarded). It was
// kept: max_in_flight 1, a second request reserving 4,000 while the first
// (usage 100) streamed left 5,900 of 10,000 instead of 9,900.
TEST(MeteredDaemon, AConcurrencyRefusalRefundsTheReservation) {
  ratelimit::testing::SseUpstream upstream;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "server:\n  upstream: " + upstream.url() +
                "\n"
                "limits:\n"
                "  tokens: {algorithm: token_bucket, capacity: 10000, refill_per_second: 0.01}\n"
                "routes:\n"
                "  - name: chat\n    path: /sse\n    limits: [tokens]\n"
                "    concurrency: {max_in_flight: 1}\n"
                "    cost: {from_request_header: X-Estimate, settle_from: sse_last_event, "
                "field: usage.total_tokens}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  // The first request holds the only place: its first event has arrived.
  const int first = Connect(d.port());
  ASSERT_GE(first, 0);
  ASSERT_TRUE(SendAll(first,
                      "GET /sse HTTP/1.1\r\nHost: t\r\nX-Estimate: 100\r\nX-Usage: 100\r\n"
                      "X-Hold: 1\r\nConnection: close\r\n\r\n"));
  std::string got;
  ASSERT_TRUE(ratelimit::testing::ReadFirstEvent(first, got)) << got;
  HttpResponse refused =
      Http(d.port(), "GET", "/sse", {{"X-Estimate", "4000"}, {"X-Usage", "4000"}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  upstream.Release();
  char buf[4096];
  for (ssize_t n; (n = ::recv(first, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  ::close(first);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  auto count = [&](const std::string& outcome) { return Settlements(d, outcome); };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((count("settled") < 1 || count("not_forwarded") < 1) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(count("settled"), 1);
  EXPECT_EQ(count("not_forwarded"), 1);
  HttpResponse s = Http(d.admin_port(), "GET", "/v1/clients/ip:127.0.0.1/state");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(json::parse(s.body)["limits"][0]["remaining"].get<int64_t>(), 10'000 - 100) << s.body;
}

}  // namespace
}  // namespace rltest
