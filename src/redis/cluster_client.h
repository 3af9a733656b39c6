// ClusterClient: a thread-safe client for a Redis Cluster, built on one
// pipelining Client per master.
//
// It learns the slot map from the seed nodes (CLUSTER SHARDS, or CLUSTER SLOTS
// on servers that lack it), sends each call to the master of the slot of its
// first key, and follows the cluster's answers:
//   -MOVED   the slot has a new owner: the map entry is updated, a full
//            refresh is scheduled, and the call goes to the new owner;
//   -ASK     the slot is migrating: the call is sent once to the named node,
//            preceded by ASKING on the same connection; the map is unchanged;
//   -TRYAGAIN, -CLUSTERDOWN
//            retried after a short backoff while the call's deadline allows;
//            then it fails with kUnavailable.
// These answers mean the command did not run, so retrying is safe. A call
// whose outcome is unknown (a timeout or a lost connection after sending) is
// never replayed: it fails, and a refresh of the map is scheduled. The map is
// also refreshed every `refresh_interval`. Scripts are loaded per node on
// NOSCRIPT (see Client::EvalScript). A malformed map or redirection is a
// kInternal/kUnavailable status, never a crash.
//
//   IoThread io;
//   auto cluster = ClusterClient::Create(io.executor(),
//                                        *ParseClusterUrl("redis+cluster://10.0.0.1:7000"));
//   (*cluster)->EvalScript(script, keys, args, [](StatusOr<Reply> r) { ... }, 100ms);
//
// Calls made before the first map arrives wait for it (within their deadline).
// Nodes are identified by small integers (NodeForSlot), stable for the
// client's life, so that per-node state kept by a caller (e.g. a circuit
// breaker) can be indexed by it. A node that is absent from 3 consecutive
// slot maps (and got no call meanwhile; seeds excepted) is dropped: its
// Client is closed (calls still on it fail with kUnavailable), it is no
// longer asked for the map, and OnNodeDropped's handler hears its id. Its id
// stays its address's: a later map, MOVED or ASK naming it revives it.
//
// Ownership: owns the per-node Clients. Destroying (or Close()-ing) it fails
// pending calls with kUnavailable, which needs the executor to keep running
// for a moment (as for Client).
// Thread-safety: all methods may be called concurrently from any thread.
// Callbacks run on the executor, never inline in the call that was given them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "ratelimit/status.h"
#include "redis/callback.h"
#include "redis/client.h"
#include "redis/endpoint.h"
#include "redis/reply.h"
#include "redis/url.h"

namespace ratelimit::redis {

class ClusterClient final : public Endpoint {
 public:
  // Starts connecting to the seeds and loading the slot map at once. A setup
  // error (bad options, unreadable TLS files) is kept in init_status() and
  // fails every call; Create() reports it instead.
  ClusterClient(boost::asio::any_io_executor executor, ClusterOptions options);
  static StatusOr<std::unique_ptr<ClusterClient>> Create(boost::asio::any_io_executor executor,
                                                         ClusterOptions options);
  ~ClusterClient() override;  // Close()
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // One command routed by the slot of args[1] (its first key).
  // REQUIRES: args.size() >= 2; every key of the command is in args[1]'s slot.
  void Execute(std::span<const std::string_view> args, Callback cb,
               std::chrono::milliseconds timeout) override;
  void Execute(const std::vector<std::string>& args, Callback cb);  // options' command_timeout

  // EVALSHA (SCRIPT LOAD + retry on NOSCRIPT) routed by the slot of keys[0].
  // REQUIRES: !keys.empty(); all keys in one slot; `script` outlives the callback.
  void EvalScript(const Script& script, std::span<const std::string_view> keys,
                  std::span<const std::string_view> args, Callback cb,
                  std::chrono::milliseconds timeout) override;
  // The undo goes to the node the call last went to, behind it (Endpoint).
  void EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                          std::span<const std::string_view> args,
                          std::span<const std::string_view> undo, Callback cb,
                          std::chrono::milliseconds timeout) override;
  // EVALSHA with no KEYS on the master of `slot` by the current map (see
  // Endpoint::EvalScriptOnNode); NOSCRIPT loads the script there and retries.
  void EvalScriptOnNode(const Script& script, uint16_t slot, std::span<const std::string_view> args,
                        Callback cb, std::chrono::milliseconds timeout) override;

  // The node serving `slot` now, or -1 while no map is known.
  int NodeForSlot(uint16_t slot) const override;
  // "host:port" of a node id from NodeForSlot. REQUIRES: 0 <= node < node_count().
  std::string NodeName(int node) const;
  // Ids given so far (dropped nodes included), and the nodes not dropped.
  int node_count() const;
  int live_node_count() const;
  // `handler(node)` runs (on the executor) when a node is dropped. Replaces
  // the previous one; Close() removes it and waits for a run under way.
  void OnNodeDropped(std::function<void(int node)> handler) override;
  // True once a slot map has been loaded.
  bool has_slot_map() const;
  // Schedules a slot map refresh (rate-limited by min_refresh_interval).
  void RequestRefresh() override;
  // Endpoint: "redis node host:port"; -1 and RedactedUrl: the seeds.
  std::string Describe(int node) const override;
  std::string RedactedUrl() const override;
  bool sharded() const override { return true; }
  // A master of the slot map (attempt i: the one serving slot i * 5461 % 16384),
  // or a seed while no map is known.
  std::optional<Options> SubscriptionNode(int attempt) const override;
  // Slot map refreshes completed so far (for tests and metrics).
  uint64_t refreshes() const;

  // Stops everything; pending and later calls fail with kUnavailable. Idempotent.
  void Close() override;

  const ClusterOptions& options() const;
  const Status& init_status() const;

  struct State;  // shared with pending operations

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ratelimit::redis
