// ConcurrencyLimiter: failure modes, the lease guard, waiting, the decision
// API's renewals; ParseAcquire, ParseRelease, ParseRenew.
#include "server/concurrency_guard.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "server/concurrency_api.h"
#include "server/in_turns.h"
#include "server/metrics.h"
#include "server/outcome_reply.h"

namespace ratelimit::server {
namespace {

using std::chrono::milliseconds;
using OnLimit = policy::ConcurrencyConfig::OnLimit;

// Sanitizers slow every callback; latency bounds get slack there.
#if defined(RL_SANITIZED)  // ASan or TSan (CMakeLists.txt)
constexpr milliseconds kSlack{40};
#else
constexpr milliseconds kSlack{0};
#endif

class FailingConcurrencyStore final : public ConcurrencyStore {
 public:
  void Acquire(const AcquireRequest&, AcquireCallback done) override {
    done(Unavailable("redis down"));
  }
  void Release(std::string_view, std::string_view, std::string_view,
               ReleaseCallback done) override {
    done(Unavailable("redis down"));
  }
  void Renew(std::string_view, std::string_view, std::string_view, std::chrono::microseconds,
             RenewCallback done) override {
    done(Unavailable("redis down"));
  }
};

// Its first `failures` releases and first `renew_failures` renewals fail as
// in a Redis blip; then `inner` answers. Counts the calls.
class FlakyStore final : public ConcurrencyStore {
 public:
  FlakyStore(ConcurrencyStore& inner, int failures, int renew_failures = 0)
      : inner_(inner), failures_(failures), renew_failures_(renew_failures) {}
  void Acquire(const AcquireRequest& r, AcquireCallback done) override {
    inner_.Acquire(r, std::move(done));
  }
  void Release(std::string_view key, std::string_view name, std::string_view id,
               ReleaseCallback done) override {
    ++releases;
    if (failures_.fetch_sub(1) > 0) return done(Unavailable("redis blip"));
    inner_.Release(key, name, id, std::move(done));
  }
  void Renew(std::string_view key, std::string_view name, std::string_view id,
             std::chrono::microseconds ttl, RenewCallback done) override {
    ++renewals;
    if (renew_failures_.fetch_sub(1) > 0) return done(Unavailable("redis blip"));
    inner_.Renew(key, name, id, ttl, std::move(done));
  }
  std::atomic<int> releases{0}, renewals{0};

 private:
  ConcurrencyStore& inner_;
  std::atomic<int> failures_, renew_failures_;
};

// Waits up to 2 s for `done()`.
template <typename F>
bool Eventually(F done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!done() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  return done();
}

class LimiterTest : public testing::Test {
 protected:
  LimiterTest() : work_(ioc_.get_executor()), thread_([this] { ioc_.run(); }) {}
  ~LimiterTest() override {
    work_.reset();
    ioc_.stop();
    thread_.join();
  }

  ConcurrencyOutcome Acquire(ConcurrencyLimiter& l, policy::ConcurrencyConfig c,
                             policy::FailureMode mode = policy::FailureMode::kOpen) {
    std::promise<ConcurrencyOutcome> p;
    auto f = p.get_future();
    l.Acquire({.key = "user:ada",
               .name = "upload",
               .route = "upload",
               .config = c,
               .failure_mode = mode,
               .expected_instances = store_config_.expected_instances,
               .closed_status = store_config_.closed_status},
              [&p](ConcurrencyOutcome o) { p.set_value(std::move(o)); });
    return f.get();
  }

  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
  MemoryConcurrencyStore memory_;
  policy::StoreConfig store_config_;
};

TEST_F(LimiterTest, RejectThenTheGuardReleases) {
  ConcurrencyLimiter l(ioc_.get_executor(), memory_);
  ConcurrencyOutcome first = Acquire(l, {.max_in_flight = 1});
  ASSERT_EQ(first.status, 200u);
  ASSERT_NE(first.lease, nullptr);
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 1);
  ConcurrencyOutcome second = Acquire(l, {.max_in_flight = 1});
  EXPECT_EQ(second.status, 429u);
  EXPECT_EQ(second.denial, ConcurrencyOutcome::Denial::kLimit);
  EXPECT_EQ(second.lease, nullptr);
  EXPECT_EQ(second.result.in_flight, 1);
  const std::string body = ConcurrencyExceededBody(second, "upload", "/up");
  EXPECT_NE(body.find(R"("limit":"concurrency:upload")"), std::string::npos) << body;
  EXPECT_NE(body.find("1 of 1 requests in flight"), std::string::npos) << body;
  first.lease.reset();  // the RAII guard gives the lease back
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 0);
  EXPECT_EQ(Acquire(l, {.max_in_flight = 1}).status, 200u);
}

TEST_F(LimiterTest, FailureModes) {
  FailingConcurrencyStore down;
  store_config_.closed_status = 503;
  store_config_.expected_instances = 2;
  ConcurrencyLimiter l(ioc_.get_executor(), down);
  ConcurrencyOutcome open = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kOpen);
  EXPECT_EQ(open.status, 200u);
  EXPECT_TRUE(open.degraded);
  EXPECT_EQ(open.lease, nullptr);
  ConcurrencyOutcome closed = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kClosed);
  EXPECT_EQ(closed.status, 503u);
  EXPECT_TRUE(closed.degraded);
  // local: 3 over 2 instances -> 2 here.
  ConcurrencyOutcome a = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kLocal);
  ConcurrencyOutcome b = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kLocal);
  ConcurrencyOutcome c = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kLocal);
  ASSERT_EQ(a.status, 200u);
  ASSERT_NE(a.lease, nullptr);
  EXPECT_TRUE(a.lease->id().starts_with("l-"));
  EXPECT_TRUE(a.degraded);
  EXPECT_EQ(b.status, 200u);
  EXPECT_EQ(c.status, 429u);
  a.lease.reset();
  EXPECT_EQ(Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kLocal).status, 200u);
}

// closed_status 429 is allowed; a store outage is still not "limit reached".
TEST_F(LimiterTest, FailedClosedWith429IsNotALimitDenial) {
  FailingConcurrencyStore down;
  store_config_.closed_status = 429;
  ConcurrencyLimiter l(ioc_.get_executor(), down);
  ConcurrencyOutcome closed = Acquire(l, {.max_in_flight = 3}, policy::FailureMode::kClosed);
  EXPECT_EQ(closed.status, 429u);
  EXPECT_TRUE(closed.failed_closed);
  EXPECT_EQ(closed.denial, ConcurrencyOutcome::Denial::kNone);
  const Reply r =
      ConcurrencyRefusalReply(closed, "upload", policy::HeaderDialect::kDraft06, "/upload");
  EXPECT_EQ(r.status, 429u);
  EXPECT_NE(r.body.find("unavailable"), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("reached"), std::string::npos) << r.body;
  for (const auto& [name, value] : r.headers) {
    EXPECT_FALSE(name.starts_with("RateLimit")) << name << ": " << value;
  }
  EXPECT_NE(r.Find("X-RateLimit-Degraded"), nullptr);
}

// failure_mode local keeps leases for at most store.local_max_keys keys
// (here 2); beyond, it admits without a lease, as the rate limits' fallback.
TEST_F(LimiterTest, LocalFallbackHonoursLocalMaxKeys) {
  FailingConcurrencyStore down;
  ConcurrencyLimiter l(ioc_.get_executor(), down, {.local_max_keys = 2});
  std::vector<ConcurrencyOutcome> held;
  for (const char* key : {"a", "b", "c"}) {
    std::promise<ConcurrencyOutcome> p;
    l.Acquire({.key = key,
               .name = "upload",
               .route = "upload",
               .config = {.max_in_flight = 3},
               .failure_mode = policy::FailureMode::kLocal},
              [&p](ConcurrencyOutcome o) { p.set_value(std::move(o)); });
    held.push_back(p.get_future().get());
    EXPECT_EQ(held.back().status, 200u) << key;
    EXPECT_TRUE(held.back().degraded) << key;
  }
  EXPECT_NE(held[0].lease, nullptr);
  EXPECT_NE(held[1].lease, nullptr);
  EXPECT_EQ(held[2].lease, nullptr);  // full: no third key
}

// A route's per: route limit reaches the local fallback as route-wide
// (through ResilientConcurrencyStore): a full fallback still leases it, and
// its cap holds, where another new key is let through without a lease.
TEST_F(LimiterTest, ARouteWideLimitHoldsInAFullLocalFallback) {
  FailingConcurrencyStore down;
  ConcurrencyLimiter l(ioc_.get_executor(), down, {.local_max_keys = 2});
  auto acquire = [&](const char* key, policy::ConcurrencyConfig::Per per) {
    std::promise<ConcurrencyOutcome> p;
    l.Acquire({.key = key,
               .name = "export",
               .route = "export",
               .config = {.max_in_flight = 1, .per = per},
               .failure_mode = policy::FailureMode::kLocal},
              [&p](ConcurrencyOutcome o) { p.set_value(std::move(o)); });
    return p.get_future().get();
  };
  using Per = policy::ConcurrencyConfig::Per;
  ConcurrencyOutcome a = acquire("d:a", Per::kClient), b = acquire("d:b", Per::kClient);
  ASSERT_NE(a.lease, nullptr);
  ASSERT_NE(b.lease, nullptr);
  ConcurrencyOutcome c = acquire("d:c", Per::kClient);
  EXPECT_EQ(c.status, 200u);
  EXPECT_EQ(c.lease, nullptr);  // full: let through
  ConcurrencyOutcome whole = acquire("~all", Per::kRoute);
  EXPECT_EQ(whole.status, 200u);
  EXPECT_NE(whole.lease, nullptr);
  EXPECT_EQ(acquire("~all", Per::kRoute).status, 429u);  // the route's cap of 1
}

// A release the store failed is retried once it answers again, not left
// to hold the place for all of lease_ttl (here 30 s).
TEST_F(LimiterTest, AFailedReleaseIsRetriedWhenTheStoreReturns) {
  FlakyStore flaky(memory_, 2);
  ConcurrencyLimiter l(ioc_.get_executor(), flaky, {.release_retry = milliseconds(5)});
  ConcurrencyOutcome held = Acquire(l, {.max_in_flight = 1, .lease_ttl = milliseconds(30'000)});
  ASSERT_NE(held.lease, nullptr);
  held.lease.reset();  // fails: the blip
  for (int i = 0; i < 1000 && memory_.InFlight("user:ada", "upload") != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 0);
  EXPECT_EQ(flaky.releases.load(), 3);  // failed, failed, released
  EXPECT_EQ(Acquire(l, {.max_in_flight = 1}).status, 200u);
}

// The server sweeps a mass expiry of leases in turns (InTurns +
// SweepSome): the first step at once, each next one queued behind what
// arrived meanwhile, so a request waits for one step, not for the whole sweep.
TEST(InTurns, ALeaseSweepLetsQueuedWorkInBetweenItsSteps) {
  ManualClock clock;
  MemoryConcurrencyStore store({.clock = &clock});
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(
        store.AcquireSync({.key = "k" + std::to_string(i), .name = "upload", .max_in_flight = 1})
            ->acquired);
  }
  clock.Advance(std::chrono::hours(1));
  boost::asio::io_context ioc;
  int steps = 0, request_served_after = 0;
  InTurns(ioc.get_executor(), [&] {
    if (++steps == 1) boost::asio::post(ioc, [&] { request_served_after = steps; });  // a request
    return store.SweepSome(64).more;
  });
  EXPECT_EQ(steps, 1);
  ioc.run();
  EXPECT_EQ(steps, 16);  // ceil(1000 / 64)
  EXPECT_EQ(request_served_after, 1);
  EXPECT_EQ(store.Sweep(), 0u);
}

TEST(RenewInterval, AThirdOfTheTtlNotUnder10MsUnlessTheTtlIsShort) {
  EXPECT_EQ(RenewInterval(milliseconds(30'000)), milliseconds(10'000));
  EXPECT_EQ(RenewInterval(milliseconds(90)), milliseconds(30));
  EXPECT_EQ(RenewInterval(milliseconds(21)), milliseconds(10));
  EXPECT_EQ(RenewInterval(milliseconds(10)), milliseconds(5));
  EXPECT_EQ(RenewInterval(milliseconds(1)), milliseconds(1));
}

// A request that runs longer than its lease_ttl (a streamed answer) keeps
// its place: the guard renews the lease every 30 ms, so that after more than
// 3 x lease_ttl a second request is still refused; the release frees it.
TEST_F(LimiterTest, AHeldLeaseIsRenewedPastItsTtl) {
  ConcurrencyLimiter l(ioc_.get_executor(), memory_);
  const policy::ConcurrencyConfig c{.max_in_flight = 1, .lease_ttl = milliseconds(90)};
  auto& lost = Metrics::Global().Concurrency("upload").lease_lost;
  const uint64_t lost_before = lost.value();
  ConcurrencyOutcome held = Acquire(l, c);
  ASSERT_NE(held.lease, nullptr);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 1);
  ConcurrencyOutcome second = Acquire(l, c);
  EXPECT_EQ(second.status, 429u);
  EXPECT_EQ(second.denial, ConcurrencyOutcome::Denial::kLimit);
  held.lease.reset();
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 0);
  EXPECT_EQ(Acquire(l, c).status, 200u);
  EXPECT_EQ(lost.value(), lost_before);
}

// A lease the store no longer holds (here released behind the guard's back)
// is lost: counted once, and the guard stops renewing it.
TEST_F(LimiterTest, ALostLeaseStopsRenewingAndIsCounted) {
  FlakyStore counting(memory_, 0);
  ConcurrencyLimiter l(ioc_.get_executor(), counting);
  auto& lost = Metrics::Global().Concurrency("upload").lease_lost;
  const uint64_t before = lost.value();
  ConcurrencyOutcome held = Acquire(l, {.max_in_flight = 1, .lease_ttl = milliseconds(60)});
  ASSERT_NE(held.lease, nullptr);
  ASSERT_TRUE(Eventually([&] { return counting.renewals.load() >= 2; }));
  EXPECT_EQ(lost.value(), before);
  ASSERT_TRUE(*memory_.ReleaseSync("user:ada", "upload", held.lease->id()));
  ASSERT_TRUE(Eventually([&] { return lost.value() == before + 1; }));
  const int renewals = counting.renewals.load();
  std::this_thread::sleep_for(milliseconds(100));  // five renewal intervals
  EXPECT_EQ(counting.renewals.load(), renewals);
  held.lease.reset();
  EXPECT_EQ(lost.value(), before + 1);
}

// A renewal the store fails is tried again at the next tick: one blip does
// not lose the lease.
TEST_F(LimiterTest, AFailedRenewalIsRetriedAtTheNextTick) {
  FlakyStore flaky(memory_, 0, /*renew_failures=*/1);
  ConcurrencyLimiter l(ioc_.get_executor(), flaky);
  auto& lost = Metrics::Global().Concurrency("upload").lease_lost;
  const uint64_t before = lost.value();
  const policy::ConcurrencyConfig c{.max_in_flight = 1, .lease_ttl = milliseconds(90)};
  ConcurrencyOutcome held = Acquire(l, c);
  ASSERT_NE(held.lease, nullptr);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_GE(flaky.renewals.load(), 3);
  EXPECT_EQ(Acquire(l, c).status, 429u);
  EXPECT_EQ(lost.value(), before);
}

// Renewals that keep failing stop when the lease has expired: lost.
TEST_F(LimiterTest, RenewalsThatKeepFailingStopAtTheLeasesExpiry) {
  FlakyStore down(memory_, 0, /*renew_failures=*/1'000'000);
  ConcurrencyLimiter l(ioc_.get_executor(), down);
  auto& lost = Metrics::Global().Concurrency("upload").lease_lost;
  const uint64_t before = lost.value();
  ConcurrencyOutcome held = Acquire(l, {.max_in_flight = 1, .lease_ttl = milliseconds(60)});
  ASSERT_NE(held.lease, nullptr);
  ASSERT_TRUE(Eventually([&] { return lost.value() == before + 1; }));
  // Every 20 ms: at 20 and 40 ms (failed), at 60 ms it had expired.
  const int renewals = down.renewals.load();
  EXPECT_GE(renewals, 1);
  EXPECT_LE(renewals, 3);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(down.renewals.load(), renewals);
  EXPECT_EQ(memory_.InFlight("user:ada", "upload"), 0);
}

// Renew helpers: the decision API's calls, answered in the call or on the
// store's thread.
StatusOr<bool> Renew(ConcurrencyLimiter& l, std::string_view id, milliseconds ttl) {
  std::promise<StatusOr<bool>> p;
  l.Renew("user:ada", "upload", id, ttl, [&p](StatusOr<bool> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

StatusOr<bool> Release(ConcurrencyLimiter& l, std::string_view id) {
  std::promise<StatusOr<bool>> p;
  l.Release("user:ada", "upload", id, [&p](StatusOr<bool> r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

// A decision-API lease (detached from its guard: nothing renews it here) is
// kept by the caller's renewals past its first lease_ttl, each for its own
// ttl from the store's now; one expired or released is not held again.
TEST_F(LimiterTest, ADecisionApiLeaseIsKeptByItsRenewals) {
  ManualClock clock;
  MemoryConcurrencyStore memory({.clock = &clock});
  ConcurrencyLimiter l(ioc_.get_executor(), memory);
  const milliseconds ttl(30'000);  // the guard's own renewals, 10 s apart, never come
  ConcurrencyOutcome held = Acquire(l, {.max_in_flight = 1, .lease_ttl = ttl});
  ASSERT_NE(held.lease, nullptr);
  const std::string id = held.lease->Detach();
  clock.Advance(milliseconds(25'000));
  EXPECT_TRUE(*Renew(l, id, ttl));
  clock.Advance(milliseconds(25'000));  // 50 s after the acquire
  EXPECT_EQ(memory.InFlight("user:ada", "upload"), 1);
  EXPECT_TRUE(*Renew(l, id, milliseconds(1000)));  // shorter: now + 1 s
  clock.Advance(milliseconds(1001));
  EXPECT_EQ(memory.InFlight("user:ada", "upload"), 0);
  EXPECT_FALSE(*Renew(l, id, ttl));  // expired: acquire again
  EXPECT_EQ(memory.InFlight("user:ada", "upload"), 0);
  ConcurrencyOutcome again = Acquire(l, {.max_in_flight = 1, .lease_ttl = ttl});
  ASSERT_NE(again.lease, nullptr);
  const std::string next = again.lease->Detach();
  EXPECT_TRUE(*Release(l, next));
  EXPECT_FALSE(*Renew(l, next, ttl));  // released
}

// A lease the local fallback gave out ("l-") is renewed there, with the
// inner store down; any other goes to the inner store, and its failure is
// the caller's to see (no failure mode turns it into "renewed").
TEST_F(LimiterTest, ALocalFallbackLeaseIsRenewedInTheFallback) {
  FailingConcurrencyStore down;
  ConcurrencyLimiter l(ioc_.get_executor(), down);
  ConcurrencyOutcome local = Acquire(l, {.max_in_flight = 1, .lease_ttl = milliseconds(30'000)},
                                     policy::FailureMode::kLocal);
  ASSERT_NE(local.lease, nullptr);
  const std::string id = local.lease->Detach();
  ASSERT_TRUE(id.starts_with("l-")) << id;
  StatusOr<bool> renewed = Renew(l, id, milliseconds(60'000));
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_TRUE(*renewed);
  StatusOr<bool> inner = Renew(l, id.substr(2), milliseconds(60'000));
  ASSERT_FALSE(inner.ok());
  EXPECT_EQ(inner.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(*Release(l, id));
  EXPECT_FALSE(*Renew(l, id, milliseconds(60'000)));
}

TEST_F(LimiterTest, WaitsUntilALeaseIsReleased) {
  ConcurrencyLimiter l(ioc_.get_executor(), memory_);
  const policy::ConcurrencyConfig wait{.max_in_flight = 1,
                                       .on_limit = OnLimit::kWait,
                                       .max_wait = milliseconds(5000),
                                       .max_waiting = 1};
  ConcurrencyOutcome first = Acquire(l, wait);
  ASSERT_EQ(first.status, 200u);
  std::promise<ConcurrencyOutcome> p;
  auto f = p.get_future();
  l.Acquire({.key = "user:ada", .name = "upload", .route = "upload", .config = wait},
            [&p](ConcurrencyOutcome o) { p.set_value(std::move(o)); });
  // The waiting room holds one: a third is refused at once.
  ConcurrencyOutcome third = Acquire(l, wait);
  EXPECT_EQ(third.status, 429u);
  EXPECT_EQ(third.denial, ConcurrencyOutcome::Denial::kQueueFull);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(f.wait_for(milliseconds(0)), std::future_status::timeout);  // still waiting
  const auto released = std::chrono::steady_clock::now();
  first.lease.reset();
  ConcurrencyOutcome second = f.get();
  EXPECT_EQ(second.status, 200u);
  EXPECT_GE(second.waited, milliseconds(300));
  // Woken by the release, not by its next poll (up to 200 ms later).
  EXPECT_LT(std::chrono::steady_clock::now() - released, milliseconds(150) + kSlack);
}

// Two releases in a row wake two waiters, not the oldest one twice. The
// waiters' own polls are 10 s apart here: only a wake-up lets them in soon.
TEST_F(LimiterTest, TwoReleasesWakeTwoWaiters) {
  ConcurrencyLimiter l(ioc_.get_executor(), memory_,
                       {.first_retry = milliseconds(10'000), .max_retry = milliseconds(10'000)});
  const policy::ConcurrencyConfig wait{.max_in_flight = 2,
                                       .on_limit = OnLimit::kWait,
                                       .max_wait = milliseconds(60'000),
                                       .max_waiting = 2};
  ConcurrencyOutcome a = Acquire(l, wait), b = Acquire(l, wait);
  ASSERT_EQ(a.status, 200u);
  ASSERT_EQ(b.status, 200u);
  std::promise<ConcurrencyOutcome> p1, p2;
  auto f1 = p1.get_future(), f2 = p2.get_future();
  auto& waiting = Metrics::Global().Concurrency("upload").waiting;
  const int64_t before = waiting.value();
  for (auto* p : {&p1, &p2}) {
    l.Acquire({.key = "user:ada", .name = "upload", .route = "upload", .config = wait},
              [p](ConcurrencyOutcome o) { p->set_value(std::move(o)); });
  }
  for (int i = 0; i < 500 && waiting.value() < before + 2; ++i) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_EQ(waiting.value(), before + 2);
  // Both releases land before the first woken waiter has asked again: the
  // I/O thread is held busy meanwhile.
  std::promise<void> go;
  boost::asio::post(ioc_, [f = go.get_future()]() mutable { f.wait(); });
  a.lease.reset();
  b.lease.reset();
  go.set_value();
  ASSERT_EQ(f1.wait_for(milliseconds(2000)), std::future_status::ready);
  ASSERT_EQ(f2.wait_for(milliseconds(2000)), std::future_status::ready);
  EXPECT_EQ(f1.get().status, 200u);
  EXPECT_EQ(f2.get().status, 200u);
}

TEST_F(LimiterTest, GivesUpAfterMaxWait) {
  ConcurrencyLimiter l(ioc_.get_executor(), memory_);
  const policy::ConcurrencyConfig wait{
      .max_in_flight = 1, .on_limit = OnLimit::kWait, .max_wait = milliseconds(100)};
  ConcurrencyOutcome first = Acquire(l, wait);
  ConcurrencyOutcome second = Acquire(l, wait);
  EXPECT_EQ(second.status, 429u);
  EXPECT_EQ(second.denial, ConcurrencyOutcome::Denial::kWaitTimeout);
  EXPECT_GE(second.waited, milliseconds(100));
  EXPECT_NE(ConcurrencyExceededBody(second, "upload", "").find("after waiting"), std::string::npos);
}

TEST(ParseAcquire, ContractAndErrors) {
  auto parse = [](std::string_view text) {
    return ParseAcquire(nlohmann::json::parse(text), nullptr);
  };
  StatusOr<ParsedAcquire> ok =
      parse(R"({"key": "u", "name": "upload", "max_in_flight": 3, "lease_ttl": "2s"})");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->request.key, "d:u");  // apart from the rules' keys (a route's "~all")
  EXPECT_EQ(ok->request.config.max_in_flight, 3);
  EXPECT_EQ(ok->request.config.lease_ttl, milliseconds(2000));
  EXPECT_EQ(
      parse(R"({"key": "u", "name": "upload", "max_in_flight": 3})")->request.config.lease_ttl,
      milliseconds(30'000));
  auto error = [&](std::string_view text) {
    StatusOr<ParsedAcquire> r = parse(text);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(error(R"({"name": "x", "max_in_flight": 1})"), "field 'key' is required");
  EXPECT_EQ(error(R"({"key": "u", "max_in_flight": 1})"), "field 'name' (or 'route') is required");
  EXPECT_EQ(error(R"({"key": "u", "name": "x"})"), "field 'max_in_flight' is required");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "max_in_flight": 1.5})"),
            "field 'max_in_flight' must be an integer in [1, 1000000]");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "max_in_flight": 1, "lease_ttl": 30})"),
            "field 'lease_ttl' must be a duration string such as \"30s\"");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "max_in_flight": 1, "lease_ttl": "1ms"})"),
            "field 'lease_ttl' must be whole milliseconds between 10ms and 24h");
  EXPECT_EQ(error(R"({"key": "u", "route": "nope"})"), "unknown route 'nope'");
  EXPECT_EQ(
      error(R"({"key": ")" + std::string(513, 'k') + R"(", "name": "x", "max_in_flight": 1})"),
      "field 'key' is 513 bytes; the maximum is 512");
  EXPECT_EQ(error(R"({"key": "u", "route": "r", "max_in_flight": 1})"),
            "field 'max_in_flight' does not go with 'route' (the route sets it)");
  EXPECT_NE(error(R"({"key": "u", "name": "x", "max_in_flight": 1, "cost": 1})")
                .find("unknown field 'cost'"),
            std::string::npos);
  const std::string id = "0123456789abcdef0123456789abcdef";
  for (const std::string& good : {id, "l-" + id}) {
    StatusOr<ParsedAcquire> rel =
        ParseRelease(nlohmann::json{{"key", "u"}, {"name", "x"}, {"lease_id", good}}, nullptr);
    ASSERT_TRUE(rel.ok()) << rel.status().message();
    EXPECT_EQ(rel->lease_id, good);
  }
  // Only the ids /v1/acquire hands out: anything else is a 400, never
  // {"released": false}.
  for (const std::string& bad :
       {std::string("a b"), std::string("l-abc"), std::string("nope"), id.substr(1), id + "0",
        "L-" + id, "l-l-" + id, std::string("0123456789ABCDEF0123456789abcdef"),
        id.substr(1) + "g"}) {
    StatusOr<ParsedAcquire> rel =
        ParseRelease(nlohmann::json{{"key", "u"}, {"name", "x"}, {"lease_id", bad}}, nullptr);
    EXPECT_FALSE(rel.ok()) << bad;
  }
}

TEST(ParseRenew, ContractAndErrors) {
  auto parse = [](std::string_view text) {
    return ParseRenew(nlohmann::json::parse(text), nullptr);
  };
  const std::string id = "0123456789abcdef0123456789abcdef";
  StatusOr<ParsedAcquire> ok =
      parse(R"({"key": "u", "name": "upload", "lease_id": ")" + id + R"(", "lease_ttl": "2s"})");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->request.key, "d:u");  // where /v1/acquire put it
  EXPECT_EQ(ok->request.name, "upload");
  EXPECT_EQ(ok->lease_id, id);
  EXPECT_EQ(ok->request.config.lease_ttl, milliseconds(2000));
  // Without lease_ttl: the default /v1/acquire takes.
  StatusOr<ParsedAcquire> plain =
      parse(R"({"key": "u", "name": "x", "lease_id": "l-)" + id + "\"}");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->request.config.lease_ttl, milliseconds(30'000));
  auto error = [&](std::string_view text) {
    StatusOr<ParsedAcquire> r = parse(text);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  const std::string lease = R"(, "lease_id": ")" + id + "\"";
  EXPECT_EQ(error(R"({"key": "u", "name": "x"})"), "field 'lease_id' is required");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "lease_id": "l-abc"})"),
            "field 'lease_id' is not a lease id /v1/acquire gives out (32 hex digits, or l- and "
            "32 hex digits)");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "lease_ttl": "5ms")" + lease + "}"),
            "field 'lease_ttl' must be whole milliseconds between 10ms and 24h");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "lease_ttl": "1500us")" + lease + "}"),
            "field 'lease_ttl' must be whole milliseconds between 10ms and 24h");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "lease_ttl": "25h")" + lease + "}"),
            "field 'lease_ttl' must be whole milliseconds between 10ms and 24h");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "lease_ttl": 30)" + lease + "}"),
            "field 'lease_ttl' must be a duration string such as \"30s\"");
  EXPECT_EQ(error(R"({"name": "x")" + lease + "}"), "field 'key' is required");
  EXPECT_EQ(error(R"({"key": "u")" + lease + "}"), "field 'name' (or 'route') is required");
  EXPECT_EQ(error(R"({"key": "u", "route": "r", "name": "x")" + lease + "}"),
            "field 'name' does not go with 'route' (the route sets it)");
  EXPECT_EQ(error(R"({"key": "u", "name": "x", "max_in_flight": 1)" + lease + "}"),
            "unknown field 'max_in_flight' (expected key, name, route, lease_id, lease_ttl)");
  // A release takes no lease_ttl: it is a renewal's alone.
  StatusOr<ParsedAcquire> release = ParseRelease(
      nlohmann::json{{"key", "u"}, {"name", "x"}, {"lease_id", id}, {"lease_ttl", "1s"}}, nullptr);
  ASSERT_FALSE(release.ok());
  EXPECT_NE(release.status().message().find("unknown field 'lease_ttl'"), std::string::npos);
}

// The policy of a config's text (a reload's, for the ParseRelease/ParseRenew tests).
std::shared_ptr<const policy::Policy> MakePolicy(std::string_view yaml) {
  StatusOr<policy::Config> c = policy::ParseConfig(yaml, "t.yaml");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(*std::move(c));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *std::move(p);
}

// A lease taken by route is released by route after a reload removed the
// route (or its concurrency block): the release needs only the name.
TEST(ParseAcquire, ReleaseByRouteSurvivesRouteRemoval) {
  auto before = MakePolicy(
      "server: {upstream: \"http://127.0.0.1:1\"}\n"
      "routes:\n  - name: upload\n    path: /up\n    concurrency: {max_in_flight: 3}\n");
  StatusOr<ParsedAcquire> acquired =
      ParseAcquire(nlohmann::json{{"key", "u"}, {"route", "upload"}}, before.get());
  ASSERT_TRUE(acquired.ok()) << acquired.status().message();
  const std::string id = "0123456789abcdef0123456789abcdef";
  const nlohmann::json release = {{"key", "u"}, {"route", "upload"}, {"lease_id", id}};
  for (const auto& after : {before,
                            MakePolicy("server: {upstream: \"http://127.0.0.1:1\"}\n"
                                       "routes:\n  - name: upload\n    path: /up\n"),
                            MakePolicy("server: {upstream: \"http://127.0.0.1:1\"}\n"
                                       "routes:\n  - name: other\n    path: /o\n")}) {
    StatusOr<ParsedAcquire> released = ParseRelease(release, after.get());
    ASSERT_TRUE(released.ok()) << released.status().message();
    EXPECT_EQ(released->request.key, acquired->request.key);
    EXPECT_EQ(released->request.name, acquired->request.name);
    EXPECT_EQ(released->lease_id, id);
  }
}

// A renewal by route takes the route's lease_ttl, or the caller's; after a
// reload removed the route (or its concurrency block) the holder still
// renews by the route's name, for the default lease_ttl unless it names one.
TEST(ParseRenew, ByRouteTakesItsTtlAndSurvivesItsRemoval) {
  auto before = MakePolicy(
      "server: {upstream: \"http://127.0.0.1:1\"}\n"
      "routes:\n  - name: upload\n    path: /up\n"
      "    concurrency: {max_in_flight: 3, lease_ttl: 2s}\n");
  const std::string id = "0123456789abcdef0123456789abcdef";
  const nlohmann::json renew = {{"key", "u"}, {"route", "upload"}, {"lease_id", id}};
  StatusOr<ParsedAcquire> r = ParseRenew(renew, before.get());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->request.key, "d:u");
  EXPECT_EQ(r->request.name, "upload");
  EXPECT_EQ(r->request.config.lease_ttl, milliseconds(2000));
  nlohmann::json own = renew;
  own["lease_ttl"] = "5s";
  EXPECT_EQ(ParseRenew(own, before.get())->request.config.lease_ttl, milliseconds(5000));
  for (const auto& after : {MakePolicy("server: {upstream: \"http://127.0.0.1:1\"}\n"
                                       "routes:\n  - name: upload\n    path: /up\n"),
                            MakePolicy("server: {upstream: \"http://127.0.0.1:1\"}\n"
                                       "routes:\n  - name: other\n    path: /o\n")}) {
    StatusOr<ParsedAcquire> gone = ParseRenew(renew, after.get());
    ASSERT_TRUE(gone.ok()) << gone.status().message();
    EXPECT_EQ(gone->request.name, "upload");
    EXPECT_EQ(gone->request.config.lease_ttl, milliseconds(30'000));
    EXPECT_EQ(gone->lease_id, id);
    EXPECT_EQ(ParseRenew(own, after.get())->request.config.lease_ttl, milliseconds(5000));
  }
}

}  // namespace
}  // namespace ratelimit::server
