// redis_decisions_bench: decisions per second through the LIBRARY's stores.
//
// Keeps --inflight checks outstanding (closed loop: each answer issues the next
// check) on --stores RedisStore instances, one token bucket per key, keys
// drawn uniformly from --keys, for --duration-ms after --warmup-ms. Prints one
// line of key=value pairs (parsed by scripts/bench.sh):
//
//   decisions=... secs=... rate=... p50_us=... p99_us=... p999_us=...
//   allowed=... denied=... errors=... verify=ok|FAIL:<why>
//
// Decisions are verified, not just counted: every answer must carry the
// requested limit and a consistent remaining/retry_after; no key may be
// allowed more than capacity + refill x elapsed (+1); a key answered at most
// `capacity` times must never have been denied (client keys are fresh per run:
// --run-id); and a final probe sends 2 x capacity checks for one fresh key at
// once and expects exactly `capacity` of them allowed (give or take refill).
//
// Other modes:
//   --rate=R            open loop: R checks/s scheduled by the main thread
//                       (latency from the scheduled time), e.g. the abuse flood
//                       on --keys=1.
//   --prefetch=N        the limit prefetches N tokens (`prefetch: N`; --lease=N
//                       is the old name); the per-key bound grows by stores x (N - 1).
//   --sequential        each key exactly once (0..keys-1), then stop: fills
//                       Redis for the memory-per-key measurement.
//   --run-id=P          client keys are P0, P1, ... (default "<pid>.<n>:", fresh
//                       per run); with --run-id=u the Redis keys are rl:{u0}b ...
//   --store=memory      MemoryStore: insert --keys keys, print bytes per key
//                       (MemoryUsage() and the process RSS delta).
//
// Everything is loopback and bounded by --duration-ms (or --keys).
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flags.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using ratelimit::CheckResult;
using ratelimit::Limit;
using ratelimit::LimitCheck;
using ratelimit::StatusOr;

struct Flags {
  std::string store = "redis";
  std::string url = "redis://127.0.0.1:6379";
  int64_t duration_ms = 3000;
  int64_t warmup_ms = 500;
  int64_t inflight = 512;
  int64_t keys = 100'000;
  int64_t stores = 1;
  int64_t connections = 2;
  int64_t max_batch = 32;
  int64_t max_calls_in_flight = 16;  // as RedisStore::Options
  int64_t deadline_ms = 100;
  int64_t capacity = 10;
  double refill = 5;
  int64_t prefetch = 0;  // > 1: the limit prefetches tokens, this many (`prefetch: n`)
  double rate = 0;       // 0: closed loop
  bool sequential = false;
  std::string run_id;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  f.run_id = std::to_string(::getpid()) + "." +
             std::to_string(Clock::now().time_since_epoch().count() % 1'000'000) + ":";
  const bench::Usage usage{
      "redis_decisions_bench",
      "--store=redis|memory --url=URL --duration-ms --warmup-ms --inflight --keys\n"
      "       --stores --connections --max-batch --max-calls-in-flight --deadline-ms\n"
      "       --capacity --refill --prefetch (--lease) --rate --sequential --run-id=ID"};
  bench::ParseLoadFlags(argc, argv, usage, f,
                        {{"store", &f.store},
                         {"url", &f.url},
                         {"inflight", &f.inflight},
                         {"stores", &f.stores},
                         {"max-batch", &f.max_batch},
                         {"max-calls-in-flight", &f.max_calls_in_flight},
                         {"deadline-ms", &f.deadline_ms},
                         {"capacity", &f.capacity},
                         {"refill", &f.refill},
                         {"prefetch", &f.prefetch},
                         {"lease", &f.prefetch},  // the old name (scripts/bench.sh)
                         {"sequential", &f.sequential},
                         {"run-id", &f.run_id}});
  if (f.inflight < 1 || f.keys < 1 || f.stores < 1 || f.capacity < 1) usage.Fail("(zero)");
  return f;
}

// xorshift64*: cheap, good enough to spread keys.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ULL;
  }
};

// Per-lane (per store) results. Mostly written by the store's I/O thread, but
// a check the store answers at once (e.g. from its over-limit cache) completes
// on the calling thread, hence the (uncontended) mutex.
struct LaneStats {
  std::mutex mu;
  std::vector<uint32_t> latency_ns;  // GUARDED_BY(mu)
  int64_t decisions = 0;
};

struct Shared {
  Flags flags;
  Limit limit;
  std::vector<std::string> keys;               // client keys, built once
  std::vector<std::atomic<uint32_t>> allowed;  // per key, whole run
  std::vector<std::atomic<uint32_t>> answered;
  std::atomic<int> phase{0};  // 0 warmup, 1 measure, 2 stop
  std::atomic<int64_t> total_allowed{0}, total_denied{0}, errors{0}, bad_answers{0};
  std::atomic<int64_t> outstanding{0};
  std::atomic<int64_t> next_sequential{0};
  std::mutex error_mu;
  std::map<std::string, int64_t> error_kinds;  // GUARDED_BY(error_mu)
  std::mutex done_mu;
  std::condition_variable done_cv;

  Shared(Flags f, Limit l)
      : flags(std::move(f)), limit(std::move(l)), allowed(flags.keys), answered(flags.keys) {}
};

// Checks one answer for internal consistency; returns false if it is wrong.
bool Consistent(const CheckResult& r, int64_t capacity) {
  if (r.decisions.size() != 1) return false;
  const auto& d = r.overall;
  if (d.limit != capacity) return false;
  if (d.allowed) return d.remaining >= 0 && d.remaining < capacity && d.retry_after.count() == 0;
  return d.remaining >= 0 && d.retry_after.count() > 0;
}

struct Driver {
  Shared& sh;
  std::vector<std::unique_ptr<ratelimit::RedisStore>> stores;
  std::vector<LaneStats> lanes;
  LimitCheck check[1];

  explicit Driver(Shared& s) : sh(s), lanes(s.flags.stores) { check[0] = {&sh.limit, 1}; }

  void Record(size_t lane, size_t key, Clock::time_point start, const StatusOr<CheckResult>& r) {
    const auto now = Clock::now();
    const int phase = sh.phase.load(std::memory_order_relaxed);
    if (!r.ok()) {
      sh.errors.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(sh.error_mu);
      ++sh.error_kinds[r.status().ToString().substr(0, 80)];
      return;
    }
    if (!Consistent(*r, sh.flags.capacity)) sh.bad_answers.fetch_add(1, std::memory_order_relaxed);
    sh.answered[key].fetch_add(1, std::memory_order_relaxed);
    if (r->overall.allowed) sh.allowed[key].fetch_add(1, std::memory_order_relaxed);
    if (phase == 1) {
      LaneStats& ls = lanes[lane];
      std::lock_guard lock(ls.mu);
      ++ls.decisions;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count();
      ls.latency_ns.push_back(static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX)));
      (r->overall.allowed ? sh.total_allowed : sh.total_denied)
          .fetch_add(1, std::memory_order_relaxed);
    }
  }

  size_t PickKey(Rng& rng) {
    if (sh.flags.sequential) {
      const int64_t k = sh.next_sequential.fetch_add(1, std::memory_order_relaxed);
      return k < sh.flags.keys ? static_cast<size_t>(k) : SIZE_MAX;
    }
    return static_cast<size_t>(rng.Next() % static_cast<uint64_t>(sh.flags.keys));
  }

  // Closed loop: one "slot" of the in-flight window; its answer issues the
  // next check. A check answered at once (inside Check) would recurse; such
  // re-issues are queued on a trampoline and run by the outermost Issue.
  void Issue(size_t lane, Rng rng) {
    thread_local bool issuing = false;
    thread_local std::vector<std::pair<size_t, Rng>> deferred;
    if (issuing) {
      deferred.emplace_back(lane, rng);
      return;
    }
    issuing = true;
    deferred.emplace_back(lane, rng);
    while (!deferred.empty()) {
      auto [l, g] = deferred.back();
      deferred.pop_back();
      IssueOne(l, g);
    }
    issuing = false;
  }

  void IssueOne(size_t lane, Rng rng) {
    if (sh.phase.load(std::memory_order_relaxed) == 2) return Finished();
    const size_t key = PickKey(rng);
    if (key == SIZE_MAX) return Finished();
    const auto start = Clock::now();
    stores[lane]->Check({sh.keys[key], check},
                        [this, lane, key, start, rng](StatusOr<CheckResult> r) {
                          Record(lane, key, start, r);
                          Issue(lane, rng);
                        });
  }

  void Finished() {
    if (sh.outstanding.fetch_sub(1) == 1) {
      std::lock_guard lock(sh.done_mu);
      sh.done_cv.notify_all();
    }
  }

  void WaitAllFinished() {
    std::unique_lock lock(sh.done_mu);
    sh.done_cv.wait(lock, [&] { return sh.outstanding.load() == 0; });
  }
};

std::string Percentile(std::vector<uint32_t>& v, double q) {
  if (v.empty()) return "nan";
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v[i] / 1000.0);
  return buf;
}

int64_t RssBytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

int RunMemoryStore(const Flags& f, const Limit& limit) {
  std::vector<std::string> keys;
  keys.reserve(f.keys);
  for (int64_t i = 0; i < f.keys; ++i) {
    std::string k = "u";
    k += std::to_string(i);
    keys.push_back(std::move(k));
  }
  const int64_t rss0 = RssBytes();
  ratelimit::MemoryStore store({.max_keys = static_cast<size_t>(f.keys) * 2});
  const auto t0 = Clock::now();
  int64_t allowed = 0, errors = 0;
  for (const std::string& k : keys) {
    auto d = store.DecideOne(k, limit, 1);
    if (!d.ok())
      ++errors;
    else if (d->allowed)
      ++allowed;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t rss1 = RssBytes();
  const bool ok = errors == 0 && allowed == f.keys && store.size() == static_cast<size_t>(f.keys);
  std::printf(
      "store=memory keys=%lld size=%zu usage_bytes=%zu usage_per_key=%.1f rss_delta_per_key=%.1f "
      "insert_rate=%.0f errors=%lld verify=%s\n",
      static_cast<long long>(f.keys), store.size(), store.MemoryUsage(),
      static_cast<double>(store.MemoryUsage()) / static_cast<double>(f.keys),
      static_cast<double>(rss1 - rss0) / static_cast<double>(f.keys),
      static_cast<double>(f.keys) / secs, static_cast<long long>(errors),
      ok ? "ok" : "FAIL:not-every-key-stored");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  auto limit = Limit::TokenBucket("b", flags.capacity, flags.refill);
  if (limit.ok() && flags.prefetch > 1) limit = limit->WithPrefetch(flags.prefetch);
  if (!limit.ok()) {
    std::fprintf(stderr, "bad limit: %s\n", limit.status().ToString().c_str());
    return 2;
  }
  if (flags.store == "memory") return RunMemoryStore(flags, *limit);
  if (flags.store != "redis") {
    std::fprintf(stderr, "redis_decisions_bench: --store must be redis or memory\n");
    return 2;
  }

  Shared sh(flags, *limit);
  sh.keys.reserve(flags.keys);
  for (int64_t i = 0; i < flags.keys; ++i) sh.keys.push_back(flags.run_id + std::to_string(i));

  Driver drv(sh);
  for (int64_t i = 0; i < flags.stores; ++i) {
    auto s = ratelimit::RedisStore::Create(
        {.url = flags.url,
         .deadline = std::chrono::milliseconds(flags.deadline_ms),
         .connections = static_cast<int>(flags.connections),
         .max_pending = static_cast<size_t>(flags.inflight + 1024),
         .max_batch = static_cast<size_t>(flags.max_batch),
         .max_calls_in_flight = static_cast<size_t>(flags.max_calls_in_flight)});
    if (!s.ok()) {
      std::fprintf(stderr, "RedisStore::Create: %s\n", s.status().ToString().c_str());
      return 2;
    }
    drv.stores.push_back(*std::move(s));
  }
  // Connect (and load the script) before timing anything.
  for (auto& s : drv.stores) {
    auto r = s->CheckSync({flags.run_id + "warm", drv.check});
    if (!r.ok()) {
      std::fprintf(stderr, "first check failed: %s\n", r.status().ToString().c_str());
      return 2;
    }
  }
  for (auto& l : drv.lanes) l.latency_ns.reserve(4'000'000 / drv.lanes.size());

  Clock::time_point measure_start, measure_end;
  if (flags.rate > 0) {
    // Open loop: scheduled sends on this thread, no reissue from callbacks.
    sh.phase = 1;
    measure_start = Clock::now();
    const auto interval = std::chrono::duration<double>(1.0 / flags.rate);
    const auto end = measure_start + std::chrono::milliseconds(flags.duration_ms);
    Rng rng{0x9E3779B97F4A7C15ULL};
    int64_t n = 0;
    for (;;) {
      const auto at = measure_start + std::chrono::duration_cast<Clock::duration>(interval * n);
      if (at >= end) break;
      // Sleep while the next send is far off (the machine has 2 cores to share
      // with Redis); spin only for the last few microseconds.
      if (at - Clock::now() > std::chrono::microseconds(60)) {
        std::this_thread::sleep_until(at - std::chrono::microseconds(50));
      }
      while (Clock::now() < at) {
      }
      const size_t key = drv.PickKey(rng);
      const size_t lane = static_cast<size_t>(n) % drv.stores.size();
      sh.outstanding.fetch_add(1);
      drv.stores[lane]->Check({sh.keys[key], drv.check},
                              [&drv, lane, key, at](StatusOr<CheckResult> r) {
                                drv.Record(lane, key, at, r);
                                drv.Finished();
                              });
      ++n;
    }
    measure_end = Clock::now();
    drv.WaitAllFinished();
  } else {
    sh.outstanding = flags.inflight;
    for (int64_t i = 0; i < flags.inflight; ++i) {
      drv.Issue(static_cast<size_t>(i) % drv.stores.size(),
                Rng{0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(i + 1)});
    }
    if (flags.sequential) {
      sh.phase = 1;
      measure_start = Clock::now();
      drv.WaitAllFinished();
      measure_end = Clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(flags.warmup_ms));
      sh.phase = 1;
      measure_start = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(flags.duration_ms));
      sh.phase = 2;
      measure_end = Clock::now();
      drv.WaitAllFinished();
    }
  }
  const auto run_end = Clock::now();

  // Deny probe: 2 x capacity checks for one fresh key, all in flight together.
  int64_t probe_allowed = 0, probe_denied = 0, probe_errors = 0;
  {
    std::mutex mu;
    std::condition_variable cv;
    int64_t left = 2 * flags.capacity;
    const std::string key = flags.run_id + "probe";
    for (int64_t i = 0; i < 2 * flags.capacity; ++i) {
      drv.stores[0]->Check({key, drv.check}, [&](StatusOr<CheckResult> r) {
        std::lock_guard lock(mu);
        if (!r.ok())
          ++probe_errors;
        else if (r->overall.allowed)
          ++probe_allowed;
        else
          ++probe_denied;
        if (--left == 0) cv.notify_all();
      });
    }
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return left == 0; });
  }

  // Merge and verify.
  std::vector<uint32_t> lat;
  int64_t decisions = 0;
  for (auto& l : drv.lanes) {
    std::lock_guard lock(l.mu);
    decisions += l.decisions;
    lat.insert(lat.end(), l.latency_ns.begin(), l.latency_ns.end());
  }
  const double secs = std::chrono::duration<double>(measure_end - measure_start).count();
  // Everything since the first check counts for the per-key bound.
  const double whole_secs = std::chrono::duration<double>(run_end - measure_start).count() +
                            static_cast<double>(flags.warmup_ms) / 1000.0 + 1.0;
  // Token prefetch: each store may spend up to prefetch - 1 tokens it took
  // earlier (the documented overshoot, docs/architecture.md "Token prefetch").
  const int64_t per_key_max = flags.capacity + static_cast<int64_t>(flags.refill * whole_secs) + 1 +
                              (flags.prefetch > 1 ? flags.stores * (flags.prefetch - 1) : 0);
  int64_t over_bound = 0, denied_early = 0, answered_total = 0, allowed_total = 0;
  for (int64_t k = 0; k < flags.keys; ++k) {
    const int64_t a = sh.allowed[k].load(), n = sh.answered[k].load();
    answered_total += n;
    allowed_total += a;
    if (a > per_key_max) ++over_bound;
    if (n <= flags.capacity && a != n) ++denied_early;
  }
  std::string verify = "ok";
  auto fail = [&](const std::string& why) {
    if (verify == "ok")
      verify = "FAIL:" + why;
    else
      verify += "," + why;
  };
  if (decisions == 0) fail("no-decisions");
  if (sh.errors > 0) fail("errors");
  if (sh.bad_answers > 0) fail("inconsistent-answers");
  if (over_bound > 0) fail("keys-over-limit");
  if (denied_early > 0) fail("denied-under-capacity");
  if (flags.sequential && answered_total != flags.keys) fail("not-every-key");
  // Refill during the probe (a few ms) may add one or two tokens.
  const int64_t probe_slack = 1 + static_cast<int64_t>(flags.refill * 0.05);
  if (probe_errors > 0 || probe_allowed < flags.capacity ||
      probe_allowed > flags.capacity + probe_slack)
    fail("probe");

  std::printf(
      "decisions=%lld secs=%.3f rate=%.0f p50_us=%s p99_us=%s p999_us=%s allowed=%lld "
      "denied=%lld errors=%lld bad_answers=%lld answered_total=%lld allowed_total=%lld "
      "keys_over_bound=%lld denied_under_capacity=%lld per_key_max=%lld probe=%lld/%lld "
      "inflight=%lld stores=%lld connections=%lld max_batch=%lld max_calls_in_flight=%lld "
      "verify=%s\n",
      static_cast<long long>(decisions), secs, static_cast<double>(decisions) / secs,
      Percentile(lat, 0.5).c_str(), Percentile(lat, 0.99).c_str(), Percentile(lat, 0.999).c_str(),
      static_cast<long long>(sh.total_allowed.load()),
      static_cast<long long>(sh.total_denied.load()), static_cast<long long>(sh.errors.load()),
      static_cast<long long>(sh.bad_answers.load()), static_cast<long long>(answered_total),
      static_cast<long long>(allowed_total), static_cast<long long>(over_bound),
      static_cast<long long>(denied_early), static_cast<long long>(per_key_max),
      static_cast<long long>(probe_allowed), static_cast<long long>(2 * flags.capacity),
      static_cast<long long>(flags.inflight), static_cast<long long>(flags.stores),
      static_cast<long long>(flags.connections), static_cast<long long>(flags.max_batch),
      static_cast<long long>(flags.max_calls_in_flight), verify.c_str());
  for (const auto& [what, n] : sh.error_kinds) {
    std::fprintf(stderr, "error x%lld: %s\n", static_cast<long long>(n), what.c_str());
  }
  return verify == "ok" ? 0 : 1;
}
