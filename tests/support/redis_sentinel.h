// RedisSentinel: a real Redis Sentinel deployment for tests: one master, one
// replica (repl-diskless-sync-delay 0, so it can be promoted at once) and
// three sentinels (quorum 2) with a short down-after-milliseconds, each a
// redis-server child process (RedisServer) on a free loopback port; each
// sentinel has its own writable config file.
//
//   RedisSentinel s({.down_after = std::chrono::milliseconds(1000)});  // up and agreed
//   auto store = RedisStore::Create({.url = s.url()});   // redis+sentinel://.../main
//   s.data(s.MasterIndex()).Kill();                      // the sentinels promote the replica
//   size_t m = s.WaitForNewMaster(old);                  // index of the new master
//
// Passwords: `password` is the data nodes' (requirepass + masterauth, and the
// sentinels' auth-pass), `sentinel_password` the sentinels' own (requirepass,
// sentinel-pass). Cli() authenticates with them.
//
// Failures throw std::runtime_error (GoogleTest reports a test failure); a
// missing redis-server is a failure, never a skip. The destructor kills every
// process. Thread-safety: thread-compatible; start it from the test's main
// thread (see RedisServer).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "support/redis_server.h"

namespace ratelimit::testing {

struct RedisSentinelOptions {
  std::string master_name = "main";
  std::chrono::milliseconds down_after{1000};  // sentinel down-after-milliseconds
  std::string password;                        // data nodes; empty: none
  std::string sentinel_password;               // sentinels; empty: none
};

class RedisSentinel {
 public:
  explicit RedisSentinel(RedisSentinelOptions options = {});
  ~RedisSentinel();
  RedisSentinel(const RedisSentinel&) = delete;
  RedisSentinel& operator=(const RedisSentinel&) = delete;

  // Data nodes: 0 is the first master, 1 its replica.
  RedisServer& data(size_t i) { return *data_.at(i); }
  RedisServer& sentinel(size_t i) { return *sentinels_.at(i); }
  size_t sentinels() const { return sentinels_.size(); }
  const RedisSentinelOptions& options() const { return options_; }

  // "redis+sentinel://[:password@]127.0.0.1:S1,...:S3/<name>[?sentinel_password=...]".
  std::string url() const;

  // One command on a data node or a sentinel (with its password), as RedisServer::Cli
  // renders replies. Throws if it cannot be run.
  std::string Cli(RedisServer& server, const std::vector<std::string>& args) const;
  // The data node that a live sentinel names as master now.
  size_t MasterIndex();
  // ROLE of a running data node is master.
  bool IsMaster(size_t i);
  // Waits until every live sentinel names a master other than `old`, and that
  // node says it is master; returns its index. Throws on timeout.
  size_t WaitForNewMaster(size_t old, std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Waits until the replica's link is up and every live sentinel knows the
  // master, its replica and the other sentinels. Throws on timeout.
  void WaitUntilReady(std::chrono::milliseconds timeout = std::chrono::seconds(15));

 private:
  size_t IndexOfPort(int port) const;

  RedisSentinelOptions options_;
  std::vector<std::unique_ptr<RedisServer>> data_;
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace ratelimit::testing
