// Session: one client connection. Reads a request, hands it to its
// RequestHandler (the Router), writes the Reply, and loops while keep-alive.
// Reads top to bottom:
//
//   WaitForRequest (idle_timeout) -> ReadHeader (read_timeout) -> ReadHead
//   (piece by piece, max_header_bytes in all) -> [100 Continue]
//   -> ReadBody (same deadline, piece by piece, body limit; framing and
//   trailer within max_header_bytes more) -> Handle
//   -> Write -> WaitForRequest ...
//
// A reply with a body_stream (the gateway's) is written as its header, then
// one piece at a time as the source delivers it: Content-Length when the
// source knows it, else chunked (HTTP/1.1) or ended by closing (HTTP/1.0).
//
// Every read is bounded: too-large headers answer 431, a too-large body 413,
// any other parse error 400 (also a Transfer-Encoding not ending in chunked,
// and trailer fields, which Beast would merge into the header fields); each
// of these then closes the connection. A
// client silent for idle_timeout between requests, or slower than
// read_timeout for one request, is disconnected (the read_timeout deadline is
// set once per request: trickled bytes do not extend it). With
// max_requests_per_second set, a connection that sends requests faster has
// its next request read later (pipelined requests wait; none is dropped).
//
// The handler may answer on any thread; the answer is posted back to the
// session's executor before writing. Sessions register with the
// SessionRegistry so the server can count them (max connections) and drain
// them.
//
// Thread-safety: all work of a session runs on its executor: a strand of its
// own, or, when the server has one I/O thread, the io_context's executor.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "policy/ip.h"
#include "ratelimit/thread_annotations.h"
#include "server/hold.h"
#include "server/http.h"
#include "server/lazy_deadline.h"
#include "server/reply.h"
#include "server/request_handler.h"

namespace ratelimit::server {

class Session;

struct SessionLimits {
  size_t max_header_bytes = 8 * 1024;
  size_t max_body_bytes = 64 * 1024;
  std::chrono::milliseconds read_timeout{10'000};
  std::chrono::milliseconds idle_timeout{60'000};
  int64_t max_requests_per_second = 0;  // per connection; 0 = no cap
};

// Every live session, for max_connections and for draining.
class SessionRegistry {
 public:
  size_t size() const {
    LockGuard lock(mu_);
    return sessions_.size();
  }
  void Add(Session* s, std::weak_ptr<Session> w) {
    LockGuard lock(mu_);
    sessions_.emplace(s, std::move(w));
  }
  void Remove(Session* s) {
    LockGuard lock(mu_);
    sessions_.erase(s);
  }
  std::vector<std::shared_ptr<Session>> Snapshot() const;

  std::atomic<bool> draining{false};

 private:
  mutable Mutex mu_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_ RL_GUARDED_BY(mu_);
};

class Session : public std::enable_shared_from_this<Session>, public Holder {
 public:
  Session(tcp::socket&& socket, RequestHandler& handler, const SessionLimits& limits,
          SessionRegistry& registry);
  ~Session() override;

  // `slot` is held until the session ends (the listener's per-address count);
  // `paced`: max_requests_per_second applies (false for trusted proxies).
  void Start(std::shared_ptr<void> slot, bool paced);
  const policy::IpAddress& peer() const { return peer_; }
  // Drain: closes the connection now if no request is in progress, else
  // after the current answer is written.
  void Shutdown();

  // Holder: the delay of a shaped request (see hold.h). While held, the
  // request has been read whole and nothing is being written, so the socket
  // is idle: a wait for readability there sees the client leave.
  void Hold(std::chrono::steady_clock::time_point until, std::function<void(bool)> then) override;

 private:
  void WaitForRequest();
  // False if the request rate cap says wait: then WaitForRequest runs again later.
  bool Pace();
  void ReadHeader();
  void ReadHead();
  void OnHeader(beast::error_code ec);
  // Whether the bytes the parser holds back in a chunked body (framing: a
  // chunk line, the trailer) have an LF without its CR.
  bool HeldFramingHasBareLf() const;
  void ReadBody();
  void OnBody();
  size_t FieldCount() const;  // the request's header fields (and trailer, once read)
  void Handle();
  void Write(Reply&& reply);
  // Writes a reply whose body comes from reply.body_stream, piece by piece.
  void WriteStreamed(Reply&& reply, unsigned version, bool close);
  void StreamNext(bool close);
  void EndStreamed(bool close, beast::error_code ec);
  void OnWrite(bool close, beast::error_code ec);
  void FailRequest(beast::error_code ec);
  // Answers `status` with a problem naming the request's path, then closes.
  void Refuse(unsigned status, std::string_view detail);
  // After a refusal: the sending side closed, what the client still sends
  // read and dropped for a while, then Close (see session.cc).
  void Linger();
  void LingerRead();
  void Close();
  void WatchPeer(uint64_t hold);
  void EndHold(uint64_t hold, bool client_alive);
  void SetDeadline(std::chrono::milliseconds d) { deadline_.ExpiresAfter(d, *this); }

  tcp::socket socket_;
  // The deadline of the current read or write: past it, the connection is
  // closed (its pending operation then fails).
  LazyDeadline<Session> deadline_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string out_;  // the answer being written (not streamed), kept across requests
  // A streamed reply (gateway): its header, serializer and source.
  std::optional<http::response<http::buffer_body>> streamed_;
  std::optional<http::response_serializer<http::buffer_body>> serializer_;
  std::shared_ptr<BodyStream> body_stream_;
  http::response<http::empty_body> continue_;
  RequestHandler& handler_;
  const SessionLimits limits_;
  SessionRegistry& registry_;
  policy::IpAddress peer_;
  std::string peer_text_;
  size_t head_bytes_ = 0;   // bytes of the current head the parser has taken
  size_t body_bytes_ = 0;   // and of its body, framing included
  size_t head_fields_ = 0;  // a chunked request's header fields, before its trailer
  bool linger_ = false;     // the answer is a refusal: Linger before closing
  size_t lingered_ = 0;     // bytes dropped while lingering
  std::chrono::steady_clock::time_point request_started_{};  // its first bytes read (stage timing)
  std::shared_ptr<void> slot_;
  net::steady_timer pace_timer_;
  bool paced_ = false;
  double tokens_ = 0;  // requests this connection may start now (max_requests_per_second)
  std::chrono::steady_clock::time_point tokens_at_{};
  bool busy_ = false;  // a request is being handled or answered
  bool closed_ = false;
  net::steady_timer hold_timer_;
  std::function<void(bool)> hold_then_;  // set while a request is held
  uint64_t hold_id_ = 0;                 // tells a stale timer or wait from the current hold
};

}  // namespace ratelimit::server
