// Client: a pipelining, thread-safe client for one standalone Redis node.
//
// It owns Options.connections Connections to the node and spreads calls over
// them round-robin (skipping disconnected ones), with one shared bound
// (Options.max_pending) on calls queued or in flight. Every call completes
// through its Callback exactly once, on the executor's thread(s), with either a
// Reply (which may be an error reply, e.g. WRONGTYPE) or a failed Status
// (see connection.h for the codes).
//
//   IoThread io;
//   Client client(io.executor(), *ParseRedisUrl("redis://127.0.0.1:6379"));
//   client.Execute({"INCR", "hits"}, [](StatusOr<Reply> r) { ... });
//   StatusOr<Reply> v = client.ExecuteSync({"GET", "hits"});  // not on the io thread
//
// Scripts run with EVALSHA; only on a "-NOSCRIPT" error reply is the script
// loaded (SCRIPT LOAD) and the call retried, once, on the same connection.
//
// Ownership: the Client shares its Connections with their pending operations;
// destroying (or Close()-ing) the Client fails the pending calls with
// kUnavailable, which needs the executor to keep running for a moment.
// Thread-safety: all methods may be called concurrently from any thread,
// except ExecuteSync, which must not be called on an executor thread.
#pragma once

#include <chrono>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>

#include "ratelimit/status.h"
#include "redis/callback.h"
#include "redis/connection.h"
#include "redis/endpoint.h"
#include "redis/reply.h"
#include "redis/url.h"

namespace ratelimit::redis {

// A Lua script identified by the SHA1 of its source.
struct Script {
  std::string source;
  std::string sha1;  // 40 lowercase hex digits

  static Script Create(std::string source);
};

// Lowercase hex SHA1 of `data` (what Redis uses to name scripts).
std::string Sha1Hex(std::string_view data);

// Loads the TLS files of `options` (tls_ca_file, tls_cert_file, tls_key_file)
// as a Client does: Ok, or the error its Create() would return.
Status CheckTlsFiles(const Options& options);

// One node: an Endpoint whose every slot is node 0.
class Client final : public Endpoint {
 public:
  // Starts connecting at once. A TLS setup error (unreadable CA file, ...) is
  // kept in init_status() and fails every call; Create() reports it instead.
  Client(boost::asio::any_io_executor executor, Options options);
  static StatusOr<std::unique_ptr<Client>> Create(boost::asio::any_io_executor executor,
                                                  Options options);
  ~Client() override;  // Close()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One command, with Options.command_timeout or an explicit timeout.
  // REQUIRES: !args.empty().
  void Execute(std::span<const std::string_view> args, Callback cb);
  void Execute(std::span<const std::string_view> args, Callback cb,
               std::chrono::milliseconds timeout) override;
  void Execute(std::initializer_list<std::string_view> args, Callback cb);
  void Execute(const std::vector<std::string>& args, Callback cb);

  // Blocks until the reply. REQUIRES: not called on an executor thread.
  StatusOr<Reply> ExecuteSync(std::initializer_list<std::string_view> args);
  StatusOr<Reply> ExecuteSync(std::span<const std::string_view> args);

  // EVALSHA script.sha1 len(keys) keys... args...; SCRIPT LOAD + one retry on NOSCRIPT.
  // REQUIRES: `script` outlives the callback (scripts are normally long-lived).
  void EvalScript(const Script& script, std::span<const std::string_view> keys,
                  std::span<const std::string_view> args, Callback cb);
  void EvalScript(const Script& script, std::span<const std::string_view> keys,
                  std::span<const std::string_view> args, Callback cb,
                  std::chrono::milliseconds timeout) override;
  // The undo goes behind the script on its connection (Endpoint).
  void EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                          std::span<const std::string_view> args,
                          std::span<const std::string_view> undo, Callback cb,
                          std::chrono::milliseconds timeout) override;

  // Endpoint: one node, 0, described by the URL without its password.
  int NodeForSlot(uint16_t) const override { return 0; }
  std::string Describe(int node) const override;
  std::string RedactedUrl() const override;
  bool sharded() const override { return false; }
  std::optional<Options> SubscriptionNode(int) const override { return options_; }

  // Redis Cluster, after an -ASK redirection: the same calls, each sent as
  // ASKING + the command back to back on one connection (a NOSCRIPT retry
  // sends ASKING again). Used by ClusterClient.
  void ExecuteAsking(std::span<const std::string_view> args, Callback cb,
                     std::chrono::milliseconds timeout);
  void EvalScriptAsking(const Script& script, std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, Callback cb,
                        std::chrono::milliseconds timeout,
                        std::span<const std::string_view> undo = {});

  // Pub/sub messages and connection losses of every connection (Connection::OnPush).
  void OnPush(const Connection::PushHandler& on_push);

  // Stops reconnecting and fails pending calls with kUnavailable; later calls
  // fail fast. Idempotent.
  void Close() override;

  const Options& options() const { return options_; }
  const Status& init_status() const { return init_status_; }
  // Calls queued or in flight right now (for metrics).
  int64_t pending() const { return budget_->used(); }

 private:
  Connection& Pick();
  void Eval(const Script& script, std::span<const std::string_view> keys,
            std::span<const std::string_view> args, Callback cb, std::chrono::milliseconds timeout,
            bool asking, std::span<const std::string_view> undo = {});

  const Options options_;
  Status init_status_;
  boost::asio::any_io_executor executor_;
  std::shared_ptr<PendingBudget> budget_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::atomic<uint32_t> next_{0};
};

}  // namespace ratelimit::redis
