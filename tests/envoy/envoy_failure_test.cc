// The gRPC face when Redis dies (SIGSTOP) under load: every call is answered
// within the store deadline + 10 ms (or stalled together with a call that
// touches no store: the machine), by the failure mode (open: OK, closed:
// OVER_LIMIT, local: decided locally, error: gRPC UNAVAILABLE), and the
// circuit breaker opens. A C++ client built from proto/ (wire compatibility
// with Envoy's own proto is envoy_grpc_test's job).
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "harness.h"
#include "support/redis_server.h"

namespace {

using namespace std::chrono_literals;
namespace pb = ::envoy::service::ratelimit::v3;
using Clock = std::chrono::steady_clock;

constexpr int kDeadlineMs = 20;  // store.deadline: Envoy's default timeout
constexpr int kThreads = 4;
constexpr int kPauseMs = 1;

constexpr int64_t kBoundUs = (kDeadlineMs + 10) * 1000;
constexpr int64_t kStallUs = 10'000;  // a store-free call this slow: the machine stalled

struct Interval {
  Clock::time_point from, to;
  bool Overlaps(const Interval& o) const { return from <= o.to && o.from <= to; }
};

struct Tally {
  std::mutex mu;
  std::map<std::string, int> answers;  // "OK", "OVER_LIMIT", "UNAVAILABLE", ...
  int64_t slowest_us = 0;
  int calls = 0;
  std::vector<Interval> over_bound;  // calls slower than kBoundUs
};

// The calls over the bound that no stall of a store-free call overlapped.
int Unexplained(const Tally& t, const std::vector<Interval>& stalls) {
  int n = 0;
  for (const Interval& call : t.over_bound) {
    bool stalled = false;
    for (const Interval& s : stalls) stalled = stalled || call.Overlaps(s);
    n += stalled ? 0 : 1;
  }
  return n;
}

std::string Answer(const grpc::Status& s, const pb::RateLimitResponse& r) {
  if (!s.ok())
    return s.error_code() == grpc::StatusCode::UNAVAILABLE
               ? "UNAVAILABLE"
               : "grpc error " + std::to_string(s.error_code());
  return r.overall_code() == pb::RateLimitResponse::OK           ? "OK"
         : r.overall_code() == pb::RateLimitResponse::OVER_LIMIT ? "OVER_LIMIT"
                                                                 : "UNKNOWN";
}

// The bound is 10 ms over the deadline, on a shared 2-core machine, where a
// gRPC call that touches no store at all now and then takes 30-50 ms (seen
// with Redis healthy, before the pause, on 2026-12-03: the VM and gRPC's
// thread hand-offs, docs/performance.md section 8). So a probe thread asks
// the same daemon, over the same channel, for a domain it does not have
// (answered without the store) the whole time, and a load call over the
// bound passes only if a probe call was stalled (> 10 ms) at the same
// moment, at most 1% of the calls of a phase; an answer waiting on the dead
// Redis has no such company. Also, the
// load is paced (each thread waits kPauseMs between calls: a saturating load
// would measure the scheduler, not the daemon), and, as tests/chaos does (see
// its HighPriority), the test moves itself to the lowest real-time priority
// when allowed; the daemon and Redis it starts inherit it, so other work on
// the box does not keep them from a CPU. (Paced, they stay far below the
// kernel's real-time share, sched_rt_runtime_us.)
class EnvoyFailure : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    const sched_param rr{.sched_priority = 1};
    if (::sched_setscheduler(0, SCHED_RR, &rr) != 0)
      std::printf("ENVOY note: running at normal priority (no SCHED_RR)\n");
  }
};

TEST_P(EnvoyFailure, DeadRedisUnderLoadIsAnsweredInTimeByTheFailureMode) {
  const std::string mode = GetParam();
  ratelimit::testing::RedisServer redis;
  const std::string dir = rltest::MakeTempDir();
  std::filesystem::create_directories(dir + "/envoy");
  rltest::WriteFile(dir + "/envoy/load.yaml",
                    "domain: load\ndescriptors:\n  - key: client\n"
                    "    rate_limit: {unit: hour, requests_per_unit: 1000000}\n");
  const int grpc_port = rltest::FreePort();
  rltest::WriteFile(dir + "/ratelimitd.yaml",
                    "server:\n  grpc_listen: 127.0.0.1:" + std::to_string(grpc_port) +
                        "\nstore:\n  type: redis\n  url: \"" + redis.url() +
                        "\"\n  deadline: " + std::to_string(kDeadlineMs) +
                        "ms\n  failure_mode: " + (mode == "error" ? "open" : mode) +
                        "\n  breaker: {failures: 5, open_for: 100ms, max_open_for: 500ms}\n"
                        "envoy:\n  config_dir: envoy\n" +
                        (mode == "error" ? "  failure_mode: error\n" : ""));
  rltest::Daemon d({"--config", dir + "/ratelimitd.yaml"});
  ASSERT_TRUE(d.WaitForLog("gRPC listening", 10s)) << d.Log();

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port),
                                     grpc::InsecureChannelCredentials());
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + 5s));
  std::atomic<bool> stop{false}, paused{false};
  Tally before, transition, during;
  std::vector<std::thread> load;
  std::mutex stalls_mu;
  std::vector<Interval> stalls;  // probe calls slower than kStallUs
  int probes = 0;
  load.emplace_back([&] {
    auto stub = pb::RateLimitService::NewStub(channel);
    pb::RateLimitRequest req;
    req.set_domain("no-such-domain");  // OK without a store step
    req.add_descriptors()->add_entries()->set_key("client");
    while (!stop) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 2s);
      pb::RateLimitResponse resp;
      const Interval call{Clock::now(), {}};
      (void)stub->ShouldRateLimit(&ctx, req, &resp);
      const Interval done{call.from, Clock::now()};
      {
        std::lock_guard lock(stalls_mu);
        ++probes;
        if (done.to - done.from > std::chrono::microseconds(kStallUs)) stalls.push_back(done);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kPauseMs));
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    load.emplace_back([&, t] {
      auto stub = pb::RateLimitService::NewStub(channel);
      pb::RateLimitRequest req;
      req.set_domain("load");
      auto* e = req.add_descriptors()->add_entries();
      e->set_key("client");
      e->set_value("c" + std::to_string(t));
      while (!stop) {
        const bool was_paused = paused;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        pb::RateLimitResponse resp;
        const auto t0 = Clock::now();
        const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
        const auto t1 = Clock::now();
        const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(t1 - t0).count();
        // Calls under way when Redis stopped may get either answer.
        Tally& tally = was_paused ? during : paused ? transition : before;
        {
          std::lock_guard lock(tally.mu);
          ++tally.answers[Answer(s, resp)];
          ++tally.calls;
          tally.slowest_us = std::max(tally.slowest_us, us);
          if (us > kBoundUs) tally.over_bound.push_back({t0, t1});
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(kPauseMs));
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  redis.Pause();
  paused = true;
  std::this_thread::sleep_for(500ms);
  const rltest::HttpResponse metrics = rltest::Http(d.admin_port(), "GET", "/metrics");
  std::this_thread::sleep_for(1000ms);
  stop = true;
  for (auto& th : load) th.join();
  redis.Resume();

  EXPECT_GT(before.calls, 0);
  EXPECT_EQ(before.answers["OK"], before.calls);
  // Each phase: every call within the bound, or stalled with the probe.
  auto within_bound = [&](const char* phase, const Tally& t) {
    EXPECT_EQ(Unexplained(t, stalls), 0)
        << phase << ": calls over " << kBoundUs << " us with no stall of the probe; slowest "
        << t.slowest_us << " us";
    EXPECT_LE(static_cast<int>(t.over_bound.size()), t.calls / 100 + 1)
        << phase << ": too many calls over the bound to be the machine's";
    EXPECT_LT(t.slowest_us, 500'000) << phase;
  };
  within_bound("before", before);
  within_bound("transition", transition);
  ASSERT_GT(during.calls, 50);
  const std::string expected = mode == "closed"  ? "OVER_LIMIT"
                               : mode == "error" ? "UNAVAILABLE"
                                                 : "OK";
  std::string seen;
  for (const auto& [answer, n] : during.answers) seen += answer + ": " + std::to_string(n) + " ";
  EXPECT_EQ(during.answers[expected], during.calls) << "mode " << mode << ": " << seen;
  EXPECT_EQ(transition.answers["OK"] + (expected == "OK" ? 0 : transition.answers[expected]),
            transition.calls);
  within_bound(("during, mode " + mode).c_str(), during);
  // Open (1) or probing (2), not closed, while Redis is stopped.
  const size_t at = metrics.body.find("\nratelimit_store_breaker_state ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NE(metrics.body.substr(at, 33), "\nratelimit_store_breaker_state 0\n");
  std::printf(
      "ENVOY failure_mode %s: %d calls while Redis was stopped, slowest %.1f ms; calls over "
      "%lld ms: %zu before, %zu in transition, %zu during; probe calls stalled: %zu of %d\n",
      mode.c_str(), during.calls, during.slowest_us / 1000.0,
      static_cast<long long>(kBoundUs / 1000), before.over_bound.size(),
      transition.over_bound.size(), during.over_bound.size(), stalls.size(), probes);
}

// store.failure_mode is not restart-bound: a reload applies it to the gRPC
// face's next call, as to the HTTP faces' (the face kept the start config's,
// while /v1/config showed the new one). Redis is not there at all.
TEST(EnvoyReload, AReloadedStoreFailureModeDecidesTheNextCall) {
  const std::string dir = rltest::MakeTempDir();
  std::filesystem::create_directories(dir + "/envoy");
  rltest::WriteFile(dir + "/envoy/d.yaml",
                    "domain: d\ndescriptors:\n  - key: client\n"
                    "    rate_limit: {unit: hour, requests_per_unit: 100}\n");
  const int grpc_port = rltest::FreePort();
  const std::string url = "redis://127.0.0.1:" + std::to_string(rltest::FreePort());
  auto config = [&](const std::string& mode) {
    return "server:\n  grpc_listen: 127.0.0.1:" + std::to_string(grpc_port) +
           "\nstore:\n  type: redis\n  url: \"" + url + "\"\n  failure_mode: " + mode +
           "\nenvoy:\n  config_dir: envoy\n";
  };
  rltest::WriteFile(dir + "/ratelimitd.yaml", config("open"));
  rltest::Daemon d({"--config", dir + "/ratelimitd.yaml"});
  ASSERT_TRUE(d.WaitForLog("gRPC listening", 10s)) << d.Log();
  auto stub = pb::RateLimitService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(grpc_port), grpc::InsecureChannelCredentials()));
  auto call = [&] {
    pb::RateLimitRequest req;
    req.set_domain("d");
    auto* e = req.add_descriptors()->add_entries();
    e->set_key("client");
    e->set_value("a");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    pb::RateLimitResponse resp;
    const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
    return Answer(s, resp);
  };
  EXPECT_EQ(call(), "OK");  // open
  rltest::WriteFile(dir + "/ratelimitd.yaml", config("closed"));
  d.Signal(SIGHUP);
  ASSERT_TRUE(d.WaitForLog("config reloaded", 10s)) << d.Log();
  EXPECT_EQ(call(), "OVER_LIMIT") << d.Log();
}

INSTANTIATE_TEST_SUITE_P(Modes, EnvoyFailure,
                         ::testing::Values("open", "closed", "local", "error"));

}  // namespace
