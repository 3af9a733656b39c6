#include "server/gateway.h"

#include <sys/socket.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/container/small_vector.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ascii.h"
#include "server/json_log.h"
#include "server/lazy_deadline.h"
#include "server/problem.h"

namespace ratelimit::server {

using namespace std::string_view_literals;  // "\r\n"sv: appended with its length

namespace {

// The fixed hop-by-hop names, by Beast's id for the field's name (it knows
// them all); the "Proxy-" ones by name.
bool IsHopByHop(http::field id, std::string_view name) {
  switch (id) {
    case http::field::connection:
    case http::field::keep_alive:
    case http::field::te:
    case http::field::trailer:
    case http::field::transfer_encoding:
    case http::field::upgrade: return true;
    default: break;
  }
  return name.size() >= 6 && (name[0] == 'p' || name[0] == 'P') &&
         EqualsIgnoreCase(name.substr(0, 6), "proxy-");
}

// Headers named in Connection ("Connection: close, X-Foo") are hop-by-hop too:
// calls `f` with each name listed in one Connection field's value.
template <typename F>
void ForEachToken(std::string_view v, F f) {
  while (!v.empty()) {
    const size_t comma = v.find(',');
    const std::string_view token = core::Trim(v.substr(0, comma));
    if (!token.empty()) f(token);
    v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
  }
}

// An upstream response's fields, as UpstreamParser keeps them: the reply's
// own type, so the head becomes the reply's headers without a copy.
using FieldList = std::vector<std::pair<std::string, std::string>>;

// Tells the hop-by-hop fields of one message (RFC 9110 section 7.6.1): the
// fixed names and the names its Connection fields list, held as views into
// the message (inline for up to four: nothing allocated for the usual
// "Connection: keep-alive"). Both directions skip them while copying.
class HopByHop {
 public:
  explicit HopByHop(const http::fields& fields) {
    for (auto it = fields.find(http::field::connection);
         it != fields.end() && it->name() == http::field::connection; ++it) {
      ForEachToken(it->value(), [this](std::string_view t) { named_.push_back(t); });
    }
  }
  HopByHop(const FieldList& fields, std::span<const http::field> ids) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (ids[i] != http::field::connection) continue;
      ForEachToken(fields[i].second, [this](std::string_view t) { named_.push_back(t); });
    }
  }
  bool operator()(http::field id, std::string_view name) const {
    if (IsHopByHop(id, name)) return true;
    for (std::string_view n : named_) {
      if (EqualsIgnoreCase(name, n)) return true;
    }
    return false;
  }

 private:
  boost::container::small_vector<std::string_view, 4> named_;
};

// The upstream's response head, parsed straight into the list the reply is
// built from: Beast's http::response_parser would first insert every field
// into an http::fields (an allocation per field) and the gateway then copied
// each one out again. The body goes where body() points, as
// http::buffer_body's reader puts it (need_buffer when that space is full).
// Fields after the head are a chunked body's trailer.
class UpstreamParser final : public http::basic_parser<false> {
 public:
  explicit UpstreamParser(size_t max_field_bytes) : left_(max_field_bytes) {
    head_.reserve(16);  // and the reply's RateLimit fields
  }

  int status() const { return status_; }
  FieldList& head() { return head_; }
  std::span<const http::field> head_ids() const {  // Beast's, per field
    return {head_ids_.data(), head_ids_.size()};
  }
  const FieldList& trailer() const { return trailer_; }
  http::buffer_body::value_type& body() { return body_; }

 private:
  void on_request_impl(http::verb, beast::string_view, beast::string_view, int,
                       beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view, int, beast::error_code&) override {
    status_ = code;
  }
  // Beast applies its header limit only to the bytes it has not handed over
  // yet (session.cc): the fields kept are bounded here.
  void on_field_impl(http::field id, beast::string_view name, beast::string_view value,
                     beast::error_code& ec) override {
    const size_t bytes = name.size() + value.size() + 4;
    if (bytes > left_) {
      ec = http::error::header_limit;
      return;
    }
    left_ -= bytes;
    if (in_head_) head_ids_.push_back(id);
    (in_head_ ? head_ : trailer_)
        .emplace_back(std::piecewise_construct, std::forward_as_tuple(name.data(), name.size()),
                      std::forward_as_tuple(value.data(), value.size()));
  }
  void on_header_impl(beast::error_code&) override { in_head_ = false; }
  void on_body_init_impl(const boost::optional<std::uint64_t>&, beast::error_code&) override {}
  size_t on_body_impl(beast::string_view s, beast::error_code& ec) override { return Put(s, ec); }
  void on_chunk_header_impl(std::uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, beast::string_view s, beast::error_code& ec) override {
    return Put(s, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  size_t Put(beast::string_view s, beast::error_code& ec) {
    if (body_.data == nullptr || body_.size == 0) {
      ec = http::error::need_buffer;
      return 0;
    }
    const size_t n = std::min(body_.size, s.size());
    std::memcpy(body_.data, s.data(), n);
    body_.data = static_cast<char*>(body_.data) + n;
    body_.size -= n;
    if (n < s.size()) ec = http::error::need_buffer;
    return n;
  }

  int status_ = 0;
  bool in_head_ = true;
  size_t left_;
  FieldList head_, trailer_;
  boost::container::small_vector<http::field, 16> head_ids_;
  http::buffer_body::value_type body_;
};

}  // namespace

StatusOr<std::unique_ptr<Gateway>> Gateway::Create(net::io_context& ioc, const std::string& url,
                                                   GatewayOptions options) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return InvalidArgument("server.upstream '" + url + "' must start with http://");
  }
  std::string hostport = url.substr(kScheme.size());
  if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
  if (hostport.find('/') != std::string::npos) {
    return InvalidArgument("server.upstream '" + url + "' must not have a path");
  }
  std::string host = hostport, port = "80";
  if (!hostport.empty() && hostport.front() == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos) return InvalidArgument("bad upstream address '" + url + "'");
    host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] == ':')
      port = hostport.substr(close + 2);
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(host, port, ec);
  if (ec || endpoints.empty()) {
    return Unavailable("cannot resolve upstream '" + url + "': " + ec.message());
  }
  return std::unique_ptr<Gateway>(new Gateway(ioc, url, std::move(endpoints), options));
}

void Gateway::CloseIdle() { pool_->CloseIdle(); }

struct UpstreamConnection::Impl : std::enable_shared_from_this<Impl> {
  explicit Impl(const net::any_io_executor& ex) : socket(ex), deadline(ex, &Impl::Expire) {}

  void Expire() {
    timed_out = true;
    beast::error_code ignored;
    socket.close(ignored);  // the pending operation fails
  }

  tcp::socket socket;
  LazyDeadline<Impl> deadline;
  bool timed_out = false;
  // Idle in the pool: bumped by Park and Unpark, so that a read wait that
  // completes after the connection was taken does nothing.
  uint64_t parked = 0;
  bool went_bad = false;  // a byte or the close arrived while idle, after it was taken
};

UpstreamConnection::UpstreamConnection(const net::any_io_executor& ex)
    : impl_(std::make_shared<Impl>(ex)) {}

UpstreamConnection::~UpstreamConnection() {
  // On the executor, where the timer's handler runs; the handler's reference
  // keeps the state until it has seen the cancellation.
  const net::any_io_executor ex = impl_->socket.get_executor();  // before impl_ is moved
  net::dispatch(ex, [impl = std::move(impl_)] {
    impl->deadline.Cancel();
    beast::error_code ignored;
    impl->socket.close(ignored);
  });
}

tcp::socket& UpstreamConnection::socket() { return impl_->socket; }
net::any_io_executor UpstreamConnection::get_executor() { return impl_->socket.get_executor(); }
void UpstreamConnection::ExpiresNever() { impl_->deadline.Clear(); }
bool UpstreamConnection::timed_out() const { return impl_->timed_out; }

void UpstreamConnection::ExpiresAfter(std::chrono::milliseconds d) {
  impl_->timed_out = false;
  impl_->deadline.ExpiresAfter(d, *impl_);
}

void Gateway::Park(std::unique_ptr<UpstreamConnection> c) {
  // No system call and, with Asio's recycled handler memory, no allocation:
  // the socket is registered with the reactor already. The wait starts before
  // the connection is in the pool (after, an exchange could take it first);
  // it cannot complete before this handler returns (same executor). A
  // connection the pool has no room for is destroyed here, which cancels it.
  // What it cannot see: bytes already in the socket when the answer's last
  // read ended exactly at the answer's end (Asio waits for the next edge of
  // its edge-triggered epoll), until more arrive; a request that must not be
  // sent twice still peeks (Op::Send).
  const std::shared_ptr<UpstreamConnection::Impl>& impl = c->impl_;
  impl->went_bad = false;
  impl->socket.async_wait(
      tcp::socket::wait_read,
      [pool = std::weak_ptr<Pool>(pool_), impl, generation = ++impl->parked](beast::error_code ec) {
        if (ec == net::error::operation_aborted || impl->parked != generation) return;
        const std::shared_ptr<Pool> p = pool.lock();
        if (p == nullptr) return;  // the gateway is gone (its idle connections with it)
        // Readable while idle: stray bytes (the end of an answer longer than
        // it said), or the upstream's close (its idle timeout). Either way the
        // connection cannot carry a request. Rare: one peek to tell which.
        char byte = 0;
        if (::recv(impl->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) {
          Log(Level::kWarn, "upstream error",
              {{"detail", "upstream sent bytes on an idle connection after its answer: closed"}});
        }
        std::unique_ptr<UpstreamConnection> dropped =
            p->TakeIf([&](const UpstreamConnection& u) { return u.impl_ == impl; });
        // Destroyed (closed) when it was still idle; if an exchange took it
        // meanwhile, its Unpark (queued behind this handler) sees this.
        if (dropped == nullptr) impl->went_bad = true;
      });
  pool_->GiveBack(std::move(c));
}

bool Gateway::Unpark(UpstreamConnection& c) {
  UpstreamConnection::Impl& impl = *c.impl_;
  ++impl.parked;
  beast::error_code ignored;
  impl.socket.cancel(ignored);  // the reactor's queue only: no system call
  return !std::exchange(impl.went_bad, false);
}

// One exchange with the upstream. After the response header arrives, the Op
// becomes the Reply's BodyStream: the session pulls the body piece by piece,
// so a response of any size passes through one 64 KiB buffer.
struct Gateway::Op : BodyStream, std::enable_shared_from_this<Gateway::Op> {
  static constexpr size_t kPiece = 64 * 1024;
  static constexpr size_t kMaxFieldBytes = 64 * 1024;  // head and trailer
  static constexpr int kMaxInterim = 16;               // 1xx responses before the final one

  Gateway& gw;
  std::function<void(Reply&&)> done;
  std::unique_ptr<UpstreamConnection> stream;
  bool reused = false;
  bool retried = false;
  bool wrote = false;  // the whole request went out once: the upstream may act on it
  // The request may be sent twice (RFC 9110 9.2.2's idempotent methods, or an
  // Idempotency-Key): an upstream that took it and closed without a word
  // may have acted on it, so only such a request is sent again then.
  bool replayable = true;
  int interim = 0;  // 1xx responses dropped so far
  bool head = false;
  bool keep = false;  // the upstream connection can be reused after the body
  beast::flat_buffer buffer;
  std::optional<UpstreamParser> parser;
  std::optional<uint64_t> length;
  std::unique_ptr<char[]> piece;  // allocated when the body is pulled
  std::string wire;               // the request as sent (kept for a retry): Gateway::Forward

  Op(Gateway& g, std::string w, std::function<void(Reply&&)> d)
      : gw(g), done(std::move(d)), wire(std::move(w)) {}
  ~Op() override { gw.pool_->Finish(); }

  void Start() {
    stream = gw.pool_->TakeIdle();
    reused = stream != nullptr;
    if (!reused) return Connect();
    // A pooled connection is used on its own executor only (its timer's
    // handler, and its idle read wait's, may be running there).
    if (gw.options_.one_thread) return SendOnPooled();
    net::dispatch(stream->get_executor(), [self = shared_from_this()] { self->SendOnPooled(); });
  }

  void SendOnPooled() {
    if (Unpark(*stream)) return Send();
    reused = false;  // the upstream wrote to it or closed it while it was idle
    stream.reset();
    Connect();
  }

  void Connect() {
    stream = gw.options_.one_thread
                 ? std::make_unique<UpstreamConnection>(gw.ioc_.get_executor())
                 : std::make_unique<UpstreamConnection>(net::make_strand(gw.ioc_));
    stream->ExpiresAfter(gw.options_.connect_timeout);
    net::async_connect(stream->socket(), gw.endpoints_,
                       [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                         if (ec && self->stream->timed_out())
                           return self->Fail(504, "upstream connect timed out");
                         if (ec) return self->Fail(502, "upstream unreachable: " + ec.message());
                         beast::error_code ignored;
                         self->stream->socket().set_option(tcp::no_delay(true), ignored);
                         self->Send();
                       });
  }

  // The request target, from the request line: for a problem+json reply.
  std::string_view Target() const {
    const size_t start = wire.find(' ') + 1;
    return std::string_view(wire).substr(start, wire.find(" HTTP/1.1\r\n", start) - start);
  }

  void Send() {
    // A request that must not be sent twice is not sent on a pooled
    // connection the upstream has already closed (its idle timeout): that
    // close is only learnt after the write, when the request can no longer be
    // retried. One peek at the socket, for those requests only; the race of
    // a close arriving after it is left (then 502), as for nginx and Go.
    if (reused && !replayable && !PooledStillOpen()) {
      reused = false;
      beast::error_code ignored;
      stream->socket().close(ignored);
      return Connect();
    }
    stream->ExpiresAfter(gw.options_.timeout);
    net::async_write(stream->socket(), net::buffer(wire),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec)
                         return self->RetryOr(502, "upstream write failed: " + ec.message(), false);
                       self->wrote = true;
                       self->ReadHeader();
                     });
  }

  void ReadHeader() {
    buffer.clear();
    ReadHead();
  }

  // One response head, into a new parser: after an interim (1xx) response
  // the buffer may already hold the next one.
  void ReadHead() {
    parser.emplace(kMaxFieldBytes);
    // Streamed: no size limit, constant memory. (Not boost::none: Boost 1.74
    // compares a Content-Length against an empty optional as "over the limit".)
    parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    parser->header_limit(kMaxFieldBytes);
    if (head) parser->skip(true);
    http::async_read_header(stream->socket(), buffer, *parser,
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (!ec) return self->OnHead();
                              if (self->stream->timed_out())
                                return self->Fail(504, "upstream did not answer in time");
                              if (n == 0)
                                return self->RetryOr(
                                    502, "upstream closed the connection: " + ec.message(), true);
                              self->Fail(502, "bad upstream response: " + ec.message());
                            });
  }

  // Beast takes a 1xx head for a whole message: answering it as final would
  // leave the real response unread on a connection that goes back to the
  // pool, to be read as the answer to the next request. An interim answer
  // (100 Continue, 103 Early Hints) is dropped, and the response read on,
  // within the same deadline; a protocol switch (101) cannot be relayed.
  void OnHead() {
    const int status = parser->status();
    if (status / 100 != 1) return Respond();
    // The upstream has the request: it must not be sent again.
    retried = true;
    if (status == 101 || ++interim > kMaxInterim) {
      stream.reset();  // never pooled: what follows is another protocol, or unread
      return Fail(502, status == 101 ? "upstream switched protocols"
                                     : "upstream sent too many interim (1xx) responses");
    }
    ReadHead();
  }

  // An idle pooled connection has nothing to read: end of stream, an error
  // or stray bytes all say it cannot carry a request.
  bool PooledStillOpen() {
    char byte = 0;
    const ssize_t n = ::recv(stream->socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  // `sent`: the whole request reached the upstream's socket.
  void RetryOr(unsigned status, std::string detail, bool sent) {
    if (reused && !retried && (replayable || !sent)) {
      retried = true;
      reused = false;
      beast::error_code ignored;
      stream->socket().close(ignored);
      return Connect();
    }
    Fail(status, std::move(detail));
  }

  void Respond() {
    Reply r;
    r.status = static_cast<unsigned>(parser->status());
    keep = parser->keep_alive() && !parser->need_eof();
    // The head becomes the reply's headers, less the hop-by-hop fields and
    // Content-Length (the session sets it): marked first (HopByHop holds
    // views into the Connection fields), then closed up in place.
    FieldList& fields = parser->head();
    const std::span<const http::field> ids = parser->head_ids();
    const HopByHop dropped(fields, ids);
    boost::container::small_vector<bool, 16> drop(fields.size());
    for (size_t i = 0; i < fields.size(); ++i) {
      drop[i] =
          (!head && ids[i] == http::field::content_length) || dropped(ids[i], fields[i].first);
    }
    size_t kept = 0;
    for (size_t i = 0; i < fields.size(); ++i) {
      if (drop[i]) continue;
      if (kept != i) fields[kept] = std::move(fields[i]);
      ++kept;
    }
    fields.resize(kept);
    r.headers = std::move(fields);
    r.keep_content_length = head;
    if (!TakeBufferedBody(r)) {
      stream.reset();  // never reuse a connection mid-message
      return Fail(502, "bad upstream response body");
    }
    if (parser->is_done()) {
      ReleaseConnection();
    } else {
      if (auto n = parser->content_length()) length = *n;
      r.body_stream = shared_from_this();
    }
    Finish(std::move(r));
  }

  // A small answer often arrives whole with its head: then it is relayed as
  // one buffer (one write to the client, like any other reply) instead of a
  // head and a streamed piece. False if the parser failed on the body.
  bool TakeBufferedBody(Reply& r) {
    if (head || parser->is_done()) return true;
    const auto n = parser->content_length();  // boost::optional
    if (!n || *n > kPiece || buffer.size() < *n) return true;
    r.body.resize(static_cast<size_t>(*n));
    auto& body = parser->body();
    body.data = r.body.data();
    body.size = r.body.size();
    beast::error_code ec;
    buffer.consume(parser->put(buffer.data(), ec));
    return (!ec || ec == http::error::need_buffer) && parser->is_done();
  }

  std::optional<uint64_t> content_length() const override { return length; }

  // A chunked body's trailer fields, once the body is done.
  std::optional<std::string> Trailer(std::string_view name) const override {
    if (!parser.has_value() || !parser->is_done()) return std::nullopt;
    for (const auto& [field, value] : parser->trailer()) {
      if (EqualsIgnoreCase(field, name)) return value;
    }
    return std::nullopt;
  }

  void Next(Piece next) override {
    if (stream == nullptr) return next(parser.has_value() && parser->is_done(), {}, true);
    net::dispatch(
        stream->get_executor(), [self = shared_from_this(), next = std::move(next)]() mutable {
          if (!self->piece) self->piece = std::make_unique<char[]>(kPiece);
          auto& body = self->parser->body();
          body.data = self->piece.get();
          body.size = kPiece;
          self->stream->ExpiresAfter(self->gw.options_.timeout);
          http::async_read_some(
              self->stream->socket(), self->buffer, *self->parser,
              [self, next = std::move(next)](beast::error_code ec, size_t) mutable {
                if (ec == http::error::need_buffer) ec = {};  // the piece is full
                if (ec) {
                  Log(Level::kWarn, "upstream error",
                      {{"detail", "response body: " + ec.message()}, {"upstream", self->gw.url_}});
                  self->stream.reset();  // never reuse a connection mid-message
                  return next(false, {}, true);
                }
                const size_t n = kPiece - self->parser->body().size;
                const bool last = self->parser->is_done();
                if (last) self->ReleaseConnection();
                next(true, std::string_view(self->piece.get(), n), last);
              });
        });
  }

  // The response is complete: keep the connection for the next request,
  // unless bytes beyond the message were read with it (the upstream sent
  // more than it said: a body after a HEAD answer, more than its
  // Content-Length). Pooled, they would be read as the answer to the next
  // request, another client's; bytes that come later are Park's.
  void ReleaseConnection() {
    if (!keep || stream == nullptr) return;
    if (buffer.size() != 0) {
      Log(Level::kWarn, "upstream error",
          {{"detail", "bytes after the answer: connection closed"}, {"upstream", gw.url_}});
      stream.reset();
      return;
    }
    stream->ExpiresNever();
    gw.Park(std::move(stream));
  }

  void Fail(unsigned status, std::string detail) {
    Log(Level::kWarn, "upstream error",
        {{"status", status}, {"detail", detail}, {"upstream", gw.url_}});
    Reply r = ProblemReply(status, detail, Target());
    r.unsent = !wrote;
    Finish(std::move(r));
  }

  void Finish(Reply&& r) {
    auto cb = std::move(done);
    if (cb) cb(std::move(r));
  }
};

// The upstream request in one buffer, written with one call, rendered
// straight from the client's request: no copy into a second message (a heap
// entry per header field) and no serializer (a chain of small buffers through
// several layers of views). The fields go out in the client's order without
// the hop-by-hop ones, Content-Length and X-Forwarded-For; then the
// X-Forwarded-For with the peer appended, then Content-Length when there is
// a body or the method takes one (Beast's prepare_payload rule).
void Gateway::Forward(const Request& request, std::string_view peer_ip,
                      std::function<void(Reply&&)> done) {
  if (!pool_->TryStart()) {
    Reply r = ProblemReply(503, "too many concurrent upstream requests", request.target());
    r.Add("Retry-After", "1");  // places free as exchanges end: soon
    r.unsent = true;
    return done(std::move(r));
  }
  const HopByHop dropped(request.base());

  const std::string_view body = request.body();
  // Beast reads the method case-sensitively ("head" is verb::unknown), as
  // RFC 9110 has it; upstreams that upper-case it (Werkzeug) answer "head"
  // as a HEAD, with no body, and routes match it so (policy.cc). Read so
  // here too, or the exchange would wait for a body that never comes.
  const http::verb method = request.method() != http::verb::unknown
                                ? request.method()
                                : http::string_to_verb(core::AsciiUpper(request.method_string()));
  const bool has_length = !body.empty() || method == http::verb::options ||
                          method == http::verb::put || method == http::verb::post;
  const Decimal length(body.size());
  std::string wire;
  RenderInto(wire, [&](const auto& put) {
    put(request.method_string());
    put(" "sv);
    put(request.target());
    put(" HTTP/1.1\r\n"sv);
    for (const auto& f : request.base()) {
      const std::string_view name = f.name_string();
      if (f.name() == http::field::content_length || dropped(f.name(), name)) continue;  // below
      // The session has answered 100-continue and holds the whole body: an
      // upstream asked to would only send a 100 of its own.
      if (f.name() == http::field::expect) continue;
      if (EqualsIgnoreCase(name, "X-Forwarded-For")) continue;  // below
      PutField(put, name, f.value());
    }
    // X-Forwarded-For: the client's entries (every such field, in order), then the peer.
    put("X-Forwarded-For: "sv);
    for (const auto& f : request.base()) {
      if (!EqualsIgnoreCase(f.name_string(), "X-Forwarded-For")) continue;
      put(f.value());
      put(", "sv);
    }
    put(peer_ip);
    put("\r\n"sv);
    if (has_length) PutField(put, "Content-Length"sv, length.view());
    put("\r\n"sv);
    put(body);
  });

  auto op = std::make_shared<Op>(*this, std::move(wire), std::move(done));
  op->head = method == http::verb::head;
  op->replayable = method == http::verb::get || method == http::verb::head ||
                   method == http::verb::options || method == http::verb::trace ||
                   method == http::verb::put || method == http::verb::delete_ ||
                   request.count("Idempotency-Key") > 0;
  op->Start();
}

}  // namespace ratelimit::server
