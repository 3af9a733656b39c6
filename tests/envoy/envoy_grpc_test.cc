// ratelimitd's gRPC face, driven by a Node.js client generated at run time
// from Envoy's own rls.proto (tests/envoy/client/scenario.cjs): wire
// compatibility, envoyproxy/ratelimit's integration scenario on the memory
// store and on a real Redis, the config checker and reloads.
//
// A missing node or npm, or an npm install that fails, is a failure, never a skip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "harness.h"
#include "support/redis_server.h"
#include "support/subprocess.h"

namespace rltest {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using ratelimit::testing::RunCommand;

// @grpc/grpc-js, @grpc/proto-loader and @grpc/grpc-js-xds (Envoy's protos):
// installed from the lockfile by scripts/install-deps.sh (make test runs it).
// Not installed here: two tests of this binary run at once under ctest -j2,
// and two `npm ci` in one folder race.
void EnsureNodeModules() {
  std::string out;
  ASSERT_EQ(RunCommand({"sh", "-c", "command -v node && command -v npm"}, &out), 0)
      << "node and npm are required";
  const std::string dir = RL_ENVOY_CLIENT_DIR;
  ASSERT_EQ(::access((dir + "/node_modules/@grpc/grpc-js-xds/package.json").c_str(), R_OK), 0)
      << dir << "/node_modules is missing: run scripts/install-deps.sh";
}

// Runs scenario.cjs; its exit code and output.
std::pair<int, std::string> Client(const std::string& cmd, int port, const std::string& arg = "") {
  std::vector<std::string> argv = {"node", std::string(RL_ENVOY_CLIENT_DIR) + "/scenario.cjs", cmd,
                                   std::to_string(port)};
  if (!arg.empty()) argv.push_back(arg);
  std::string out;
  const int rc = RunCommand(argv, &out);
  return {rc, out};
}

struct GrpcDaemon {
  explicit GrpcDaemon(std::vector<std::string> extra,
                      const std::string& envoy_dir = RL_ENVOY_CONFIG_DIR)
      : grpc_port(FreePort()) {
    std::vector<std::string> args = {"--grpc-listen", "127.0.0.1:" + std::to_string(grpc_port),
                                     "--envoy-config", envoy_dir};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon = std::make_unique<Daemon>(args);
    EXPECT_TRUE(daemon->WaitForLog("gRPC listening", 10s)) << daemon->Log();
  }
  int grpc_port;
  std::unique_ptr<Daemon> daemon;
};

void RunScenario(GrpcDaemon& d) {
  auto [hrc, health] = Client("health", d.grpc_port);
  EXPECT_EQ(hrc, 0);
  EXPECT_EQ(health, "SERVING\n");
  auto [rc, out] = Client("scenario", d.grpc_port);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "PASS\n");
}

// --grpc-listen reads HOST:PORT as the HTTP listeners do (one resolver):
// a host name is resolved, not refused at start.
TEST(EnvoyGrpc, TheGrpcListenerTakesAHostName) {
  const int port = FreePort();
  Daemon d({"--grpc-listen", "localhost:" + std::to_string(port), "--envoy-config",
            RL_ENVOY_CONFIG_DIR});
  EXPECT_TRUE(d.WaitForLog("gRPC listening", 10s)) << d.Log();
  EXPECT_EQ(d.Log().find("cannot start the gRPC face"), std::string::npos) << d.Log();
}

// grpc.health.v1 as Envoy's grpc_health_check and Kubernetes' probes use it:
// Check knows the server ("") and the rate limit service, nothing else;
// Watch hears NOT_SERVING when SIGTERM starts the shutdown, then the stream
// ends OK and the daemon exits 0.
TEST(EnvoyGrpc, HealthChecksAndWatchSeeTheShutdown) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  GrpcDaemon d({});
  EXPECT_EQ(Client("health", d.grpc_port, "envoy.service.ratelimit.v3.RateLimitService").second,
            "SERVING\n");
  EXPECT_EQ(Client("health", d.grpc_port, "no.such.Service").second, "ERROR NOT_FOUND\n");
  auto [rc, out] = Client("watch", d.grpc_port, std::to_string(d.daemon->pid()));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "SERVING\nNOT_SERVING\nEND OK\n") << d.daemon->Log();
  EXPECT_EQ(d.daemon->Wait(10s), 0) << d.daemon->Log();
}

TEST(EnvoyGrpc, EnvoyproxyIntegrationScenarioOnMemory) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  GrpcDaemon d({});
  RunScenario(d);
}

TEST(EnvoyGrpc, EnvoyproxyIntegrationScenarioOnRedis) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  ratelimit::testing::RedisServer redis;
  GrpcDaemon d({"--redis", redis.url()});
  RunScenario(d);
  // The admin listener shows the loaded domains.
  const HttpResponse m = Http(d.daemon->admin_port(), "GET", "/metrics");
  EXPECT_NE(m.body.find("ratelimit_envoy_domain_descriptors{domain=\"another\"} 6\n"),
            std::string::npos);
  EXPECT_NE(m.body.find("ratelimit_decisions_total{face=\"envoy\",route=\"envoy:another\",limit="
                        "\"key2\",outcome=\"denied\"} 5\n"),
            std::string::npos)
      << m.body;
  // Calls 17 to 20 of 20 (remaining 3..0) are past 80%: near_limit.
  EXPECT_NE(m.body.find("ratelimit_decisions_total{face=\"envoy\",route=\"envoy:another\","
                        "limit=\"key2\",outcome=\"near_limit\"} 4\n"),
            std::string::npos);
  // The counters are Redis': the domain's one hash tag.
  EXPECT_NE(redis.Cli("KEYS", "rl:{envoy:another}*"), "");
}

// Two identical descriptors (two of a route's actions that produce the same
// entries), from Envoy's own rls.proto, decided on Redis: both hits count on
// the one counter (key3, 10 an hour), and each descriptor reports the count
// after its own, as envoyproxy/ratelimit's INCRBY per descriptor does.
// Before, INVALID_ARGUMENT.
TEST(EnvoyGrpc, IdenticalDescriptorsCountBothHitsOnRedis) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  ratelimit::testing::RedisServer redis;
  GrpcDaemon d({"--redis", redis.url()});
  const std::string one = R"({"entries":[{"key":"key3","value":"twin"}]})";
  const std::string twin = R"({"domain":"another","descriptors":[)" + one + "," + one + "]}";
  std::string out = Client("call", d.grpc_port, twin).second;
  EXPECT_NE(out.find(R"("overall_code":"OK")"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("limit_remaining":9,)"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("limit_remaining":8,)"), std::string::npos) << out;
  out = Client("call", d.grpc_port, R"({"domain":"another","descriptors":[)" + one + "]}").second;
  EXPECT_NE(out.find(R"("limit_remaining":7,)"), std::string::npos) << out;
}

// The threads of a running process.
size_t ThreadsOf(pid_t pid) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    ++n;
  }
  return n;
}

// The face serves on the server's threads (with one, also the Redis
// clients': a call, its batch and its answer stay on one thread), so it adds
// no thread, whatever server.threads says; and the server's drain ends it.
TEST(EnvoyGrpc, TheFaceRunsOnTheServersThreads) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  const std::string dir = MakeTempDir();
  for (const int threads : {1, 2}) {
    SCOPED_TRACE("server.threads " + std::to_string(threads));
    ratelimit::testing::RedisServer redis;
    const std::string config = dir + "/threads" + std::to_string(threads) + ".yaml";
    WriteFile(config, "server:\n  threads: " + std::to_string(threads) +
                          "\nstore:\n  type: redis\n  url: " + redis.url() + "\n");
    Daemon without({"--config", config});
    ASSERT_TRUE(without.started()) << without.Log();
    GrpcDaemon with({"--config", config});
    RunScenario(with);  // decided on Redis
    EXPECT_EQ(ThreadsOf(with.daemon->pid()), ThreadsOf(without.pid()));
    // With one, every Redis client (checks, concurrency leases, overrides)
    // shares it too: the whole daemon is that one thread.
    if (threads == 1) {
      EXPECT_EQ(ThreadsOf(with.daemon->pid()), 1u);
    }
    with.daemon->Signal(SIGTERM);
    EXPECT_EQ(with.daemon->Wait(10s), 0) << with.daemon->Log();
  }
}

TEST(EnvoyGrpc, RequestErrorsAreInvalidArgument) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  GrpcDaemon d({});
  EXPECT_EQ(Client("call", d.grpc_port,
                   R"({"domain":"","descriptors":[{"entries":[{"key":"a","value":"b"}]}]})")
                .second,
            "{\"error\":\"INVALID_ARGUMENT\"}\n");
  EXPECT_EQ(Client("call", d.grpc_port, R"({"domain":"basic","descriptors":[]})").second,
            "{\"error\":\"INVALID_ARGUMENT\"}\n");
}

// envoy.headers: response_headers_to_add in the configured dialect, for the
// descriptor closest to its limit; none by default.
TEST(EnvoyGrpc, ResponseHeadersFollowTheConfiguredDialect) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  const std::string dir = MakeTempDir();
  const int port = FreePort();
  WriteFile(dir + "/ratelimitd.yaml", "server: {grpc_listen: \"127.0.0.1:" + std::to_string(port) +
                                          "\"}\nenvoy: {config_dir: \"" + RL_ENVOY_CONFIG_DIR +
                                          "\", headers: draft06}\n");
  Daemon d({"--config", dir + "/ratelimitd.yaml"});
  ASSERT_TRUE(d.WaitForLog("gRPC listening", 10s)) << d.Log();
  const std::string two =
      R"({"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"h"}]},)"
      R"({"entries":[{"key":"key3","value":"h"}]}]})";
  const std::string out = Client("call", port, two).second;
  // key3 (10/hour) is the closer to its limit: 9 left.
  EXPECT_NE(out.find(R"("key":"RateLimit-Limit","value":"10")"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("key":"RateLimit-Remaining","value":"9")"), std::string::npos) << out;

  GrpcDaemon plain({});
  const std::string none = Client("call", plain.grpc_port, two).second;
  EXPECT_NE(none.find(R"("response_headers_to_add":[])"), std::string::npos) << none;
}

// Every fixture of tests/envoy/config_errors through the daemon's checker.
TEST(EnvoyGrpc, CheckConfigReportsEveryFixtureWithFileAndLine) {
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(RL_ENVOY_ERRORS_DIR)) {
    if (!entry.is_directory()) continue;
    ++cases;
    const std::string dir = entry.path().string();
    std::string expected = ReadFile(dir + "/expected");
    expected = expected.substr(0, expected.find('\n'));
    std::string out;
    const int rc = ratelimit::testing::RunCommand({RATELIMITD_PATH, "--check-config", dir}, &out);
    EXPECT_EQ(rc, 1) << dir;
    for (size_t at; (at = out.find(dir + "/")) != std::string::npos;) out.erase(at, dir.size() + 1);
    EXPECT_EQ(out, expected + "\n") << dir;
  }
  EXPECT_GE(cases, 11);
  std::string out;
  EXPECT_EQ(ratelimit::testing::RunCommand({RATELIMITD_PATH, "--check-config", RL_ENVOY_CONFIG_DIR},
                                           &out),
            0);
  EXPECT_EQ(out, "OK\n");
}

std::string Limit(int port) {
  return Client("call", port,
                R"({"domain":"r","descriptors":[{"entries":[{"key":"k","value":"v"}]}]})")
      .second;
}

// A file changed in the directory (inotify) or SIGHUP reloads; a broken file
// keeps the config in use.
TEST(EnvoyGrpc, ReloadsOnChangeAndSighupAndKeepsTheOldConfigOnError) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  const std::string dir = MakeTempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    // Written aside and renamed in, as config management tools do.
    WriteFile(dir + "/." + name + ".tmp", text);
    fs::rename(dir + "/." + name + ".tmp", dir + "/" + name);
  };
  write(
      "r.yaml",
      "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n");
  GrpcDaemon d({}, dir);
  EXPECT_NE(Limit(d.grpc_port).find("\"requests_per_unit\":5,"), std::string::npos);

  write(
      "r.yaml",
      "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n");
  ASSERT_TRUE(d.daemon->WaitForLog("\"domains\":1", 5s));
  for (int i = 0;
       i < 50 && Limit(d.grpc_port).find("\"requests_per_unit\":7,") == std::string::npos; ++i)
    std::this_thread::sleep_for(100ms);
  EXPECT_NE(Limit(d.grpc_port).find("\"requests_per_unit\":7,"), std::string::npos);

  write("r.yaml",
        "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: "
        "9}\n");
  ASSERT_TRUE(d.daemon->WaitForLog("r.yaml:4: invalid rate limit unit 'fortnight'", 5s))
      << d.daemon->Log();
  EXPECT_NE(Limit(d.grpc_port).find("\"requests_per_unit\":7,"), std::string::npos);
  // The admin API shows the domains in use and why the last reload failed.
  HttpResponse domains = Http(d.daemon->admin_port(), "GET", "/v1/envoy/domains");
  EXPECT_EQ(domains.status, 200);
  EXPECT_NE(domains.body.find("\"domain\":\"r\""), std::string::npos) << domains.body;
  EXPECT_NE(domains.body.find("\"requests_per_unit\":7"), std::string::npos) << domains.body;
  EXPECT_NE(domains.body.find("\"ok\":false"), std::string::npos) << domains.body;
  EXPECT_NE(domains.body.find("r.yaml:4: invalid rate limit unit 'fortnight'"), std::string::npos)
      << domains.body;
  EXPECT_EQ(Http(d.daemon->admin_port(), "POST", "/v1/envoy/domains").status, 405);

  // SIGHUP after a fix; the inotify reload may come first, either is fine.
  write(
      "r.yaml",
      "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n");
  d.daemon->Signal(SIGHUP);
  for (int i = 0;
       i < 50 && Limit(d.grpc_port).find("\"requests_per_unit\":3,") == std::string::npos; ++i)
    std::this_thread::sleep_for(100ms);
  EXPECT_NE(Limit(d.grpc_port).find("\"requests_per_unit\":3,"), std::string::npos);
  domains = Http(d.daemon->admin_port(), "GET", "/v1/envoy/domains");
  EXPECT_NE(domains.body.find("\"requests_per_unit\":3"), std::string::npos) << domains.body;
  EXPECT_NE(domains.body.find("\"last_reload\":{\"ok\":true}"), std::string::npos) << domains.body;
  // The daemon's own SIGHUP handling carries on beside the face's.
  EXPECT_TRUE(d.daemon->started());
}

// envoyproxy/ratelimit's reload deployment (RUNTIME_ROOT a symlink,
// RUNTIME_WATCH_ROOT=true): the config directory is reached through `cur ->
// v1`, and a new version goes live by renaming a new symlink `cur -> v2`
// over it. The swap reloads, and so does a change in v2 afterwards. Before,
// the watch stayed on v1: neither was seen (its one event came when v1 was
// deleted, and the watch died with it).
TEST(EnvoyGrpc, ReloadsWhenASymlinkOnThePathIsSwapped) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  const std::string root = MakeTempDir();
  auto rule = [](int n) {
    return "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: " +
           std::to_string(n) + "}\n";
  };
  // Whether the face answers with `n` within 10 s (each call is a node
  // process of its own).
  auto serves = [](int port, int n) {
    const std::string want = "\"requests_per_unit\":" + std::to_string(n) + ",";
    for (const auto end = std::chrono::steady_clock::now() + 10s;;) {
      if (Limit(port).find(want) != std::string::npos) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(100ms);
    }
  };
  for (const char* v : {"v1", "v2"}) fs::create_directories(root + "/" + v + "/config");
  WriteFile(root + "/v1/config/r.yaml", rule(5));
  WriteFile(root + "/v2/config/r.yaml", rule(7));
  fs::create_directory_symlink("v1", root + "/cur");
  GrpcDaemon d({}, root + "/cur/config");
  EXPECT_TRUE(serves(d.grpc_port, 5));

  fs::create_directory_symlink("v2", root + "/cur.new");
  fs::rename(root + "/cur.new", root + "/cur");  // atomic, as `mv -T` does
  EXPECT_TRUE(serves(d.grpc_port, 7)) << d.daemon->Log();

  WriteFile(root + "/v2/config/.r.yaml.tmp", rule(9));
  fs::rename(root + "/v2/config/.r.yaml.tmp", root + "/v2/config/r.yaml");
  EXPECT_TRUE(serves(d.grpc_port, 9)) << d.daemon->Log();
  fs::remove_all(root + "/v1");  // the old version goes: nothing changes
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(serves(d.grpc_port, 9));
}

// `align: calendar` on the gRPC face: a month of Berlin's calendar;
// duration_until_reset is the time to local midnight on the 1st (by glibc's
// reading of tzdata), allowed or over the limit, on the memory store and on
// Redis.
TEST(EnvoyGrpc, CalendarMonthResetsAtLocalMidnightOnTheFirst) {
  ASSERT_NO_FATAL_FAILURE(EnsureNodeModules());
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/cal.yaml", R"(domain: cal
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 2, align: calendar, timezone: Europe/Berlin}
)");
  ratelimit::testing::RedisServer redis;
  for (const std::vector<std::string>& store :
       {std::vector<std::string>{}, std::vector<std::string>{"--redis", redis.url()}}) {
    GrpcDaemon d(store, dir);
    const std::string call =
        R"({"domain":"cal","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]})";
    for (int i = 0; i < 3; ++i) {
      const std::string out = Client("call", d.grpc_port, call).second;
      const int64_t want = NextLocalMidnight("Europe/Berlin", time(nullptr), true) - time(nullptr);
      const std::string tag = R"("duration_until_reset":{"seconds":)";
      const size_t at = out.find(tag);
      ASSERT_NE(at, std::string::npos) << out;
      const int64_t got = std::stoll(out.substr(at + tag.size()));
      EXPECT_LE(std::llabs(got - want), 3) << out;
      EXPECT_NE(out.find(i < 2 ? R"("overall_code":"OK")" : R"("overall_code":"OVER_LIMIT")"),
                std::string::npos)
          << i << ": " << out;
    }
  }
}

}  // namespace
}  // namespace rltest
