// Gateway: forwards allowed requests to the upstream HTTP/1.1 server.
//
//   StatusOr<std::unique_ptr<Gateway>> g = Gateway::Create(ioc, "http://127.0.0.1:9000", opts);
//   (*g)->Forward(request, "203.0.113.7", [](Reply r) { ... });
//
// Keeps a bounded pool of idle keep-alive connections (max_idle); at most
// max_active upstream connections at once (beyond: 503). Responses are
// streamed: `done` gets the status and headers as soon as they arrive, with
// Reply::body_stream pulling the body piece by piece (64 KiB at a time, any
// length, chunked or close-delimited upstream bodies re-framed for the
// client). Request bodies are forwarded whole, within the server's body limit
// (like nginx's default proxy_request_buffering). Hop-by-hop headers
// (Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade
// and every header named in Connection) are removed both ways, and Expect
// is not forwarded (the session has answered 100-continue and holds the
// body); the peer's address is appended to X-Forwarded-For; Host is passed
// unchanged. Interim (1xx) responses are dropped; a 101 is a 502.
// Upstream refused/reset/garbled -> 502; no answer within `timeout` -> 504.
// A request that fails on a reused idle connection before any byte of the
// answer arrived is retried once on a new connection (the upstream closed the
// idle connection first). A connection is pooled only when nothing is left
// unread after its answer, and while it is idle a read wait watches it (as
// nginx's keepalive module does): a byte or the upstream's close meanwhile
// drops it from the pool, so that bytes the upstream sent beyond an answer (a
// body after a HEAD answer, more than its Content-Length) are not read as the
// answer to the next request. Two narrow races remain (Gateway::Park): bytes
// all in the socket before the wait starts, and a wait that completes as an
// exchange takes the connection; a request that must not be sent twice peeks
// at the socket first.
//
// Thread-safety: Forward may be called from any thread; `done` runs on a
// gateway connection's executor (a strand, or the io_context's executor with
// GatewayOptions::one_thread).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ratelimit/status.h"
#include "server/http.h"
#include "server/reply.h"
#include "server/upstream_pool.h"

namespace ratelimit::server {

struct GatewayOptions {
  std::chrono::milliseconds connect_timeout{5'000};
  // Once connected: for the request and the response header, then for each
  // piece of the response body (an upstream silent this long is cut off).
  std::chrono::milliseconds timeout{10'000};
  size_t max_idle = 64;
  size_t max_active = 1024;
  // The io_context runs on one thread: upstream connections need no strand.
  bool one_thread = false;
};

// One connection to the upstream, with the lazy deadline the client sessions
// use (lazy_deadline.h: one timer for the connection, not one per operation,
// as beast::tcp_stream had). When the deadline passes, the socket is closed:
// the pending operation fails and timed_out() tells why.
//
// Thread-safety: used on its executor (a strand unless the server runs one
// thread), except that it may be created, and destroyed, anywhere: the
// socket and the timer live in a shared state the timer's handler holds, and
// the destructor closes them on the executor.
class UpstreamConnection {
 public:
  explicit UpstreamConnection(const net::any_io_executor& ex);
  ~UpstreamConnection();
  UpstreamConnection(const UpstreamConnection&) = delete;
  UpstreamConnection& operator=(const UpstreamConnection&) = delete;

  tcp::socket& socket();
  net::any_io_executor get_executor();
  // For the next operation (and any after it until the next call).
  void ExpiresAfter(std::chrono::milliseconds d);
  void ExpiresNever();
  bool timed_out() const;

 private:
  friend class Gateway;  // watches the socket while the connection is idle (Park)
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

class Gateway {
 public:
  static StatusOr<std::unique_ptr<Gateway>> Create(net::io_context& ioc, const std::string& url,
                                                   GatewayOptions options);

  void Forward(const Request& request, std::string_view peer_ip, std::function<void(Reply&&)> done);

  const std::string& url() const { return url_; }
  // Drops the idle connections (at shutdown, while the io_context exists).
  void CloseIdle();

 private:
  struct Op;
  using Pool = UpstreamPool<UpstreamConnection>;
  Gateway(net::io_context& ioc, std::string url, tcp::resolver::results_type endpoints,
          GatewayOptions options)
      : ioc_(ioc),
        url_(std::move(url)),
        endpoints_(std::move(endpoints)),
        options_(options),
        pool_(std::make_shared<Pool>(options.max_idle, options.max_active)) {}

  // Gives `c` (an answer read whole, nothing left unread; on its executor) to
  // the pool, with a read wait that drops it from there if the upstream sends
  // a byte or closes it while it is idle.
  void Park(std::unique_ptr<UpstreamConnection> c);
  // Taken from the pool (on its executor): ends the wait. False when the
  // connection turned bad while idle (the wait saw it after it was taken).
  static bool Unpark(UpstreamConnection& c);

  net::io_context& ioc_;
  const std::string url_;
  const tcp::resolver::results_type endpoints_;
  const GatewayOptions options_;
  // max_active and the idle connections. Shared: an idle connection's wait
  // holds it weakly, and may complete after the Gateway is gone.
  const std::shared_ptr<Pool> pool_;
};

}  // namespace ratelimit::server
