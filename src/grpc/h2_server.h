// H2Server: the gRPC server under ratelimitd's gRPC face. HTTP/2 comes from
// nghttp2 (framing, HPACK, flow control, stream limits: the codec Envoy's own
// gRPC client uses); over it, gRPC's wire format (a length-prefixed message
// each way, `grpc-status` in the trailers, `grpc-timeout`), for unary and
// server-streaming methods. Connections run on the io_context the owner
// gives, each on a strand; a handler runs on its connection's strand and may
// answer inline (no thread hop: a memory-store decision is answered within
// the read that brought it) or later from any thread. Answers given together
// leave in one write: those of one read's dispatch, those queued on the
// strand at once, and those given within a core::CompletionBatch on the
// connection's thread (a Redis reply that answers a batch of calls).
//
// Why not gRPC C++: its server moves every call across threads (poller,
// executor, the callback's thread, the writer): on 2 cores it took a
// trivial service 0.3 ms at the median and several at p99 even when nearly
// idle, and its CPU per call set the face's ceiling (docs/envoy.md,
// docs/performance.md row 8).
//
//   net::io_context ioc;
//   H2Server server(ioc, {});
//   server.Handle("/pkg.Service/Method", [](GrpcCall call) {
//     call.Reply(Answer(call.request()));  // or call.Finish(GrpcCode::kInvalidArgument, "why")
//   });
//   if (Status s = server.Listen({net::ip::make_address("127.0.0.1"), 0}); !s.ok()) ...
//   ... threads run ioc ...
//   server.Shutdown(std::chrono::seconds(5));  // GOAWAY; in-flight calls finish
//
// What it does not do: TLS (Envoy talks to its rate limit service in plain
// text inside the mesh, or through a sidecar), compression (it answers
// UNIMPLEMENTED with `grpc-accept-encoding: identity`, as gRPC's spec asks;
// Envoy's client does not compress), client streaming.
//
// Thread-safety: Handle before Listen; Listen, Shutdown and the destructor
// from one thread, not one of the io_context's (unless Stop came first).
// GrpcCall is a handle that any thread may use, once per answer
// (Finish/Reply at most once).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ratelimit/status.h"

#include <boost/asio/ip/tcp.hpp>

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ratelimit::grpcface {

// gRPC status codes (grpc/include/grpc/impl/codegen/status.h), those we send.
enum class GrpcCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kResourceExhausted = 8,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

struct H2ServerOptions {
  // A request message larger than this is refused (RESOURCE_EXHAUSTED):
  // gRPC's default receive limit.
  size_t max_message_bytes = 4 << 20;
  // SETTINGS_MAX_CONCURRENT_STREAMS: calls one connection may have open.
  uint32_t max_concurrent_streams = 1024;
  // Request bytes one connection may hold for requests not yet handed to
  // their handler (incomplete, or complete and waiting for room among the
  // answers: max_unsent_answer_bytes), never less than one message of
  // max_message_bytes: the stream whose bytes would pass it is refused
  // (RESOURCE_EXHAUSTED) and what it held is freed. Without it a client
  // could pin max_concurrent_streams messages of max_message_bytes (4 GiB)
  // per connection by never ending its requests. A request's bytes are
  // freed once its handler has it (GrpcCall::request).
  size_t max_pending_request_bytes = 8 << 20;
  // Answer bytes one connection may hold unsent: written to a socket that
  // did not take them yet, or waiting for the client's HTTP/2 flow-control
  // window. While its socket holds more, the connection is not read (a
  // client that sends without reading is held back by TCP); while its
  // answers do, complete requests wait (counted in
  // max_pending_request_bytes, reset after request_timeout) instead of
  // going to their handler: a client that grants no window (an
  // INITIAL_WINDOW_SIZE of 0, no WINDOW_UPDATE) cannot pile up answers.
  size_t max_unsent_answer_bytes = 1 << 20;
  // A request still incomplete this long after its headers arrived has its
  // stream reset (RST_STREAM CANCEL) and its bytes freed: a request that
  // stops half-way would otherwise hold them as long as its connection.
  std::chrono::milliseconds request_timeout{10'000};
  // A request's headers larger than this reset its stream.
  size_t max_header_bytes = 16 << 10;
  // Connections past this many are closed as they are accepted.
  size_t max_connections = 10'000;
  // A connection that has not sent HTTP/2's preface and SETTINGS by then is
  // closed.
  std::chrono::milliseconds handshake_timeout{10'000};
  // A connection whose answers have waited this long for the socket (the
  // client stopped reading and the socket's buffers are full) is closed:
  // otherwise it would keep its place among max_connections and up to
  // max_unsent_answer_bytes of answers for as long as the client likes. A
  // stream whose answer has moved no byte this long (the client's
  // flow-control window stays shut) is reset (RST_STREAM CANCEL), and its
  // answer freed: otherwise it would stay open, and keep its slot among
  // max_concurrent_streams, for as long as the connection.
  std::chrono::milliseconds write_timeout{10'000};
  // A connection with no open stream this long is drained as Drain does it
  // (GOAWAY in two steps) and closes: a client that connects and then sends
  // nothing would otherwise keep its place among max_connections for good.
  // 0: never. (Envoy reconnects when it needs the connection again.)
  std::chrono::milliseconds idle_timeout{300'000};
};

class H2Server;

// One call: the request message and the way to answer it. Copyable; every
// copy is the same call.
class GrpcCall {
 public:
  // The request message (without gRPC's 5-byte prefix). Valid during the
  // handler's call only: its bytes are freed when the handler returns (a
  // call answered later keeps no request body); empty afterwards.
  std::string_view request() const;
  // From `grpc-timeout` (time_point::max() when none).
  std::chrono::steady_clock::time_point deadline() const;

  // Unary: the answer and status OK, in one step.
  void Reply(std::string message) const;
  // Server streaming: one more message.
  void Write(std::string message) const;
  // Ends the call with `code` (and `message` as grpc-message). An answer
  // after the deadline becomes DEADLINE_EXCEEDED; one to a call the client
  // has cancelled, or on a closed connection, is dropped.
  void Finish(GrpcCode code, std::string message = {}) const;
  // `fn` runs once on the connection's strand when the stream closes: its
  // answer has left, the client reset it, or the connection closed (at once
  // if that happened already). An owner that keeps calls (health Watch)
  // forgets them here; otherwise they would hold their connection.
  void OnClosed(std::function<void()> fn) const;

  struct Stream;
  struct Conn;
  GrpcCall(std::shared_ptr<Conn> conn, std::shared_ptr<Stream> stream);

 private:
  std::shared_ptr<Conn> conn_;
  std::shared_ptr<Stream> stream_;
};

using GrpcHandler = std::function<void(GrpcCall)>;

class H2Server {
 public:
  H2Server(boost::asio::io_context& ioc, H2ServerOptions options);
  ~H2Server();
  H2Server(const H2Server&) = delete;
  H2Server& operator=(const H2Server&) = delete;

  // `path` is "/<package>.<Service>/<Method>". Before Listen.
  void Handle(std::string path, GrpcHandler handler);
  // Binds `endpoint` (port 0: any free port) and starts accepting. The
  // daemon resolves its setting with server::ResolveListenAddress.
  Status Listen(const boost::asio::ip::tcp::endpoint& endpoint);
  int port() const { return port_; }
  // Serves a connection the owner has at hand as Listen's acceptor serves
  // each one it accepts (max_connections too), on the socket's executor (a
  // strand, when the io_context runs on several threads): the fuzz target's
  // in-process connection (fuzz/grpc_fuzzer.cc). Any thread.
  void Serve(boost::asio::ip::tcp::socket socket);
  // Open connections.
  size_t connections() const;
  // Writes to the connections' sockets so far (each Flush that had bytes).
  uint64_t socket_writes() const;

  // Stops accepting and sends GOAWAY on every connection, in RFC 9113's two
  // steps (a notice, and the final GOAWAY a round trip or at most 1 s
  // later: the calls the client sent meanwhile are taken): the calls in
  // flight finish, a connection closes when it has none. Does not block; any
  // thread (an io_context thread too); idempotent.
  void Drain();
  // Drain, then waits for the connections to close; closes what is left
  // after `grace`. Blocks; not from an io_context thread, and the io_context
  // must be running. Idempotent.
  void Shutdown(std::chrono::milliseconds grace);
  // Closes every connection on its strand (calls in flight are dropped).
  // Does not block; any thread; a drain's last step after its grace.
  void CloseAll();
  // Drain and CloseAll, without waiting: for an owner that drains on its
  // io_context (ratelimitd's Server), and may call this after that stopped
  // (what is left closes when the io_context is destroyed). Afterwards
  // Shutdown and the destructor do not wait. Idempotent.
  void Stop();

  struct Shared;

 private:
  boost::asio::io_context* ioc_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<void> acceptor_;
  int port_ = 0;
  bool shut_down_ = false;
  // Drain's hand-offs to the connections' strands.
  void EachConnection(const std::function<void(GrpcCall::Conn&)>& fn);
};

// The value of a `grpc-timeout` header ("<1-8 digits><H|M|S|m|u|n>"), or -1
// when it is malformed.
std::chrono::nanoseconds ParseGrpcTimeout(std::string_view value);

}  // namespace ratelimit::grpcface
