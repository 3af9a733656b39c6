// ratelimitd on a real Redis (--redis): state shared by two daemons, and the
// failure modes when Redis is down. A missing redis-server is a failure.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

extern char** environ;

namespace rltest {
namespace {

class RedisServer {
 public:
  RedisServer() : port_(FreePort()), dir_(MakeTempDir()) {
    std::vector<std::string> args = {"/usr/bin/redis-server",
                                     "--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--dir",
                                     dir_};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir_ + "/redis.log").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 200 && pid_ > 0; ++i) {
      if (ReadFile(dir_ + "/redis.log").find("Ready to accept") != std::string::npos) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  bool running() const { return pid_ > 0; }

 private:
  int port_;
  std::string dir_;
  pid_t pid_ = -1;
};

int Ping(int port, const std::string& key, HttpResponse* out = nullptr) {
  HttpResponse r = Http(port, "GET", "/api/ping", {{"X-API-Key", key}});
  if (out != nullptr) *out = r;
  return r.status;
}

TEST(Redis, TwoDaemonsShareOneLimit) {
  ASSERT_EQ(::access("/usr/bin/redis-server", X_OK), 0) << "redis-server is required";
  RedisServer redis;
  ASSERT_TRUE(redis.running());
  Daemon a({"--redis", redis.url()});
  Daemon b({"--redis", redis.url()});
  ASSERT_TRUE(a.started()) << a.Log();
  ASSERT_TRUE(b.started()) << b.Log();
  std::vector<int> codes;
  for (int i = 0; i < 3; ++i) codes.push_back(Ping(a.port(), "shared"));
  for (int i = 0; i < 3; ++i) codes.push_back(Ping(b.port(), "shared"));
  EXPECT_EQ(codes, (std::vector<int>{200, 200, 200, 200, 200, 429})) << a.Log() << b.Log();
  EXPECT_EQ(Ping(a.port(), "someone-else"), 200);
}

// 200 concurrent requests spread over two daemons sharing one Redis: exactly
// the capacity is allowed (the decision is atomic inside Redis). One daemon
// has one I/O thread, which then runs its Redis client too.
TEST(Redis, TwoHundredConcurrentRequestsOverTwoDaemonsAllowExactlyTheCapacity) {
  RedisServer redis;
  ASSERT_TRUE(redis.running());
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/one.yaml", "server:\n  threads: 1\n");
  Daemon a({"--redis", redis.url()});
  Daemon b({"--config", dir + "/one.yaml", "--redis", redis.url()});
  ASSERT_TRUE(a.started()) << a.Log();
  ASSERT_TRUE(b.started()) << b.Log();
  const std::string body =
      R"({"key": "race", "limits": [{"name": "burst", "algorithm": "token_bucket",)"
      R"( "capacity": 10, "refill_per_second": 0.001}]})";
  std::atomic<int> allowed{0}, denied{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 200; ++i) {
    threads.emplace_back([&, i] {
      const int port = i % 2 == 0 ? a.port() : b.port();
      HttpResponse r =
          Http(port, "POST", "/v1/check", {{"Content-Type", "application/json"}}, body);
      if (r.status == 200)
        allowed.fetch_add(1);
      else if (r.status == 429)
        denied.fetch_add(1);
      else
        other.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 10);
  EXPECT_EQ(denied.load(), 190);
  EXPECT_EQ(other.load(), 0) << a.Log() << b.Log();
}

TEST(Redis, FailureModesWhenRedisIsDown) {
  const std::string dead = "redis://127.0.0.1:" + std::to_string(FreePort());
  {
    Daemon d({"--redis", dead, "--failure-mode", "open"});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r;
    for (int i = 0; i < 7; ++i) EXPECT_EQ(Ping(d.port(), "k", &r), 200);
    EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
  }
  {
    Daemon d({"--redis", dead, "--failure-mode", "closed"});
    ASSERT_TRUE(d.started()) << d.Log();
    HttpResponse r;
    EXPECT_EQ(Ping(d.port(), "k", &r), 503);
    EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
  }
  {
    Daemon d({"--redis", dead, "--failure-mode", "local"});
    ASSERT_TRUE(d.started()) << d.Log();
    std::vector<int> codes;
    HttpResponse r;
    for (int i = 0; i < 7; ++i) codes.push_back(Ping(d.port(), "k", &r));
    EXPECT_EQ(codes, (std::vector<int>{200, 200, 200, 200, 200, 429, 429}));
    EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
    EXPECT_NE(d.Log().find("store error"), std::string::npos);
  }
}

// The failure mode set per route and per limit is the one applied: with Redis
// down, a store-wide `open` is overridden by a route's `closed` and by one
// limit's `local` (at limit / expected_instances), and every such answer is
// marked degraded.
TEST(Redis, PerRouteAndPerLimitFailureModesWhenRedisIsDown) {
  TestUpstream upstream;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "server: {upstream: http://127.0.0.1:" + std::to_string(upstream.port()) +
                "}\n"
                "store: {type: redis, url: \"redis://127.0.0.1:" +
                std::to_string(FreePort()) +
                "\", failure_mode: open, expected_instances: 2}\n"
                "limits: {api: {algorithm: token_bucket, capacity: 6, refill_per_second: 0.001}}\n"
                "routes:\n"
                "  - {name: pay, path: /pay, failure_mode: closed, limits: [api]}\n"
                "  - {name: search, path: /search, limits: [{name: api, failure_mode: local}]}\n"
                "  - {name: rest, path: /, limits: [api]}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  auto codes = [&](const std::string& path, HttpResponse* last) {
    std::vector<int> out;
    for (int i = 0; i < 5; ++i) {
      *last = Http(d.port(), "GET", path, {{"X-API-Key", "k"}});
      out.push_back(last->status);
    }
    return out;
  };
  HttpResponse r;
  // Store-wide open: everything passes.
  EXPECT_EQ(codes("/other", &r), (std::vector<int>{200, 200, 200, 200, 200})) << d.Log();
  EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
  // The route's closed: refused with closed_status, never forwarded.
  const int forwarded = upstream.requests();
  EXPECT_EQ(codes("/pay", &r), (std::vector<int>{503, 503, 503, 503, 503}));
  EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
  EXPECT_EQ(upstream.requests(), forwarded);
  // The limit's local: capacity 6 over 2 expected instances = 3 here.
  EXPECT_EQ(codes("/search", &r), (std::vector<int>{200, 200, 200, 429, 429}));
  EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
}

// A request denied by a later group (a client over its own burst) had
// already taken from the route's per-IP login limit, on Redis too: key-a's
// two denials drained `login`, and key-b behind the same IP was refused
// though one login had been let through. Now they give it back (Lua settle).
TEST(Redis, ARequestDeniedByALaterGroupLeavesEarlierGroupsUntouched) {
  ASSERT_EQ(::access("/usr/bin/redis-server", X_OK), 0) << "redis-server is required";
  RedisServer redis;
  ASSERT_TRUE(redis.running());
  TestUpstream upstream;
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "server: {upstream: http://127.0.0.1:" + std::to_string(upstream.port()) +
                "}\n"
                "store: {type: redis, url: \"" +
                redis.url() +
                "\"}\n"
                "limits: {burst: {algorithm: token_bucket, capacity: 1, refill_per_second: "
                "0.001}}\n"
                "plans: {p: {limits: []}}\n"
                "api_keys: {key-a: p, key-b: p, key-c: p, key-d: p}\n"
                "global: [burst]\n"
                "routes:\n"
                "  - {name: login, methods: [POST], path: /login, match: exact, key_by: ip,\n"
                "     limits: [{name: login, algorithm: fixed_window, limit: 3, window: 1h}]}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  auto login = [&](const std::string& key) {
    return Http(d.port(), "POST", "/login", {{"X-API-Key", key}}).status;
  };
  EXPECT_EQ(login("key-a"), 200);
  EXPECT_EQ(login("key-a"), 429);  // its own burst
  EXPECT_EQ(login("key-a"), 429);
  EXPECT_EQ(login("key-b"), 200);  // two logins of three
  EXPECT_EQ(login("key-c"), 200);  // three
  HttpResponse r = Http(d.port(), "POST", "/login", {{"X-API-Key", "key-d"}});
  EXPECT_EQ(r.status, 429);
  EXPECT_NE(r.body.find("login"), std::string::npos) << r.body;
  EXPECT_EQ(upstream.requests(), 3);
}

}  // namespace
}  // namespace rltest
