#include "server/session.h"

#include <sys/socket.h>

#include <algorithm>
#include <iterator>

#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/string.hpp>
#include <cerrno>

#include "core/ascii.h"
#include "core/steady_clock.h"
#include "server/metrics.h"
#include "server/problem.h"

namespace ratelimit::server {

using namespace std::string_view_literals;  // "\r\n"sv: appended with its length

std::vector<std::shared_ptr<Session>> SessionRegistry::Snapshot() const {
  std::vector<std::shared_ptr<Session>> out;
  LockGuard lock(mu_);
  out.reserve(sessions_.size());
  for (const auto& [ptr, weak] : sessions_) {
    if (auto s = weak.lock()) out.push_back(std::move(s));
  }
  return out;
}

namespace {

// The status line's reason phrase: the problem title's name (RFC 9110's,
// "413 Content Too Large") where there is one, so the two always agree;
// Beast's phrase for the rest (an upstream's 418).
std::string_view ReasonPhrase(unsigned status) {
  const std::string_view title = StatusTitle(status);
  return title != StatusTitle(0) ? title : http::obsolete_reason(http::int_to_status(status));
}

// Whether a request's Transfer-Encoding fields, together, list exactly one
// coding, chunked (empty list elements aside: RFC 9110 5.6.1).
bool OnlyChunked(const Request& req) {
  int codings = 0;
  bool other = false;
  for (auto it = req.find(http::field::transfer_encoding);
       it != req.end() && it->name() == http::field::transfer_encoding; ++it) {
    std::string_view v = it->value();
    while (!v.empty()) {
      const size_t comma = v.find(',');
      const std::string_view coding = core::Trim(v.substr(0, comma));
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      if (coding.empty()) continue;
      ++codings;
      other = other || !core::EqualsIgnoreCase(coding, "chunked");
    }
  }
  return codings == 1 && !other;
}

policy::IpAddress ToIp(const net::ip::address& a) {
  if (a.is_v4()) return policy::IpAddress::FromV4(a.to_v4().to_uint());
  return policy::IpAddress::FromV6(a.to_v6().to_bytes());
}

}  // namespace

Session::Session(tcp::socket&& socket, RequestHandler& handler, const SessionLimits& limits,
                 SessionRegistry& registry)
    : socket_(std::move(socket)),
      deadline_(socket_.get_executor(), &Session::Close),
      handler_(handler),
      limits_(limits),
      registry_(registry),
      pace_timer_(socket_.get_executor()),
      hold_timer_(socket_.get_executor()) {
  beast::error_code ec;
  tcp::endpoint ep = socket_.remote_endpoint(ec);
  if (!ec) {
    net::ip::address a = ep.address();
    if (a.is_v6() && a.to_v6().is_v4_mapped()) {
      a = net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6());
    }
    peer_ = ToIp(a);
    peer_text_ = a.to_string();
  }
  continue_.version(11);
  continue_.result(http::status::continue_);
}

Session::~Session() { registry_.Remove(this); }

void Session::Start(std::shared_ptr<void> slot, bool paced) {
  slot_ = std::move(slot);
  paced_ = paced && limits_.max_requests_per_second > 0;
  tokens_ = static_cast<double>(limits_.max_requests_per_second);
  tokens_at_ = core::SteadyClock::now();
  registry_.Add(this, weak_from_this());
  // Start on the strand: the acceptor's thread must not touch the session.
  net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->WaitForRequest(); });
}

void Session::Shutdown() {
  net::post(socket_.get_executor(), [self = shared_from_this()] {
    if (!self->busy_) self->Close();
  });
}

void Session::WaitForRequest() {
  if (closed_) return;
  if (registry_.draining.load(std::memory_order_relaxed)) return Close();
  if (!Pace()) return;
  if (buffer_.size() > 0) return ReadHeader();  // a pipelined request is already here
  // Between requests: wait up to idle_timeout for the first byte.
  SetDeadline(limits_.idle_timeout);
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (ec) return self->Close();
                            self->buffer_.commit(n);
                            self->ReadHeader();
                          });
}

bool Session::Pace() {
  if (!paced_) return true;
  const double rate = static_cast<double>(limits_.max_requests_per_second);
  const auto now = core::SteadyClock::now();
  tokens_ =
      std::min(rate, tokens_ + rate * std::chrono::duration<double>(now - tokens_at_).count());
  tokens_at_ = now;
  if (tokens_ >= 1) {
    tokens_ -= 1;
    return true;
  }
  // Too fast: read nothing until one more request is allowed (at most 1/rate
  // seconds). The client's bytes wait in the socket: TCP backpressure.
  Metrics::Global().paced.Inc();
  const auto wait = std::chrono::duration<double>((1 - tokens_) / rate);
  pace_timer_.expires_after(std::chrono::ceil<std::chrono::microseconds>(wait));
  pace_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec) return self->Close();
    self->WaitForRequest();
  });
  return false;
}

void Session::ReadHeader() {
  request_started_ = core::SteadyClock::now();  // its first bytes are in buffer_
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
  parser_->body_limit(limits_.max_body_bytes);
  // One deadline for the whole request, header and body.
  SetDeadline(limits_.read_timeout);
  head_bytes_ = 0;
  ReadHead();
}

// Beast 1.74's parser hands over each complete header field as it arrives
// and applies header_limit only to what it has not taken yet: a head sent in
// pieces would pass any limit and grow without bound (http::async_read_some
// and async_read_header both loop inside until the head is complete). So the
// session feeds the parser itself, and before each piece lowers the limit by
// what the parser already took. Parsing as bytes arrive keeps garbage a
// prompt 400.
void Session::ReadHead() {
  const size_t max = limits_.max_header_bytes;
  while (buffer_.size() > 0) {
    beast::error_code ec;
    const size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    head_bytes_ += used;
    if (!ec && parser_->is_header_done()) return OnHeader(ec);
    if (ec && ec != http::error::need_more) return FailRequest(ec);
    if (head_bytes_ >= max) return FailRequest(http::error::header_limit);
    parser_->header_limit(static_cast<std::uint32_t>(max - head_bytes_));
    if (ec == http::error::need_more || used == 0) break;
  }
  socket_.async_read_some(buffer_.prepare(4096),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (ec) return self->FailRequest(ec);
                            self->buffer_.commit(n);
                            self->ReadHead();
                          });
}

void Session::OnHeader(beast::error_code ec) {
  if (ec) return FailRequest(ec);
  // RFC 9112 6.3: a request's Transfer-Encoding must end in chunked, else its
  // length cannot be known. Beast reads such a request as bodyless, so its
  // body would be parsed as the next request (smuggled past whatever sits in
  // front of ratelimitd): refused, and the connection closed.
  if (!parser_->chunked() && parser_->get().count(http::field::transfer_encoding) > 0) {
    return Refuse(400, "malformed HTTP request: Transfer-Encoding does not end in chunked");
  }
  // RFC 9112 6.1: a transfer coding the server does not implement is a 501.
  // The session decodes chunked only: another coding before it ("gzip,
  // chunked", or gzip and chunked in two fields) would otherwise be dropped
  // silently (the gateway forwards the body re-framed, without the field).
  if (parser_->chunked() && !OnlyChunked(parser_->get())) {
    return Refuse(501, "Transfer-Encoding other than chunked is not implemented");
  }
  // RFC 9112 3.2: an HTTP/1.1 request has exactly one Host field, and no
  // request has two. Which one a proxy or an upstream would pick is anyone's
  // guess (the gateway forwards the fields as they came).
  if (const size_t hosts = parser_->get().count(http::field::host);
      hosts > 1 || (hosts == 0 && parser_->get().version() >= 11)) {
    return Refuse(400, hosts > 1 ? "malformed HTTP request: more than one Host field"
                                 : "malformed HTTP request: HTTP/1.1 request without Host");
  }
  if (parser_->is_done()) return Handle();
  body_bytes_ = 0;
  if (parser_->chunked()) head_fields_ = FieldCount();
  parser_->eager(true);  // the whole body in one put() where it has arrived
  const auto expect = parser_->get()[http::field::expect];
  // RFC 9110 10.1.1: an HTTP/1.0 client knows no interim answers; its
  // expectation is ignored.
  if (parser_->get().version() >= 11 && core::EqualsIgnoreCase(expect, "100-continue")) {
    http::async_write(socket_, continue_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Close();
                        self->ReadBody();
                      });
    return;
  }
  ReadBody();
}

// Beast's body limit counts chunk data only, and a chunk line (an endless
// chunk extension) or a trailer section stays in the buffer, unparsed, until
// its end arrives: left to http::async_read, a client could grow the buffer
// for the whole read_timeout. So, as for the head, the session feeds the
// parser itself and bounds the body's bytes on the wire, framing included:
// those the parser took and those it holds back (all of this request's: the
// parser stops short of the next one only once this one is done). Framing
// and trailer get a head's allowance on top of the body limit. A small body
// usually arrives with its head and is taken from the buffer at once.
void Session::ReadBody() {
  const size_t max = limits_.max_body_bytes + limits_.max_header_bytes;
  while (buffer_.size() > 0 && !parser_->is_done()) {
    beast::error_code ec;
    const size_t used = parser_->put(buffer_.data(), ec);
    buffer_.consume(used);
    body_bytes_ += used;
    if (ec && ec != http::error::need_more) return FailRequest(ec);
    if (ec || used == 0) break;
  }
  if (parser_->is_done()) return OnBody();
  // Beast looks for CRLF only: a chunk line or trailer ending in a bare LF
  // would be waited on until the read timeout. What the parser holds back
  // here is framing (it takes chunk data as it arrives), where no LF may
  // stand without its CR: a prompt 400, as for the head.
  if (parser_->chunked() && HeldFramingHasBareLf()) {
    return Refuse(400, "malformed HTTP request: a chunk line ends in a bare LF");
  }
  const size_t held = body_bytes_ + buffer_.size();
  if (held > max) {
    return Refuse(
        413, "request body with its chunked framing exceeds " + std::to_string(max) + " bytes");
  }
  // At most one byte past the bound: the buffer never grows beyond it.
  const size_t want = std::min(beast::read_size(buffer_, 64 * 1024), max + 1 - held);
  socket_.async_read_some(buffer_.prepare(want),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (ec) return self->FailRequest(ec);
                            self->buffer_.commit(n);
                            self->ReadBody();
                          });
}

bool Session::HeldFramingHasBareLf() const {
  const auto* data = static_cast<const char*>(buffer_.data().data());
  const std::string_view held(data, buffer_.size());
  for (size_t lf = held.find('\n'); lf != std::string_view::npos; lf = held.find('\n', lf + 1)) {
    // At 0, its CR would have been taken without it: Beast takes a CRLF whole.
    if (lf == 0 || held[lf - 1] != '\r') return true;
  }
  return false;
}

size_t Session::FieldCount() const {
  const auto& fields = parser_->get().base();
  return static_cast<size_t>(std::distance(fields.begin(), fields.end()));
}

void Session::OnBody() {
  // Beast adds a chunked body's trailer fields to the request's header
  // fields, where they would pass for headers: an API key or user header the
  // rules read, a field forwarded upstream. No route expects a trailer.
  if (parser_->chunked() && FieldCount() != head_fields_) {
    return Refuse(400,
                  "malformed HTTP request: trailer fields in a chunked request are not "
                  "accepted");
  }
  Handle();
}

void Session::FailRequest(beast::error_code ec) {
  if (ec == http::error::header_limit) {
    return Refuse(431,
                  "request headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes");
  }
  if (ec == http::error::body_limit) {
    return Refuse(413, "request body exceeds " + std::to_string(limits_.max_body_bytes) + " bytes");
  }
  if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return Refuse(400, "malformed HTTP request: " + ec.message());
  }
  Close();  // timeout, reset, end of stream: nobody to answer
}

void Session::Refuse(unsigned status, std::string_view detail) {
  // The request target, once the request line has been parsed (Beast parses
  // it before the header fields): a 431 for a long field still names it.
  std::string_view instance;
  if (parser_.has_value()) {
    instance = parser_->get().target();
    instance = instance.substr(0, instance.find('?'));
  }
  Reply r = ProblemReply(status, detail, instance);
  r.close = true;
  linger_ = true;
  Write(std::move(r));
}

void Session::Handle() {
  busy_ = true;
  deadline_.Clear();  // the handler bounds its own waits (store deadline, upstream timeout)
  Metrics& m = Metrics::Global();
  m.in_flight.Add(1);
  const auto handled = core::SteadyClock::now();
  m.StageTime(Metrics::Stage::kParse).Observe(handled - request_started_);
  handler_.Handle(
      parser_->get(), peer_, peer_text_,
      [self = shared_from_this(), handled](Reply&& r) {
        Metrics& m = Metrics::Global();
        m.in_flight.Add(-1);
        const auto answered = core::SteadyClock::now();
        m.StageTime(Metrics::Stage::kHandler).Observe(answered - handled);
        net::dispatch(self->socket_.get_executor(), [self, r = std::move(r), answered]() mutable {
          Metrics::Global()
              .StageTime(Metrics::Stage::kDispatch)
              .Observe(core::SteadyClock::now() - answered);
          self->Write(std::move(r));
        });
      },
      this);  // the callback above keeps the session alive for as long as a hold
}

void Session::Hold(std::chrono::steady_clock::time_point until, std::function<void(bool)> then) {
  net::dispatch(socket_.get_executor(),
                [self = shared_from_this(), until, then = std::move(then)]() mutable {
                  const uint64_t id = ++self->hold_id_;
                  self->hold_then_ = std::move(then);
                  if (self->closed_) return self->EndHold(id, false);
                  self->hold_timer_.expires_at(until);
                  self->hold_timer_.async_wait([self, id](beast::error_code ec) {
                    if (ec != net::error::operation_aborted) self->EndHold(id, true);
                  });
                  self->WatchPeer(id);
                });
}

// Detecting the client leaving: a pending wait for readability rather than a
// read (a read would take bytes of a pipelined next request away from the
// parser's buffer, and Beast allows one read at a time) or a check at wake-up
// only (the place would stay taken for the whole delay). Readable then means
// EOF or an error, or the next pipelined request: recv(MSG_PEEK) tells which.
void Session::WatchPeer(uint64_t hold) {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this(),
                                              hold](beast::error_code ec) {
    if (hold != self->hold_id_ || !self->hold_then_ || ec == net::error::operation_aborted) return;
    if (!ec) {
      char byte;
      const ssize_t n = ::recv(self->socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      // Bytes of a pipelined request: the client is there. Stop watching (a
      // readable socket would wake us at once, again and again); the parser
      // reads them after the answer.
      if (n > 0) return;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return self->WatchPeer(hold);
      }
    }
    self->hold_timer_.cancel();
    self->EndHold(hold, false);
  });
}

void Session::EndHold(uint64_t hold, bool client_alive) {
  if (hold != hold_id_ || !hold_then_) return;
  auto then = std::move(hold_then_);
  hold_then_ = nullptr;
  if (client_alive) {
    // Ends the readability wait; no Beast operation is pending while held.
    beast::error_code ignored;
    socket_.cancel(ignored);
  } else {
    Close();
  }
  then(client_alive);
}

void Session::Write(Reply&& reply) {
  busy_ = true;
  const bool have_request = parser_.has_value() && parser_->is_header_done();
  const bool head = have_request && parser_->get().method() == http::verb::head;
  const unsigned version = have_request && parser_->get().version() == 10 ? 10 : 11;
  const bool draining = registry_.draining.load(std::memory_order_relaxed);
  const bool close = reply.close || draining || !have_request || !parser_->get().keep_alive();
  if (reply.body_stream != nullptr && !head) {
    return WriteStreamed(std::move(reply), version, close);
  }
  // The whole answer in one buffer, written with one call (Beast's serializer
  // would write the head's pieces and the body as a chain of buffers).
  const bool no_body = reply.status < 200 || reply.status == 204 || reply.status == 304;
  // (HEAD through the gateway keeps the upstream's Content-Length, no body.)
  const bool has_length = !reply.keep_content_length && !no_body;
  const Decimal status(reply.status), length(reply.body.size());
  RenderInto(out_, [&](const auto& put) {
    put(version == 10 ? "HTTP/1.0 "sv : "HTTP/1.1 "sv);
    put(status.view());
    put(" "sv);
    put(ReasonPhrase(reply.status));
    put("\r\n"sv);
    for (const auto& [name, value] : reply.headers) PutField(put, name, value);  // repeats kept
    if (!reply.content_type.empty()) PutField(put, "Content-Type"sv, reply.content_type);
    // HTTP/1.1 keeps the connection unless told; HTTP/1.0 closes it unless told.
    if (close && version == 11) PutField(put, "Connection"sv, "close"sv);
    if (!close && version == 10) PutField(put, "Connection"sv, "keep-alive"sv);
    if (has_length) PutField(put, "Content-Length"sv, length.view());
    put("\r\n"sv);
    if (!head && !no_body) put(reply.body);
  });
  SetDeadline(limits_.read_timeout);
  net::async_write(socket_, net::buffer(out_),
                   [self = shared_from_this(), close, started = core::SteadyClock::now()](
                       beast::error_code ec, size_t) {
                     Metrics::Global()
                         .StageTime(Metrics::Stage::kWrite)
                         .Observe(core::SteadyClock::now() - started);
                     self->OnWrite(close, ec);
                   });
}

void Session::WriteStreamed(Reply&& reply, unsigned version, bool close) {
  streamed_.emplace();
  auto& res = *streamed_;
  res.result(reply.status);
  res.reason(ReasonPhrase(reply.status));
  res.version(version);
  for (auto& [name, value] : reply.headers) res.insert(name, value);  // repeats kept
  if (!reply.content_type.empty()) res.set(http::field::content_type, reply.content_type);
  body_stream_ = std::move(reply.body_stream);
  if (std::optional<uint64_t> n = body_stream_->content_length()) {
    res.content_length(*n);
  } else if (version == 11) {
    res.chunked(true);
  } else {
    close = true;  // HTTP/1.0 without a length: the end of the body is the end of the connection
  }
  res.keep_alive(!close);
  res.body().data = nullptr;
  res.body().more = true;
  serializer_.emplace(res);
  SetDeadline(limits_.read_timeout);
  http::async_write_header(socket_, *serializer_,
                           [self = shared_from_this(), close](beast::error_code ec, size_t) {
                             if (ec) return self->EndStreamed(true, ec);
                             self->StreamNext(close);
                           });
}

void Session::StreamNext(bool close) {
  body_stream_->Next(
      [self = shared_from_this(), close](bool ok, std::string_view piece, bool last) {
        net::dispatch(self->socket_.get_executor(), [self, close, ok, piece, last] {
          // The source failed mid-body: the status is sent, so the only honest
          // signal left is to cut the connection (the client sees a short body).
          if (!ok) return self->EndStreamed(true, {});
          if (piece.empty() && !last) return self->StreamNext(close);
          auto& body = self->streamed_->body();
          body.data = piece.empty() ? nullptr : const_cast<char*>(piece.data());
          body.size = piece.size();
          body.more = !last;
          self->SetDeadline(self->limits_.read_timeout);
          http::async_write(self->socket_, *self->serializer_,
                            [self, close, last](beast::error_code ec, size_t) {
                              if (ec == http::error::need_buffer) ec = {};  // piece written
                              if (ec) return self->EndStreamed(true, ec);
                              if (last) {
                                self->body_stream_->Delivered();  // metered costs settle here
                                return self->EndStreamed(close, {});
                              }
                              self->StreamNext(close);
                            });
        });
      });
}

void Session::EndStreamed(bool close, beast::error_code ec) {
  serializer_.reset();
  streamed_.reset();
  body_stream_.reset();  // an unfinished upstream exchange closes its connection
  OnWrite(close, ec);
}

void Session::OnWrite(bool close, beast::error_code ec) {
  busy_ = false;
  if (ec) return Close();
  if (close) return linger_ ? Linger() : Close();
  parser_.reset();
  WaitForRequest();
}

// A refused request may not have been read to its end (a 413 upload the
// client is still sending). Closing a socket with unread bytes makes the
// kernel send a reset instead of a FIN, and a reset can destroy the answer
// before the client has read it (RFC 9112 9.6). So the session closes its
// sending side (the client sees the answer end), then reads and drops what
// still comes, up to kLingerBytes or for kLingerTime, and only then closes,
// as nginx's lingering_close does.
namespace {
constexpr std::chrono::milliseconds kLingerTime{2000};
constexpr size_t kLingerBytes = 1 << 20;
}  // namespace

void Session::Linger() {
  if (closed_) return;
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return Close();
  buffer_.clear();
  SetDeadline(kLingerTime);  // then Close
  LingerRead();
}

void Session::LingerRead() {
  socket_.async_read_some(buffer_.prepare(16 << 10),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->lingered_ += n;
                            if (ec || self->lingered_ > kLingerBytes) return self->Close();
                            self->LingerRead();  // what came is dropped: never committed
                          });
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  pace_timer_.cancel();
  deadline_.Cancel();
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  socket_.close(ec);
}

}  // namespace ratelimit::server
