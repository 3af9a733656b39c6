// RedisBackend: the one way both Redis stores (RedisStore, RedisConcurrencyStore)
// reach Redis, whatever serves it: one node, a Cluster, or (later) a master
// found through Sentinel. It owns what the stores used to repeat:
//   - the executor (a thread of its own, or the caller's io_context);
//   - the endpoint (redis::Endpoint: Client, ClusterClient, ...) opened from
//     RedisConnectionOptions::url, and the script it runs;
//   - one circuit breaker per node (BreakerFor), another while a slot's node
//     is unknown, and breaker_state() over all of them;
//   - the URL for logs, without its password;
//   - the shutdown drain: calls out are counted until their callback returns.
//
//   auto b = *RedisBackend::Create(options, store::kCheckScript);
//   uint16_t slot = b->SlotOf(key);
//   StatusOr<RedisBackend::Pass> pass = b->Admit(slot);      // open: the status
//   b->Eval(keys, args, [..](StatusOr<redis::Reply> r) { RedisBackend::Report(*pass, r); .. },
//           timeout);
//   ... or, if the call is not sent after all: RedisBackend::GiveBack(*pass);
//
// A call whose outcome is unknown is failed, never replayed (the endpoints'
// rule); only NOSCRIPT loads the script and retries. A node that answers
// that it cannot serve now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN,
// READONLY, OOM, MISCONF, NOREPLICAS) failed the call, for the breaker and for the caller (Judged).
//
// Thread-safety: every method may be called from any thread. Callbacks run
// on executor() and must not block.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "ratelimit/circuit_breaker.h"
#include "ratelimit/redis_store.h"
#include "ratelimit/status.h"
#include "ratelimit/thread_annotations.h"
#include "redis/callback.h"
#include "redis/client.h"
#include "redis/endpoint.h"
#include "redis/io_thread.h"
#include "redis/subscriber.h"

namespace ratelimit::store {

class RedisBackend {
 public:
  static StatusOr<std::unique_ptr<RedisBackend>> Create(const RedisConnectionOptions& options,
                                                        std::string_view script_source);
  // Closes and waits for the calls out (as CloseAndWait).
  ~RedisBackend();
  RedisBackend(const RedisBackend&) = delete;
  RedisBackend& operator=(const RedisBackend&) = delete;

  // The slot a call on `key` goes to. REQUIRES for a script call: every key in
  // the slot of the first one (a client's keys share its hash tag).
  uint16_t SlotOf(std::string_view key) const;
  // Whether calls for different slots may go to different nodes: a batch of
  // script calls must then be split by slot.
  bool sharded() const { return endpoint_->sharded(); }

  // What a breaker let through: whom to tell how the call ended, and whether
  // it carries the half-open probe (CircuitBreaker::Allow).
  struct Pass {
    CircuitBreaker* breaker = nullptr;
    uint64_t probe = 0;
  };
  // The breaker of the node serving `slot` (one more stands in while that node
  // is unknown): its pass, or the failed status when it is open (and then the
  // endpoint is asked to look for a new owner, in case the node is gone).
  // Every pass must end in Report or GiveBack: a probe that ends in neither
  // keeps the breaker half-open until it lapses (probe_timeout).
  StatusOr<Pass> Admit(uint16_t slot);
  // Tells the breaker how a call it let through ended: a reply shows the
  // node serving, unless it is one by which the node says it cannot serve now
  // (Reply::IsUnavailableError: LOADING, BUSY, MASTERDOWN, CLUSTERDOWN,
  // READONLY, OOM, MISCONF, NOREPLICAS); that reply and a failed call count towards opening it,
  // except kResourceExhausted (our own bound, not the node's fault: a probe is given back).
  static void Report(const Pass& pass, const StatusOr<redis::Reply>& reply);
  // The reply as the stores see a call's outcome: an error reply by which the
  // node says it cannot serve now (Reply::IsUnavailableError) becomes the
  // failure it is, kUnavailable with the node's text, as a refused connection
  // (the failure mode answers, cause `refused`); anything else as it is.
  // Guarded* hand their callbacks judged replies; Eval, EvalOnNode and
  // Execute hand the raw ones (a caller may act on the error first).
  static StatusOr<redis::Reply> Judged(StatusOr<redis::Reply> reply);
  // The call was never sent: a probe goes back for the next caller.
  static void GiveBack(const Pass& pass) {
    if (pass.probe != 0) pass.breaker->GiveBack(pass.probe);
  }

  // The script (given to Create) on keys' node, within `timeout`.
  void Eval(std::span<const std::string_view> keys, std::span<const std::string_view> args,
            redis::Callback done, std::chrono::milliseconds timeout);
  // The script in node mode (check.lua's "N" calls; Redis 7.0+: it is loaded
  // with the shebang line that allows keys of several slots) with no KEYS on
  // the node that serves `slot` by the endpoint's map, within `timeout`.
  void EvalOnNode(uint16_t slot, std::span<const std::string_view> args, redis::Callback done,
                  std::chrono::milliseconds timeout);
  // The node serving `slot` now (a small integer), or -1 while it is unknown.
  int NodeOf(uint16_t slot) const { return endpoint_->NodeForSlot(slot); }
  // The endpoint may have a stale map: ask it to look again.
  void RequestRefresh() { endpoint_->RequestRefresh(); }
  // A command on args[1]'s node, within the options' deadline.
  void Execute(std::span<const std::string_view> args, redis::Callback done);
  // Admit + Eval/Execute + Report, and the reply Judged: a call made on its
  // own (not batched). `undo`, if given, goes behind a script call that
  // fails without a reply (Endpoint::EvalScriptWithUndo).
  void GuardedEval(std::span<const std::string_view> keys, std::span<const std::string_view> args,
                   redis::Callback done, std::span<const std::string_view> undo = {});
  void GuardedExecute(std::span<const std::string_view> args, redis::Callback done);

  // Listens on a pub/sub channel (redis::Subscriber) on the node the endpoint
  // names, until Close(). `handler` runs on executor().
  std::shared_ptr<redis::Subscriber> Subscribe(std::string channel,
                                               redis::Subscriber::Handler handler,
                                               redis::Subscriber::Timing timing = {});

  // The worst state over the nodes' breakers (open > half-open > closed).
  // The unknown-node stand-in counts only while the slot it last stood in
  // for is still unknown: once a slot map or master is known, a state it kept
  // from before (nothing asks it again) does not read as an open store.
  CircuitBreaker::State breaker_state() const;
  const std::string& url_for_logs() const { return url_for_logs_; }
  const boost::asio::any_io_executor& executor() const { return exec_; }
  // Script calls and commands sent whose callback has not returned yet.
  int64_t calls_out() const { return calls_out_.load(std::memory_order_acquire); }

  // Closes the connections: calls in flight fail (kUnavailable), later ones
  // fail at once. Idempotent.
  void Close();
  // Closes, then waits (at most 5 s, and not past the caller's io_context
  // stopping: its handlers are then dropped, never called) until no call is
  // out and `idle()` (the caller's own queues) holds. For destructors.
  void CloseAndWait(const std::function<bool()>& idle);
  // Closes; `done` runs on executor() once no call is out and `idle()` holds,
  // at most a second later.
  void Shutdown(std::function<bool()> idle, std::function<void()> done);

 private:
  explicit RedisBackend(const RedisConnectionOptions& options);
  CircuitBreaker* BreakerFor(uint16_t slot);
  // The endpoint dropped `node` (OnNodeDropped): its breaker is retired
  // (closed, kept for the calls that hold it, no longer counted) and a
  // fresh one takes its place.
  void ForgetNode(int node);
  // Passes an endpoint's event on to RedisConnectionOptions::on_redis_event;
  // a failure the same as the last one passed on, less than 10 s ago, is
  // counted instead (the count goes with the next one passed on).
  void OnEndpointEvent(const redis::EndpointEvent& event);
  redis::Callback Counted(redis::Callback done);

  const RedisConnectionOptions opts_;
  redis::Script script_;
  redis::Script node_script_;  // script_ behind "#!lua flags=allow-cross-slot-keys"
  std::string url_for_logs_;
  std::atomic<int64_t> calls_out_{0};
  // Unknown nodes' stand-in, then one per node id.
  std::unique_ptr<CircuitBreaker> unknown_node_breaker_;
  std::atomic<int> unknown_slot_{-1};  // the slot the stand-in last served, -1: none yet
  mutable Mutex breakers_mu_;
  std::vector<std::unique_ptr<CircuitBreaker>> node_breakers_ RL_GUARDED_BY(breakers_mu_);
  // ForgetNode's: one per node dropped (a failover, pod churn), a few
  // hundred bytes each, kept for the store's life.
  std::vector<std::unique_ptr<CircuitBreaker>> retired_breakers_ RL_GUARDED_BY(breakers_mu_);
  std::atomic<CircuitBreaker*> known_[64] = {};  // node_breakers_' first, read without the lock
  Mutex events_mu_;
  std::string last_failure_ RL_GUARDED_BY(events_mu_);
  int64_t last_failure_at_ RL_GUARDED_BY(events_mu_) = 0;  // steady micros
  int64_t failures_dropped_ RL_GUARDED_BY(events_mu_) = 0;
  Mutex subscribers_mu_;
  std::vector<std::shared_ptr<redis::Subscriber>> subscribers_ RL_GUARDED_BY(subscribers_mu_);
  // Declared before the endpoint: destroyed after it.
  std::unique_ptr<redis::IoThread> own_io_;
  boost::asio::any_io_executor exec_;
  std::unique_ptr<redis::Endpoint> endpoint_;
};

}  // namespace ratelimit::store
