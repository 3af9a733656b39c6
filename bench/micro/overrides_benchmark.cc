// What an override costs a decision (Google Benchmark; scripts/bench.sh row
// 9, docs/performance.md): Policy::Resolve + Enforcer::Enforce of one
// request of a client WITH an override (its own limit parameters and plan)
// against one of a client without, while the table holds 1,000 other
// overrides (so "without" pays the lookup miss). Memory store: one thread,
// decisions one after the other. Redis store (RL_BENCH_REDIS_URL): 64
// decisions in flight, closed loop; a benchmark iteration is 1,000 decisions.
//
//   build/bench/micro/overrides_benchmark --benchmark_filter=Memory
//   RL_BENCH_REDIS_URL=redis://127.0.0.1:6379 build/bench/micro/overrides_benchmark
#include <benchmark/benchmark.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "server/enforcer.h"
#include "server/overrides.h"

namespace ratelimit::server {
namespace {

// Limits that never deny: every decision takes the same path.
constexpr std::string_view kConfig = R"(
limits:
  burst: {algorithm: token_bucket, capacity: 2000000000, refill_per_second: 1000000}
plans:
  free: {limits: [{name: daily, algorithm: fixed_window, limit: 2000000000, window: 1d}]}
  pro: {limits: [{name: daily_pro, algorithm: fixed_window, limit: 2000000000, window: 1d}]}
default_plan: free
clients: {accept_unknown_api_keys: true}
routes:
  - {name: api, path: /api, limits: [burst]}
)";

struct Rig {
  std::shared_ptr<const policy::Policy> policy;
  std::unique_ptr<Enforcer> enforcer;
  std::unique_ptr<Overrides> overrides;

  explicit Rig(std::shared_ptr<Store> store) {
    policy = *policy::Policy::Create(*policy::ParseConfig(kConfig, "bench.yaml"));
    enforcer = std::make_unique<Enforcer>(std::move(store), 1000);
    overrides = std::make_unique<Overrides>(MakeMemoryOverrideStore(), Clock::System());
    enforcer->SetOverrides(overrides.get());
    overrides->SetPolicy(policy);
    auto put = [&](std::string client, std::optional<std::string> plan, std::vector<Limit> ls) {
      ClientOverride o;
      o.client = std::move(client);
      o.plan = std::move(plan);
      for (const Limit& l : ls) o.given.push_back(EveryField(l));
      overrides->Put(std::move(o), [](StatusOr<Overrides::Stored>) {});
    };
    for (int i = 0; i < 1000; ++i) put("k:other-" + std::to_string(i), "pro", {});
    put("k:with", "pro", {*Limit::TokenBucket("burst", 1'999'999'999, 1e6)});
  }

  policy::RequestPlan Resolve(const std::string& key) const {
    policy::RequestView view{
        .method = "GET",
        .target = "/api/x",
        .peer = policy::IpAddress::FromV4(0x7f000001),
        .header = [&key](std::string_view name) -> std::optional<std::string_view> {
          if (name == "X-API-Key") return key;
          return std::nullopt;
        }};
    return *policy->Resolve(view);
  }

  // The capacity of `burst` a decision of `key` used (to check the variant).
  int64_t BurstCapacity(const std::string& key) {
    std::promise<int64_t> p;
    enforcer->Enforce(policy, Resolve(key), "/api/x", Face::kGateway, [&p](Outcome o) {
      int64_t c = -1;
      for (const LimitOutcome& l : o.limits) {
        if (l.limit->name() == "burst") c = l.limit->limit();
      }
      p.set_value(o.allowed() ? c : -2);
    });
    return p.get_future().get();
  }
};

const std::string& KeyOf(const benchmark::State& state) {
  static const std::string with = "with", without = "without";
  return state.range(0) == 1 ? with : without;
}

bool Verify(Rig& rig, benchmark::State& state) {
  const int64_t want = state.range(0) == 1 ? 1'999'999'999 : 2'000'000'000;
  const int64_t got = rig.BurstCapacity(KeyOf(state));
  if (got == want) return true;
  state.SkipWithError(
      ("the decision used capacity " + std::to_string(got) + ", not " + std::to_string(want))
          .c_str());
  return false;
}

// Memory store: Resolve + Enforce, one decision at a time.
void BM_OverrideDecisionMemory(benchmark::State& state) {
  Rig rig(std::make_shared<MemoryStore>());
  if (!Verify(rig, state)) return;
  const std::string& key = KeyOf(state);
  int64_t allowed = 0;
  for (auto _ : state) {
    rig.enforcer->Enforce(rig.policy, rig.Resolve(key), "/api/x", Face::kGateway,
                          [&allowed](const Outcome& o) { allowed += o.allowed() ? 1 : 0; });
  }
  state.counters["decisions"] = static_cast<double>(allowed);
  state.SetItemsProcessed(state.iterations());
}
// 0: a client without an override, 1: with.
BENCHMARK(BM_OverrideDecisionMemory)->Arg(0)->Arg(1)->UseRealTime();

// Redis store: 1,000 decisions per iteration, 64 in flight.
void BM_OverrideDecisionRedis(benchmark::State& state) {
  const char* url = std::getenv("RL_BENCH_REDIS_URL");
  if (url == nullptr) return state.SkipWithError("RL_BENCH_REDIS_URL is not set");
  auto store = RedisStore::Create({.url = url, .deadline = std::chrono::milliseconds(1000)});
  if (!store.ok()) return state.SkipWithError(store.status().ToString().c_str());
  Rig rig(std::shared_ptr<Store>(*std::move(store)));
  if (!Verify(rig, state)) return;
  const std::string& key = KeyOf(state);
  constexpr int kPerIteration = 1000, kInFlight = 64;
  std::mutex mu;
  std::condition_variable cv;
  int64_t allowed = 0;
  for (auto _ : state) {
    std::atomic<int> issued{0}, finished{0};
    std::function<void()> next = [&] {
      if (issued.fetch_add(1) >= kPerIteration) return;
      rig.enforcer->Enforce(rig.policy, rig.Resolve(key), "/api/x", Face::kGateway,
                            [&](const Outcome& o) {
                              if (o.allowed()) {
                                std::lock_guard lock(mu);
                                ++allowed;
                              }
                              if (finished.fetch_add(1) + 1 == kPerIteration) {
                                std::lock_guard lock(mu);
                                cv.notify_all();
                              } else {
                                next();
                              }
                            });
    };
    for (int i = 0; i < kInFlight; ++i) next();
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return finished.load() == kPerIteration; });
  }
  state.counters["decisions"] = static_cast<double>(allowed);
  state.SetItemsProcessed(state.iterations() * kPerIteration);
}
BENCHMARK(BM_OverrideDecisionRedis)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace
}  // namespace ratelimit::server

BENCHMARK_MAIN();
