// rl-lab: the seeds' lab, reproduced on the library. Two limiter instances,
// each with its own Redis connections, share one Redis (REDIS_ADDR=host:port):
// token bucket, capacity 10, 5 tokens a second, time from Redis.
//
//   REDIS_ADDR=127.0.0.1:6379 build/rl-lab
//
// REDIS_ADDR may also be a redis:// URL. Exit status: 0 when every call of
// steps 1-4 was answered, 1 when one failed (each failure is on stderr: a
// failed call would read as a denial), 2 for bad usage.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/redis_store.h"

namespace {

using namespace ratelimit;  // NOLINT: a small program

// Steps 2-4 count a failed call as not allowed (as the seeds' lab does); they
// say so on stderr and make the exit status 1.
struct Failures {
  std::atomic<int> count{0};
  void Note(const Status& s) {
    if (count.fetch_add(1) == 0) std::fprintf(stderr, "rl-lab: %s\n", s.ToString().c_str());
  }
};

std::unique_ptr<RedisStore> Open(const std::string& addr) {
  // A lab on a busy machine: 200 racing calls on two connections may wait
  // longer than the library's default deadline (100 ms).
  const std::string url = addr.rfind("redis://", 0) == 0 ? addr : "redis://" + addr;
  auto store = RedisStore::Create({.url = url, .deadline = std::chrono::seconds(2)});
  if (!store.ok()) {
    std::fprintf(stderr, "rl-lab: %s\n", store.status().ToString().c_str());
    std::exit(2);
  }
  return *std::move(store);
}

// What the seeds' middleware does when Redis fails: the failure mode decides.
Decision DecideOrFail(const StatusOr<CheckResult>& r, bool fail_open, bool* error) {
  *error = !r.ok();
  if (r.ok()) return r->overall;
  return Decision{.allowed = fail_open};
}

long RoundTo100ms(std::chrono::microseconds d) { return (d.count() + 50'000) / 100'000 * 100; }

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("REDIS_ADDR");
  if (argc > 1 || env == nullptr || *env == '\0') {
    std::fprintf(stderr,
                 "usage: REDIS_ADDR=host:port %s   (or REDIS_ADDR=redis://...; no arguments)\n"
                 "  the seeds' lab: two limiter instances share one Redis\n",
                 argv[0]);
    return 2;
  }
  const std::string addr = env;
  auto inst_a = Open(addr);
  auto inst_b = Open(addr);
  const Limit limit = *Limit::TokenBucket("lab", 10, 5);
  const Limit* limits[] = {&limit};
  for (const char* key : {"user:ada", "user:bob", "user:race"}) {
    if (Status s = inst_a->ResetSync(key, limits); !s.ok()) {
      std::fprintf(stderr, "rl-lab: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  Failures failures;
  auto check = [&](Store& s, std::string_view key) {
    LimitCheck c[] = {{&limit, 1}};
    StatusOr<CheckResult> r = s.CheckSync({key, c});
    if (!r.ok()) failures.Note(r.status());
    return r;
  };

  // 1. A burst of 12 for one key, alternating between the instances.
  int allowed = 0, denied = 0;
  for (int i = 0; i < 12; ++i) {
    StatusOr<CheckResult> r = check(i % 2 == 0 ? *inst_a : *inst_b, "user:ada");
    if (!r.ok()) {
      std::fprintf(stderr, "rl-lab: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (r->overall.allowed) {
      ++allowed;
    } else if (++denied == 1) {
      std::printf("first denial: remaining=%lld retry_after=%ldms\n",
                  static_cast<long long>(r->overall.remaining),
                  RoundTo100ms(r->overall.retry_after));
    }
  }
  std::printf("burst of 12 across two instances: %d allowed, %d denied\n", allowed, denied);

  // 2. Tokens come back at the refill rate.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  allowed = 0;
  for (int i = 0; i < 8; ++i) {
    StatusOr<CheckResult> r = check(*inst_a, "user:ada");
    allowed += (r.ok() && r->overall.allowed) ? 1 : 0;
  }
  std::printf("after one second at 5 tokens/s: %d of 8 allowed\n", allowed);

  // 3. Keys are independent.
  StatusOr<CheckResult> bob = check(*inst_a, "user:bob");
  std::printf("another key is untouched: allowed=%s remaining=%lld\n",
              bob.ok() && bob->overall.allowed ? "true" : "false",
              bob.ok() ? static_cast<long long>(bob->overall.remaining) : -1LL);

  // 4. 200 threads race for one fresh key over both instances. They start
  // together: started one by one, the first checks could come more than 200
  // ms (a token at 5/s) before the last, and an 11th allowed would be the
  // refill, not a race lost (seen under ASan on a loaded machine).
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  std::latch start(200);
  for (int i = 0; i < 200; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      StatusOr<CheckResult> r = check(i % 2 == 0 ? *inst_a : *inst_b, "user:race");
      if (r.ok() && r->overall.allowed) ok.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  std::printf("200 concurrent requests, capacity 10: %d allowed\n", ok.load());

  // 5. Redis unreachable: fail open or fail closed is a decision, not an accident.
  auto dead =
      RedisStore::Create({.url = "redis://127.0.0.1:1", .deadline = std::chrono::milliseconds(50)});
  if (!dead.ok()) {
    std::fprintf(stderr, "rl-lab: %s\n", dead.status().ToString().c_str());
    return 1;
  }
  for (bool open : {true, false}) {
    bool error = false;
    LimitCheck c[] = {{&limit, 1}};
    Decision d = DecideOrFail((*dead)->CheckSync({"user:ada", c}), open, &error);
    std::printf("redis down, failOpen=%-5s -> allowed=%s (error reported: %s)\n",
                open ? "true" : "false", d.allowed ? "true" : "false", error ? "true" : "false");
  }
  if (const int n = failures.count.load(); n > 0) {
    std::fprintf(stderr, "rl-lab: %d call(s) failed; the figures above count them as denials\n", n);
    return 1;
  }
  return 0;
}
