// In-memory decision cost (Google Benchmark). Run: build/bench/micro/memory_store_benchmark
// Figures are recorded in docs/performance.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "core/algorithms.h"
#include "core/steady_clock.h"
#include "ratelimit/memory_store.h"

namespace ratelimit {
namespace {

const Limit& Bucket() {
  static const Limit l = *Limit::TokenBucket("b", 1'000'000'000, 1e6);  // never denies
  return l;
}

std::vector<std::string> Keys(int n, int offset = 0) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (int i = 0; i < n; ++i) keys.push_back("user:" + std::to_string(offset + i));
  return keys;
}

// The arithmetic alone: a GCRA step on a state in a register.
void BM_TokenBucketArithmetic(benchmark::State& state) {
  core::CompactState s;
  int64_t now = 1'700'000'000'000'000;
  for (auto _ : state) {
    core::Evaluation e = core::Evaluate(Bucket(), s, now++, 1);
    s = e.next;
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(BM_TokenBucketArithmetic);

// A fixed window's step: Arg 0 epoch-aligned (1d), Arg 1 a calendar quota
// (1mo, Europe/Berlin), whose window comes from Calendar's one-word cache.
void BM_FixedWindowArithmetic(benchmark::State& state) {
  const Limit epoch = *Limit::FixedWindow("f", 1'000'000'000, std::chrono::hours(24));
  const Limit calendar =
      *Limit::CalendarQuota("f", 1'000'000'000, CalendarUnit::kMonth, "Europe/Berlin");
  const Limit& l = state.range(0) == 0 ? epoch : calendar;
  core::CompactState s;
  int64_t now = 1'700'000'000'000'000;
  for (auto _ : state) {
    core::Evaluation e = core::Evaluate(l, s, now++, 1);
    s = e.next;
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(BM_FixedWindowArithmetic)->Arg(0)->Arg(1);

// What the cache saves: a calendar window computed afresh (time zone lookups,
// civil date arithmetic), as at each boundary.
void BM_CalendarWindowUncached(benchmark::State& state) {
  const std::shared_ptr<const Calendar> c = *Calendar::Get(CalendarUnit::kMonth, "Europe/Berlin");
  int64_t now = 1'700'000'000'000'000;
  for (auto _ : state) benchmark::DoNotOptimize(c->Compute(now += 1'000'003));
}
BENCHMARK(BM_CalendarWindowUncached);

void BM_SystemClockRead(benchmark::State& state) {
  const Clock& c = Clock::System();
  for (auto _ : state) benchmark::DoNotOptimize(c.NowMicros());
}
BENCHMARK(BM_SystemClockRead);

// clock_gettime(CLOCK_REALTIME) on every read: what Clock::System() was.
void BM_KernelClockRead(benchmark::State& state) {
  const Clock& c = Clock::Kernel();
  for (auto _ : state) benchmark::DoNotOptimize(c.NowMicros());
}
BENCHMARK(BM_KernelClockRead);

// The monotonic clock of deadlines and latency histograms (src/core/steady_clock.h)
// against std::chrono::steady_clock, which it replaced on the request path.
void BM_SteadyClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(core::SteadyClock::now());
}
BENCHMARK(BM_SteadyClockRead);

void BM_StdSteadyClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_StdSteadyClockRead);

// One decision through MemoryStore, including the clock read, the hash, the
// shard lock and the table probe. Arg: number of distinct keys.
void BM_MemoryStoreDecide(benchmark::State& state) {
  static MemoryStore* store = nullptr;
  static std::vector<std::string> keys;
  if (state.thread_index() == 0) {
    store = new MemoryStore();
    keys = Keys(static_cast<int>(state.range(0)));
  }
  size_t i = static_cast<size_t>(state.thread_index()) * 7919;
  for (auto _ : state) {
    benchmark::DoNotOptimize(store->DecideOne(keys[i % keys.size()], Bucket(), 1));
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    delete store;
    store = nullptr;
  }
}
BENCHMARK(BM_MemoryStoreDecide)->Arg(1)->Arg(100'000)->Threads(1)->UseRealTime();
// Contended: two threads on ONE key; and two threads on distinct keys.
BENCHMARK(BM_MemoryStoreDecide)->Arg(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_MemoryStoreDecide)->Arg(100'000)->Threads(2)->UseRealTime();

// Peer (docs/performance.md, benchmark 5): the floor of an in-process
// decision, GCRA on ONE std::atomic<int64_t> with a CAS loop plus a
// steady_clock read: no key lookup, no lock, one limit. Never denies.
void BM_PeerAtomicGcra(benchmark::State& state) {
  static std::atomic<int64_t> tat{0};
  constexpr int64_t kInterval = 1;             // ns per token
  constexpr int64_t kTau = 1'000'000'000'000;  // burst tolerance
  for (auto _ : state) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t t = tat.load(std::memory_order_relaxed);
    bool allowed;
    for (;;) {
      const int64_t next = std::max(t, now) + kInterval;
      allowed = next - kTau <= now;
      if (!allowed || tat.compare_exchange_weak(t, next, std::memory_order_relaxed)) break;
    }
    benchmark::DoNotOptimize(allowed);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PeerAtomicGcra)->Threads(1)->UseRealTime();

// The same with state that persists: a bucket of a million tokens refilled
// at 1/s never denies here, and each decision moves its key's state one
// second further from fresh, so after the first pass every key is live and
// every decision finds it in a table of 100,000 live keys. (A bucket refilled
// at 1000/s is fresh again 1 ms after a decision: the store may drop such a
// key and re-insert it, which keeps its tables small and flatters the figure.
// With Bucket() above that happens after 1 us: that measures the insert path.)
// This is the steady state of a real client.
const Limit& HeldBucket() {
  static const Limit l = *Limit::TokenBucket("h", 1'000'000, 1);
  return l;
}
void BM_MemoryStoreDecideHeld(benchmark::State& state) {
  static MemoryStore* store = nullptr;
  static std::vector<std::string> keys;
  if (state.thread_index() == 0) {
    store = new MemoryStore();
    keys = Keys(static_cast<int>(state.range(0)));
    for (const std::string& k : keys)
      benchmark::DoNotOptimize(store->DecideOne(k, HeldBucket(), 1));
  }
  // Each thread decides its own slice of the keys: distinct clients, as two
  // I/O threads serving different connections see them.
  const size_t slice = keys.size() / static_cast<size_t>(state.threads());
  const size_t first = static_cast<size_t>(state.thread_index()) * slice;
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(store->DecideOne(keys[first + i], HeldBucket(), 1));
    if (++i == slice) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    delete store;
    store = nullptr;
  }
}
BENCHMARK(BM_MemoryStoreDecideHeld)->Arg(100'000)->Threads(1)->UseRealTime();
BENCHMARK(BM_MemoryStoreDecideHeld)->Arg(100'000)->Threads(2)->UseRealTime();

// The physical floor of a decision on a key that is not in cache: a dependent
// random read over a table as large as the store's with 100,000 held keys
// (MemoryUsage() of a store filled as BM_MemoryStoreDecideHeld fills it).
// One 32-byte entry per slot, linked into a single random cycle, so each read
// is a miss whose address depends on the previous one: no prefetch, no
// overlap. Arg: keys in the store that sizes the table.
void BM_PointerChase(benchmark::State& state) {
  struct alignas(32) Entry {
    uint32_t next;
  };
  static std::vector<Entry> table;
  if (table.empty()) {
    MemoryStore store;
    for (const std::string& k : Keys(static_cast<int>(state.range(0))))
      benchmark::DoNotOptimize(store.DecideOne(k, HeldBucket(), 1));
    const size_t n = store.MemoryUsage() / sizeof(Entry);
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    std::mt19937_64 rng(42);
    std::shuffle(order.begin(), order.end(), rng);
    table.resize(n);
    for (size_t i = 0; i < n; ++i) table[order[i]].next = order[(i + 1) % n];
  }
  uint32_t i = 0;
  for (auto _ : state) {
    i = table[i].next;
    benchmark::DoNotOptimize(i);
  }
  // (A label, not a user counter: bench.sh reads the CSV of every benchmark,
  // whose header is that of the first one.)
  state.SetLabel(std::to_string(table.size() * sizeof(Entry)) + " bytes");
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PointerChase)->Arg(100'000)->UseRealTime();

// The general path (vector result, all-or-nothing over two limits).
void BM_MemoryStoreTwoLimits(benchmark::State& state) {
  MemoryStore store;
  const Limit daily = *Limit::FixedWindow("daily", 1'000'000'000, std::chrono::hours(24));
  LimitCheck checks[] = {{&Bucket(), 1}, {&daily, 1}};
  auto keys = Keys(1000);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(store.Decide({keys[i++ % keys.size()], checks}));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MemoryStoreTwoLimits);

// A sweep of a store holding Arg 0 keys. Arg 1: 0 none reclaimable (every
// key used within its window), 1 all of them (a token bucket refilled since,
// as after a burst of one-off clients). Arg 2: the parts the store is swept
// in (Store::SweepPart): 1 the whole store, 64 what the daemon sweeps at once
// (every 78 ms, on an I/O thread). One part is timed: what holds the thread.
// Each iteration refills a fresh store first (not timed).
void BM_Sweep(benchmark::State& state) {
  const Limit bucket = *Limit::TokenBucket("s", 10, 5);  // fresh again 0.2 s after a decision
  const std::vector<std::string> keys = Keys(static_cast<int>(state.range(0)));
  const auto parts = static_cast<size_t>(state.range(2));
  ManualClock clock;
  for (auto _ : state) {
    state.PauseTiming();
    auto store = std::make_unique<MemoryStore>(MemoryStore::Options{.clock = &clock});
    for (const std::string& k : keys) benchmark::DoNotOptimize(store->DecideOne(k, bucket, 1));
    if (state.range(1) == 1) clock.Advance(std::chrono::seconds(1));
    state.ResumeTiming();
    benchmark::DoNotOptimize(store->SweepPart(0, parts));
    state.PauseTiming();
    store.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_Sweep)
    ->ArgsProduct({{100'000, 1'000'000}, {0, 1}, {1, 64}})
    ->Iterations(8)  // each refills a store of up to 1,000,000 keys (untimed)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace ratelimit

BENCHMARK_MAIN();
