// The config as a new user meets it, through the real binary: the README's
// example starts, --check-config checks every file a config names, the
// effective config after a reload, and what the start says about Redis down,
// an upstream without limits and a taken admin port (issue 16).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.h"

namespace rltest {
namespace {

std::pair<int, std::string> RunDaemon(const std::string& args) {
  const std::string dir = MakeTempDir();
  const std::string cmd = std::string(RATELIMITD_PATH) + " " + args + " > " + dir + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  return {WEXITSTATUS(rc), ReadFile(dir + "/out")};
}

TEST(ConfigDaemon, TheReadmeGatewayExampleStartsAndItsSampleTokenWorks) {
  Daemon d({"--config", RL_EXAMPLES_DIR "/gateway.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  EXPECT_EQ(Http(d.admin_port(), "GET", "/v1/config").status, 401);
  HttpResponse r = Http(d.admin_port(), "GET", "/v1/config",
                        {{"Authorization", "Bearer example-admin-token-change-me"}});
  EXPECT_EQ(r.status, 200) << r.body;
  // The sample token is readable by everyone: said at start.
  EXPECT_NE(d.Log().find("is readable by every user of this host"), std::string::npos) << d.Log();
}

TEST(ConfigDaemon, CheckConfigChecksTheFilesTheConfigNames) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "server: {admin_token_file: /nonexistent/tok}\n");
  auto [rc, out] = RunDaemon("--check-config " + dir + "/c.yaml");
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(out, dir +
                     "/c.yaml: server.admin_token_file '/nonexistent/tok': No such file or "
                     "directory\n");
  WriteFile(dir + "/c.yaml", "store: {type: redis, url: \"rediss://h?tls_ca_file=ca.pem\"}\n");
  std::tie(rc, out) = RunDaemon("--check-config " + dir + "/c.yaml");
  EXPECT_EQ(rc, 1);
  // Relative to the config's folder, as every file the config names.
  EXPECT_NE(out.find("tls_ca_file '" + dir + "/ca.pem': No such file or directory"),
            std::string::npos)
      << out;
  // The README's own command.
  std::tie(rc, out) = RunDaemon("--check-config " RL_EXAMPLES_DIR "/gateway.yaml");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("OK\n"), std::string::npos) << out;
}

// A config check connects to nothing: with no Redis listening, the README's
// --check-config of examples/redis.yaml says OK at once and warns of nothing
// (it read the stored overrides, waited on Redis and warned "overrides not
// read").
TEST(ConfigDaemon, CheckConfigConnectsToNothing) {
  const auto start = std::chrono::steady_clock::now();
  auto [rc, out] = RunDaemon("--check-config " RL_EXAMPLES_DIR "/redis.yaml");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "OK\n");
  EXPECT_LT(took, std::chrono::milliseconds(1500)) << out;
}

// What the start resolves on its machine, --check-config resolves too, and
// fails with the start's message: a run-as user this machine lacks, and an
// upstream host that does not resolve. It printed OK for both.
TEST(ConfigDaemon, CheckConfigResolvesTheRunAsUserAndTheUpstreamAsTheStartDoes) {
  const std::string dir = MakeTempDir();
  for (const auto& [yaml, message] : std::vector<std::pair<std::string, std::string>>{
           {"server: {user: rl-no-such-user}\n", "--user: unknown user 'rl-no-such-user'"},
           {"server: {upstream: \"http://rl-no-such-host.invalid:9000\"}\n"
            "limits: {l: {algorithm: token_bucket, capacity: 5, refill_per_second: 1}}\n"
            "global: [l]\n",
            "cannot resolve upstream 'http://rl-no-such-host.invalid:9000': "}}) {
    SCOPED_TRACE(yaml);
    WriteFile(dir + "/c.yaml", yaml);
    auto [rc, out] = RunDaemon("--check-config " + dir + "/c.yaml");
    EXPECT_EQ(rc, 1) << out;
    ASSERT_EQ(out.rfind(dir + "/c.yaml: " + message, 0), 0u) << out;
    ASSERT_EQ(out.find('\n'), out.size() - 1) << out;  // one line
    // The start stops with the same message (the whole of it).
    const std::string prefix = dir + "/c.yaml: ";
    std::string said = out.substr(prefix.size());
    if (!said.empty() && said.back() == '\n') said.pop_back();
    auto [start_rc, start_out] = RunDaemon("--config " + dir + "/c.yaml --listen 127.0.0.1:0 " +
                                           "--admin-listen 127.0.0.1:0");
    EXPECT_EQ(start_rc, 1) << start_out;
    EXPECT_NE(start_out.find("\"error\":\"" + said + "\""), std::string::npos) << said << "\n"
                                                                               << start_out;
  }
}

TEST(ConfigDaemon, RedisFlagErrorListsEveryScheme) {
  auto [rc, out] = RunDaemon("--redis http://127.0.0.1:6379");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// "
                     "or rediss+sentinel://"),
            std::string::npos)
      << out;
}

// Two connections at once from 127.0.0.1: the status the second is answered
// with while the first is open (0: closed at once, over the per-address cap).
int SecondConnectionsStatus(int port) {
  const std::string req = "GET /nowhere HTTP/1.1\r\nHost: rl\r\n\r\n";
  const int first = Connect(port);
  std::string pending;
  EXPECT_TRUE(SendAll(first, req));
  EXPECT_NE(ReadResponse(first, pending, std::chrono::seconds(5)).status, 0);  // counted: open
  const int second = Connect(port);
  std::string more;
  SendAll(second, req);
  const int status = ReadResponse(second, more, std::chrono::seconds(5)).status;
  ::close(second);
  ::close(first);
  return status;
}

// The per-address connection cap's exemptions are the trusted proxies in
// effect: a reload that adds one applies to new connections as it does to
// the client identity (they were the start config's until a restart).
TEST(ConfigDaemon, AReloadedTrustedProxyIsExemptFromTheConnectionCap) {
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/c.yaml";
  WriteFile(file, "server: {max_connections_per_ip: 1}\n");
  Daemon d({"--config", file});
  ASSERT_TRUE(d.started()) << d.Log();
  EXPECT_EQ(SecondConnectionsStatus(d.port()), 0);  // over the cap
  WriteFile(file,
            "server: {max_connections_per_ip: 1}\n"
            "clients: {trusted_proxies: [127.0.0.1/32]}\n");
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(10))) << d.Log();
  EXPECT_EQ(SecondConnectionsStatus(d.port()), 404) << d.Log();
}

TEST(ConfigDaemon, AfterAReloadTheConfigShowsWhatIsInEffect) {
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/c.yaml";
  WriteFile(file, "server: {threads: 2}\nstore: {type: memory}\n");
  Daemon d({"--config", file});
  ASSERT_TRUE(d.started()) << d.Log();
  WriteFile(file,
            "server: {threads: 3, headers: legacy}\n"
            "store: {type: redis, url: \"redis://:pw@127.0.0.1:1\"}\n");
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(10))) << d.Log();
  HttpResponse r = Http(d.admin_port(), "GET", "/v1/config");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\n  type: memory\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\n  threads: 2\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\n  headers: legacy\n"), std::string::npos) << r.body;  // reloaded
  EXPECT_NE(r.body.find("#   store.type: redis\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("#   store.url: redis://:***@127.0.0.1:1\n"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("#   server.threads: 3\n"), std::string::npos) << r.body;
  r = Http(d.admin_port(), "GET", "/readyz");
  EXPECT_NE(r.body.find("\"store\":\"memory\""), std::string::npos) << r.body;
}

TEST(ConfigDaemon, RedisUnreachableAtStartIsSaidAndTheFailureModeServes) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(FreePort());
  Daemon d({"--redis", url});
  ASSERT_TRUE(d.started()) << d.Log();
  ASSERT_TRUE(d.WaitForLog("the store cannot be reached", std::chrono::seconds(10))) << d.Log();
  EXPECT_NE(d.Log().find("\"store\":\"" + url + "\""), std::string::npos) << d.Log();
  HttpResponse r = Http(d.port(), "GET", "/api/ping", {{"X-API-Key", "a"}});
  EXPECT_EQ(r.status, 200);  // failure_mode: open
  EXPECT_EQ(r.Header("X-RateLimit-Degraded"), "true");
}

// store.closed_status is not restart-bound: after a reload the concurrency
// limit's closed answer uses the new one, as the rate limits' does (the
// limiter kept the start config's, while /v1/config showed the new one).
TEST(ConfigDaemon, AReloadedClosedStatusAppliesToConcurrencyLimits) {
  TestUpstream upstream;
  const std::string dir = MakeTempDir();
  const std::string file = dir + "/c.yaml";
  auto config = [&](int closed_status) {
    return "server: {upstream: \"http://127.0.0.1:" + std::to_string(upstream.port()) +
           "\"}\nstore: {type: redis, url: \"redis://127.0.0.1:" + std::to_string(FreePort()) +
           "\", failure_mode: closed, closed_status: " + std::to_string(closed_status) +
           "}\nroutes:\n  - {name: work, path: /, concurrency: {max_in_flight: 2}}\n";
  };
  WriteFile(file, config(503));
  Daemon d({"--config", file});
  ASSERT_TRUE(d.started()) << d.Log();
  EXPECT_EQ(Http(d.port(), "GET", "/x").status, 503);  // the leases' Redis is down: closed
  WriteFile(file, config(429));                        // (the new url waits for a restart)
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", std::chrono::seconds(10))) << d.Log();
  EXPECT_NE(Http(d.admin_port(), "GET", "/v1/config").body.find("closed_status: 429"),
            std::string::npos);
  EXPECT_EQ(Http(d.port(), "GET", "/x").status, 429);
}

TEST(ConfigDaemon, AnUpstreamWithoutLimitsIsWarnedAbout) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml", "server: {upstream: \"http://127.0.0.1:1\"}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  EXPECT_NE(d.Log().find("every request is forwarded unlimited"), std::string::npos) << d.Log();
  auto [rc, out] = RunDaemon("--check-config " + dir + "/c.yaml");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("warning: server.upstream is set but no limit applies"), std::string::npos)
      << out;
}

TEST(ConfigDaemon, ATakenAdminPortSaysHowToRunASecondInstance) {
  Daemon first({});
  ASSERT_TRUE(first.started()) << first.Log();
  const std::string admin = "127.0.0.1:" + std::to_string(first.admin_port());
  Daemon second({"--admin-listen", admin});
  EXPECT_FALSE(second.started());  // it exited: the constructor saw it go
  EXPECT_NE(second.Log().find("each instance on a host needs its own, e.g. --admin-listen"),
            std::string::npos)
      << second.Log();
}

}  // namespace
}  // namespace rltest
