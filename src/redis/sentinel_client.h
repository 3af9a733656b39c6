// SentinelClient: the master of a Redis Sentinel deployment, found through
// the sentinels and followed across failovers; an Endpoint with one node at a
// time.
//
// Discovery asks the sentinels in turn (the last one that answered first)
// for `SENTINEL get-master-addr-by-name <name>` and checks the answer with
// ROLE on the node itself: a node that says it is a replica is followed to
// the master it names, once, and that one must say `master`. A data user
// that may not run ROLE (-NOPERM: ROLE is @admin @dangerous) takes the
// sentinel's answer unchecked, and is warned once (OnEvent). The data calls
// then go to a standalone Client on that node (every slot is the node's);
// each new master gets a new node id, so per-node state (a circuit breaker)
// starts fresh, and the old id is reported dropped (OnNodeDropped).
// For switch_hold (30 s) after a +switch-master, a sentinel that names the
// master it replaced has not caught up: that answer is passed over (the
// next sentinel is asked; if none names another master, the current one is
// kept), since during a planned failover the old master still says `master`
// for a while, and the other sentinels learn of the switch only from the
// next hello (2 s).
// Discovery runs again, at most once per min_discovery_interval:
//   - on `+switch-master` for our name, from one sentinel we subscribe to
//     (at once: without the wait, also after a discovery under way);
//   - on a `-READONLY` reply (the node was demoted: the call did not run and
//     fails with kUnavailable, never replayed) and on a failed call
//     (connection lost or refused, a timeout);
//   - when the subscription drops (its connection is lost or a PING on it
//     fails: then the next sentinel is subscribed to) and while no master is
//     known (every check_interval);
//   - on RequestRefresh (the store's breaker for the node opened).
// While no master is known, calls fail at once with kUnavailable (the
// store's failure mode answers), with the last discovery's reasons (each
// sentinel's: refused, a wrong password, an unknown master name...). NOSCRIPT on a new master loads
// the script and retries once (Client::EvalScript); an unknown outcome is never replayed.
//
//   auto s = SentinelClient::Create(io.executor(),
//       *ParseSentinelUrl("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/main"));
//   (*s)->EvalScript(script, keys, args, [](StatusOr<Reply> r) { ... }, 100ms);
//
// The sentinel connections are standalone Clients too (one connection each),
// with the sentinels' own user and password (SentinelOptions::sentinel).
//
// Ownership: owns its Clients; destroying (or Close()-ing) it fails pending
// calls with kUnavailable, which needs the executor to keep running for a
// moment (as for Client).
// Thread-safety: every method may be called from any thread. Callbacks run on
// the executor, never inline in the call that was given them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>

#include "ratelimit/status.h"
#include "redis/callback.h"
#include "redis/client.h"
#include "redis/endpoint.h"
#include "redis/url.h"

namespace ratelimit::redis {

class SentinelClient final : public Endpoint {
 public:
  // Starts discovery and the subscription at once. A setup error (no
  // sentinels, unreadable TLS files) is kept in init_status() and fails every
  // call; Create() reports it instead.
  SentinelClient(boost::asio::any_io_executor executor, SentinelOptions options);
  static StatusOr<std::unique_ptr<SentinelClient>> Create(boost::asio::any_io_executor executor,
                                                          SentinelOptions options);
  ~SentinelClient() override;  // Close()
  SentinelClient(const SentinelClient&) = delete;
  SentinelClient& operator=(const SentinelClient&) = delete;

  void EvalScript(const Script& script, std::span<const std::string_view> keys,
                  std::span<const std::string_view> args, Callback cb,
                  std::chrono::milliseconds timeout) override;
  void EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                          std::span<const std::string_view> args,
                          std::span<const std::string_view> undo, Callback cb,
                          std::chrono::milliseconds timeout) override;
  void Execute(std::span<const std::string_view> args, Callback cb,
               std::chrono::milliseconds timeout) override;

  // The current master's node id (0, 1, ... one per master adopted), or -1
  // while none is known.
  int NodeForSlot(uint16_t slot) const override;
  // "redis master <name> at host:port" for a node id; the URL for -1.
  std::string Describe(int node) const override;
  std::string RedactedUrl() const override;
  bool sharded() const override { return false; }
  // The current master (with the data nodes' options), nullopt while none is known.
  std::optional<Options> SubscriptionNode(int attempt) const override;
  // Asks the sentinels again (rate-limited).
  void RequestRefresh() override;
  // `handler(node)` runs (on the executor) when a new master replaces the
  // node `node`: that id is never used again. Replaces the previous handler;
  // Close() removes it and waits for a run under way.
  void OnNodeDropped(std::function<void(int node)> handler) override;
  // Reports each master adopted ("... is 10.0.0.2:6379 (was 10.0.0.1:6379)"),
  // each failed discovery (every sentinel's reason), and once that ROLE is
  // not permitted.
  void OnEvent(std::function<void(const EndpointEvent& event)> handler) override;
  void Close() override;

  // "host:port" of the current master, "" while none is known (for tests).
  std::string master() const;
  // Discoveries that ended with a master confirmed by ROLE (for tests).
  uint64_t discoveries() const;
  const Status& init_status() const;

  struct State;  // shared with pending operations

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ratelimit::redis
