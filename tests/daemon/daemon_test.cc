// The decision API contract, the embedded default, the header dialects and
// the server's bounds, against the real ratelimitd binary.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness.h"
#include "json_calls.h"
#include "support/redis_server.h"

namespace rltest {
namespace {

using nlohmann::json;

const char* kBurst =
    R"({"name": "burst", "algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5})";

TEST(EmbeddedDefault, SevenPingsThenAnotherKey) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  std::vector<int> codes;
  std::vector<std::string> remaining;
  HttpResponse last;
  for (int i = 0; i < 7; ++i) {
    last = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "team-a"}});
    codes.push_back(last.status);
    remaining.push_back(last.Header("RateLimit-Remaining"));
  }
  EXPECT_EQ(codes, (std::vector<int>{200, 200, 200, 200, 200, 429, 429}));
  EXPECT_EQ(remaining, (std::vector<std::string>{"4", "3", "2", "1", "0", "0", "0"}));
  EXPECT_EQ(last.Header("RateLimit-Limit"), "5");
  EXPECT_EQ(last.Header("Retry-After"), "1");
  // Denied: the reset is when more quota comes (Retry-After), not the 5 s
  // until the bucket is full.
  EXPECT_EQ(last.Header("RateLimit-Reset"), "1");
  EXPECT_EQ(last.Header("Cache-Control"), "no-store");
  EXPECT_EQ(last.Header("Content-Type"), "application/problem+json");
  json p = Body(last);
  EXPECT_EQ(p["type"], "https://iana.org/assignments/http-problem-types#quota-exceeded");
  EXPECT_EQ(p["status"], 429);
  EXPECT_EQ(p["title"], "Too Many Requests");
  EXPECT_EQ(p["limit"], "ping");
  EXPECT_EQ(p["instance"], "/api/ping");
  EXPECT_EQ(p["retry_after_seconds"], 1);
  EXPECT_EQ(p["violated-policies"], json::array({"ping"}));
  EXPECT_EQ(p["detail"], "limit 'ping' exceeded: retry in 1 s");

  HttpResponse other = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "team-b"}});
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(Body(other), json({{"pong", true}}));
  EXPECT_EQ(other.Header("RateLimit-Remaining"), "4");
  EXPECT_NE(d.Log().find("\"msg\":\"denied\""), std::string::npos);
  EXPECT_EQ(d.Log().find("team-a"), std::string::npos) << "API keys must not be logged whole";
}

TEST(EmbeddedDefault, DemoPage) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  HttpResponse r = Http(d.port(), "GET", "/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Header("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r.body.find("Send 10 at once"), std::string::npos);
  EXPECT_NE(r.body.find("Send 1 per second for 8 s"), std::string::npos);
  EXPECT_EQ(r.body.find("cdn"), std::string::npos);
  EXPECT_EQ(Http(d.port(), "GET", "/nope").status, 404);
}

TEST(DecisionApi, Contract) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  HttpResponse r = Check(
      d.port(),
      std::string(R"({"key": "user:ada", "cost": 1, "limits": [)") + kBurst +
          R"(, {"name": "daily", "algorithm": "fixed_window", "limit": 1000, "window": "1d"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  json j = Body(r);
  EXPECT_EQ(j["allowed"], true);
  EXPECT_EQ(j["limit"], 10);
  EXPECT_EQ(j["remaining"], 9);
  EXPECT_EQ(j["retry_after_ms"], 0);
  EXPECT_EQ(j["reset_after_ms"], 200);
  EXPECT_EQ(j["degraded"], false);
  ASSERT_EQ(j["limits"].size(), 2u);
  EXPECT_EQ(j["limits"][0], json({{"name", "burst"},
                                  {"allowed", true},
                                  {"limit", 10},
                                  {"remaining", 9},
                                  {"retry_after_ms", 0},
                                  {"reset_after_ms", 200},
                                  {"delay_ms", 0}}));
  EXPECT_EQ(j["limits"][1]["name"], "daily");
  EXPECT_EQ(j["limits"][1]["limit"], 1000);
  EXPECT_EQ(j["limits"][1]["remaining"], 999);
  EXPECT_EQ(r.Header("RateLimit-Limit"), "10");
  EXPECT_EQ(r.Header("RateLimit-Remaining"), "9");
  EXPECT_EQ(r.Header("RateLimit-Reset"), "1");

  // cost 0 asks without consuming.
  j = Body(
      Check(d.port(), std::string(R"({"key": "user:ada", "cost": 0, "limit": )") + kBurst + "}"));
  EXPECT_EQ(j["allowed"], true);
  EXPECT_EQ(j["remaining"], 9);
  j = Body(
      Check(d.port(), std::string(R"({"key": "user:ada", "cost": 0, "limit": )") + kBurst + "}"));
  EXPECT_EQ(j["remaining"], 9);

  // Spend the rest, then a denial: 429, Retry-After, retry_after_ms rounded up.
  j = Body(
      Check(d.port(), std::string(R"({"key": "user:ada", "cost": 9, "limit": )") + kBurst + "}"));
  EXPECT_EQ(j["remaining"], 0);
  r = Check(d.port(), std::string(R"({"key": "user:ada", "limit": )") + kBurst + "}");
  EXPECT_EQ(r.status, 429);
  j = Body(r);
  EXPECT_EQ(j["allowed"], false);
  EXPECT_GT(j["retry_after_ms"].get<int>(), 100);
  EXPECT_LE(j["retry_after_ms"].get<int>(), 200);
  EXPECT_EQ(r.Header("Retry-After"), "1");
  EXPECT_EQ(r.Header("Cache-Control"), "no-store");
  // Logged under the admin API's name of a decision-API key: d:<key>.
  EXPECT_TRUE(
      d.WaitForLog(R"("msg":"denied","key":"d:user:ada","limit":"burst","path":"/v1/check")",
                   std::chrono::seconds(5)))
      << d.Log();

  // Named limits from the config (the embedded default defines "ping").
  r = Check(d.port(), R"({"key": "user:bob", "limits": ["ping"]})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(Body(r)["limits"][0]["name"], "ping");
  EXPECT_EQ(Body(r)["limit"], 5);
  r = Check(d.port(), R"({"key": "user:bob", "limit": "ping"})");
  EXPECT_EQ(Body(r)["remaining"], 3);
}

TEST(DecisionApi, Batch) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  HttpResponse r = Http(
      d.port(), "POST", "/v1/check/batch", {},
      std::string(R"({"checks": [{"key": "a", "limit": )") + kBurst +
          R"(}, {"key": "a", "cost": 1.5, "limit": "ping"}, {"key": "b", "limits": ["ping"], "cost": 5}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["results"][0]["remaining"], 9);
  EXPECT_EQ(j["results"][1]["error"]["status"], 400);
  EXPECT_EQ(j["results"][1]["error"]["detail"],
            "checks[1]: field 'cost' must be a non-negative integer");
  EXPECT_EQ(j["results"][2]["allowed"], true);
  EXPECT_EQ(j["results"][2]["remaining"], 0);

  std::string many = R"({"checks": [)";
  for (int i = 0; i < 101; ++i)
    many += std::string(i ? "," : "") + R"({"key": "k", "limit": "ping", "cost": 0})";
  r = Http(d.port(), "POST", "/v1/check/batch", {}, many + "]}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Body(r)["detail"], "field 'checks' has 101 entries; the maximum is 100");
}

TEST(DecisionApi, EveryBadRequestSaysWhy) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string tb = kBurst;
  struct Case {
    std::string body;
    std::string detail;  // prefix of the expected detail
  } cases[] = {
      {"{", "request body is not valid JSON: "},
      {"", "request body is not valid JSON: "},
      {R"({"key": "k", "cost": 1.5, "limit": )" + tb + "}",
       "field 'cost' must be a non-negative integer"},
      {R"({"key": "k", "cost": -1, "limit": )" + tb + "}",
       "field 'cost' must be a non-negative integer"},
      {R"({"key": "k", "cost": "1", "limit": )" + tb + "}",
       "field 'cost' must be a non-negative integer"},
      {R"({"key": "k", "cost": 1e400, "limit": )" + tb + "}", "request body is not valid JSON: "},
      {R"({"key": "k", "cost": NaN, "limit": )" + tb + "}", "request body is not valid JSON: "},
      {R"({"key": "k", "cots": 1, "limit": )" + tb + "}", "unknown field 'cots'"},
      {R"({"key": "k", "limit": {"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 5, "burst": 1}})",
       "limit: unknown field 'burst'"},
      {"{\"key\": \"a\xc3\x28\", \"limit\": " + tb + "}", "request body is not valid JSON: "},
      {R"({"key": ")" + std::string(513, 'k') + R"(", "limit": )" + tb + "}",
       "field 'key' is 513 bytes; the maximum is 512"},
      {R"({"key": "k", "limits": ["nope"]})", "limits[0]: unknown limit 'nope'"},
      {R"({"key": "k", "cost": 11, "limit": )" + tb + "}", "limit 'burst': "},
      {R"({"key": "k", "limit": {"algorithm": "fixed_window", "limit": 5, "window": "5 minutes"}})",
       "limit: field 'window': "},
      {"[1]", "a check must be a JSON object"},
  };
  for (const Case& c : cases) {
    HttpResponse r = Check(d.port(), c.body);
    EXPECT_EQ(r.status, 400) << c.body.substr(0, 80);
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
    json p = Body(r);
    ASSERT_TRUE(p.is_object()) << r.body;
    EXPECT_EQ(p["status"], 400);
    EXPECT_EQ(p["title"], "Bad Request");
    EXPECT_EQ(p["instance"], "/v1/check");
    EXPECT_EQ(p["detail"].get<std::string>().substr(0, c.detail.size()), c.detail) << p["detail"];
  }
  std::string many = R"({"key": "k", "limits": [)";
  for (int i = 0; i < 17; ++i) {
    many += std::string(i ? "," : "") + R"({"name": "l)" + std::to_string(i) +
            R"(", "algorithm": "fixed_window", "limit": 1, "window": "1s"})";
  }
  HttpResponse r = Check(d.port(), many + "]}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Body(r)["detail"], "field 'limits' has 17 entries; the maximum is 16");

  r = Http(d.port(), "GET", "/v1/check");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.Header("Allow"), "POST");
  EXPECT_EQ(Body(r)["detail"], "use POST for /v1/check");
  // The server still serves after all that.
  EXPECT_EQ(Check(d.port(), R"({"key": "ok", "limit": "ping"})").status, 200);
}

// The embedded default's ping route and limit, refilled once in 1000 s so
// that no number moves during a test.
std::string SlowPingConfig() {
  const std::string path = MakeTempDir() + "/ping.yaml";
  WriteFile(path, R"(server: {demo: true}
clients: {accept_unknown_api_keys: true}
limits: {ping: {algorithm: token_bucket, capacity: 5, refill_per_second: 0.001}}
routes:
  - {name: ping, methods: [GET], path: /api/ping, match: exact, limits: [ping]}
)");
  return path;
}

// A decision-API key lives under "d:<key>", apart from every key the rules
// form (docs/security.md, "Key isolation"): a public caller naming the API
// key client "k:victim" with the route's own limit drains only "d:k:victim",
// and the admin API reads and resets each under its own name.
void DecisionKeysStayApartFromTheRulesClients(const Daemon& d) {
  HttpResponse r = Check(d.port(), R"({"key": "k:victim", "limit": "ping", "cost": 5})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Check(d.port(), R"({"key": "k:victim", "limit": "ping"})").status, 429);
  r = Http(d.port(), "POST", "/v1/check/batch", {},
           R"({"checks": [{"key": "k:victim", "limit": "ping"}]})");
  EXPECT_EQ(Body(r)["results"][0]["allowed"], false) << r.body;
  HttpResponse ping = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "victim"}});
  EXPECT_EQ(ping.status, 200) << ping.body;
  EXPECT_EQ(ping.Header("RateLimit-Remaining"), "4");
  HttpResponse s = Http(d.admin_port(), "GET", "/v1/clients/d:k:victim/state");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(Body(s)["limits"][0]["remaining"], 0) << s.body;
  s = Http(d.admin_port(), "GET", "/v1/clients/k:victim/state");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(Body(s)["limits"][0]["remaining"], 4) << s.body;
  // Resetting the decision-API key gives it a full bucket and leaves the
  // API key's as it is.
  ASSERT_EQ(Http(d.admin_port(), "POST", "/v1/clients/d:k:victim/reset").status, 200);
  EXPECT_EQ(
      Body(Check(d.port(), R"({"key": "k:victim", "limit": "ping", "cost": 0})"))["remaining"], 5);
  EXPECT_EQ(
      Body(Http(d.admin_port(), "GET", "/v1/clients/k:victim/state"))["limits"][0]["remaining"], 4);
  // The "d:" comes on top of the documented key length: a key of
  // store.max_key_length (512) bytes is taken, one byte more is refused.
  const std::string longest(512, 'k');
  r = Check(d.port(), R"({"key": ")" + longest + R"(", "limit": "ping"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["remaining"], 4);
  r = Check(d.port(), R"({"key": ")" + longest + R"(k", "limit": "ping"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Body(r)["detail"], "field 'key' is 513 bytes; the maximum is 512");
}

TEST(DecisionApi, KeysStayApartFromTheRulesClients) {
  Daemon d({"--config", SlowPingConfig()});
  ASSERT_TRUE(d.started()) << d.Log();
  DecisionKeysStayApartFromTheRulesClients(d);
}

TEST(DecisionApi, KeysStayApartFromTheRulesClientsOnRedis) {
  ratelimit::testing::RedisServer redis;
  Daemon d({"--config", SlowPingConfig(), "--redis", redis.url()});
  ASSERT_TRUE(d.started()) << d.Log();
  DecisionKeysStayApartFromTheRulesClients(d);
  // Where each lives: the client part of the Redis keys (docs/configuration.md,
  // key_prefix). The reset above deleted the decision API's: take one again.
  EXPECT_EQ(redis.Cli("EXISTS", "rl:{d:k:victim}ping"), "0");
  ASSERT_EQ(Check(d.port(), R"({"key": "k:victim", "limit": "ping"})").status, 200);
  EXPECT_EQ(redis.Cli("EXISTS", "rl:{d:k:victim}ping"), "1");
  EXPECT_EQ(redis.Cli("EXISTS", "rl:{k:victim}ping"), "1");
}

TEST(Server, BoundsAnswerAndKeepServing) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  // Headers over 8 KiB -> 431.
  HttpResponse r =
      RawHttp(d.port(),
              "GET /api/ping HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n");
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(Body(r)["detail"], "request headers exceed 8192 bytes");
  // Body over 64 KiB -> 413 (announced by Content-Length).
  r = RawHttp(d.port(), "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n" +
                            std::string(1000, ' '));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(Body(r)["detail"], "request body exceeds 65536 bytes");
  // Garbage -> 400 and close.
  r = RawHttp(d.port(), "HELLO\x01 / HTTP/9\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
  r = RawHttp(d.port(), "GET / HTTP/1.1\r\nBad Header\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  // Keep-alive: two requests on one connection.
  r = RawHttp(d.port(),
              "GET /api/ping HTTP/1.1\r\nHost: x\r\nX-API-Key: ka\r\n\r\n"
              "GET /api/ping HTTP/1.1\r\nHost: x\r\nX-API-Key: ka\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("HTTP/1.1 200"), std::string::npos) << "second pipelined answer";
  EXPECT_EQ(Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "after"}}).status, 200);
}

// The session renders every answer itself (one buffer, one write): the
// framing rules it must keep for HTTP/1.0 and 1.1, HEAD and 204.
TEST(Server, AnswerFraming) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  // HTTP/1.0 asking for keep-alive: kept open, and said so; then HEAD on the
  // same connection (HTTP/1.0, no keep-alive): the length of the GET's body,
  // no body, and the connection closed.
  HttpResponse r =
      RawHttp(d.port(),
              "GET /api/ping HTTP/1.0\r\nX-API-Key: fr\r\nConnection: keep-alive\r\n\r\n"
              "HEAD /api/ping HTTP/1.0\r\nX-API-Key: fr\r\n\r\n");
  ASSERT_EQ(r.status, 200) << r.raw_head;
  EXPECT_EQ(r.raw_head.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << r.raw_head;
  EXPECT_EQ(r.Header("Connection"), "keep-alive");
  const size_t length = std::stoul(r.Header("Content-Length"));
  ASSERT_GE(r.body.size(), length);
  HttpResponse head = ParseResponse(r.body.substr(length));
  ASSERT_EQ(head.status, 200) << r.body;
  EXPECT_EQ(head.raw_head.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << head.raw_head;
  EXPECT_FALSE(head.Has("Connection")) << head.raw_head;
  EXPECT_EQ(head.Header("Content-Length"), std::to_string(length));
  EXPECT_EQ(head.body, "") << "HEAD must not carry a body";
  // HTTP/1.1 with Connection: close: said so, and closed.
  r = RawHttp(d.port(), "GET /api/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.Header("Connection"), "close");
  EXPECT_EQ(r.body.size(), std::stoul(r.Header("Content-Length")));
  // 204 (nginx auth_request, allowed): no Content-Length, no body; the
  // keep-alive connection serves the next request.
  r = RawHttp(
      d.port(),
      "GET /v1/auth HTTP/1.1\r\nHost: x\r\nX-Original-Method: GET\r\nX-Original-URI: /api/ping\r\n"
      "X-API-Key: fr204\r\n\r\n"
      "GET /api/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(r.status, 204) << r.raw_head;
  EXPECT_FALSE(r.Has("Content-Length")) << r.raw_head;
  EXPECT_FALSE(r.Has("Connection")) << r.raw_head;
  EXPECT_EQ(r.body.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << "the next answer follows at once";
}

// server.threads: 1 runs connections on the io_context's own executor, with
// no strand each: eight keep-alive clients at once must still be answered in
// full and counted exactly (one limit of 100 shared by all of them).
TEST(Server, OneThreadServesConcurrentKeepAliveClients) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "server:\n  threads: 1\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string body = R"({"key": "one-thread", "limits": [{"name": "shared", )"
                           R"("algorithm": "fixed_window", "limit": 100, "window": "1h"}]})";
  std::string request =
      "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  constexpr int kClients = 8, kEach = 25;
  std::string pipelined;
  for (int i = 0; i < kEach - 1; ++i) pipelined += request;
  pipelined += request.insert(request.find("\r\n\r\n"), "\r\nConnection: close");
  std::atomic<int> answers{0}, allowed{0}, denied{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&] {
      HttpResponse r = RawHttp(d.port(), pipelined);
      // RawHttp parses the first answer; the rest follow in its body.
      std::string rest = r.raw_head + "\r\n\r\n" + r.body;
      for (size_t at = rest.find("HTTP/1.1 "); at != std::string::npos;
           at = rest.find("HTTP/1.1 ", at + 1)) {
        const int status = std::atoi(rest.c_str() + at + 9);
        ++answers;
        if (status == 200) ++allowed;
        if (status == 429) ++denied;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(answers.load(), kClients * kEach) << d.Log();
  EXPECT_EQ(allowed.load(), 100);
  EXPECT_EQ(denied.load(), kClients * kEach - 100);
}

// The session's deadlines: a connection that sends nothing is closed at
// idle_timeout, so is a keep-alive connection idle after its answer, and a
// request that does not arrive whole within read_timeout is cut even though
// bytes keep coming. Meanwhile a busy connection is never cut: its deadline
// moves with every request.
TEST(Server, IdleAndReadDeadlines) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "server:\n  idle_timeout: 400ms\n  read_timeout: 600ms\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  using Clock = std::chrono::steady_clock;
  auto closed_after = [](int fd) {  // waits for EOF; how long it took
    const auto start = Clock::now();
    char byte;
    while (::recv(fd, &byte, 1, 0) > 0) {
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  };
  // Silent from the start.
  int fd = Connect(d.port());
  ASSERT_GE(fd, 0);
  int64_t ms = closed_after(fd);
  ::close(fd);
  EXPECT_GE(ms, 300);
  EXPECT_LE(ms, 2000);
  // Busy for 1.2 s (longer than both deadlines), then idle.
  fd = Connect(d.port());
  ASSERT_GE(fd, 0);
  std::string pending;
  const auto busy_until = Clock::now() + std::chrono::milliseconds(1200);
  int answers = 0;
  while (Clock::now() < busy_until) {
    ASSERT_TRUE(SendAll(fd, "GET /api/ping HTTP/1.1\r\nHost: x\r\nX-API-Key: busy\r\n\r\n"));
    ASSERT_NE(ReadResponse(fd, pending, std::chrono::seconds(2)).status, 0) << "cut while busy";
    ++answers;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(answers, 10);
  ms = closed_after(fd);
  ::close(fd);
  EXPECT_GE(ms, 300);
  EXPECT_LE(ms, 2000);
  // A head trickled one byte per 100 ms: cut at read_timeout, no answer.
  fd = Connect(d.port());
  ASSERT_GE(fd, 0);
  const std::string head =
      "GET /api/ping HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
  const auto start = Clock::now();
  bool cut = false;
  for (char c : head) {
    if (!SendAll(fd, std::string(1, c))) {
      cut = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    char byte;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      cut = true;
      break;
    }
    ASSERT_LT(n, 1) << "no answer is due to a request that never arrived whole";
  }
  ::close(fd);
  const int64_t cut_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  EXPECT_TRUE(cut);
  EXPECT_GE(cut_ms, 500);
  EXPECT_LE(cut_ms, 2500);
}

TEST(Server, HeaderDialects) {
  std::string dir = MakeTempDir();
  for (const char* dialect : {"structured", "legacy", "none", "draft06"}) {
    WriteFile(dir + "/c.yaml", std::string("server:\n  headers: ") + dialect + "\n");
    Daemon d({"--config", dir + "/c.yaml"});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r = Check(d.port(), std::string(R"({"key": "k", "limit": )") + kBurst + "}");
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string name = dialect;
    EXPECT_EQ(r.Has("RateLimit-Policy"), name == "structured");
    EXPECT_EQ(r.Has("RateLimit-Limit"), name == "draft06");
    EXPECT_EQ(r.Has("X-RateLimit-Limit"), name == "legacy");
    if (name == "structured") {
      EXPECT_EQ(r.Header("RateLimit-Policy"), "\"burst\";q=10;w=2");
      EXPECT_EQ(r.Header("RateLimit"), "\"burst\";r=9;t=1");
    }
    if (name == "legacy") {
      EXPECT_EQ(r.Header("X-RateLimit-Limit"), "10");
      EXPECT_EQ(r.Header("X-RateLimit-Remaining"), "9");
      EXPECT_EQ(r.Header("X-RateLimit-Reset"), "1");
    }
  }
}

TEST(Server, MaxConnections) {
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "server:\n  demo: true\n  max_connections: 2\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  // Two idle connections take the two places; a third is closed at once.
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    HttpResponse dummy;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(d.port()));
    a.sin_addr.s_addr = htonl(0x7f000001);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Http(d.port(), "GET", "/").status, 0);
  for (int fd : fds) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Http(d.port(), "GET", "/").status, 200);
}

TEST(Cli, FlagsAndCheckConfig) {
  std::string dir = MakeTempDir();
  auto run = [&](const std::string& args) {
    std::string cmd = std::string(RATELIMITD_PATH) + " " + args + " > " + dir + "/out 2>&1";
    int rc = std::system(cmd.c_str());
    return std::make_pair(WEXITSTATUS(rc), ReadFile(dir + "/out"));
  };
  WriteFile(dir + "/good.yaml", "server:\n  headers: legacy\n");
  WriteFile(dir + "/bad.yaml", "server:\n  headerz: legacy\n");
  auto [rc, out] = run("--check-config " + dir + "/good.yaml");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, "OK\n");
  std::tie(rc, out) = run("--check-config " + dir + "/bad.yaml");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("bad.yaml:2"), std::string::npos) << out;
  EXPECT_NE(out.find("headerz"), std::string::npos) << out;
  std::tie(rc, out) = run("--version");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out.rfind("ratelimitd ", 0), 0u);
  // The malloc the build chose (RL_ALLOCATOR; the sanitizer builds keep the
  // system's) is the one serving the process.
  EXPECT_NE(out.find("\nmalloc: " RL_DAEMON_ALLOCATOR), std::string::npos) << out;
  EXPECT_EQ(out.find("not serving"), std::string::npos) << out;
  std::tie(rc, out) = run("--help");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("--check-config"), std::string::npos);
  std::tie(rc, out) = run("--bogus");
  EXPECT_EQ(rc, 2);
  std::tie(rc, out) = run("--failure-mode sideways");
  EXPECT_EQ(rc, 2);
}

}  // namespace
}  // namespace rltest
