// Concurrency limits end to end (issue #10): real ratelimitd processes in
// front of an upstream that counts how many requests it holds at once, with
// the leases in a real Redis shared by two instances.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"
#include "support/redis_server.h"
#include "support/sse_upstream.h"

namespace rltest {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// An HTTP/1.1 upstream that holds each request for `hold` (/hang: 4 s) and
// records how many it held at once. One thread per connection.
class CountingUpstream {
 public:
  explicit CountingUpstream(milliseconds hold) : hold_(hold) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 128) != 0) {
      throw std::runtime_error("upstream: cannot listen");
    }
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] {
      while (!stop_) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        if (stop_) {
          ::close(c);
          break;
        }
        std::lock_guard lock(mu_);
        workers_.emplace_back([this, c] { Serve(c); });
      }
    });
  }
  ~CountingUpstream() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    acceptor_.join();
    std::lock_guard lock(mu_);
    for (auto& w : workers_) w.join();
  }
  int port() const { return port_; }
  int peak() const { return peak_; }
  int in_flight() const { return in_flight_; }
  int served() const { return served_; }

 private:
  void Serve(int c) {
    std::string buf;
    char tmp[4096];
    while (!stop_) {
      const size_t head_end = buf.find("\r\n\r\n");
      if (head_end == std::string::npos) {
        const ssize_t n = ::read(c, tmp, sizeof tmp);
        if (n <= 0) break;
        buf.append(tmp, static_cast<size_t>(n));
        continue;
      }
      const std::string target =
          buf.substr(buf.find(' ') + 1, buf.find(' ', buf.find(' ') + 1) - buf.find(' ') - 1);
      buf.erase(0, head_end + 4);  // the tests send no bodies
      const int now = ++in_flight_;
      int p = peak_;
      while (now > p && !peak_.compare_exchange_weak(p, now)) {
      }
      const auto until =
          Clock::now() + (target.rfind("/hang", 0) == 0 ? milliseconds(4000) : hold_);
      while (!stop_ && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
      --in_flight_;
      ++served_;
      const std::string res = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
      if (::write(c, res.data(), res.size()) < 0) break;
    }
    ::close(c);
  }

  milliseconds hold_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> in_flight_{0}, peak_{0}, served_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

std::string Config(int upstream_port, const std::string& concurrency) {
  return "server:\n  upstream: \"http://127.0.0.1:" + std::to_string(upstream_port) +
         "\"\n  threads: 2\nroutes:\n  - name: work\n    path: /\n    concurrency: " + concurrency +
         "\n";
}

std::string WriteConfig(const std::string& text) {
  const std::string path = MakeTempDir() + "/config.yaml";
  WriteFile(path, text);
  return path;
}

// `n` requests at once, alternating over `ports`; their answers in order.
std::vector<HttpResponse> Burst(const std::vector<int>& ports, int n, const std::string& target) {
  std::vector<HttpResponse> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready < n) std::this_thread::yield();
      out[static_cast<size_t>(i)] =
          Http(ports[static_cast<size_t>(i) % ports.size()], "GET", target);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

int Count(const std::vector<HttpResponse>& rs, int status) {
  int n = 0;
  for (const auto& r : rs) n += r.status == status ? 1 : 0;
  return n;
}

TEST(ConcurrencyDaemon, TwoInstancesOnRedisNeverExceedTheLimit) {
  ratelimit::testing::RedisServer redis;
  CountingUpstream upstream(milliseconds(1500));
  const std::string config =
      WriteConfig(Config(upstream.port(), "{max_in_flight: 3, lease_ttl: 10s}"));
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();

  std::vector<HttpResponse> rs = Burst({a.port(), b.port()}, 10, "/work");
  EXPECT_LE(upstream.peak(), 3);
  EXPECT_EQ(Count(rs, 200) + Count(rs, 429), 10);
  // All ten start together and each holds the upstream 1.5 s: three get in.
  // (A straggler may start after the first three ended: at most 6 by then.)
  EXPECT_GE(Count(rs, 200), 3);
  EXPECT_LE(Count(rs, 200), 6);
  EXPECT_EQ(upstream.served(), Count(rs, 200));
  for (const HttpResponse& r : rs) {
    if (r.status != 429) continue;
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
    EXPECT_NE(r.body.find("\"limit\":\"concurrency:work\""), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("\"max_in_flight\":3"), std::string::npos) << r.body;
    EXPECT_EQ(r.Header("Retry-After"), "1");
    EXPECT_EQ(r.Header("RateLimit-Limit"), "3");
    EXPECT_EQ(r.Header("RateLimit-Remaining"), "0");
    break;
  }
  // Every lease was released when its answer ended: all 3 places are free.
  EXPECT_EQ(redis.Cli("ZCARD", "rl:{ip:127.0.0.1}~c:work"), "0");
  rs = Burst({a.port(), b.port()}, 3, "/again");
  EXPECT_EQ(Count(rs, 200), 3);
  // The denials are counted per route class.
  HttpResponse m = Http(a.admin_port(), "GET", "/metrics");
  HttpResponse m2 = Http(b.admin_port(), "GET", "/metrics");
  EXPECT_NE((m.body + m2.body)
                .find("ratelimit_concurrency_denied_total{route=\"work\",reason=\"limit\"}"),
            std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_concurrency_in_flight{route=\"work\"} 0"), std::string::npos)
      << m.body;
}

TEST(ConcurrencyDaemon, LeasesOfAKilledInstanceExpire) {
  ratelimit::testing::RedisServer redis;
  CountingUpstream upstream(milliseconds(10));
  const std::string config =
      WriteConfig(Config(upstream.port(), "{max_in_flight: 3, lease_ttl: 1500ms}"));
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();

  // Three requests in the upstream through instance a: all places taken.
  std::vector<std::thread> hung;
  for (int i = 0; i < 3; ++i) hung.emplace_back([&] { Http(a.port(), "GET", "/hang"); });
  const auto taken = Clock::now();
  while (upstream.in_flight() < 3 && Clock::now() - taken < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  ASSERT_EQ(upstream.in_flight(), 3);
  EXPECT_EQ(Http(b.port(), "GET", "/work").status, 429);

  // a dies holding its leases; nobody releases them. They expire after
  // lease_ttl, and b's clients get the capacity back.
  a.Signal(SIGKILL);
  const auto killed = Clock::now();
  int status = 0;
  while (Clock::now() - killed < std::chrono::seconds(6)) {
    status = Http(b.port(), "GET", "/work").status;
    if (status == 200) break;
    EXPECT_EQ(status, 429);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(status, 200);
  // Not before the leases expired (1.5 s after they were taken).
  EXPECT_GE(Clock::now() - taken, milliseconds(1500));
  std::vector<HttpResponse> rs = Burst({b.port()}, 3, "/work");
  EXPECT_EQ(Count(rs, 200), 3);
  for (auto& t : hung) t.join();
}

// A streamed answer (an SSE or LLM token stream) that outlives lease_ttl
// keeps its place: the instance serving it renews its lease in Redis, so
// after 5 x lease_ttl the other instance still refuses a second request;
// once the stream has ended, the place is free.
TEST(ConcurrencyDaemon, AStreamLongerThanItsLeaseTtlKeepsItsPlace) {
  ratelimit::testing::RedisServer redis;
  ratelimit::testing::SseUpstream upstream;
  const std::string config =
      WriteConfig("server:\n  upstream: \"" + upstream.url() +
                  "\"\n  threads: 2\nroutes:\n  - name: chat\n    path: /sse\n"
                  "    concurrency: {max_in_flight: 1, lease_ttl: 100ms}\n");
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();
  const int stream = Connect(a.port());
  ASSERT_GE(stream, 0);
  ASSERT_TRUE(SendAll(stream,
                      "GET /sse HTTP/1.1\r\nHost: t\r\nX-Usage: 10\r\nX-Hold: 1\r\n"
                      "Connection: close\r\n\r\n"));
  std::string got;
  ASSERT_TRUE(ratelimit::testing::ReadFirstEvent(stream, got)) << got;
  std::this_thread::sleep_for(milliseconds(500));  // 5 x lease_ttl, streaming
  HttpResponse refused = Http(b.port(), "GET", "/sse", {{"X-Usage", "10"}});
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(redis.Cli("ZCARD", "rl:{ip:127.0.0.1}~c:chat"), "1");
  upstream.Release();
  char buf[4096];
  for (ssize_t n; (n = ::recv(stream, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  ::close(stream);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got;
  HttpResponse next = Http(b.port(), "GET", "/sse", {{"X-Usage", "10"}});
  EXPECT_EQ(next.status, 200) << next.body;
  HttpResponse m = Http(a.admin_port(), "GET", "/metrics");
  EXPECT_NE(m.body.find("ratelimit_concurrency_lease_lost_total{route=\"chat\"} 0"),
            std::string::npos)
      << m.body;
}

TEST(ConcurrencyDaemon, SequentialRequestsNeverFindTheirOwnLease) {
  // The answer goes out only after its lease is released in Redis: a client
  // that waits for each answer is never refused, on either instance.
  ratelimit::testing::RedisServer redis;
  CountingUpstream upstream(milliseconds(1));
  const std::string config = WriteConfig(Config(upstream.port(), "{max_in_flight: 1}"));
  Daemon a({"--config", config, "--redis", redis.url()});
  Daemon b({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(a.started() && b.started()) << a.Log() << b.Log();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(Http(i % 2 == 0 ? a.port() : b.port(), "GET", "/work").status, 200) << i;
  }
}

TEST(ConcurrencyDaemon, WaitModeHoldsRequestsUntilALeaseFrees) {
  CountingUpstream upstream(milliseconds(700));
  const std::string config = WriteConfig(
      Config(upstream.port(),
             "{max_in_flight: 2, lease_ttl: 30s, on_limit: wait, max_wait: 8s, max_waiting: 3}"));
  Daemon d({"--config", config});
  ASSERT_TRUE(d.started()) << d.Log();
  const auto start = Clock::now();
  std::vector<HttpResponse> rs = Burst({d.port()}, 6, "/work");
  const auto took = Clock::now() - start;
  // Two in the upstream, three wait their turn, the sixth finds the waiting
  // room full: 429 at once.
  EXPECT_LE(upstream.peak(), 2);
  EXPECT_EQ(Count(rs, 200), 5);
  EXPECT_EQ(Count(rs, 429), 1);
  EXPECT_GE(took, milliseconds(3 * 700));  // three rounds of two
  HttpResponse m = Http(d.admin_port(), "GET", "/metrics");
  EXPECT_NE(
      m.body.find("ratelimit_concurrency_denied_total{route=\"work\",reason=\"queue_full\"} 1"),
      std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("ratelimit_concurrency_waiting{route=\"work\"} 0"), std::string::npos);
}

// A shadow route's concurrency limit is counted and logged, never refuses
// nor holds a request back (here on_limit: wait), and its leases are
// released as any.
TEST(ConcurrencyDaemon, AShadowRoutesConcurrencyLimitNeverRefuses) {
  CountingUpstream upstream(milliseconds(500));
  const std::string config =
      WriteConfig("server:\n  upstream: \"http://127.0.0.1:" + std::to_string(upstream.port()) +
                  "\"\n  threads: 2\nroutes:\n  - name: work\n    path: /\n    shadow: true\n"
                  "    concurrency: {max_in_flight: 1, on_limit: wait, max_wait: 8s}\n");
  Daemon d({"--config", config});
  ASSERT_TRUE(d.started()) << d.Log();
  std::vector<HttpResponse> rs = Burst({d.port()}, 3, "/work");
  EXPECT_EQ(Count(rs, 200), 3);
  EXPECT_GE(upstream.peak(), 2);  // none waited for the one place
  EXPECT_TRUE(d.WaitForLog("shadow:concurrency:work", milliseconds(2000))) << d.Log();
  HttpResponse m = Http(d.admin_port(), "GET", "/metrics");
  const std::string shadow =
      "ratelimit_concurrency_denied_total{route=\"work\",reason=\"shadow\"} ";
  ASSERT_NE(m.body.find(shadow), std::string::npos) << m.body;
  EXPECT_EQ(m.body.find(shadow + "0"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("ratelimit_concurrency_denied_total{route=\"work\",reason=\"limit\"} 0"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("ratelimit_concurrency_in_flight{route=\"work\"} 0"), std::string::npos)
      << m.body;
}

TEST(ConcurrencyDaemon, DecisionApiAcquireAndRelease) {
  Daemon d({"--listen", "127.0.0.1:0"});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string acquire =
      R"({"key": "user:ada", "name": "upload", "max_in_flight": 1, "lease_ttl": "30s"})";
  HttpResponse r =
      Http(d.port(), "POST", "/v1/acquire", {{"Content-Type", "application/json"}}, acquire);
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t at = r.body.find("\"lease_id\":\"");
  ASSERT_NE(at, std::string::npos) << r.body;
  const std::string id = r.body.substr(at + 12, 32);
  EXPECT_NE(r.body.find("\"in_flight\":1"), std::string::npos) << r.body;
  r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("\"acquired\":false"), std::string::npos) << r.body;
  EXPECT_EQ(r.Header("Retry-After"), "1");
  const std::string release = R"({"key": "user:ada", "name": "upload", "lease_id": ")" + id + "\"}";
  r = Http(d.port(), "POST", "/v1/release", {}, release);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"released":true})");
  r = Http(d.port(), "POST", "/v1/release", {}, release);
  EXPECT_EQ(r.body, R"({"released":false})");
  EXPECT_EQ(Http(d.port(), "POST", "/v1/acquire", {}, acquire).status, 200);
  // Bad input: 400 problem+json naming the field; wrong method: 405.
  r = Http(d.port(), "POST", "/v1/acquire", {}, R"({"key": "k", "name": "x", "max_in_flight": 0})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
  EXPECT_NE(r.body.find("max_in_flight"), std::string::npos) << r.body;
  r = Http(d.port(), "POST", "/v1/release", {}, R"({"key": "k", "name": "x", "lease": "a"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown field 'lease'"), std::string::npos) << r.body;
  EXPECT_EQ(Http(d.port(), "GET", "/v1/acquire").status, 405);
}

// A decision-API lease lives under "d:<key>", apart from the keys the rules
// form: a caller naming a whole-route limit's key "~all" (or a client's
// identity) takes no place of the route's own concurrency limit.
void AcquiredLeasesStayApartFromTheRoutes(const Daemon& d, ratelimit::testing::RedisServer* redis) {
  const std::string acquire = R"({"key": "~all", "route": "work"})";
  HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  ASSERT_EQ(r.status, 200) << r.body;
  const size_t at = r.body.find("\"lease_id\":\"");
  ASSERT_NE(at, std::string::npos) << r.body;
  const std::string id = r.body.substr(at + 12, 32);
  // The route's one place is still free for its clients...
  HttpResponse work = Http(d.port(), "GET", "/work");
  EXPECT_EQ(work.status, 200) << work.body;
  // ...and the caller's own lease still counts against the caller.
  EXPECT_EQ(Http(d.port(), "POST", "/v1/acquire", {}, acquire).status, 429);
  if (redis != nullptr) {
    EXPECT_EQ(redis->Cli("ZCARD", "rl:{d:~all}~c:work"), "1");
    EXPECT_EQ(redis->Cli("ZCARD", "rl:{~all}~c:work"), "0");
  }
  r = Http(d.port(), "POST", "/v1/release", {},
           R"({"key": "~all", "route": "work", "lease_id": ")" + id + "\"}");
  EXPECT_EQ(r.body, R"({"released":true})");
  // The "d:" comes on top of the documented key length: a key of
  // store.max_key_length (512) bytes is taken, one byte more is refused.
  const std::string longest(512, 'k');
  r = Http(d.port(), "POST", "/v1/acquire", {},
           R"({"key": ")" + longest + R"(", "name": "x", "max_in_flight": 1})");
  EXPECT_EQ(r.status, 200) << r.body;
  r = Http(d.port(), "POST", "/v1/acquire", {},
           R"({"key": ")" + longest + R"(k", "name": "x", "max_in_flight": 1})");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("field 'key' is 513 bytes; the maximum is 512"), std::string::npos)
      << r.body;
}

TEST(ConcurrencyDaemon, DecisionApiLeasesStayApartFromTheRoutes) {
  CountingUpstream upstream(milliseconds(1));
  const std::string config =
      WriteConfig(Config(upstream.port(), "{max_in_flight: 1, per: route, lease_ttl: 1h}"));
  {
    Daemon d({"--config", config});
    ASSERT_TRUE(d.started()) << d.Log();
    AcquiredLeasesStayApartFromTheRoutes(d, nullptr);
  }
  ratelimit::testing::RedisServer redis;
  Daemon d({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(d.started()) << d.Log();
  AcquiredLeasesStayApartFromTheRoutes(d, &redis);
}

// The lease id of a /v1/acquire answer ("" when it has none).
std::string LeaseId(const HttpResponse& r) {
  const size_t at = r.body.find("\"lease_id\":\"");
  if (at == std::string::npos) return "";
  const size_t end = r.body.find('"', at + 12);
  return r.body.substr(at + 12, end - at - 12);
}

// A caller's heartbeat: a lease renewed before its lease_ttl passed outlives
// it, each renewal for its own lease_ttl from now (also shorter); one expired
// or released is not held again (renewed: false: acquire again).
void RenewedLeasesOutliveTheirTtl(const Daemon& d, ratelimit::testing::RedisServer* redis) {
  const std::string acquire =
      R"({"key": "ada", "name": "upload", "max_in_flight": 1, "lease_ttl": "1500ms"})";
  HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  const auto acquired = Clock::now();  // the lease expires before acquired + 1.5 s
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = LeaseId(r);
  ASSERT_EQ(id.size(), 32u) << r.body;
  auto renew = [&](const std::string& lease, const std::string& ttl) {
    const std::string with_ttl = ttl.empty() ? "" : R"(, "lease_ttl": ")" + ttl + "\"";
    return Http(
        d.port(), "POST", "/v1/renew", {{"Content-Type", "application/json"}},
        R"({"key": "ada", "name": "upload", "lease_id": ")" + lease + "\"" + with_ttl + "}");
  };
  r = renew(id, "1h");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, R"({"renewed":true,"lease_ttl_ms":3600000})");
  std::this_thread::sleep_until(acquired + milliseconds(2000));  // past its first lease_ttl
  r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  EXPECT_EQ(r.status, 429) << "the renewed lease still holds the one place: " << r.body;
  if (redis != nullptr) {
    EXPECT_EQ(redis->Cli("ZCARD", "rl:{d:ada}~c:upload"), "1");
  }
  // Without lease_ttl: the default of /v1/acquire.
  EXPECT_EQ(renew(id, "").body, R"({"renewed":true,"lease_ttl_ms":30000})");
  // Shorter: the expiry moves to now + 200 ms, not kept at the later one.
  EXPECT_EQ(renew(id, "200ms").body, R"({"renewed":true,"lease_ttl_ms":200})");
  const auto renewed = Clock::now();
  std::string next;
  while (next.empty() && Clock::now() - renewed < std::chrono::seconds(10)) {
    r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
    if (r.status == 200)
      next = LeaseId(r);
    else
      std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_EQ(next.size(), 32u) << "the place never freed: " << r.body;
  // Expired, its place taken: not renewed, not held again.
  r = renew(id, "1h");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, R"({"renewed":false})");
  if (redis != nullptr) {
    EXPECT_EQ(redis->Cli("ZCARD", "rl:{d:ada}~c:upload"), "1");
  }
  // Released: not renewed either.
  r = Http(d.port(), "POST", "/v1/release", {},
           R"({"key": "ada", "name": "upload", "lease_id": ")" + next + "\"}");
  EXPECT_EQ(r.body, R"({"released":true})");
  EXPECT_EQ(renew(next, "1h").body, R"({"renewed":false})");
  EXPECT_EQ(Http(d.port(), "POST", "/v1/acquire", {}, acquire).status, 200);
}

TEST(ConcurrencyDaemon, DecisionApiRenewedLeasesOutliveTheirTtl) {
  Daemon d({"--listen", "127.0.0.1:0"});
  ASSERT_TRUE(d.started()) << d.Log();
  RenewedLeasesOutliveTheirTtl(d, nullptr);
}

TEST(ConcurrencyDaemon, DecisionApiRenewedLeasesOutliveTheirTtlOnRedis) {
  ratelimit::testing::RedisServer redis;
  Daemon d({"--listen", "127.0.0.1:0", "--redis", redis.url()});
  ASSERT_TRUE(d.started()) << d.Log();
  RenewedLeasesOutliveTheirTtl(d, &redis);
}

// A lease taken by route is renewed by route, for the route's lease_ttl; a
// reload that removed the route since leaves its holder renewing it (for the
// default lease_ttl) and releasing it.
void RenewByRouteSurvivesItsRemoval(Daemon& d, const std::string& config, int upstream_port) {
  const std::string by_route = R"({"key": "ada", "route": "work")";
  HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, by_route + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string lease = R"(, "lease_id": ")" + LeaseId(r) + "\"}";
  r = Http(d.port(), "POST", "/v1/renew", {}, by_route + lease);
  EXPECT_EQ(r.body, R"({"renewed":true,"lease_ttl_ms":3600000})");
  WriteFile(config, "server:\n  upstream: \"http://127.0.0.1:" + std::to_string(upstream_port) +
                        "\"\nroutes:\n  - name: other\n    path: /\n");
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", milliseconds(5000))) << d.Log();
  r = Http(d.port(), "POST", "/v1/acquire", {}, by_route + "}");
  EXPECT_EQ(r.status, 400) << "the route is gone: " << r.body;
  r = Http(d.port(), "POST", "/v1/renew", {}, by_route + lease);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, R"({"renewed":true,"lease_ttl_ms":30000})");
  r = Http(d.port(), "POST", "/v1/renew", {}, by_route + R"(, "lease_ttl": "2h")" + lease);
  EXPECT_EQ(r.body, R"({"renewed":true,"lease_ttl_ms":7200000})");
  r = Http(d.port(), "POST", "/v1/release", {}, by_route + lease);
  EXPECT_EQ(r.body, R"({"released":true})");
  EXPECT_EQ(Http(d.port(), "POST", "/v1/renew", {}, by_route + lease).body, R"({"renewed":false})");
}

TEST(ConcurrencyDaemon, DecisionApiRenewByRouteSurvivesItsRemoval) {
  CountingUpstream upstream(milliseconds(1));
  const std::string route = "{max_in_flight: 1, lease_ttl: 1h}";
  {
    const std::string config = WriteConfig(Config(upstream.port(), route));
    Daemon d({"--config", config});
    ASSERT_TRUE(d.started()) << d.Log();
    RenewByRouteSurvivesItsRemoval(d, config, upstream.port());
  }
  ratelimit::testing::RedisServer redis;
  const std::string config = WriteConfig(Config(upstream.port(), route));
  Daemon d({"--config", config, "--redis", redis.url()});
  ASSERT_TRUE(d.started()) << d.Log();
  RenewByRouteSurvivesItsRemoval(d, config, upstream.port());
}

// Bad input is a 400 problem naming the field, before any store is asked;
// another method is a 405.
TEST(ConcurrencyDaemon, DecisionApiRenewRefusesBadInput) {
  Daemon d({"--listen", "127.0.0.1:0"});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string id = "0123456789abcdef0123456789abcdef";
  for (const auto& [body, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"key": "k", "name": "x", "lease": ")" + id + "\"}", "unknown field 'lease'"},
           {R"({"key": "k", "name": "x"})", "field 'lease_id' is required"},
           {R"({"key": "k", "name": "x", "lease_id": "abc"})",
            "field 'lease_id' is not a lease id /v1/acquire gives out"},
           {R"({"key": "k", "name": "x", "lease_ttl": "5ms", "lease_id": ")" + id + "\"}",
            "field 'lease_ttl' must be whole milliseconds between 10ms and 24h"},
           {R"({"key": "k", "name": "x", "lease_ttl": 30, "lease_id": ")" + id + "\"}",
            "field 'lease_ttl' must be a duration string"},
           {R"({"name": "x", "lease_id": ")" + id + "\"}", "field 'key' is required"},
           {"not json", "JSON"}}) {
    const HttpResponse r = Http(d.port(), "POST", "/v1/renew", {}, body);
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    EXPECT_EQ(r.Header("Content-Type"), "application/problem+json") << body;
    EXPECT_NE(r.body.find(says), std::string::npos) << body << ": " << r.body;
    EXPECT_NE(r.body.find("\"instance\":\"/v1/renew\""), std::string::npos) << r.body;
  }
  const HttpResponse get = Http(d.port(), "GET", "/v1/renew");
  EXPECT_EQ(get.status, 405);
  EXPECT_EQ(get.Header("Allow"), "POST");
}

// With Redis down and failure_mode local, a lease of the local fallback
// ("l-") is renewed there. One Redis gave out can be neither renewed nor
// said lost: 503 and Retry-After, as its release, and the message says the
// renewal may or may not have been made (a timed-out call may have run).
TEST(ConcurrencyDaemon, DecisionApiRenewWhileRedisIsDown) {
  ratelimit::testing::RedisServer redis;
  CountingUpstream upstream(milliseconds(1));
  const std::string config =
      WriteConfig(Config(upstream.port(), "{max_in_flight: 1}") + "store: {type: redis, url: \"" +
                  redis.url() + "\", failure_mode: local, reconnect_max_backoff: 200ms}\n");
  Daemon d({"--config", config});
  ASSERT_TRUE(d.started()) << d.Log();
  const std::string acquire =
      R"({"key": "ada", "name": "upload", "max_in_flight": 2, "lease_ttl": "1h"})";
  HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string shared = LeaseId(r);
  ASSERT_EQ(shared.size(), 32u) << r.body;
  redis.Stop();
  r = Http(d.port(), "POST", "/v1/acquire", {}, acquire);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("\"degraded\":true"), std::string::npos) << r.body;
  const std::string local = LeaseId(r);
  ASSERT_TRUE(local.starts_with("l-")) << r.body;
  auto with = [](const std::string& id) {
    return R"({"key": "ada", "name": "upload", "lease_ttl": "2h", "lease_id": ")" + id + "\"}";
  };
  r = Http(d.port(), "POST", "/v1/renew", {}, with(local));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, R"({"renewed":true,"lease_ttl_ms":7200000})");
  r = Http(d.port(), "POST", "/v1/renew", {}, with(shared));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/problem+json");
  EXPECT_EQ(r.Header("Retry-After"), "1");
  EXPECT_NE(r.body.find("the concurrency store is unavailable"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("may or may not have been made"), std::string::npos) << r.body;
  const std::string release = R"({"key": "ada", "name": "upload", "lease_id": ")" + shared + "\"}";
  EXPECT_EQ(Http(d.port(), "POST", "/v1/release", {}, release).status, 503);
  r = Http(d.port(), "POST", "/v1/release", {},
           R"({"key": "ada", "name": "upload", "lease_id": ")" + local + "\"}");
  EXPECT_EQ(r.body, R"({"released":true})");
  EXPECT_EQ(Http(d.port(), "POST", "/v1/renew", {}, with(local)).body, R"({"renewed":false})");
}

// The memory store bounds leases (store.max_keys), and a flood of ad-hoc
// decision-API leases that fills it makes new ones go by the failure mode
// (open: admitted without a lease). A route's per: route limit, the one cap
// in front of its upstream, is still taken and still holds.
TEST(ConcurrencyDaemon, AFullStoreKeepsAPerRouteCap) {
  CountingUpstream upstream(milliseconds(500));
  const std::string config =
      WriteConfig(Config(upstream.port(), "{max_in_flight: 1, per: route, lease_ttl: 1h}") +
                  "store:\n  max_keys: 4\n");
  Daemon d({"--config", config});
  ASSERT_TRUE(d.started()) << d.Log();
  for (int i = 0; i < 4; ++i) {
    const HttpResponse r =
        Http(d.port(), "POST", "/v1/acquire", {},
             R"({"key": "flood)" + std::to_string(i) +
                 R"(", "name": "x", "max_in_flight": 1000000, "lease_ttl": "24h"})");
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_NE(r.body.find("\"degraded\":false"), std::string::npos) << r.body;
  }
  // Full: an ad-hoc lease, one by the route's name too (the caller's own
  // key, not the route's), is admitted without a lease.
  for (const char* body : {R"({"key": "flood0", "name": "x", "max_in_flight": 1000000})",
                           R"({"key": "caller", "route": "work"})"}) {
    const HttpResponse r = Http(d.port(), "POST", "/v1/acquire", {}, body);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.body.find("\"lease_id\":null"), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("\"degraded\":true"), std::string::npos) << r.body;
  }
  const std::vector<HttpResponse> rs = Burst({d.port()}, 6, "/work");
  EXPECT_EQ(Count(rs, 200), 1);
  EXPECT_EQ(Count(rs, 429), 5);
  EXPECT_EQ(upstream.peak(), 1);
  EXPECT_EQ(Http(d.port(), "GET", "/work").status, 200);  // its lease was given back
}

}  // namespace
}  // namespace rltest
