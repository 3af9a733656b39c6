// SIGHUP reload (good and bad file) and SIGTERM drain, on the real binary.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>

#include "harness.h"

namespace rltest {
namespace {

std::string Config(int capacity, const std::string& extra = "") {
  return extra + "limits:\n  api: {algorithm: token_bucket, capacity: " + std::to_string(capacity) +
         ", refill_per_second: 0.01}\n"
         "routes:\n  - name: all\n    path: /\n    match: prefix\n    limits: [api]\n";
}

TEST(Signals, HupReloadsAGoodFileAndKeepsTheOldOnABadOne) {
  std::string dir = MakeTempDir();
  const std::string file = dir + "/c.yaml";
  WriteFile(file, Config(2));
  Daemon d({"--config", file});
  ASSERT_TRUE(d.started()) << d.Log();
  Headers h = {{"X-Original-Method", "GET"}, {"X-Original-URI", "/x"}, {"X-API-Key", "hup"}};
  EXPECT_EQ(Http(d.port(), "GET", "/v1/auth", h).Header("RateLimit-Limit"), "2");

  WriteFile(file, Config(50));
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(10))) << d.Log();
  HttpResponse r = Http(d.port(), "GET", "/v1/auth", h);
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.Header("RateLimit-Limit"), "50");

  WriteFile(file, "limits:\n  api: {algorithm: token_bucket, capacity: -1}\n");
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("reload failed", std::chrono::seconds(10))) << d.Log();
  r = Http(d.port(), "GET", "/v1/auth", h);
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.Header("RateLimit-Limit"), "50") << "the old policy keeps serving";
  EXPECT_NE(d.Log().find("\"level\":\"error\""), std::string::npos);

  // A change that needs a restart is logged as ignored.
  WriteFile(file, Config(50, "server:\n  max_connections: 7\n"));
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("changes that need a restart were ignored", std::chrono::seconds(10)))
      << d.Log();
}

// A SIGHUP that comes while the daemon starts waits and is one reload once
// it serves (its default action would have ended the daemon). Here it is
// held by the mask the daemon inherits from its parent (this thread's, with
// SIGHUP blocked), which the daemon must undo: under it, no reload arrived.
TEST(Signals, AHupBeforeTheServerRunsIsOneReloadOnceItServes) {
  std::string dir = MakeTempDir();
  const std::string file = dir + "/c.yaml";
  WriteFile(file, Config(2));
  sigset_t hup, before;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &hup, &before), 0);
  Daemon d({"--config", file});
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &before, nullptr), 0);
  ASSERT_TRUE(d.started()) << d.Log();
  WriteFile(file, Config(40));
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(10))) << d.Log();
  Headers h = {{"X-Original-Method", "GET"}, {"X-Original-URI", "/x"}, {"X-API-Key", "hup"}};
  EXPECT_EQ(Http(d.port(), "GET", "/v1/auth", h).Header("RateLimit-Limit"), "40");
}

// While a request holds the drain (a slow upstream answer), the admin
// listener keeps answering: /readyz 503 "draining" (a load balancer takes the
// instance out), /healthz 200 (a liveness probe does not kill the drain).
TEST(Signals, TermDrainsInFlightRequestsThenExitsZero) {
  TestUpstream upstream;
  std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", Config(100, "server:\n  upstream: http://127.0.0.1:" +
                                             std::to_string(upstream.port()) + "\n"));
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const int port = d.port(), admin = d.admin_port();
  ASSERT_GT(admin, 0);
  EXPECT_EQ(Http(admin, "GET", "/readyz").status, 200);
  auto slow = std::async(std::launch::async, [port] { return Http(port, "GET", "/slow"); });
  // Wait until the upstream has the request, then ask the daemon to stop.
  for (int i = 0; i < 200 && upstream.requests() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(upstream.requests(), 1);
  d.Signal(SIGTERM);
  ASSERT_TRUE(d.WaitForLog("\"msg\":\"draining\"", std::chrono::seconds(5))) << d.Log();
  // The upstream holds /slow for 1.5 s: the drain lasts that long.
  HttpResponse ready = Http(admin, "GET", "/readyz");
  EXPECT_EQ(ready.status, 503) << ready.body;
  EXPECT_NE(ready.body.find("\"draining\":true"), std::string::npos) << ready.body;
  EXPECT_NE(ready.body.find("\"ready\":false"), std::string::npos) << ready.body;
  HttpResponse health = Http(admin, "GET", "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_NE(health.body.find("draining"), std::string::npos) << health.body;
  EXPECT_EQ(Http(admin, "GET", "/metrics").status, 200);
  EXPECT_EQ(Http(port, "GET", "/x").status, 0) << "the public listener stopped accepting";
  HttpResponse r = slow.get();
  EXPECT_EQ(r.status, 200) << "the in-flight request completes";
  EXPECT_EQ(d.Wait(std::chrono::seconds(12)), 0) << d.Log();
  EXPECT_EQ(Http(port, "GET", "/x").status, 0) << "no longer listening";
  EXPECT_EQ(Http(admin, "GET", "/readyz").status, 0) << "closed once the drain ended";
}

TEST(Signals, TermWithIdleKeepAliveConnectionsExitsPromptly) {
  Daemon d({});
  ASSERT_TRUE(d.started()) << d.Log();
  // An idle keep-alive connection must not hold the drain for 10 s.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(d.port()));
  a.sin_addr.s_addr = htonl(0x7f000001);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(std::chrono::seconds(5)), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  ::close(fd);
}

}  // namespace
}  // namespace rltest
