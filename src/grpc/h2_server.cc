#include "grpc/h2_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/accept_retry.h"
#include "core/completion_batch.h"
#include "core/percent.h"
#include "ratelimit/thread_annotations.h"

namespace ratelimit::grpcface {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr size_t kPrefix = 5;              // gRPC's message prefix: flag + length
constexpr size_t kMaxQueuedFrames = 4096;  // stop reading while nghttp2 holds this many frames
// A drain's final GOAWAY follows its notice after the client acks the PING
// sent with it (one round trip), or after this long at most.
constexpr std::chrono::milliseconds kGoAwayNoticeWait{1000};
constexpr uint8_t kDrainPing[8] = {'r', 'l', '-', 'd', 'r', 'a', 'i', 'n'};

nghttp2_nv Header(std::string_view name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NO_COPY_NAME};
}

void AppendFramed(std::string& out, std::string_view message) {
  const auto n = static_cast<uint32_t>(message.size());
  const char prefix[kPrefix] = {0, static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                                static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(prefix, kPrefix);
  out.append(message);
}

}  // namespace

std::chrono::nanoseconds ParseGrpcTimeout(std::string_view v) {
  // TimeoutValue is 1*8DIGIT: from_chars alone would also take "-0".
  if (v.size() < 2 || v.size() > 9 || v.front() < '0' || v.front() > '9')
    return std::chrono::nanoseconds(-1);
  int64_t n = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size() - 1, n);
  if (ec != std::errc() || p != v.data() + v.size() - 1 || n < 0)
    return std::chrono::nanoseconds(-1);
  switch (v.back()) {
    case 'H':
      // 8 digits of hours (up to 11,400 years) overflow int64 nanoseconds
      // past 2,562,047 h: such a timeout is "no deadline we keep".
      if (n > std::chrono::nanoseconds::max() / std::chrono::hours(1))
        return std::chrono::nanoseconds::max();
      return std::chrono::hours(n);
    case 'M': return std::chrono::minutes(n);
    case 'S': return std::chrono::seconds(n);
    case 'm': return std::chrono::milliseconds(n);
    case 'u': return std::chrono::microseconds(n);
    case 'n': return std::chrono::nanoseconds(n);
    default: return std::chrono::nanoseconds(-1);
  }
}

// Everything below touches a connection only on its strand.
struct GrpcCall::Stream {
  int32_t id = 0;
  // The request.
  std::string method, path, content_type, encoding;
  size_t header_bytes = 0;
  std::string body;  // gRPC-framed
  bool too_big = false;
  bool crowded = false;  // refused: max_pending_request_bytes
  bool expired = false;  // reset: not handed to its handler within request_timeout
  bool held = false;     // complete, in Conn::held (the answers are full)
  size_t pending = 0;    // body bytes counted in Conn::pending_bytes
  SteadyClock::time_point began;
  SteadyClock::time_point deadline = SteadyClock::time_point::max();
  // The answer.
  bool dispatched = false;  // handed to a handler (or answered by the server)
  bool started = false;     // response headers submitted with a data provider
  bool finished = false;    // Finish called: trailers follow the data
  bool closed = false;      // nghttp2 closed the stream, or the connection went
  bool stuck = false;       // reset: its answer moved no byte within write_timeout
  std::string out;          // framed messages not yet handed to nghttp2
  size_t out_off = 0;       // (out.size() - out_off counts in Conn::answer_bytes)
  // Since when its answer has waited without a byte leaving (Waiting()).
  SteadyClock::time_point progress;
  std::string status, message;      // the trailers
  std::function<void()> on_closed;  // GrpcCall::OnClosed

  size_t Unsent() const { return out.size() - out_off; }
  // An answer has begun and not all of it left: its bytes wait for the
  // client's window (or for nghttp2's queue), or its end does.
  bool Waiting() const { return !closed && (finished || Unsent() > 0); }

  // The stream is over (runs on_closed once).
  void Closed() {
    closed = true;
    if (on_closed) std::exchange(on_closed, nullptr)();
  }
};

struct H2Server::Shared {
  H2ServerOptions options;
  std::unordered_map<std::string, GrpcHandler> handlers;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> socket_writes{0};  // H2Server::socket_writes
  mutable Mutex mu;
  std::condition_variable_any gone;
  std::unordered_map<GrpcCall::Conn*, std::weak_ptr<GrpcCall::Conn>> conns RL_GUARDED_BY(mu);
};

struct GrpcCall::Conn : std::enable_shared_from_this<GrpcCall::Conn> {
  using Shared = H2Server::Shared;

  Conn(tcp::socket s, std::shared_ptr<Shared> sh)
      : socket(std::move(s)),
        shared(std::move(sh)),
        handshake(socket.get_executor()),
        write_timer(socket.get_executor()),
        request_timer(socket.get_executor()),
        answer_timer(socket.get_executor()),
        goaway_timer(socket.get_executor()),
        idle_timer(socket.get_executor()) {}

  ~Conn() {
    if (session != nullptr) nghttp2_session_del(session);
    Unregister();  // never started (over max_connections)
  }
  // Shutdown waits for this, not for the object: a GrpcCall may outlive it.
  void Unregister() {
    LockGuard lock(shared->mu);
    shared->conns.erase(this);
    shared->gone.notify_all();
  }

  tcp::socket socket;
  std::shared_ptr<Shared> shared;
  net::steady_timer handshake;
  net::steady_timer write_timer;       // armed while an async_write waits (write_timeout)
  net::steady_timer request_timer;     // the oldest incomplete request's request_timeout
  net::steady_timer answer_timer;      // the oldest waiting answer's write_timeout
  net::steady_timer goaway_timer;      // a drain's notice: kGoAwayNoticeWait
  net::steady_timer idle_timer;        // idle_timeout, from idle_since
  SteadyClock::time_point idle_since;  // when the last stream closed (or the connection began)
  SteadyClock::time_point data_moved;  // when an answer's bytes last went to nghttp2 (any stream)
  bool request_timer_armed = false, answer_timer_armed = false;
  size_t pending_bytes = 0;  // bodies of requests not yet handed to their handler
  size_t answer_bytes = 0;   // the streams' answers not yet handed to nghttp2 (Stream::Unsent)
  uint64_t writes = 0;       // async_writes begun
  nghttp2_session* session = nullptr;
  std::array<uint8_t, 16 << 10> in{};
  std::string out;  // being written
  bool writing = false, reading = false, closed = false, greeted = false;
  // A drain: the notice (GOAWAY of 2^31-1) is out; its PING came back; the
  // final GOAWAY is out.
  bool noticed = false, drain_pinged = false, gone_away = false;
  int batch = 0;  // > 0: inside a read's dispatch; one Flush at its end
  // Answers handed to the strand and not yet given (GrpcCall; any thread).
  std::atomic<int> queued_answers{0};
  bool flush_deferred = false;  // a Flush waits for the CompletionBatch's end
  std::unordered_map<int32_t, std::shared_ptr<Stream>> streams;
  std::vector<std::shared_ptr<Stream>> ready;  // complete requests, dispatched after mem_recv
  // Complete requests waiting for the answers to drop below
  // max_unsent_answer_bytes, in arrival order (open streams only).
  std::deque<std::shared_ptr<Stream>> held;

  void Start() {
    nghttp2_session_callbacks* cb = nullptr;
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, OnBeginHeaders);
    nghttp2_session_callbacks_set_on_header_callback(cb, OnHeader);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, OnData);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, OnFrame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, OnClose);
    nghttp2_session_server_new(&session, cb, this);
    nghttp2_session_callbacks_del(cb);
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, shared->options.max_concurrent_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         static_cast<uint32_t>(shared->options.max_header_bytes)},
    };
    nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, settings, std::size(settings));
    handshake.expires_after(shared->options.handshake_timeout);
    handshake.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && !self->greeted) self->Close();
    });
    idle_since = SteadyClock::now();
    ArmIdleTimer(idle_since + shared->options.idle_timeout);
    Flush();
    Read();
  }

  // A connection with no stream for idle_timeout is drained (GoAway) and
  // closes: otherwise a client that connects and then sends nothing would
  // keep its place among max_connections for good.
  void ArmIdleTimer(SteadyClock::time_point at) {
    if (shared->options.idle_timeout.count() <= 0 || closed) return;
    idle_timer.expires_at(at);
    idle_timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->CheckIdle();
    });
  }
  void CheckIdle() {
    if (closed || noticed) return;
    const SteadyClock::time_point now = SteadyClock::now();
    const auto timeout = shared->options.idle_timeout;
    if (!streams.empty()) return ArmIdleTimer(now + timeout);
    if (idle_since + timeout > now) return ArmIdleTimer(idle_since + timeout);
    GoAway();
  }

  // Reads while what waits to be sent is bounded: a client that sends
  // without reading its answers stops being read (TCP then stops it).
  void Read() {
    if (reading || closed || out.size() > shared->options.max_unsent_answer_bytes ||
        nghttp2_session_get_outbound_queue_size(session) > kMaxQueuedFrames)
      return;
    reading = true;
    socket.async_read_some(net::buffer(in), [self = shared_from_this()](
                                                const boost::system::error_code& ec, size_t n) {
      self->reading = false;
      if (ec || self->closed) return self->Close();
      const ssize_t rv = nghttp2_session_mem_recv(self->session, self->in.data(), n);
      if (rv < 0) return self->Close();
      ++self->batch;
      for (std::shared_ptr<Stream>& s : std::exchange(self->ready, {})) self->Dispatch(s);
      // After the streams the client sent before it saw the notice.
      if (self->drain_pinged) self->FinalGoAway();
      --self->batch;
      self->Flush();
      self->Read();
    });
  }

  // Hands what nghttp2 has to send to the socket, one write at a time.
  // The socket is non-blocking: what fits in its buffer (nearly always all
  // of it) is written here, with no completion to run on the next turn of
  // the loop; only the rest waits for the socket in an async_write. At a
  // steady rate of single calls that saves a posted handler per answer (the
  // CPU a call costs when nothing batches it: docs/performance.md section 8).
  void Flush() {
    if (closed || writing || batch > 0) return;
    for (;;) {
      for (;;) {
        const uint8_t* data = nullptr;
        const ssize_t n = nghttp2_session_mem_send(session, &data);
        if (n < 0) return Close();
        if (n == 0) break;
        out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
      }
      // Answers left (the client's window opened, or a stuck one was reset):
      // the requests that waited for room go to their handlers, and what
      // they answer at once goes out with the rest.
      if (held.empty() || AnswersFull()) break;
      ++batch;
      DispatchHeld();
      --batch;
      if (closed) return;
    }
    if (out.empty()) {
      if (nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0)
        Close();
      return;
    }
    boost::system::error_code ec;
    shared->socket_writes.fetch_add(1, std::memory_order_relaxed);
    const size_t written = socket.write_some(net::buffer(out), ec);
    if (ec && ec != net::error::would_block && ec != net::error::try_again) return Close();
    if (!ec && written == out.size()) {
      out.clear();
      if (nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0)
        return Close();
      return Read();  // it may have stopped while `out` was full
    }
    out.erase(0, ec ? 0 : written);
    writing = true;
    // The socket's buffers are full: the client is slow to read, or has
    // stopped. A timer per wait, not per write (this path is rare).
    write_timer.expires_after(shared->options.write_timeout);
    write_timer.async_wait(
        [self = shared_from_this(), wait = ++writes](const boost::system::error_code& ec) {
          // (A wait that ended as its write did, queued behind it, must not
          // close the connection during the next one.)
          if (!ec && self->writing && self->writes == wait) self->Close();  // the write fails
        });
    net::async_write(socket, net::buffer(out),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       self->writing = false;
                       self->write_timer.cancel();
                       self->out.clear();
                       if (ec) return self->Close();
                       self->Flush();
                       self->Read();
                     });
  }

  void Close() {
    if (closed) return;
    closed = true;
    handshake.cancel();
    write_timer.cancel();
    request_timer.cancel();
    answer_timer.cancel();
    goaway_timer.cancel();
    idle_timer.cancel();
    pending_bytes = 0;
    answer_bytes = 0;
    held.clear();
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    // on_closed runs with the connection's state settled: it may drop the
    // last GrpcCall of a stream.
    std::unordered_map<int32_t, std::shared_ptr<Stream>> gone;
    gone.swap(streams);
    ready.clear();
    Unregister();
    for (auto& [id, s] : gone) s->Closed();
  }

  // A request's bytes stop counting against max_pending_request_bytes: it is
  // handed to its handler, refused, reset or closed.
  void Release(Stream& s) {
    pending_bytes -= s.pending;
    s.pending = 0;
  }
  // Answers hold max_unsent_answer_bytes or more: complete requests wait.
  bool AnswersFull() const {
    return out.size() + answer_bytes >= shared->options.max_unsent_answer_bytes;
  }
  // `s` no longer waits for room (it closed, or expired).
  void Unhold(const std::shared_ptr<Stream>& s) {
    if (!s->held) return;
    s->held = false;
    std::erase(held, s);
  }
  size_t PendingCap() const {
    return std::max(shared->options.max_pending_request_bytes,
                    kPrefix + shared->options.max_message_bytes);
  }

  // A timer of the connection's streams, armed once at the earliest
  // deadline it keeps: `expire` looks at every stream and arms it again for
  // the next one.
  void ArmOnce(net::steady_timer& timer, bool& armed, SteadyClock::time_point at,
               void (Conn::*expire)()) {
    if (armed || closed) return;
    armed = true;
    timer.expires_at(at);
    timer.async_wait(
        [self = shared_from_this(), &armed, expire](const boost::system::error_code& ec) {
          armed = false;
          if (!ec && !self->closed) (self.get()->*expire)();
        });
  }

  // At the oldest incomplete request's deadline.
  void ArmRequestTimer(SteadyClock::time_point at) {
    ArmOnce(request_timer, request_timer_armed, at, &Conn::ExpireRequests);
  }
  void ExpireRequests() {
    const SteadyClock::time_point now = SteadyClock::now();
    const auto timeout = shared->options.request_timeout;
    SteadyClock::time_point next = SteadyClock::time_point::max();
    std::vector<std::shared_ptr<Stream>> expired;
    for (auto& [id, s] : streams) {
      if (s->dispatched || s->expired || s->closed) continue;
      if (s->began + timeout <= now) {
        expired.push_back(s);
      } else {
        next = std::min(next, s->began + timeout);
      }
    }
    for (const std::shared_ptr<Stream>& s : expired) {
      s->expired = true;
      Unhold(s);
      Release(*s);
      std::string().swap(s->body);
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    }
    if (next != SteadyClock::time_point::max()) ArmRequestTimer(next);
    if (!expired.empty()) Flush();
  }

  // At the oldest waiting answer's write_timeout: an answer that has moved no byte for that long (a
  // client that keeps its flow-control window shut) has its stream reset, and its bytes freed.
  void ArmAnswerTimer(SteadyClock::time_point at) {
    ArmOnce(answer_timer, answer_timer_armed, at, &Conn::ExpireAnswers);
  }
  void ExpireAnswers() {
    const SteadyClock::time_point now = SteadyClock::now();
    const auto timeout = shared->options.write_timeout;
    SteadyClock::time_point next = SteadyClock::time_point::max();
    std::vector<std::shared_ptr<Stream>> stuck;
    for (auto& [id, s] : streams) {
      if (!s->Waiting() || s->stuck) continue;
      if (s->progress + timeout > now) {
        next = std::min(next, s->progress + timeout);
      } else if (Stalled(*s, now)) {
        stuck.push_back(s);
      } else {
        // Behind the socket (write_timer's part) or nghttp2's queue: its
        // wait counts from now.
        s->progress = now;
        next = std::min(next, now + timeout);
      }
    }
    for (const std::shared_ptr<Stream>& s : stuck) {
      s->stuck = true;
      DropAnswer(*s);
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_CANCEL);
    }
    if (next != SteadyClock::time_point::max()) ArmAnswerTimer(next);
    if (!stuck.empty()) Flush();
  }
  // The client holds `s` up: the stream's window is shut; or the
  // connection's is and no stream's answer has moved within write_timeout
  // (while the connection moves, `s` waits its turn behind the others: a
  // slow reader of many large answers is not a stuck one); or the answer has
  // all left and its request never ended (an early refusal: too big,
  // crowded).
  bool Stalled(const Stream& s, SteadyClock::time_point now) const {
    if (nghttp2_session_get_stream_local_close(session, s.id) == 1) return true;
    if (nghttp2_session_get_stream_remote_window_size(session, s.id) <= 0) return true;
    return nghttp2_session_get_remote_window_size(session) <= 0 &&
           data_moved + shared->options.write_timeout <= now;
  }
  void DropAnswer(Stream& s) {
    answer_bytes -= s.Unsent();
    std::string().swap(s.out);
    s.out_off = 0;
  }

  // A drain, in RFC 9113's two steps (section 6.8): a GOAWAY of 2^31-1
  // (nghttp2's shutdown notice) tells the client to open no more streams,
  // and a PING measures the round trip; once it is back (or after
  // kGoAwayNoticeWait) the final GOAWAY names the last stream taken. The
  // streams the client opened before the notice reached it are served: a
  // single GOAWAY with the last stream processed so far refused them.
  void GoAway() {
    if (closed || noticed) return;
    noticed = true;
    nghttp2_submit_shutdown_notice(session);
    nghttp2_submit_ping(session, NGHTTP2_FLAG_NONE, kDrainPing);
    goaway_timer.expires_after(kGoAwayNoticeWait);
    goaway_timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->FinalGoAway();
    });
    Flush();
  }
  void FinalGoAway() {
    if (closed || gone_away) return;
    gone_away = true;
    goaway_timer.cancel();
    nghttp2_submit_goaway(session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(session), NGHTTP2_NO_ERROR,
                          nullptr, 0);
    Flush();
  }

  // A complete request (or one refused before its end): to its handler now,
  // or, while the answers are full, once they have room.
  void Dispatch(const std::shared_ptr<Stream>& s) {
    if (s->closed || s->dispatched || s->expired || s->held) return;
    // The server's own refusals answer at once and free what they held.
    if (!s->too_big && !s->crowded && (!held.empty() || AnswersFull())) {
      s->held = true;
      held.push_back(s);
      return;
    }
    Take(s);
  }
  void DispatchHeld() {
    while (!held.empty() && !AnswersFull() && !closed) {
      const std::shared_ptr<Stream> s = std::move(held.front());
      held.pop_front();
      s->held = false;
      if (!s->closed && !s->dispatched && !s->expired) Take(s);
    }
  }
  // The handler has the request, and then its bytes are freed: an answer
  // that waits (for the store, for the client's window) keeps none.
  void Take(const std::shared_ptr<Stream>& s) {
    s->dispatched = true;
    Release(*s);
    Route(s);
    std::string().swap(s->body);
  }
  // The handler for the request's path, or the server's answer.
  void Route(const std::shared_ptr<Stream>& s) {
    GrpcCall call(shared_from_this(), s);
    if (s->method != "POST") return RespondHttp(*s, "405");
    if (s->content_type.rfind("application/grpc", 0) != 0) return RespondHttp(*s, "415");
    const auto h = shared->handlers.find(s->path);
    if (h == shared->handlers.end())
      return call.Finish(GrpcCode::kUnimplemented, "unknown method " + s->path);
    if (s->too_big) {
      // Answered at once; the rest of the request is read and dropped (a
      // RST_STREAM here would overtake the answer in nghttp2's queue).
      return call.Finish(GrpcCode::kResourceExhausted,
                         "request message larger than " +
                             std::to_string(shared->options.max_message_bytes) + " bytes");
    }
    if (s->crowded) {
      return call.Finish(GrpcCode::kResourceExhausted,
                         "requests waiting on this connection hold more than " +
                             std::to_string(PendingCap()) + " bytes");
    }
    if (s->body.size() < kPrefix) return call.Finish(GrpcCode::kInternal, "no request message");
    const auto* b = reinterpret_cast<const unsigned char*>(s->body.data());
    const size_t len = (size_t{b[1]} << 24) | (size_t{b[2]} << 16) | (size_t{b[3]} << 8) | b[4];
    if (b[0] != 0) {
      if (s->encoding.empty() || s->encoding == "identity")
        return call.Finish(GrpcCode::kInternal, "compressed flag set without grpc-encoding");
      return Unimplemented(*s, "grpc-encoding " + s->encoding + " is not supported");
    }
    if (kPrefix + len != s->body.size()) {
      return call.Finish(GrpcCode::kInternal, kPrefix + len > s->body.size()
                                                  ? "truncated request message"
                                                  : "more than one request message");
    }
    h->second(std::move(call));
  }

  // Trailers-only answers.
  void RespondHttp(Stream& s, std::string_view status) {
    const nghttp2_nv nv[] = {Header(":status", status)};
    nghttp2_submit_response(session, s.id, nv, std::size(nv), nullptr);
    Flush();
  }
  void Unimplemented(Stream& s, const std::string& why) {
    const std::string m = core::PercentEncode(why);
    const nghttp2_nv nv[] = {Header(":status", "200"), Header("content-type", "application/grpc"),
                             Header("grpc-accept-encoding", "identity"),
                             Header("grpc-status", "12"), Header("grpc-message", m)};
    nghttp2_submit_response(session, s.id, nv, std::size(nv), nullptr);
    Flush();
  }

  // On the strand: `message` (if any) joins the answer; `finish` ends it.
  void Answer(Stream& s, const std::string* message, bool finish, GrpcCode code, std::string why) {
    if (closed || s.closed || s.finished || s.stuck) return;
    const bool was_waiting = s.Waiting();
    if (message != nullptr) {
      const size_t before = s.out.size();
      AppendFramed(s.out, *message);
      answer_bytes += s.out.size() - before;
    }
    const SteadyClock::time_point now = SteadyClock::now();
    if (finish) {
      if (code == GrpcCode::kOk && now > s.deadline) {
        code = GrpcCode::kDeadlineExceeded;
        why = "the deadline passed before the answer";
        if (!s.started) DropAnswer(s);
      }
      s.finished = true;
      s.status = std::to_string(static_cast<int>(code));
      s.message = core::PercentEncode(why);
    }
    if (s.started) {
      nghttp2_session_resume_data(session, s.id);
    } else if (!s.out.empty()) {
      s.started = true;
      const nghttp2_nv nv[] = {Header(":status", "200"),
                               Header("content-type", "application/grpc")};
      nghttp2_data_provider prd;
      prd.source.ptr = &s;
      prd.read_callback = ReadOut;
      nghttp2_submit_response(session, s.id, nv, std::size(nv), &prd);
    } else if (finish) {
      // Trailers-only: one HEADERS frame that ends the stream.
      const nghttp2_nv nv[] = {Header(":status", "200"), Header("content-type", "application/grpc"),
                               Header("grpc-status", s.status), Header("grpc-message", s.message)};
      nghttp2_submit_response(session, s.id, nv, s.message.empty() ? 3 : 4, nullptr);
    }
    if (!was_waiting && s.Waiting()) {
      s.progress = now;
      ArmAnswerTimer(now + shared->options.write_timeout);
    }
  }

  // The end of an answer handed over by GrpcCall (queued_answers counted
  // it). A Redis reply answers a batch of calls at once, and one `sendto` a
  // call went out (110,153 for 128,991 calls in a closed loop): now the
  // answers written together leave in one write, with no trip through the
  // event loop. Answers posted here from another thread run one after the
  // other, and the last of them writes; answers given on the thread of a
  // core::CompletionBatch (the Redis client's read, when it runs on this
  // io_context) are written as the batch ends. Inside a read's dispatch the
  // read's own Flush sends them. (A Flush posted behind the answers instead
  // waited behind the reads the loop had ready: p50 at 15,000 calls/s
  // 570-631 us against 318-355.)
  void Answered() {
    if (queued_answers.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (batch > 0 || flush_deferred) return;
    if (core::CompletionBatch::Defer([self = shared_from_this()] {
          net::dispatch(self->socket.get_executor(), [self] {
            self->flush_deferred = false;
            self->Flush();
          });
        })) {
      flush_deferred = true;
      return;
    }
    Flush();
  }

  static ssize_t ReadOut(nghttp2_session* session, int32_t id, uint8_t* buf, size_t length,
                         uint32_t* flags, nghttp2_data_source* source, void* p) {
    auto* s = static_cast<Stream*>(source->ptr);
    if (s->stuck) return NGHTTP2_ERR_DEFERRED;  // its RST_STREAM is on the way
    const size_t n = std::min(length, s->Unsent());
    s->out.copy(reinterpret_cast<char*>(buf), n, s->out_off);
    s->out_off += n;
    if (n > 0) {
      Self(p).answer_bytes -= n;
      s->progress = Self(p).data_moved = SteadyClock::now();
    }
    if (s->out_off == s->out.size()) {
      s->out.clear();
      s->out_off = 0;
      if (!s->finished) return n > 0 ? static_cast<ssize_t>(n) : ssize_t{NGHTTP2_ERR_DEFERRED};
      *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
      nghttp2_nv nv[] = {Header("grpc-status", s->status), Header("grpc-message", s->message)};
      nghttp2_submit_trailer(session, id, nv, s->message.empty() ? 1 : 2);
    }
    return static_cast<ssize_t>(n);
  }

  // nghttp2's callbacks (inside mem_recv: they never send).
  static Conn& Self(void* p) { return *static_cast<Conn*>(p); }
  static Stream* Find(nghttp2_session* session, int32_t id) {
    return static_cast<Stream*>(nghttp2_session_get_stream_user_data(session, id));
  }

  static int OnBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* p) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
    auto s = std::make_shared<Stream>();
    s->id = frame->hd.stream_id;
    s->began = SteadyClock::now();
    nghttp2_session_set_stream_user_data(session, s->id, s.get());
    Conn& c = Self(p);
    c.ArmRequestTimer(s->began + c.shared->options.request_timeout);
    c.streams.emplace(s->id, std::move(s));
    return 0;
  }

  static int OnHeader(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* p) {
    Stream* s = Find(session, frame->hd.stream_id);
    if (s == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
    s->header_bytes += namelen + valuelen + 32;  // RFC 9113's accounting
    if (s->header_bytes > Self(p).shared->options.max_header_bytes)
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // resets the stream
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":method") {
      s->method = v;
    } else if (n == ":path") {
      s->path = v;
    } else if (n == "content-type") {
      s->content_type = v;
    } else if (n == "grpc-encoding") {
      s->encoding = v;
    } else if (n == "grpc-timeout") {
      const std::chrono::nanoseconds t = ParseGrpcTimeout(v);
      if (t.count() >= 0 && t < std::chrono::hours(24 * 365))
        s->deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(t);
    }
    return 0;
  }

  static int OnData(nghttp2_session* session, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* p) {
    Stream* s = Find(session, id);
    if (s == nullptr || s->too_big || s->crowded || s->expired) return 0;
    Conn& c = Self(p);
    const bool too_big = s->body.size() + len > kPrefix + c.shared->options.max_message_bytes;
    if (too_big || c.pending_bytes + len > c.PendingCap()) {
      (too_big ? s->too_big : s->crowded) = true;
      c.Release(*s);
      std::string().swap(s->body);
      return 0;
    }
    s->body.append(reinterpret_cast<const char*>(data), len);
    s->pending += len;
    c.pending_bytes += len;
    return 0;
  }

  static int OnFrame(nghttp2_session* session, const nghttp2_frame* frame, void* p) {
    // The handshake is over at the client's SETTINGS (which follows the
    // preface), not at its first bytes: a client that sent part of the
    // preface and stopped would otherwise hold its connection forever.
    if (frame->hd.type == NGHTTP2_SETTINGS && (frame->hd.flags & NGHTTP2_FLAG_ACK) == 0) {
      Conn& c = Self(p);
      if (!c.greeted) {
        c.greeted = true;
        c.handshake.cancel();
      }
      return 0;
    }
    if (frame->hd.type == NGHTTP2_PING && (frame->hd.flags & NGHTTP2_FLAG_ACK) != 0 &&
        std::memcmp(frame->ping.opaque_data, kDrainPing, sizeof kDrainPing) == 0) {
      Self(p).drain_pinged = true;  // the read's end sends the final GOAWAY
      return 0;
    }
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    const bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    Stream* s = Find(session, frame->hd.stream_id);
    if (s == nullptr || s->expired) return 0;
    // An oversized message is refused as soon as it is seen, not at its end.
    // (A complete request's bytes count until its handler has it.)
    if (end || s->too_big || s->crowded) {
      Conn& c = Self(p);
      if (s->too_big || s->crowded) c.Release(*s);
      if (auto it = c.streams.find(s->id); it != c.streams.end()) c.ready.push_back(it->second);
    }
    return 0;
  }

  static int OnClose(nghttp2_session* session, int32_t id, uint32_t, void* p) {
    Conn& c = Self(p);
    if (Stream* s = Find(session, id); s != nullptr) {
      c.Release(*s);
      c.DropAnswer(*s);
    }
    if (auto it = c.streams.find(id); it != c.streams.end()) {
      const std::shared_ptr<Stream> s = std::move(it->second);
      c.streams.erase(it);
      if (c.streams.empty()) c.idle_since = SteadyClock::now();
      c.Unhold(s);
      std::string().swap(s->body);
      s->Closed();
    }
    return 0;
  }
};

GrpcCall::GrpcCall(std::shared_ptr<Conn> conn, std::shared_ptr<Stream> stream)
    : conn_(std::move(conn)), stream_(std::move(stream)) {}

std::string_view GrpcCall::request() const {
  return std::string_view(stream_->body).substr(std::min(stream_->body.size(), kPrefix));
}

std::chrono::steady_clock::time_point GrpcCall::deadline() const { return stream_->deadline; }

void GrpcCall::Reply(std::string message) const {
  conn_->queued_answers.fetch_add(1, std::memory_order_relaxed);
  net::dispatch(conn_->socket.get_executor(), [c = conn_, s = stream_, m = std::move(message)] {
    c->Answer(*s, &m, true, GrpcCode::kOk, {});
    c->Answered();
  });
}

void GrpcCall::Write(std::string message) const {
  conn_->queued_answers.fetch_add(1, std::memory_order_relaxed);
  net::dispatch(conn_->socket.get_executor(), [c = conn_, s = stream_, m = std::move(message)] {
    c->Answer(*s, &m, false, GrpcCode::kOk, {});
    c->Answered();
  });
}

void GrpcCall::Finish(GrpcCode code, std::string message) const {
  conn_->queued_answers.fetch_add(1, std::memory_order_relaxed);
  net::dispatch(conn_->socket.get_executor(),
                [c = conn_, s = stream_, code, m = std::move(message)]() mutable {
                  c->Answer(*s, nullptr, true, code, std::move(m));
                  c->Answered();
                });
}

void GrpcCall::OnClosed(std::function<void()> fn) const {
  net::dispatch(conn_->socket.get_executor(), [c = conn_, s = stream_, fn = std::move(fn)] {
    if (s->closed || c->closed) return fn();
    s->on_closed = fn;
  });
}

namespace {

// A connection on the strand of its socket's executor; closed at once past
// max_connections.
void ServeConnection(const std::shared_ptr<H2Server::Shared>& shared, tcp::socket socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  socket.non_blocking(true, ignored);  // Flush writes what fits at once
  auto conn = std::make_shared<GrpcCall::Conn>(std::move(socket), shared);
  {
    LockGuard lock(shared->mu);
    if (shared->conns.size() >= shared->options.max_connections) return;  // closes it
    shared->conns.emplace(conn.get(), conn);
  }
  net::dispatch(conn->socket.get_executor(), [conn] { conn->Start(); });
}

}  // namespace

// The acceptor, on a strand of its own.
struct Acceptor : std::enable_shared_from_this<Acceptor> {
  Acceptor(net::io_context& ioc, std::shared_ptr<H2Server::Shared> sh)
      : ioc(ioc), acceptor(net::make_strand(ioc)), shared(std::move(sh)) {}
  net::io_context& ioc;
  tcp::acceptor acceptor;
  std::shared_ptr<H2Server::Shared> shared;

  void Accept() {
    acceptor.async_accept(
        net::make_strand(ioc),
        [self = shared_from_this()](const boost::system::error_code& ec, tcp::socket socket) {
          if (ec == net::error::operation_aborted || self->shared->stopping) return;
          if (ec) return self->AcceptLater();  // EMFILE and friends
          ServeConnection(self->shared, std::move(socket));
          self->Accept();
        });
  }

  void AcceptLater() {
    auto timer =
        std::make_shared<net::steady_timer>(acceptor.get_executor(), core::kAcceptRetryDelay);
    timer->async_wait([self = shared_from_this(), timer](const boost::system::error_code&) {
      if (!self->shared->stopping) self->Accept();
    });
  }
};

H2Server::H2Server(net::io_context& ioc, H2ServerOptions options)
    : ioc_(&ioc), shared_(std::make_shared<Shared>()) {
  shared_->options = options;
}

H2Server::~H2Server() { Shutdown(std::chrono::milliseconds(0)); }

void H2Server::Handle(std::string path, GrpcHandler handler) {
  shared_->handlers[std::move(path)] = std::move(handler);
}

Status H2Server::Listen(const tcp::endpoint& ep) {
  auto a = std::make_shared<Acceptor>(*ioc_, shared_);
  boost::system::error_code err;
  a->acceptor.open(ep.protocol(), err);
  if (!err) a->acceptor.set_option(tcp::acceptor::reuse_address(true), err);
  if (!err) a->acceptor.bind(ep, err);
  if (!err) a->acceptor.listen(net::socket_base::max_listen_connections, err);
  if (err) {
    return Unavailable("cannot listen for gRPC on " + ep.address().to_string() + ":" +
                       std::to_string(ep.port()) + ": " + err.message());
  }
  port_ = a->acceptor.local_endpoint().port();
  acceptor_ = a;
  a->Accept();
  return Status::Ok();
}

void H2Server::Serve(tcp::socket socket) { ServeConnection(shared_, std::move(socket)); }

uint64_t H2Server::socket_writes() const {
  return shared_->socket_writes.load(std::memory_order_relaxed);
}

size_t H2Server::connections() const {
  LockGuard lock(shared_->mu);
  return shared_->conns.size();
}

void H2Server::EachConnection(const std::function<void(GrpcCall::Conn&)>& fn) {
  std::vector<std::shared_ptr<GrpcCall::Conn>> live;
  {
    LockGuard lock(shared_->mu);
    for (auto& [p, w] : shared_->conns)
      if (auto c = w.lock()) live.push_back(std::move(c));
  }
  for (auto& c : live) net::post(c->socket.get_executor(), [c, fn] { fn(*c); });
}

void H2Server::Drain() {
  if (shared_->stopping.exchange(true)) return;
  if (auto a = std::static_pointer_cast<Acceptor>(acceptor_)) {
    net::post(a->acceptor.get_executor(), [a] {
      boost::system::error_code ignored;
      a->acceptor.close(ignored);
    });
  }
  EachConnection([](GrpcCall::Conn& c) { c.GoAway(); });
}

void H2Server::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) return;
  shut_down_ = true;
  Drain();
  auto closed_within = [this](std::chrono::milliseconds d) {
    UniqueLock lock(shared_->mu);
    return shared_->gone.wait_for(
        lock, d, [this]() RL_REQUIRES(shared_->mu) { return shared_->conns.empty(); });
  };
  if (closed_within(grace)) return;
  CloseAll();
  closed_within(std::chrono::milliseconds(1000));
}

void H2Server::CloseAll() {
  EachConnection([](GrpcCall::Conn& c) { c.Close(); });
}

void H2Server::Stop() {
  if (shut_down_) return;
  shut_down_ = true;
  Drain();
  CloseAll();
}

}  // namespace ratelimit::grpcface
