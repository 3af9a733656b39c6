// Shaping (leaky bucket) through the real ratelimitd: the gateway holds early
// requests and lets them out to a real upstream at the configured rate; the
// auth_request endpoint answers after the delay; held requests are bounded
// (server.max_held_requests) and a client that leaves frees its place at once.
//
// Timing: a burst's upstream arrivals are compared with the schedule the
// bucket gives them (one every 1/rate after the first), so only the hold's
// wake-up jitter counts, never the time the burst took to arrive. Arrival
// times are the kernel's receive timestamps at the upstream's socket, so the
// test's own threads being scheduled late on a busy box does not count
// either. Lower bounds (nothing may pass early) are exact; upper bounds allow
// for a loaded 2-core box.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness.h"

namespace rltest {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

// The bound on each arrival's distance from its slot, asked of the gateway.
// It holds under ASan+UBSan too (measured worst there: 3.9 ms): the hold is
// a timer, and little of the request path runs between it and the upstream.
constexpr double kJitterMs = 20;
// What every burst must meet, whatever the load: late by at most this.
constexpr double kLooseMs = 150;

// Writes a config (a shaped route, and /warm unshaped) and returns its path.
std::string ShapedConfig(int upstream_port, const std::string& server_extra, int depth,
                         double rate) {
  const std::string path = MakeTempDir() + "/c.yaml";
  WriteFile(path, "server:\n  upstream: http://127.0.0.1:" + std::to_string(upstream_port) + "\n" +
                      server_extra + "limits:\n  shape: {algorithm: leaky_bucket, depth: " +
                      std::to_string(depth) + ", rate_per_second: " + std::to_string(rate) +
                      "}\n"
                      "  warm: {algorithm: token_bucket, capacity: 100, refill_per_second: 100}\n"
                      "routes:\n"
                      "  - {name: warm, path: /warm, match: exact, limits: [warm]}\n"
                      "  - {name: shaped, path: /, match: prefix, limits: [shape]}\n");
  return path;
}

// Fires `n` requests at once (one thread and connection each), from
// `source_ip` (a client of its own), at `prefix` + "/r" + i.
std::vector<HttpResponse> Burst(int port, int n, const std::string& prefix = "",
                                const std::string& source_ip = "") {
  std::vector<HttpResponse> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready++;
      while (ready.load() < n) std::this_thread::yield();
      out[static_cast<size_t>(i)] =
          Http(port, "GET", prefix + "/r" + std::to_string(i), {}, "", source_ip);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// The value of an unlabelled (or fully labelled) sample in a /metrics scrape.
double Metric(const Daemon& d, const std::string& sample) {
  HttpResponse r = Http(d.admin_port(), "GET", "/metrics");
  const size_t at = r.body.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::stod(r.body.substr(at + sample.size() + 2));
}

void RaisePriority(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* dir = ::opendir(tasks.c_str());
  int raised = 0;
  while (dir != nullptr) {
    const dirent* e = ::readdir(dir);
    if (e == nullptr) break;
    const int tid = std::atoi(e->d_name);
    if (tid > 0 && ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), -10) == 0) ++raised;
  }
  if (dir != nullptr) ::closedir(dir);
  if (raised == 0) std::printf("note: could not raise ratelimitd's priority (not root?)\n");
}

// One burst of 20 from its own client, checked for what must always hold
// (all 200, none early, none later than a loose bound); returns how far the
// worst arrival was from its slot.
double ShapedBurstOf20(const Daemon& d, const TestUpstream& upstream, int attempt) {
  const std::string prefix = "/a" + std::to_string(attempt);
  const steady_clock::time_point sent = steady_clock::now();
  std::vector<HttpResponse> rs =
      Burst(d.port(), 20, prefix, "127.0.0." + std::to_string(10 + attempt));
  const double took = Ms(steady_clock::now() - sent).count();
  for (const HttpResponse& r : rs) EXPECT_EQ(r.status, 200) << r.raw_head << r.body;
  EXPECT_GE(took, 19 * 200 - kJitterMs) << "the burst cannot finish before its last slot";

  std::vector<TestUpstream::Arrival> a;
  for (const auto& x : upstream.arrivals()) {
    if (x.target.rfind(prefix + "/", 0) == 0) a.push_back(x);
  }
  EXPECT_EQ(a.size(), 20u);
  if (a.size() != 20u) return 1e9;
  std::sort(a.begin(), a.end(), [](const auto& x, const auto& y) { return x.at < y.at; });
  double worst = 0;
  std::string gaps;
  for (size_t i = 1; i < a.size(); ++i) {
    const double since_first = Ms(a[i].at - a[0].at).count();
    const double slot = 200.0 * static_cast<double>(i);
    gaps += " " + std::to_string(static_cast<int>(Ms(a[i].at - a[i - 1].at).count()));
    worst = std::max(worst, std::abs(since_first - slot));
    EXPECT_GE(since_first, slot - kJitterMs) << "arrival " << i << " came early";
    EXPECT_LE(since_first, slot + kLooseMs) << "arrival " << i;
  }
  std::printf(
      "burst of 20 at 5/s, attempt %d: upstream gaps (ms):%s; worst distance from "
      "the schedule %.1f ms\n",
      attempt + 1, gaps.c_str(), worst);
  return worst;
}

TEST(Shaping, GatewayBurstOf20ArrivesUpstream200msApartNoneRejected) {
  TestUpstream upstream;
  Daemon d({"--config", ShapedConfig(upstream.port(), "", 20, 5)});
  ASSERT_TRUE(d.started()) << d.Log();
  // The box's other tenants (parallel builds, other test binaries) must not
  // decide when the daemon's timers get a CPU: raise the priority of all its
  // threads (nice is per thread on Linux) where we may (root); elsewhere the
  // test runs at the default and says so.
  RaisePriority(d.pid());
  // One unshaped request first: the upstream connection the burst reuses is
  // then open, so the first arrival is not late by a connect.
  ASSERT_EQ(Http(d.port(), "GET", "/warm").status, 200);
  // Even so, one wake-up can be late by a scheduler slice on a loaded box. So
  // every burst must be correct, and one of up to three (each from a client
  // of its own) must keep every arrival within kJitterMs of its slot.
  double best = 1e9;
  int attempts = 0;
  while (attempts < 3 && best > kJitterMs)
    best = std::min(best, ShapedBurstOf20(d, upstream, attempts++));
  EXPECT_LE(best, kJitterMs);
  EXPECT_EQ(Metric(d, "ratelimit_delayed_requests_total{face=\"gateway\"}"), 19 * attempts);
  EXPECT_EQ(Metric(d, "ratelimit_request_delay_seconds_count"), 19 * attempts);
  EXPECT_EQ(Metric(d, "ratelimit_held_requests"), 0);
}

TEST(Shaping, BeyondTheDepthIsDeniedAndBeyondMaxHeldIs503) {
  TestUpstream upstream;
  // Depth 4 at 2/s: a burst of 6 is 4 admitted (one at once, three delayed)
  // and 2 denied; at most 2 may be held, so one of the three delayed is 503.
  Daemon d({"--config", ShapedConfig(upstream.port(), "  max_held_requests: 2\n", 4, 2)});
  ASSERT_TRUE(d.started()) << d.Log();
  std::vector<HttpResponse> rs = Burst(d.port(), 6);
  int ok = 0, denied = 0, unavailable = 0;
  for (const HttpResponse& r : rs) {
    if (r.status == 200) ++ok;
    if (r.status == 429) ++denied;
    if (r.status == 503) {
      ++unavailable;
      EXPECT_NE(nlohmann::json::parse(r.body)["detail"].get<std::string>().find(
                    "server.max_held_requests"),
                std::string::npos);
      EXPECT_EQ(r.Header("Retry-After"), "1");
    }
  }
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(denied, 2);
  EXPECT_EQ(unavailable, 1);
  EXPECT_EQ(upstream.requests(), 3);
  EXPECT_EQ(Metric(d, "ratelimit_held_requests_rejected_total"), 1);
  EXPECT_EQ(Metric(d, "ratelimit_delayed_requests_total{face=\"gateway\"}"), 2);
}

// Opens a connection, sends a GET and returns the socket (not read).
int SendOnly(int port, const std::string& target) {
  const int fd = Connect(port);
  if (fd >= 0 && !SendAll(fd, "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool WaitForMetric(const Daemon& d, const std::string& sample, double want, milliseconds within) {
  const auto until = steady_clock::now() + within;
  while (steady_clock::now() < until) {
    if (Metric(d, sample) == want) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

TEST(Shaping, ClientThatLeavesWhileHeldFreesItsPlaceAndIsNeverForwarded) {
  TestUpstream upstream;
  Daemon d({"--config", ShapedConfig(upstream.port(), "  max_held_requests: 1\n", 10, 1)});
  ASSERT_TRUE(d.started()) << d.Log();
  ASSERT_EQ(Http(d.port(), "GET", "/first").status, 200);  // delay 0: not held
  const int fd = SendOnly(d.port(), "/leaver");            // delay ~1 s: held
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WaitForMetric(d, "ratelimit_held_requests", 1, milliseconds(2000)));
  ::close(fd);
  // Freed at once (the pending wait sees EOF), long before its delay ends.
  const steady_clock::time_point closed = steady_clock::now();
  ASSERT_TRUE(WaitForMetric(d, "ratelimit_held_requests", 0, milliseconds(500)));
  EXPECT_LT(Ms(steady_clock::now() - closed).count(), 500);
  EXPECT_EQ(Metric(d, "ratelimit_held_requests_abandoned_total"), 1);
  // Its place is free: the next one is held (not 503) and then forwarded.
  HttpResponse r = Http(d.port(), "GET", "/next");
  EXPECT_EQ(r.status, 200) << r.body;  // held past the leaver's slot (~1 s after /first)
  std::vector<std::string> targets;
  for (const auto& a : upstream.arrivals()) targets.push_back(a.target);
  EXPECT_EQ(targets, (std::vector<std::string>{"/first", "/next"}));
}

TEST(Shaping, AuthRequestAnswers2xxAfterTheDelay) {
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/c.yaml",
            "limits:\n  shape: {algorithm: leaky_bucket, depth: 5, rate_per_second: 10}\n"
            "routes:\n  - {name: all, path: /, match: prefix, limits: [shape]}\n");
  Daemon d({"--config", dir + "/c.yaml"});
  ASSERT_TRUE(d.started()) << d.Log();
  const Headers h = {{"X-Original-Method", "GET"}, {"X-Original-URI", "/api/x"}};
  std::vector<double> took(3);
  std::vector<int> status(3);
  std::vector<std::thread> threads;
  const steady_clock::time_point start = steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      status[static_cast<size_t>(i)] = Http(d.port(), "GET", "/v1/auth", h).status;
      took[static_cast<size_t>(i)] = Ms(steady_clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  for (int s : status) EXPECT_EQ(s, 204);
  std::sort(took.begin(), took.end());
  // 100 ms apart: the second no earlier than 100 ms, the third than 200 ms.
  EXPECT_GE(took[1], 100 - 1);
  EXPECT_GE(took[2], 200 - 1);
  EXPECT_LT(took[2], 200 + 1000);
  EXPECT_EQ(Metric(d, "ratelimit_delayed_requests_total{face=\"auth_request\"}"), 2);
}

}  // namespace
}  // namespace rltest
