// Connection: one pipelined TCP or TLS connection to one Redis node.
//
// Callers on any thread hand it commands; it appends their bytes to one
// outgoing buffer and a FIFO of pending calls, and a single flush posted to its
// strand writes everything queued so far in one async_write. Replies are
// matched to the FIFO in order. On connect it sends AUTH and SELECT (when
// configured) ahead of any queued command. Each call has a deadline, enforced by
// one timer per connection armed for the earliest deadline. On any connection
// error every pending call fails at once and a reconnect is scheduled with
// exponential backoff and jitter; while disconnected new calls fail fast.
// With Options::reconnect_on_readonly, a -READONLY reply does the same (at
// most once per reconnect_max_backoff), after its call got it.
//
//   auto conn = Connection::Create(ex, options, tls_context, budget);
//   conn->Start();
//   std::string_view args[] = {"INCR", "hits"};
//   conn->Execute(args, [](StatusOr<Reply> r) { ... }, options.command_timeout);
//   conn->Close();
//
// Failure statuses given to callbacks:
//   kUnavailable       not connected, connect/AUTH failed, connection lost
//   kDeadlineExceeded  no reply before the call's deadline (outcome unknown if it was sent)
//   kResourceExhausted the shared PendingBudget is used up
//   kInternal          the server sent bytes that are not RESP2
// A call whose outcome is unknown is never sent again.
//
// Ownership: always held by std::shared_ptr; pending asynchronous operations
// keep it alive. Close() ends reconnecting and fails pending calls; the
// executor must keep running until that completes.
// Thread-safety: Execute, ExecuteEncoded, ExecuteAsking, IsConnected and Close may be called
// from any thread. Callbacks run on the connection's strand (never inline in
// Execute), and never while an internal lock is held, so a callback may call
// Execute again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "core/budget.h"
#include "core/steady_clock.h"
#include "ratelimit/status.h"
#include "ratelimit/thread_annotations.h"
#include "redis/callback.h"
#include "redis/reply.h"
#include "redis/url.h"

namespace ratelimit::redis {

// Bound on the calls queued or in flight over a group of connections.
// Thread-safety: thread-safe (atomic).
using PendingBudget = core::Budget;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Clock = core::SteadyClock;

  // `tls_context` is used only when options.tls (and may be null otherwise); it
  // must be configured already.
  static std::shared_ptr<Connection> Create(boost::asio::any_io_executor executor, Options options,
                                            std::shared_ptr<boost::asio::ssl::context> tls_context,
                                            std::shared_ptr<PendingBudget> budget);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Begins the first connect. Calls made before the first connect completes are
  // queued (subject to their deadlines); later reconnects do not queue.
  void Start();

  // Sends one command. `cb` is called exactly once, on the strand.
  // REQUIRES: !args.empty(); timeout > 0.
  void Execute(std::span<const std::string_view> args, Callback cb,
               std::chrono::milliseconds timeout);
  // Same with one command already RESP-encoded (exactly one command).
  void ExecuteEncoded(std::string_view command, Callback cb, std::chrono::milliseconds timeout);
  // Redis Cluster, after an -ASK redirection: writes ASKING and then `command`
  // (one RESP-encoded command) back to back on this connection, as one unit
  // (both are sent or neither). `cb` gets the reply to `command`; the +OK of
  // ASKING is consumed here.
  void ExecuteAsking(std::string_view command, Callback cb, std::chrono::milliseconds timeout);

  // Pub/sub (Redis Sentinel's +switch-master): after a SUBSCRIBE on this
  // connection, each message (["message", channel, payload]) goes to `on_push`,
  // not to a waiting call, and a lost connection (which ends the subscription)
  // calls it with the failed status. May be called at any time.
  using PushHandler = std::function<void(StatusOr<Reply>)>;
  void OnPush(PushHandler on_push);

  // True when calls would currently be accepted (a hint for routing).
  bool IsConnected() const { return connected_.load(std::memory_order_relaxed); }

  // Stops reconnecting and fails pending calls with kUnavailable. Idempotent.
  void Close();

 private:
  struct Session;
  enum class State { kConnecting, kConnected, kDisconnected, kClosed };
  // kAsking: the ASKING sent just before the kUser call that follows it.
  enum class Kind : uint8_t { kUser, kHandshake, kAsking };
  struct Call {
    Callback cb;  // empty once completed (an abandoned call keeps its FIFO slot)
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
    uint32_t size;  // encoded bytes, to drop a call that was never sent
    Kind kind;
  };
  using Completion = std::pair<Callback, StatusOr<Reply>>;

  Connection(boost::asio::any_io_executor executor, Options options,
             std::shared_ptr<boost::asio::ssl::context> tls_context,
             std::shared_ptr<PendingBudget> budget);

  // `asking`: ASKING is written first (its bytes are not part of `size`).
  template <typename AppendFn>
  void Enqueue(size_t size, AppendFn&& append, Callback cb, std::chrono::milliseconds timeout,
               bool asking = false);
  void FailSoon(Callback cb, Status status);

  // All below run on strand_.
  void StartConnect();
  void OnTcpConnected(const std::shared_ptr<Session>& session);
  void OnConnected(const std::shared_ptr<Session>& session);
  void StartRead(const std::shared_ptr<Session>& session);
  void OnRead(const std::shared_ptr<Session>& session, size_t bytes);
  void Flush();
  void ArmDeadlineTimer();
  void OnDeadlineTimer();
  void FailConnection(const Status& status);
  void ScheduleReconnect();
  void RunCompletions();

  const Options options_;
  const std::string describe_;  // "redis redis://127.0.0.1:6379", for messages
  const std::shared_ptr<boost::asio::ssl::context> tls_context_;
  const std::shared_ptr<PendingBudget> budget_;
  boost::asio::any_io_executor executor_;
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  std::atomic<bool> connected_{false};

  Mutex mu_;
  State state_ RL_GUARDED_BY(mu_) = State::kConnecting;
  bool first_connect_ RL_GUARDED_BY(mu_) = true;
  std::string out_ RL_GUARDED_BY(mu_);           // bytes of the unsent calls
  std::deque<Call> pending_ RL_GUARDED_BY(mu_);  // sent calls, then unsent calls
  size_t unsent_ RL_GUARDED_BY(mu_) = 0;         // calls at the back of pending_ in out_
  bool flush_posted_ RL_GUARDED_BY(mu_) = false;
  bool writing_ RL_GUARDED_BY(mu_) = false;
  Clock::time_point timer_at_ RL_GUARDED_BY(mu_) = Clock::time_point::max();
  std::string last_error_ RL_GUARDED_BY(mu_) = "not connected yet";
  std::shared_ptr<const PushHandler> on_push_ RL_GUARDED_BY(mu_);

  // Strand-only state.
  std::shared_ptr<Session> session_;
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer deadline_timer_;
  boost::asio::steady_timer connect_timer_;  // connect timeout, then reconnect backoff
  std::chrono::milliseconds backoff_;
  Clock::time_point next_readonly_reconnect_{};  // Options::reconnect_on_readonly
  std::vector<Reply> replies_;
  std::vector<Completion> completions_;
  std::vector<Reply> pushes_;
};

}  // namespace ratelimit::redis
