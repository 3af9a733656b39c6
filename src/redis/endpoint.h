// Endpoint: where a store's calls go, whatever Redis deployment serves them.
//
// A store sends two kinds of call: a script call (EVALSHA) on keys of one
// slot, and a plain command whose first key (args[1]) names the slot. An
// Endpoint sends each to the node that serves that slot, with a deadline,
// loads a script on NOSCRIPT and retries it once, and never replays a call
// whose outcome is unknown (a timeout, a connection lost after sending).
// Implementations:
//   Client         one standalone node: every slot is node 0;
//   ClusterClient  a Redis Cluster: the master of the slot, following
//                  MOVED/ASK/failovers;
//   SentinelClient the master a set of Redis Sentinels names: one node at a
//                  time, a new node id after each failover, RequestRefresh
//                  asks the sentinels again.
// Nodes are small integers, stable for the endpoint's life, so per-node state
// (store::RedisBackend's circuit breakers) can be indexed by them.
//
//   std::unique_ptr<Endpoint> e = *OpenEndpoint(executor, "redis://127.0.0.1:6379", tune);
//   e->EvalScript(script, keys, args, [](StatusOr<Reply> r) { ... }, 100ms);
//
// Thread-safety: every method may be called from any thread concurrently.
// Callbacks run on the executor the endpoint was made with.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "ratelimit/status.h"
#include "redis/callback.h"
#include "redis/url.h"

namespace ratelimit::redis {

struct Script;

// Something an endpoint reports for the logs: one sentence, never a password.
struct EndpointEvent {
  enum class Kind {
    kMasterAdopted,    // a master found: the first, or a new one (failover)
    kDiscoveryFailed,  // no master found this time (the current one is kept)
    kWarning,          // a setup that works, but less well (ROLE not permitted)
  };
  Kind kind;
  std::string message;
};

class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // EVALSHA on the node serving keys[0]'s slot; SCRIPT LOAD + one retry on NOSCRIPT.
  // REQUIRES: !keys.empty(), all keys in one slot; `script` outlives the callback.
  virtual void EvalScript(const Script& script, std::span<const std::string_view> keys,
                          std::span<const std::string_view> args, Callback cb,
                          std::chrono::milliseconds timeout) = 0;
  // EvalScript, and when the call fails without a reply (a timeout, a lost
  // connection: the script may run yet, or may have run), `undo` (one
  // command on keys[0]'s slot) sent at once, best effort, its reply
  // dropped: on the connection the script went out on, if it is still up,
  // so that Redis runs it after the script if it runs the script at all
  // (else on another connection to that node, in no particular order with
  // the script). Not for a call that was never sent (kResourceExhausted).
  // store::RedisConcurrencyStore takes back the lease of an acquire whose
  // answer it never got.
  virtual void EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                                  std::span<const std::string_view> args,
                                  std::span<const std::string_view> undo, Callback cb,
                                  std::chrono::milliseconds timeout) = 0;
  // EVALSHA with no KEYS on the node that serves `slot` by this endpoint's
  // map, for a script that takes its keys in `args` (of any slots that node
  // serves) and refuses keys the node does not serve before it writes: Redis
  // redirects nothing without KEYS. store::RedisStore's node calls on a
  // Cluster; an endpoint of one node sends it to that node.
  virtual void EvalScriptOnNode(const Script& script, uint16_t slot,
                                std::span<const std::string_view> args, Callback cb,
                                std::chrono::milliseconds timeout) {
    (void)slot;
    EvalScript(script, {}, args, std::move(cb), timeout);
  }
  // One command on the node serving args[1]'s slot.
  // REQUIRES: args.size() >= 2; every key of the command in args[1]'s slot.
  virtual void Execute(std::span<const std::string_view> args, Callback cb,
                       std::chrono::milliseconds timeout) = 0;

  // The node serving `slot` now, or -1 while it is not known.
  virtual int NodeForSlot(uint16_t slot) const = 0;
  // What logs and errors call a node from NodeForSlot ("redis node 10.0.0.1:7000"),
  // or the whole endpoint for -1 ("redis redis://10.0.0.1:6379").
  virtual std::string Describe(int node) const = 0;
  // The URL for logs, without its password.
  virtual std::string RedactedUrl() const = 0;
  // Whether calls for different slots may go to different nodes (so one
  // script call must hold the keys of one slot only).
  virtual bool sharded() const = 0;
  // The node of a slot may be gone (its breaker opened): look for a new owner.
  virtual void RequestRefresh() {}
  // `handler(node)` runs when the endpoint drops a node it no longer sees
  // (ClusterClient) or uses (SentinelClient: the master a new one replaced),
  // so that per-node state kept by the caller stops counting, and starts
  // afresh if the id comes back. Endpoints that never drop one ignore it.
  virtual void OnNodeDropped(std::function<void(int node)> handler) { (void)handler; }
  // `handler(event)` runs (on the executor) for what the endpoint's owner
  // should log (src/redis has no logger): SentinelClient reports each master
  // it adopts, each discovery that failed and, once, a ROLE it may not run.
  // Replaces the previous handler; Close() removes it and waits for a run
  // under way. Endpoints with nothing to report ignore it.
  virtual void OnEvent(std::function<void(const EndpointEvent& event)> handler) { (void)handler; }
  // Pub/sub (redis::Subscriber): the node to SUBSCRIBE on for the
  // `attempt`th subscription (0, 1, ...: a later attempt may name another
  // node), with this endpoint's credentials and TLS; nullopt while none is
  // known. One node: it; a Cluster: a master (PUBLISH reaches every node);
  // Sentinel: the current master.
  virtual std::optional<Options> SubscriptionNode(int attempt) const = 0;
  // Fails pending and later calls with kUnavailable. Idempotent.
  virtual void Close() = 0;
};

// Tuning a store applies to every connection of an endpoint. A value the
// URL's query gives (command_timeout_ms, connections, max_pending) wins over
// the one here.
struct EndpointTuning {
  std::chrono::milliseconds command_timeout{100};
  int connections = 2;  // per node
  int max_pending = 10'000;
  std::chrono::milliseconds reconnect_max_backoff{1000};
};

// The endpoint `url` names: redis://, rediss:// (Client), redis+cluster://,
// rediss+cluster:// (ClusterClient), redis+sentinel://, rediss+sentinel://
// (SentinelClient). kInvalidArgument for a bad URL; a setup
// error (unreadable TLS files) as the clients' Create report it.
StatusOr<std::unique_ptr<Endpoint>> OpenEndpoint(boost::asio::any_io_executor executor,
                                                 std::string_view url,
                                                 const EndpointTuning& tuning);

}  // namespace ratelimit::redis
