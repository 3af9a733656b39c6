// RedisCluster: a real Redis Cluster for tests: 3 masters + 3 replicas, each a
// redis-server child process (RedisServer) on a free loopback port with its own
// temporary directory, joined with `redis-cli --cluster create`.
//
//   RedisCluster cluster;                        // up, cluster_state:ok everywhere
//   auto store = RedisStore::Create({.url = cluster.url()});
//   size_t m = cluster.MasterOfSlot(KeySlot("rl:{ada}burst"));
//   cluster.node(m).Kill();                      // its replica takes over
//   cluster.WaitUntilHealthy();
//
// Slot migration goes in the steps Redis uses (IMPORTING/MIGRATING, MIGRATE of
// the keys, SETSLOT NODE), so a test can run load between them.
//
// Failures throw std::runtime_error (GoogleTest reports a test failure); a
// missing redis-server or redis-cli is a failure, never a skip. The
// destructor kills every node. Thread-safety: thread-compatible (one test
// thread drives it); start it from the test's main thread (see RedisServer).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/redis_server.h"

namespace ratelimit::testing {

struct RedisClusterOptions {
  int masters = 3;
  int replicas_per_master = 1;
  std::chrono::milliseconds node_timeout{2000};  // cluster-node-timeout
};

class RedisCluster {
 public:
  explicit RedisCluster(RedisClusterOptions options = {});
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  size_t size() const { return nodes_.size(); }
  RedisServer& node(size_t i) { return *nodes_.at(i); }
  const RedisClusterOptions& options() const { return options_; }
  // "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,..." (every node).
  std::string url() const;

  // The index of the node that a live node says is the master of `slot`.
  size_t MasterOfSlot(uint16_t slot);
  // Indexes of the nodes that are masters with slots now (asked of a live node).
  std::vector<size_t> Masters();
  bool IsMaster(size_t i);  // ROLE of a running node
  std::string NodeId(size_t i);
  size_t IndexOfPort(uint16_t port) const;

  // Waits until every running node reports cluster_state:ok, all of them agree
  // on which port serves which slots, no slot is served by a failed node, and
  // every running replica's link to its master is up. Throws on timeout.
  void WaitUntilHealthy(std::chrono::milliseconds timeout = std::chrono::seconds(15));

  // Slot migration, step by step.
  void BeginMigration(uint16_t slot, size_t from, size_t to);  // IMPORTING + MIGRATING
  int MigrateKeys(uint16_t slot, size_t from, size_t to);      // MIGRATE; returns keys moved
  void FinishMigration(uint16_t slot, size_t to);              // SETSLOT NODE on every master

 private:
  // "port:ranges;..." of live masters as `i` sees them ("" if unreachable).
  std::string SlotSignature(size_t i);
  size_t AnyRunningNode() const;

  RedisClusterOptions options_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace ratelimit::testing
