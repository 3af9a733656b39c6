#include "ratelimit/redis_store.h"

#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <charconv>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/algorithms.h"
#include "redis/client.h"
#include "redis/cluster_client.h"
#include "redis/io_thread.h"
#include "redis/slot.h"
#include "store/hash.h"
#include "store/lease_table.h"
#include "store/lua/scripts.h"
#include "store/over_limit_cache.h"

namespace ratelimit {
namespace {

using std::chrono::microseconds;

char AlgorithmCode(Algorithm a) {
  switch (a) {
    case Algorithm::kTokenBucket: return 't';
    case Algorithm::kFixedWindow: return 'f';
    case Algorithm::kSlidingWindow: return 's';
    case Algorithm::kSlidingLog: return 'l';
    case Algorithm::kLeakyBucket: return 'k';
  }
  return '?';
}

// One check waiting for its script call.
struct PendingCheck {
  std::chrono::steady_clock::time_point deadline;
  std::optional<uint64_t> cache_fp;  // set when the over-limit cache may keep its denial
  int64_t submitted_at = 0;          // store clock, before Redis evaluated it
  bool peek = false;
  bool leader = false;  // other checks of cache_fp wait for its reply (Impl::waiters)
  // The first limit's shape, to tell when the unit it took was the last one.
  Algorithm algorithm = Algorithm::kTokenBucket;
  int64_t window_micros = 0, interval_micros = 0;
  // Token lease: the limit's lease size (0: none) and the tokens asked for
  // (> 1: a "T" evaluation that may take several).
  uint64_t lease_fp = 0;
  int64_t lease = 0, want = 1;
  uint16_t slot = 0;                  // cluster: the slot of every key of the check
  CircuitBreaker* breaker = nullptr;  // the breaker that let it through
  std::vector<std::string> keys;
  std::vector<std::string> args;  // "c"/"p", n, then 5 per limit
  CheckCallback done;
};

}  // namespace

std::string EncodeClientKey(std::string_view key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (c > 0x20 && c < 0x7f && c != '%' && c != '{' && c != '}' && c != '#') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (out.size() <= kMaxPlainClientKey) return out;
  // 96 bits of SHA-256 in base64url: 16 characters.
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  std::string hashed = "#";
  for (int i = 0; i < 12; i += 3) {
    const uint32_t v = (uint32_t{digest[i]} << 16) | (uint32_t{digest[i + 1]} << 8) | digest[i + 2];
    for (int shift = 18; shift >= 0; shift -= 6) hashed.push_back(kB64[(v >> shift) & 63]);
  }
  return hashed;
}

struct RedisStore::Impl {
  struct Opts : Options {
    std::string url_for_logs;  // the URL without its password
  };
  Opts opts;
  const Clock* clock;
  redis::Script script;
  std::unique_ptr<CircuitBreaker> breaker;
  std::unique_ptr<store::OverLimitCache> cache;  // nullptr: off
  store::LeaseTable leases;
  const uint64_t lease_seed = std::random_device{}();
  std::atomic<uint64_t> stat_checks{0}, stat_calls{0}, stat_hits{0}, stat_failures{0},
      stat_lease_hits{0};
  // Where the client runs: a thread of our own, or Options::io_context.
  // Declared before the clients: destroyed after them.
  std::unique_ptr<redis::IoThread> own_io;
  boost::asio::any_io_executor exec;
  std::unique_ptr<redis::Client> client;  // standalone; or:
  std::unique_ptr<redis::ClusterClient> cluster;
  // Cluster: one breaker per node (indexed by node id); `breaker` stands in
  // while the slot map is unknown.
  std::mutex breakers_mu;
  std::vector<std::unique_ptr<CircuitBreaker>> node_breakers;  // GUARDED_BY(breakers_mu)

  // Checks that may be cached wait while one with the same fingerprint is in
  // flight (its `leader`), and share its denial instead of a call of their own.
  struct WaiterShard {
    std::mutex mu;
    std::unordered_map<uint64_t, std::vector<PendingCheck>> by_fp;  // GUARDED_BY(mu)
  };
  WaiterShard waiters[16];
  WaiterShard& WaitersOf(uint64_t fp) { return waiters[fp % std::size(waiters)]; }

  std::mutex mu;
  std::vector<PendingCheck> queue;   // GUARDED_BY(mu)
  bool flush_scheduled = false;      // GUARDED_BY(mu)
  std::atomic<size_t> in_flight{0};  // checks queued or awaiting a reply
  size_t calls_in_flight = 0;        // GUARDED_BY(mu) script calls awaiting a reply
  size_t completing = 0;             // GUARDED_BY(mu) replies whose answers are being handed out
  std::chrono::steady_clock::time_point last_send;  // GUARDED_BY(mu) the newest call's

  // While a call sent less than opts.hold_back ago is out, checks that do not
  // fill a batch wait for its reply and leave with it (standalone Redis).
  // Sending each as it comes costs a call apiece on both sides (on the 2-core
  // bench machine, /v1/check over Redis: 21k req/s with batches of 4.7,
  // 28-31k when a batch waited for the reply). The age bound keeps a frozen
  // or distant Redis from holding checks back: a call out longer than that no
  // longer delays the next one, so calls (and the breaker's failures) keep
  // coming as they did. In a cluster, where calls are per slot and rarely
  // fill a batch, checks go out at once.
  //
  // With `mu` held: whether a batch that is not full may leave now.
  bool PartialMayLeave(std::chrono::steady_clock::time_point now) const {
    return calls_in_flight == 0 || cluster != nullptr || now - last_send >= opts.hold_back;
  }
  // With `mu` held: whether what is queued should leave now.
  bool ReadyToSend(std::chrono::steady_clock::time_point now) const {
    if (calls_in_flight >= MaxCallsInFlight()) return false;  // a reply flushes
    return queue.size() >= PerCall() || PartialMayLeave(now);
  }

  bool Idle();  // no call out, none queued or about to leave
  void CloseClient();

  std::string Key(std::string_view client_key, const Limit& limit) const {
    std::string k;
    k.reserve(opts.key_prefix.size() + client_key.size() + limit.name().size() + 4);
    k += opts.key_prefix;
    k += '{';
    k += EncodeClientKey(client_key);
    k += '}';
    k += limit.name();
    return k;
  }

  void Submit(const CheckRequest& req, bool peek, CheckCallback done) {
    if (Status s = ValidateRequest(req, opts.max_key_length); !s.ok()) return done(s);
    std::optional<uint64_t> fp;
    const int64_t now_local = clock->NowMicros();
    if (cache != nullptr && !peek) {
      fp = cache->Fingerprint(req);
      if (fp) {
        if (std::optional<CheckResult> hit = cache->Lookup(*fp, now_local)) {
          stat_hits.fetch_add(1, std::memory_order_relaxed);
          return done(*std::move(hit));
        }
      }
    }
    // A hot key of a leased limit: spend a token taken earlier, or ask for a lease.
    const LimitCheck& only = req.checks.front();
    uint64_t lease_fp = 0;
    int64_t want = 1;
    if (!peek && req.checks.size() == 1 && only.cost == 1 && only.limit->lease() > 1) {
      lease_fp = store::Mix(store::Hash64(req.key, lease_seed) ^ only.limit->identity_hash(),
                            0x9E3779B97F4A7C15ULL);
      if (std::optional<CheckResult> spent = leases.Spend(lease_fp, now_local)) {
        stat_lease_hits.fetch_add(1, std::memory_order_relaxed);
        return done(*std::move(spent));
      }
      want = leases.Want(lease_fp, now_local, *only.limit);
    }
    stat_checks.fetch_add(1, std::memory_order_relaxed);
    std::string first_key = Key(req.key, *req.checks.front().limit);
    const Limit& first = *req.checks.front().limit;
    PendingCheck p{.deadline = std::chrono::steady_clock::now() + opts.deadline,
                   .cache_fp = fp,
                   .submitted_at = now_local,
                   .peek = peek,
                   .algorithm = first.algorithm(),
                   .window_micros = first.window_micros(),
                   .interval_micros = first.interval_micros(),
                   .lease_fp = lease_fp,
                   .lease = lease_fp != 0 ? first.lease() : 0,
                   .want = want,
                   .slot = cluster ? redis::KeySlot(first_key) : uint16_t{0},
                   .done = std::move(done)};
    p.keys.reserve(req.checks.size());
    p.args.reserve(2 + 5 * req.checks.size());
    p.args.emplace_back(peek ? "p" : "c");
    p.args.push_back(std::to_string(req.checks.size()));
    for (const LimitCheck& c : req.checks) {
      const Limit& l = *c.limit;
      // NOLINTNEXTLINE(bugprone-use-after-move): moved on the first pass only (keys empty).
      p.keys.push_back(p.keys.empty() ? std::move(first_key) : Key(req.key, l));
      p.args.emplace_back(1, want > 1 ? 'T' : AlgorithmCode(l.algorithm()));
      p.args.push_back(std::to_string(l.limit()));
      p.args.push_back(std::to_string(l.window_micros()));
      p.args.push_back(std::to_string(l.interval_micros()));
      p.args.push_back(std::to_string(peek ? 0 : want > 1 ? want : c.cost));
    }
    if (fp) {
      std::optional<StatusOr<CheckResult>> answer;
      {
        WaiterShard& shard = WaitersOf(*fp);
        std::lock_guard lock(shard.mu);
        auto [it, first_of_key] = shard.by_fp.try_emplace(*fp);
        if (!first_of_key) {
          // Same key and limits already in flight: its answer may serve this one.
          if (in_flight.fetch_add(1, std::memory_order_relaxed) < opts.max_pending) {
            it->second.push_back(std::move(p));
            return;
          }
          in_flight.fetch_sub(1, std::memory_order_relaxed);
          answer = Overloaded();
        } else if (std::optional<CheckResult> hit = cache->Lookup(*fp, now_local)) {
          // A leader answered between our first look and now (it fills the
          // cache before it lets go of its waiters): no call needed.
          shard.by_fp.erase(it);
          stat_hits.fetch_add(1, std::memory_order_relaxed);
          answer = *std::move(hit);
        } else {
          p.leader = true;
        }
      }
      if (answer) return p.done(*std::move(answer));
    }
    Dispatch(std::move(p));
  }

  Status Overloaded() const {
    return ResourceExhausted("redis store overloaded: " + std::to_string(opts.max_pending) +
                             " calls already queued or in flight");
  }

  // Through the slot's breaker and the pending bound into the queue.
  void Dispatch(PendingCheck p) {
    CircuitBreaker* node_breaker = BreakerFor(p.slot);
    Status refused;
    if (!node_breaker->Allow()) {
      // The node may be gone for good (failover): look for a new owner meanwhile.
      if (cluster) cluster->RequestRefresh();
      refused = BreakerOpenStatus(BreakerSubject(p.slot));
    } else if (in_flight.fetch_add(1, std::memory_order_relaxed) >= opts.max_pending) {
      in_flight.fetch_sub(1, std::memory_order_relaxed);
      refused = Overloaded();
    }
    if (!refused.ok()) {
      stat_failures.fetch_add(1, std::memory_order_relaxed);
      ReleaseWaiters(p, nullptr);
      return p.done(refused);
    }
    p.breaker = node_breaker;
    bool schedule = false;
    {
      std::lock_guard lock(mu);
      queue.push_back(std::move(p));
      if (!flush_scheduled && ReadyToSend(std::chrono::steady_clock::now())) {
        schedule = flush_scheduled = true;
      }
    }
    if (schedule) boost::asio::post(exec, [this] { Flush(); });
  }

  // `leader` is answered: the checks that waited for it get `denial` if it
  // was still in force when they arrived (nothing they could see differs: a
  // denied request changes no state and time must pass for room to come),
  // and otherwise go out themselves, together (no leader: one batch).
  void ReleaseWaiters(PendingCheck& leader, const CheckResult* denial) {
    if (!leader.leader) return;
    leader.leader = false;
    std::vector<PendingCheck> released;
    {
      WaiterShard& shard = WaitersOf(*leader.cache_fp);
      std::lock_guard lock(shard.mu);
      auto it = shard.by_fp.find(*leader.cache_fp);
      if (it == shard.by_fp.end()) return;
      released = std::move(it->second);
      shard.by_fp.erase(it);
    }
    for (PendingCheck& w : released) {
      in_flight.fetch_sub(1, std::memory_order_relaxed);
      if (denial != nullptr &&
          w.submitted_at < leader.submitted_at + denial->overall.retry_after.count()) {
        stat_hits.fetch_add(1, std::memory_order_relaxed);
        w.done(*denial);
      } else if (std::optional<CheckResult> spent =
                     w.lease_fp != 0 ? leases.Spend(w.lease_fp, clock->NowMicros())
                                     : std::nullopt) {
        stat_lease_hits.fetch_add(1, std::memory_order_relaxed);
        w.done(*std::move(spent));
      } else {
        if (w.want > 1) {  // the leader asked for the lease: this one takes one token
          w.want = 1;
          w.args[2] = "t";
          w.args[6] = "1";
        }
        Dispatch(std::move(w));
      }
    }
  }

  // The breaker guarding the node that serves `slot` (the only one standalone).
  CircuitBreaker* BreakerFor(uint16_t slot) {
    if (!cluster) return breaker.get();
    const int node = cluster->NodeForSlot(slot);
    if (node < 0) return breaker.get();
    std::lock_guard lock(breakers_mu);
    if (node_breakers.size() <= static_cast<size_t>(node)) node_breakers.resize(node + 1);
    auto& b = node_breakers[static_cast<size_t>(node)];
    if (!b) b = std::make_unique<CircuitBreaker>(opts.breaker);
    return b.get();
  }

  std::string BreakerSubject(uint16_t slot) const {
    if (!cluster) return "redis " + opts.url_for_logs;
    const int node = cluster->NodeForSlot(slot);
    return node < 0 ? "redis " + opts.url_for_logs : "redis node " + cluster->NodeName(node);
  }

  // On the I/O thread. At most max_calls_in_flight script calls are out at
  // once, and while a young one is out only whole batches leave (ReadyToSend);
  // the rest queue up and leave together when a reply comes back. At low load
  // every check goes out at once (a batch of one); under load batches grow,
  // and nothing waits on a timer. Invariant: a non-empty queue has a Flush
  // scheduled or a call out whose reply will flush it.
  void Flush() {
    std::vector<PendingCheck> batch;
    const size_t per_call = PerCall();
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu);
      flush_scheduled = false;
      if (!ReadyToSend(now)) return;
      if (PartialMayLeave(now)) {
        batch.swap(queue);
      } else {  // whole batches only; the remainder waits for a reply
        const size_t whole = queue.size() / per_call * per_call;
        batch.assign(std::make_move_iterator(queue.begin()),
                     std::make_move_iterator(queue.begin() + static_cast<ptrdiff_t>(whole)));
        queue.erase(queue.begin(), queue.begin() + static_cast<ptrdiff_t>(whole));
      }
    }
    // In a cluster a script may only touch keys of one slot: one call per slot.
    if (cluster) {
      std::stable_sort(
          batch.begin(), batch.end(),
          [](const PendingCheck& a, const PendingCheck& b) { return a.slot < b.slot; });
    }
    std::vector<PendingCheck> group;
    for (PendingCheck& p : batch) {
      if (p.deadline <= now) {  // waited its whole deadline in the queue: never sent
        in_flight.fetch_sub(1, std::memory_order_relaxed);
        stat_failures.fetch_add(1, std::memory_order_relaxed);
        ReleaseWaiters(p, nullptr);
        p.done(DeadlineExceeded("redis store: no reply slot within the deadline (overloaded)"));
        continue;
      }
      if (!group.empty() && group.front().slot != p.slot) Send(std::exchange(group, {}), now);
      group.push_back(std::move(p));
      if (group.size() == per_call) Send(std::exchange(group, {}), now);
    }
    if (!group.empty()) Send(std::move(group), now);
  }

  size_t MaxCallsInFlight() const { return std::max<size_t>(opts.max_calls_in_flight, 1); }
  size_t PerCall() const { return std::max<size_t>(opts.max_batch, 1); }

  // A one-limit check that consumes `cost` >= 1 of limit `spec` (1-based,
  // of `specs`), as the one number check.lua unpacks; nullopt: too large to
  // stay exact in Lua's doubles, or not that shape.
  static std::optional<size_t> PackedCheck(const PendingCheck& p, size_t spec, size_t specs) {
    if (p.keys.size() != 1 || p.args[0] != "c") return std::nullopt;
    const int64_t cost = LimitArg(p, 0, 4);
    if (cost < 1 || cost > (int64_t{1} << 32) || specs > (size_t{1} << 20)) return std::nullopt;
    return static_cast<size_t>(cost - 1) * specs + spec;  // < 2^52: exact in Lua
  }

  // Limit `i` of a check as its arguments say: field 1 the limit, 2 the
  // window, 3 the interval, 4 the cost (all numbers written by Submit).
  static int64_t LimitArg(const PendingCheck& p, size_t i, size_t field) {
    int64_t v = 0;
    const std::string& s = p.args[2 + 5 * i + field];
    std::from_chars(s.data(), s.data() + s.size(), v);
    return v;
  }

  void Send(std::vector<PendingCheck> group, std::chrono::steady_clock::time_point now) {
    // The call may take only what is left of the earliest deadline in it.
    auto deadline = group.front().deadline;
    for (const PendingCheck& p : group) deadline = std::min(deadline, p.deadline);
    const auto timeout = std::max(std::chrono::milliseconds(1),
                                  std::chrono::ceil<std::chrono::milliseconds>(deadline - now));
    // The call's arguments (check.lua): each distinct limit once, then per
    // check either one number, (cost - 1) x limits + index (one limit,
    // consumed: the common case), or its head ("p1": peek, one limit) and
    // per limit the index of its limit and its cost. A batch of one-limit
    // checks on one limit costs Redis 1 argument a check instead of 7: fewer
    // strings for Redis to make and for the script to read.
    std::vector<std::string_view> keys, args;
    std::deque<std::string> text;  // numbers made for this call (views stay valid)
    auto number = [&text](size_t v) -> std::string_view {
      static const std::array<std::string, 1025> kSmall = [] {
        std::array<std::string, 1025> a;
        for (size_t i = 0; i < a.size(); ++i) a[i] = std::to_string(i);
        return a;
      }();
      return v < kSmall.size() ? std::string_view(kSmall[v]) : text.emplace_back(std::to_string(v));
    };
    const std::string now_arg =
        opts.time_source == TimeSource::kLocal ? std::to_string(clock->NowMicros()) : std::string();
    args.push_back(now_arg);
    args.emplace_back();  // the number of distinct limits, known below
    const size_t first_spec = args.size();
    size_t specs = 0;
    std::vector<uint32_t> spec_of;  // per limit of each check, in order
    for (const PendingCheck& p : group) {
      for (size_t i = 0; i < p.keys.size(); ++i) {
        const std::string* spec = &p.args[2 + 5 * i];  // algorithm, limit, window, interval
        // (Only the first 64 distinct limits are looked for: a batch of many
        // inline limits repeats some arguments rather than search quadratically.)
        const size_t searched = std::min<size_t>(specs, 64);
        size_t j = 0;
        for (; j < searched; ++j) {
          const std::string_view* have = &args[first_spec + 4 * j];
          if (have[0] == spec[0] && have[1] == spec[1] && have[2] == spec[2] &&
              have[3] == spec[3]) {
            break;
          }
        }
        if (j == searched) {
          j = specs++;
          args.insert(args.end(), spec, spec + 4);
        }
        spec_of.push_back(static_cast<uint32_t>(j + 1));
      }
    }
    args[first_spec - 1] = number(specs);
    args.push_back(number(group.size()));
    size_t at = 0;
    for (const PendingCheck& p : group) {
      keys.insert(keys.end(), p.keys.begin(), p.keys.end());
      if (std::optional<size_t> packed = PackedCheck(p, spec_of[at], specs)) {
        args.push_back(number(*packed));
        ++at;
        continue;
      }
      args.push_back(text.emplace_back(p.args[0] + p.args[1]));
      for (size_t i = 0; i < p.keys.size(); ++i) {
        args.push_back(number(spec_of[at++]));
        args.push_back(p.args[2 + 5 * i + 4]);
      }
    }
    auto shared = std::make_shared<std::vector<PendingCheck>>(std::move(group));
    {
      std::lock_guard lock(mu);
      ++calls_in_flight;
      last_send = now;
    }
    stat_calls.fetch_add(1, std::memory_order_relaxed);
    redis::Callback on_reply = [this, shared](StatusOr<redis::Reply> reply) {
      // What queued meanwhile leaves before this call's answers are handed
      // out: Redis works on the next call while they are.
      bool more;
      {
        std::lock_guard lock(mu);
        --calls_in_flight;
        ++completing;
        more = !queue.empty();
        if (more) flush_scheduled = true;
      }
      if (more) Flush();
      Complete(*shared, std::move(reply));
      std::lock_guard lock(mu);
      --completing;
    };
    if (cluster) {
      cluster->EvalScript(script, keys, args, std::move(on_reply), timeout);
    } else {
      client->EvalScript(script, keys, args, std::move(on_reply), timeout);
    }
  }

  void Complete(std::vector<PendingCheck>& group, StatusOr<redis::Reply> reply) {
    in_flight.fetch_sub(group.size(), std::memory_order_relaxed);
    // Any reply (even a script error) shows the node is alive; a failed call
    // (refused, timed out, garbage) counts towards opening the breaker.
    // Each breaker that let a check of this call through hears the outcome once.
    CircuitBreaker* reported[4] = {};
    size_t n_reported = 0;
    for (const PendingCheck& p : group) {
      if (std::find(reported, reported + n_reported, p.breaker) != reported + n_reported) continue;
      if (reply.ok()) {
        p.breaker->OnSuccess();
      } else if (reply.status().code() != StatusCode::kResourceExhausted) {
        p.breaker->OnFailure();
      }
      if (n_reported < std::size(reported)) reported[n_reported++] = p.breaker;
    }
    Status failure;
    if (!reply.ok()) {
      failure = reply.status();
    } else if (reply->type == redis::Reply::Type::kError) {
      failure = Internal("redis script error: " + reply->str);
    } else {
      size_t expected = 0;
      for (const PendingCheck& p : group) expected += 4 * p.keys.size();
      if (reply->type != redis::Reply::Type::kArray || reply->elements.size() != expected) {
        failure = Internal("unexpected reply from the redis script (expected an array of " +
                           std::to_string(expected) + " integers)");
      } else {
        for (const redis::Reply& e : reply->elements) {
          if (e.type != redis::Reply::Type::kInteger) {
            failure = Internal("unexpected reply from the redis script: a non-integer element");
            break;
          }
        }
      }
    }
    if (!failure.ok()) {
      stat_failures.fetch_add(group.size(), std::memory_order_relaxed);
      for (PendingCheck& p : group) {
        ReleaseWaiters(p, nullptr);
        p.done(failure);
      }
      return;
    }
    size_t at = 0;
    for (PendingCheck& p : group) {
      CheckResult r;
      r.decisions.resize(p.keys.size());
      for (Decision& d : r.decisions) {
        const auto& e = reply->elements;
        d.allowed = e[at].integer > 0;  // a lease ("T"): the tokens taken
        d.remaining = e[at + 1].integer;
        d.retry_after = microseconds(e[at + 2].integer);
        d.reset_after = microseconds(e[at + 3].integer);
        at += 4;
      }
      // The limit is not echoed by the script; take it from the request args,
      // and the leaky bucket's delay from its reset_after (core::LeakyDelay).
      for (size_t i = 0; i < r.decisions.size(); ++i) {
        Decision& d = r.decisions[i];
        d.limit = LimitArg(p, i, 1);
        if (d.allowed && p.args[2 + 5 * i][0] == AlgorithmCode(Algorithm::kLeakyBucket)) {
          d.delay = core::LeakyDelay(LimitArg(p, i, 3), d.reset_after, LimitArg(p, i, 4));
        }
      }
      int64_t granted = 0;
      if (p.want > 1) {
        granted = reply->elements[at - 4].integer;
        leases.Grant(p.lease_fp, p.lease, granted, r.decisions[0], p.submitted_at,
                     clock->NowMicros());
        if (granted > 1) r.decisions[0].remaining += granted - 1;
      }
      r.overall = Combine(r.decisions);
      if (p.cache_fp) {
        // A denial, or the denial that follows taking the last unit.
        std::optional<CheckResult> denial;
        if (!r.overall.allowed) {
          denial = r;
        } else if (r.decisions.size() == 1 && granted <= 1) {
          if (std::optional<Decision> next = store::OverLimitCache::DenialAfterLastUnit(
                  p.algorithm, p.window_micros, p.interval_micros, r.decisions[0])) {
            denial = CheckResult{.overall = *next, .decisions = {*next}};
          }
        }
        if (denial && p.lease > 1) {
          // A leased limit: hold the key back until a whole lease has come
          // free, so that the next call takes n tokens rather than one (a
          // flood then costs about 2 calls per n tokens). Tokens left in the
          // bucket meanwhile are taken by that call: only the timing moves.
          const microseconds hold((p.lease - 1) * p.interval_micros);
          denial->overall.retry_after += hold;
          for (Decision& d : denial->decisions) {
            if (!d.allowed) d.retry_after += hold;
          }
          if (!r.overall.allowed) r = *denial;
        }
        if (denial) cache->Remember(*p.cache_fp, *denial, p.submitted_at, clock->NowMicros());
        ReleaseWaiters(p, denial ? &*denial : nullptr);
      }
      p.done(std::move(r));
    }
  }
};

namespace {

void ApplyStoreOptions(const RedisStore::Options& options, redis::Options* ro) {
  ro->command_timeout = options.deadline;
  ro->connections = std::max(1, options.connections);
  ro->max_pending = static_cast<int>(options.max_pending);
  ro->reconnect_max_backoff = options.reconnect_max_backoff;
}

// "redis+cluster://user:***@h1:p1,h2:p2": the seeds, never the password.
std::string RedactedClusterUrl(const redis::ClusterOptions& c) {
  std::string out = c.node.tls ? "rediss+cluster://" : "redis+cluster://";
  if (!c.node.password.empty()) out += c.node.user + ":***@";
  for (size_t i = 0; i < c.seeds.size(); ++i) out += (i > 0 ? "," : "") + c.seeds[i].ToString();
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<RedisStore>> RedisStore::Create(Options options) {
  std::optional<redis::Options> ro;
  std::optional<redis::ClusterOptions> co;
  if (redis::IsClusterUrl(options.url)) {
    StatusOr<redis::ClusterOptions> parsed = redis::ParseClusterUrl(options.url);
    if (!parsed.ok()) return parsed.status();
    co = *std::move(parsed);
    ApplyStoreOptions(options, &co->node);
  } else {
    StatusOr<redis::Options> parsed = redis::ParseRedisUrl(options.url);
    if (!parsed.ok()) return parsed.status();
    ro = *std::move(parsed);
    ApplyStoreOptions(options, &*ro);
  }
  auto impl = std::make_unique<Impl>();
  static_cast<Options&>(impl->opts) = std::move(options);
  impl->clock = impl->opts.clock != nullptr ? impl->opts.clock : &Clock::System();
  impl->opts.url_for_logs = co ? RedactedClusterUrl(*co) : redis::RedactedUrl(*ro);
  impl->breaker = std::make_unique<CircuitBreaker>(impl->opts.breaker);
  if (impl->opts.over_limit_cache_entries > 0) {
    impl->cache = std::make_unique<store::OverLimitCache>(
        store::OverLimitCache::Options{.max_entries = impl->opts.over_limit_cache_entries,
                                       .min_retry = impl->opts.over_limit_cache_min_retry});
  }
  impl->script = redis::Script::Create(std::string(store::kCheckScript));
  if (impl->opts.io_context != nullptr) {
    impl->exec = impl->opts.io_context->get_executor();
  } else {
    impl->own_io = std::make_unique<redis::IoThread>();
    impl->exec = impl->own_io->executor();
  }
  if (co) {
    StatusOr<std::unique_ptr<redis::ClusterClient>> cluster =
        redis::ClusterClient::Create(impl->exec, *std::move(co));
    if (!cluster.ok()) return cluster.status();
    impl->cluster = *std::move(cluster);
  } else {
    StatusOr<std::unique_ptr<redis::Client>> client =
        redis::Client::Create(impl->exec, *std::move(ro));
    if (!client.ok()) return client.status();
    impl->client = *std::move(client);
  }
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(impl)));
}

RedisStore::RedisStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

bool RedisStore::Impl::Idle() {
  std::lock_guard lock(mu);
  return calls_in_flight == 0 && completing == 0 && !flush_scheduled && queue.empty();
}

void RedisStore::Impl::CloseClient() {
  if (cluster) {
    cluster->Close();
  } else {
    client->Close();
  }
}

RedisStore::~RedisStore() {
  impl_->CloseClient();
  // Closing fails the calls in flight on the I/O thread; their callbacks use
  // this store, so wait for them (bounded) before the members go away. A
  // caller's io_context that has stopped runs nothing more: its queued
  // handlers are dropped with it, never called.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < give_up && !impl_->Idle()) {
    if (impl_->opts.io_context != nullptr && impl_->opts.io_context->stopped()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void RedisStore::Shutdown(std::function<void()> done) {
  impl_->CloseClient();
  struct Poll {
    Impl* impl;
    boost::asio::steady_timer timer;
    std::chrono::steady_clock::time_point give_up;
    std::function<void()> done;
    static void Run(std::shared_ptr<Poll> p) {
      if (p->impl->Idle() || std::chrono::steady_clock::now() >= p->give_up) return p->done();
      p->timer.expires_after(std::chrono::milliseconds(1));
      p->timer.async_wait([p](boost::system::error_code) { Run(p); });
    }
  };
  auto p = std::make_shared<Poll>(Poll{impl_.get(), boost::asio::steady_timer(impl_->exec),
                                       std::chrono::steady_clock::now() + std::chrono::seconds(1),
                                       std::move(done)});
  boost::asio::post(impl_->exec, [p] { Poll::Run(p); });
}

void RedisStore::Check(const CheckRequest& request, CheckCallback done) {
  impl_->Submit(request, /*peek=*/false, std::move(done));
}

void RedisStore::Peek(const CheckRequest& request, CheckCallback done) {
  impl_->Submit(request, /*peek=*/true, std::move(done));
}

void RedisStore::Reset(std::string_view key, std::span<const Limit* const> limits,
                       ResetCallback done) {
  if (limits.empty()) return done(Status::Ok());
  if (impl_->cache != nullptr) impl_->cache->Clear();
  impl_->leases.Clear();
  std::vector<std::string> args = {"DEL"};
  for (const Limit* l : limits) args.push_back(impl_->Key(key, *l));
  auto on_reply = [done = std::move(done)](StatusOr<redis::Reply> r) {
    if (!r.ok()) return done(r.status());
    if (r->type == redis::Reply::Type::kError) return done(Internal("redis: " + r->str));
    done(Status::Ok());
  };
  if (impl_->cluster) {
    impl_->cluster->Execute(args, std::move(on_reply));  // the keys share one slot
  } else {
    impl_->client->Execute(args, std::move(on_reply));
  }
}

std::string RedisStore::KeyFor(std::string_view client_key, const Limit& limit) const {
  return impl_->Key(client_key, limit);
}

size_t RedisStore::pending() const { return impl_->in_flight.load(std::memory_order_relaxed); }

CircuitBreaker::State RedisStore::breaker_state() const {
  // In a cluster: the worst state over the nodes (open > half-open > closed).
  CircuitBreaker::State worst = impl_->breaker->state();
  auto rank = [](CircuitBreaker::State s) {
    return s == CircuitBreaker::State::kOpen ? 2 : s == CircuitBreaker::State::kHalfOpen ? 1 : 0;
  };
  std::lock_guard lock(impl_->breakers_mu);
  for (const auto& b : impl_->node_breakers) {
    if (b && rank(b->state()) > rank(worst)) worst = b->state();
  }
  return worst;
}

RedisStore::Stats RedisStore::stats() const {
  return {.checks = impl_->stat_checks.load(std::memory_order_relaxed),
          .script_calls = impl_->stat_calls.load(std::memory_order_relaxed),
          .cache_hits = impl_->stat_hits.load(std::memory_order_relaxed),
          .lease_hits = impl_->stat_lease_hits.load(std::memory_order_relaxed),
          .failures = impl_->stat_failures.load(std::memory_order_relaxed)};
}

}  // namespace ratelimit
