// RedisStore: limit state in Redis, shared by every instance of an API.
//
// Each request's limits are decided by one Lua script call, atomically inside
// Redis, all or nothing, with the time taken from Redis TIME (or, for managed
// Redis that refuses TIME in scripts, from the caller's Clock). Keys look like
// `<prefix>{<client>}<limit name>` (`rl:{ip:127.0.0.1}burst`; a fixed or
// sliding window adds its window, `rl:{ip:127.0.0.1}hourly:1h`, so that a
// limit whose window changes starts afresh: src/store/redis_keys.h): all of a
// client's limits share a hash tag, so one script call stays in one Redis
// Cluster slot. (No separator
// follows the '}': braces in client text are escaped, so the key is
// unambiguous, and every byte counts: Redis keeps keys of up to 14 bytes in
// a 16-byte allocation, see docs/performance.md.) Client text is
// escaped (or hashed when long) so it can neither pick a slot with braces nor
// collide with another client's key.
//
// Redis Cluster (`redis+cluster://host:port,host:port`): each call goes to the
// master of its slot, following MOVED/ASK and failovers (see
// src/redis/cluster_client.h); coalesced checks are grouped per slot, and each
// node has its own circuit breaker.
//
// Concurrent checks are coalesced: whatever is queued when the I/O thread gets
// to it goes out as one script call (at most `max_batch` checks), pipelined
// with the others on a few connections. While a call sent less than
// `hold_back` (1 ms) ago is out, a batch that is not full waits for its reply;
// nothing waits on a timer.
//
// A key lives until its state equals the fresh state plus a second, and at
// least 10 s: a client that comes back within that overwrites its key rather
// than have Redis' expire cycle delete it and the next call make it again
// (the cycle's runs stall every call behind them; docs/performance.md).
//
//   auto store = ratelimit::RedisStore::Create({.url = "redis://127.0.0.1:6379"});
//   if (!store.ok()) ...;
//   (*store)->Check({"user:ada", checks}, [](StatusOr<CheckResult> r) { ... });
//
// A call that fails (unreachable, deadline exceeded, overloaded) completes
// with a non-OK status and is never replayed: a timed-out call may already
// have counted.
//
// Thread-safety: all methods are thread-safe. Callbacks run on the store's
// own I/O thread and must not block.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/clock.h"
#include "ratelimit/store.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ratelimit {

// Where a Redis-backed store takes `now` from: Redis TIME, or the caller's
// Clock (for managed Redis that refuses TIME in scripts, and for tests).
using RedisTimeSource = TimeSource;  // one enum: include/ratelimit/clock.h

// The options of both Redis-backed stores (RedisStore::Options and
// RedisConcurrencyStore::Options are this struct): how to reach Redis, then
// RedisStore's batching and over-limit cache, which RedisConcurrencyStore
// ignores. src/store/redis_backend.h turns the connection part into a
// connection. (One struct rather than a base and two extensions, so that
// `Create({.url = ..., .deadline = ...})` keeps compiling for embedders.)
struct RedisConnectionOptions {
  // redis://[user:password@]host:port[/db], rediss://..., or a cluster:
  // redis+cluster://[user:password@]host:port,host:port (rediss+cluster://), or a
  // master found through Redis Sentinel: redis+sentinel://[user:password@]host:port,
  // host:port/<master-name>[?sentinel_password=...&db=N] (rediss+sentinel://).
  std::string url = "redis://127.0.0.1:6379";
  std::chrono::milliseconds deadline{100};  // per call; a late call fails, never replays
  std::string key_prefix = "rl:";
  RedisTimeSource time_source = RedisTimeSource::kRedis;
  const Clock* clock = nullptr;  // kLocal: the time source (nullptr: System)
  // How long local state lasts: cached denials and prefetched tokens
  // (RedisStore), and the breakers' open and probe times unless
  // `breaker.clock` is set. A monotonic clock, so that a step of the wall
  // clock (NTP, a VM resumed) neither stretches nor cuts them (nullptr:
  // Clock::Steady()). Tests that drive the store with a ManualClock `clock`
  // usually give it here too.
  const Clock* steady_clock = nullptr;
  int connections = 2;          // per node
  size_t max_pending = 10'000;  // queued + in flight; beyond: kResourceExhausted
  // RedisStore only:
  size_t max_batch = 32;            // checks per script call (1: no coalescing)
  size_t max_calls_in_flight = 16;  // script calls out at once; more checks wait and
                                    // leave together when a reply comes back
  // RedisStore only: while a call sent less than this long ago is out, checks
  // that do not fill a batch wait for its reply and leave together with one
  // call (one node; 0: each leaves at once). Fewer, fuller calls cost both
  // sides less; a call out longer than this delays nobody.
  std::chrono::microseconds hold_back{1000};
  // RedisStore on a Cluster (Redis 7.0+): the checks of different slots that
  // one master serves share a script call (a node call; check.lua's node
  // mode), as one node's checks do, instead of a call per slot: distinct
  // clients almost never share a slot, so without it every check is a call
  // of its own (docs/scaling.md). A slot that moved is found before anything
  // is written, and its checks are sent again per slot. false: calls per slot.
  bool node_calls = true;
  // The io_context to run the client on, run by ONE thread of the caller's
  // (calls may still come from any thread). nullptr: a thread of the store's
  // own. Sharing the thread that serves the requests spares a hand-off each
  // way per batch. The caller keeps it running until Shutdown() has called
  // back, or destroys the store after it stopped.
  boost::asio::io_context* io_context = nullptr;
  size_t max_key_length = kDefaultMaxKeyLength;
  // Consecutive failures open a node's breaker; while open, calls fail at
  // once with BreakerOpenStatus and the caller's failure mode decides.
  CircuitBreaker::Options breaker;
  // The longest wait between reconnect attempts (with jitter): keeps
  // recovery after Redis returns within about a second.
  std::chrono::milliseconds reconnect_max_backoff{250};
  // What the endpoint reports for the logs (redis+sentinel://: each master
  // adopted, each discovery that found none, ROLE not permitted), one
  // sentence each, `warning` for those that need attention. A failure that
  // repeats word for word is passed on at most once per 10 s, with the
  // count of the repeats dropped. Runs on the store's executor; may be empty.
  std::function<void(bool warning, std::string_view message)> on_redis_event;
  // RedisStore only: denials of cost-1 requests are remembered until their
  // retry time and answered locally (see src/store/over_limit_cache.h). 0
  // entries: off.
  size_t over_limit_cache_entries = 100'000;
  std::chrono::milliseconds over_limit_cache_min_retry{0};
};

// A file a Redis URL names (its TLS query parameters), for checks before
// the start: `setting` names it for messages ("store.url tls_key_file").
struct RedisUrlFile {
  std::string setting;
  std::string path;
  bool secret = false;  // a private key
};
// The files `url` names, or kInvalidArgument when the URL does not parse
// (any scheme the stores accept).
StatusOr<std::vector<RedisUrlFile>> RedisUrlFiles(std::string_view url);
// Loads the URL's TLS files as a connection would: Ok, or the error that
// RedisStore::Create would return for them.
Status CheckRedisTlsFiles(std::string_view url);

class RedisStore final : public Store {
 public:
  using TimeSource = RedisTimeSource;
  using Options = RedisConnectionOptions;
  using Stats = StoreStats;  // counters since start, for metrics

  static StatusOr<std::unique_ptr<RedisStore>> Create(Options options);
  ~RedisStore() override;

  void Check(const CheckRequest& request, CheckCallback done) override;
  void Peek(const CheckRequest& request, CheckCallback done) override;
  void Reset(std::string_view key, std::span<const Limit* const> limits,
             ResetCallback done) override;
  // One script call of its own (check.lua's settlement), never batched.
  void Settle(const SettleRequest& request, CheckCallback done) override;
  void Blocks(std::string_view key, std::span<const Limit* const> limits,
              BlocksCallback done) override;
  void Unblock(std::string_view key, std::span<const Limit* const> limits,
               ResetCallback done) override;
  // Clears the over-limit cache and the prefetched tokens.
  void ForgetCached() override;
  // Kept in Redis under <prefix>reservation-secret, made by the first instance
  // to ask. Each instance keeps the one it got, and offers it again (SET NX
  // GET) when it signs at least kSecretRecheck after it last asked, taking
  // what Redis holds: after Redis lost the key, the first instance that asks
  // sets it, and the others take that one (keeping theirs for
  // kSharedSecretOverlap, see SecretAccepting).
  void SharedSecret(std::function<void(StatusOr<std::string>)> done) override;
  void SecretAccepting(std::function<bool(std::string_view)> accepts,
                       std::function<void(StatusOr<std::string>)> done) override;
  static constexpr std::chrono::seconds kSecretRecheck{1};

  // Closes the connections: the calls in flight fail (as kUnavailable) and
  // later checks fail at once. `done` runs on the client's executor once no
  // call is left, at most a second later. Needed before stopping a caller's
  // io_context (Options::io_context); the destructor does it otherwise.
  void Shutdown(std::function<void()> done) override;

  // The Redis key holding `limit`'s state for `client_key` (a calendar quota: its
  // current window's, by the store's clock).
  std::string KeyFor(std::string_view client_key, const Limit& limit) const;
  // Checks queued or in flight now.
  size_t pending() const override;
  // Cluster: the worst state over the nodes' breakers.
  CircuitBreaker::State breaker_state() const override;
  Stats stats() const override;
  bool remote() const override { return true; }

  struct Impl;

 private:
  explicit RedisStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client part of a Redis key: printable ASCII is kept, '%', '{', '}', '#'
// and other bytes are percent-escaped; a result longer than kMaxPlainClientKey
// bytes is replaced by '#' and 16 base64url characters (96 bits) of its
// SHA-256. Distinct clients collide only if SHA-256's first 96 bits do.
inline constexpr size_t kMaxPlainClientKey = 40;
std::string EncodeClientKey(std::string_view key);

}  // namespace ratelimit
