// Failover under load: two real ratelimitd on redis+sentinel:// (one master,
// one replica, three sentinels with down-after-milliseconds 1000), each under
// a steady open-loop load (tests/chaos/load.h), while the master is killed
// (SIGKILL). What must hold: every request is answered, by Redis or by the
// failure mode (open), never later than the deadline + 10 ms; decisions come
// from Redis again within 1 s of the sentinels' promotion; the degraded
// decisions of the gap are counted (ratelimit_degraded_decisions_total);
// afterwards 200 concurrent requests over both instances on a capacity of 10
// allow exactly 10. Prints one "SENTINEL failover ..." line of figures
// (docs/reliability.md collects them).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "load.h"
#include "support/redis_sentinel.h"

namespace rlchaos {
namespace {

using ratelimit::testing::RedisSentinel;
using rltest::Daemon;
using std::chrono::milliseconds;

constexpr int64_t kMs = 1000;
constexpr int64_t kDeadlineMs = 100;
constexpr milliseconds kDownAfter{1000};

// As tests/chaos: the lowest real-time priority (inherited by the daemons,
// Redis and the load) so that a busy machine's run queue is not measured.
class HighPriority : public testing::Environment {
 public:
  void SetUp() override {
    const sched_param rr{.sched_priority = 1};
    if (::sched_setscheduler(0, SCHED_RR, &rr) != 0) ::setpriority(PRIO_PROCESS, 0, -20);
  }
};
[[maybe_unused]] testing::Environment* const kHighPriority =
    testing::AddGlobalTestEnvironment(new HighPriority);

std::string WriteConfig(const std::string& url) {
  const std::string path = rltest::MakeTempDir() + "/ratelimitd.yaml";
  rltest::WriteFile(path, "store:\n  type: redis\n  url: \"" + url +
                              "\"\n  deadline: " + std::to_string(kDeadlineMs) +
                              "ms\n  failure_mode: open\n"
                              "  breaker: {failures: 5, open_for: 100ms, max_open_for: 500ms}\n");
  return path;
}

// The sum of ratelimit_degraded_decisions_total over its causes.
int64_t Degraded(const Daemon& d) {
  const rltest::HttpResponse r = rltest::Http(d.admin_port(), "GET", "/metrics");
  std::istringstream lines(r.body);
  std::string line;
  int64_t n = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("ratelimit_degraded_decisions_total{", 0) == 0) {
      n += std::atoll(line.c_str() + line.rfind(' ') + 1);
    }
  }
  return n;
}

// 20 exact answers in a row: the daemon has found the master.
bool WaitUntilExact(const Daemon& d) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Connection c(d.port());
  for (int exact = 0; exact < 20;) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    bool degraded = false;
    const int status = c.Post("/v1/check", CheckBody("warm-up", 5000), &degraded);
    exact = status == 200 && !degraded ? exact + 1 : 0;
    if (exact == 0) std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

int64_t DegradedAnswers(const std::vector<Sample>& s) {
  int64_t n = 0;
  for (const Sample& x : s) n += x.degraded ? 1 : 0;
  return n;
}

TEST(SentinelFailover, TwoInstancesUnderLoadWhileTheMasterIsKilled) {
  RedisSentinel s({.down_after = kDownAfter});
  const std::string config = WriteConfig(s.url());
  Daemon a({"--config", config});
  Daemon b({"--config", config});
  ASSERT_TRUE(a.started()) << a.Log();
  ASSERT_TRUE(b.started()) << b.Log();
  ASSERT_TRUE(WaitUntilExact(a)) << a.Log();
  ASSERT_TRUE(WaitUntilExact(b)) << b.Log();
  const int64_t degraded_start = Degraded(a) + Degraded(b);

  Load la(a.port(), {.rate = 150, .connections = 2, .keys = 4, .limit = 5000});
  Load lb(b.port(), {.rate = 150, .connections = 2, .keys = 4, .limit = 5000});
  la.Start();
  lb.Start();
  std::this_thread::sleep_for(milliseconds(1500));
  const size_t old_master = s.MasterIndex();
  const int64_t t_kill = la.Now();
  s.data(old_master).Kill();
  const size_t promoted = s.WaitForNewMaster(old_master);
  const int64_t t_promoted = la.Now();  // every sentinel names it, and ROLE says master
  std::this_thread::sleep_for(milliseconds(2500));
  la.Stop();
  lb.Stop();
  const int64_t degraded_end = Degraded(a) + Degraded(b);

  // 200 concurrent requests over both instances on a fresh key of capacity 10.
  std::atomic<int> allowed{0}, denied{0}, degraded{0}, other{0}, next{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      Connection c(t % 2 == 0 ? a.port() : b.port());
      while (next.fetch_add(1) < 200) {
        bool deg = false;
        const int status = c.Post("/v1/check", CapacityBody("after-failover", 10), &deg);
        if (deg) ++degraded;
        (status == 200 ? allowed : status == 429 ? denied : other)++;
      }
    });
  }
  for (auto& t : clients) t.join();

  std::vector<Sample> all = la.samples();
  const std::vector<Sample> more = lb.samples();  // the same clock origin is not needed:
  const PhaseStats sa = Stats(all, 0, la.Now());  // each load is judged on its own
  const PhaseStats sb = Stats(more, 0, lb.Now());
  const int64_t recovered_a = RecoveredAt(all, t_promoted);
  const int64_t t_promoted_b = t_promoted - la.Now() + lb.Now();
  const int64_t recovered_b = RecoveredAt(more, t_promoted_b);
  const int64_t degraded_answers = DegradedAnswers(all) + DegradedAnswers(more);
  std::printf(
      "SENTINEL failover down_after_ms=%lld promoted_after_ms=%.1f "
      "recovered_after_promotion_ms=%.1f/%.1f degraded=%lld counted=%lld max_latency_ms=%.1f/%.1f "
      "requests=%d/%d allowed_after=%d/10\n",
      static_cast<long long>(kDownAfter.count()), (t_promoted - t_kill) / 1000.0,
      (recovered_a - t_promoted) / 1000.0, (recovered_b - t_promoted_b) / 1000.0,
      static_cast<long long>(degraded_answers),
      static_cast<long long>(degraded_end - degraded_start), sa.max_us / 1000.0, sb.max_us / 1000.0,
      sa.requests, sb.requests, allowed.load());
  std::printf("SENTINEL failover a: %s\nSENTINEL failover b: %s\n", sa.ToString().c_str(),
              sb.ToString().c_str());
  std::fflush(stdout);

  EXPECT_NE(promoted, old_master);
  // The promoted replica had no script (SCRIPT LOAD is not replicated): the
  // first call met NOSCRIPT and loaded it.
  EXPECT_NE(s.Cli(s.data(promoted), {"INFO", "commandstats"}).find("cmdstat_script|load:calls="),
            std::string::npos);
  for (const PhaseStats* p : {&sa, &sb}) {
    EXPECT_GT(p->requests, 500);
    EXPECT_EQ(p->answered, p->requests);
    EXPECT_EQ(p->ok, p->requests);  // failure_mode open, a limit Redis never reaches
    EXPECT_LE(p->max_us, (kDeadlineMs + 10) * kMs) << "a decision waited past the deadline";
  }
  // Decisions are Redis' again within 1 s of the promotion.
  ASSERT_GE(recovered_a, 0) << a.Log();
  ASSERT_GE(recovered_b, 0) << b.Log();
  EXPECT_LE(recovered_a - t_promoted, 1000 * kMs);
  EXPECT_LE(recovered_b - t_promoted_b, 1000 * kMs);
  // The gap was decided by the failure mode, and every such decision counted.
  EXPECT_GT(degraded_answers, 0);
  EXPECT_EQ(degraded_end - degraded_start, degraded_answers);
  // Exact again, across both instances.
  EXPECT_EQ(allowed.load(), 10);
  EXPECT_EQ(denied.load(), 190);
  EXPECT_EQ(degraded.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

}  // namespace
}  // namespace rlchaos
