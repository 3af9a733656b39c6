#include "redis/connection.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <optional>
#include <random>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>

#include "core/completion_batch.h"
#include "redis/command.h"

namespace ratelimit::redis {

namespace asio = boost::asio;
using boost::system::error_code;
using tcp = asio::ip::tcp;

// One connection attempt: the socket and the buffers its operations use. Each
// handler holds a reference, so a closed session's memory outlives its
// aborted operations, and a handler whose session is no longer session_ knows
// it is stale.
struct Connection::Session {
  // `tls`: the context of a TLS connection; null for plain TCP, which then
  // makes no SSL object (SSL_new) per connection attempt.
  Session(const asio::strand<asio::any_io_executor>& strand, asio::ssl::context* tls) {
    if (tls != nullptr) {
      tls_stream.emplace(strand, *tls);
    } else {
      plain.emplace(strand);
    }
  }
  tcp::socket& socket() { return tls_stream ? tls_stream->next_layer() : *plain; }

  std::optional<asio::ssl::stream<tcp::socket>> tls_stream;  // options.tls
  std::optional<tcp::socket> plain;                          // otherwise
  bool ready = false;                                        // TCP (and TLS) established
  std::string write_buf;                                     // bytes of the async_write in flight
  ReplyReader reader;
  std::array<char, size_t{16} * 1024> read_buf;
};

namespace {

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + "ms"; }

// Calls `f` with the byte stream of `session`: TLS or the plain socket.
template <typename S, typename F>
void WithStream(S& session, F&& f) {
  if (session.tls_stream) {
    f(*session.tls_stream);
  } else {
    f(*session.plain);
  }
}

}  // namespace

std::shared_ptr<Connection> Connection::Create(asio::any_io_executor executor, Options options,
                                               std::shared_ptr<asio::ssl::context> tls_context,
                                               std::shared_ptr<PendingBudget> budget) {
  if (!tls_context && options.tls) {
    tls_context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  }
  if (!budget) budget = std::make_shared<PendingBudget>(options.max_pending);
  return std::shared_ptr<Connection>(new Connection(std::move(executor), std::move(options),
                                                    std::move(tls_context), std::move(budget)));
}

Connection::Connection(asio::any_io_executor executor, Options options,
                       std::shared_ptr<asio::ssl::context> tls_context,
                       std::shared_ptr<PendingBudget> budget)
    : options_(std::move(options)),
      describe_("redis " + RedactedUrl(options_)),
      tls_context_(std::move(tls_context)),
      budget_(std::move(budget)),
      executor_(std::move(executor)),
      strand_(asio::make_strand(executor_)),
      resolver_(strand_),
      deadline_timer_(strand_),
      connect_timer_(strand_),
      backoff_(options_.reconnect_min_backoff) {}

Connection::~Connection() = default;

void Connection::Start() {
  asio::post(strand_, [self = shared_from_this()] { self->StartConnect(); });
}

void Connection::Execute(std::span<const std::string_view> args, Callback cb,
                         std::chrono::milliseconds timeout) {
  const size_t size = EncodedCommandSize(args);
  Enqueue(
      size,
      [&](std::string& out) {
        out.reserve(out.size() + size);
        AppendCommand(out, args);
      },
      std::move(cb), timeout);
}

void Connection::ExecuteEncoded(std::string_view command, Callback cb,
                                std::chrono::milliseconds timeout) {
  Enqueue(
      command.size(), [&](std::string& out) { out.append(command); }, std::move(cb), timeout);
}

namespace {
constexpr std::string_view kAskingCommand = "*1\r\n$6\r\nASKING\r\n";
}  // namespace

void Connection::ExecuteAsking(std::string_view command, Callback cb,
                               std::chrono::milliseconds timeout) {
  Enqueue(
      command.size(), [&](std::string& out) { out.append(command); }, std::move(cb), timeout,
      /*asking=*/true);
}

template <typename AppendFn>
void Connection::Enqueue(size_t size, AppendFn&& append, Callback cb,
                         std::chrono::milliseconds timeout, bool asking) {
  if (!budget_->TryAcquire()) {
    FailSoon(std::move(cb), ResourceExhausted(describe_ + ": " + std::to_string(budget_->max()) +
                                              " calls already queued or in flight (max_pending)"));
    return;
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  bool post_flush = false;
  bool post_timer = false;
  {
    UniqueLock lock(mu_);
    if (state_ != State::kConnected && !(state_ == State::kConnecting && first_connect_)) {
      std::string why =
          state_ == State::kClosed ? "client closed" : "not connected (" + last_error_ + ")";
      lock.unlock();
      budget_->Release();
      FailSoon(std::move(cb), Unavailable(describe_ + ": " + why));
      return;
    }
    if (asking) {
      out_.append(kAskingCommand);
      pending_.push_back(Call{Callback(), deadline, timeout,
                              static_cast<uint32_t>(kAskingCommand.size()), Kind::kAsking});
      ++unsent_;
    }
    append(out_);
    pending_.push_back(
        Call{std::move(cb), deadline, timeout, static_cast<uint32_t>(size), Kind::kUser});
    ++unsent_;
    if (state_ == State::kConnected && !writing_ && !flush_posted_) {
      flush_posted_ = true;
      post_flush = true;
    }
    if (deadline < timer_at_) {
      timer_at_ = deadline;
      post_timer = true;
    }
  }
  if (post_flush) asio::post(strand_, [self = shared_from_this()] { self->Flush(); });
  if (post_timer) asio::post(strand_, [self = shared_from_this()] { self->ArmDeadlineTimer(); });
}

void Connection::OnPush(PushHandler on_push) {
  LockGuard lock(mu_);
  on_push_ = std::make_shared<const PushHandler>(std::move(on_push));
}

void Connection::FailSoon(Callback cb, Status status) {
  asio::post(executor_,
             [cb = std::move(cb), status = std::move(status)]() mutable { cb(std::move(status)); });
}

void Connection::Close() {
  {
    LockGuard lock(mu_);
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
  }
  connected_.store(false, std::memory_order_relaxed);
  asio::post(strand_, [self = shared_from_this()] {
    self->FailConnection(Unavailable(self->describe_ + ": client closed"));
  });
}

void Connection::StartConnect() {
  {
    LockGuard lock(mu_);
    if (state_ == State::kClosed) return;
    state_ = State::kConnecting;
  }
  auto session = std::make_shared<Session>(strand_, options_.tls ? tls_context_.get() : nullptr);
  session_ = session;
  auto self = shared_from_this();
  connect_timer_.expires_after(options_.connect_timeout);
  connect_timer_.async_wait([self, session](error_code ec) {
    if (ec || session != self->session_ || session->ready) return;
    self->FailConnection(Unavailable(self->describe_ + ": connect timed out after " +
                                     Millis(self->options_.connect_timeout)));
  });
  auto on_connect = [self, session](error_code ec) {
    if (session != self->session_) return;
    if (ec) {
      self->FailConnection(Unavailable(self->describe_ + ": connect failed: " + ec.message()));
      return;
    }
    self->OnTcpConnected(session);
  };
  error_code ec;
  asio::ip::address address = asio::ip::make_address(options_.host, ec);
  if (!ec) {
    session->socket().async_connect(tcp::endpoint(address, options_.port), on_connect);
    return;
  }
  resolver_.async_resolve(
      options_.host, std::to_string(options_.port),
      [self, session, on_connect](error_code ec, const tcp::resolver::results_type& results) {
        if (session != self->session_) return;
        if (ec) {
          self->FailConnection(
              Unavailable(self->describe_ + ": cannot resolve host: " + ec.message()));
          return;
        }
        asio::async_connect(session->socket(), results,
                            [on_connect](error_code ec, const tcp::endpoint&) { on_connect(ec); });
      });
}

void Connection::OnTcpConnected(const std::shared_ptr<Session>& session) {
  error_code ignored;
  session->socket().set_option(tcp::no_delay(true), ignored);
  if (!options_.tls) {
    OnConnected(session);
    return;
  }
  error_code not_ip;
  asio::ip::make_address(options_.host, not_ip);
  asio::ssl::stream<tcp::socket>& tls = *session->tls_stream;
  if (not_ip) SSL_set_tlsext_host_name(tls.native_handle(), options_.host.c_str());
  if (options_.tls_verify) {
    tls.set_verify_mode(asio::ssl::verify_peer);
    tls.set_verify_callback(asio::ssl::host_name_verification(options_.host));
  } else {
    tls.set_verify_mode(asio::ssl::verify_none);
  }
  tls.async_handshake(
      asio::ssl::stream_base::client, [self = shared_from_this(), session](error_code ec) {
        if (session != self->session_) return;
        if (ec) {
          self->FailConnection(
              Unavailable(self->describe_ + ": TLS handshake failed: " + ec.message()));
          return;
        }
        self->OnConnected(session);
      });
}

void Connection::OnConnected(const std::shared_ptr<Session>& session) {
  session->ready = true;
  connect_timer_.cancel();

  // AUTH and SELECT go ahead of everything queued while connecting.
  std::string handshake;
  std::vector<uint32_t> sizes;
  auto add = [&](std::span<const std::string_view> args) {
    size_t before = handshake.size();
    AppendCommand(handshake, args);
    sizes.push_back(static_cast<uint32_t>(handshake.size() - before));
  };
  if (!options_.password.empty()) {
    if (options_.user.empty()) {
      std::string_view args[] = {"AUTH", options_.password};
      add(args);
    } else {
      std::string_view args[] = {"AUTH", options_.user, options_.password};
      add(args);
    }
  }
  const std::string db = std::to_string(options_.db);
  if (options_.db != 0) {
    std::string_view args[] = {"SELECT", db};
    add(args);
  }

  const auto handshake_timeout = std::max(options_.connect_timeout, options_.command_timeout);
  const Clock::time_point deadline = Clock::now() + handshake_timeout;
  bool arm = false;
  {
    LockGuard lock(mu_);
    if (state_ == State::kClosed) return;  // the posted close finishes the job
    state_ = State::kConnected;
    first_connect_ = false;
    out_.insert(0, handshake);
    for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
      pending_.push_front(Call{Callback(), deadline, handshake_timeout, *it, Kind::kHandshake});
    }
    unsent_ += sizes.size();
    writing_ = false;
    flush_posted_ = false;
    if (!sizes.empty() && deadline < timer_at_) timer_at_ = deadline;
    arm = timer_at_ != Clock::time_point::max();
  }
  connected_.store(true, std::memory_order_relaxed);
  if (arm) ArmDeadlineTimer();
  StartRead(session);
  Flush();
}

void Connection::StartRead(const std::shared_ptr<Session>& session) {
  WithStream(*session, [&](auto& stream) {
    stream.async_read_some(asio::buffer(session->read_buf), [self = shared_from_this(), session](
                                                                error_code ec, size_t bytes) {
      if (session != self->session_) return;
      if (ec) {
        self->FailConnection(Unavailable(
            self->describe_ + (ec == asio::error::eof ? ": connection closed by server"
                                                      : ": read failed: " + ec.message())));
        return;
      }
      self->OnRead(session, bytes);
    });
  });
}

void Connection::OnRead(const std::shared_ptr<Session>& session, size_t bytes) {
  Status protocol_error = session->reader.Feed(std::string_view(session->read_buf.data(), bytes));
  while (protocol_error.ok()) {
    StatusOr<std::optional<Reply>> next = session->reader.Next();
    if (!next.ok()) {
      protocol_error = next.status();
    } else if (!next->has_value()) {
      break;
    } else {
      replies_.push_back(std::move(**next));
    }
  }

  Status failure;
  bool readonly = false;
  std::shared_ptr<const PushHandler> on_push;
  {
    LockGuard lock(mu_);
    on_push = on_push_;
    for (Reply& reply : replies_) {
      if (on_push && reply.IsArray() && !reply.elements.empty() &&
          reply.elements[0].str == "message") {
        pushes_.push_back(std::move(reply));
        continue;
      }
      if (pending_.size() == unsent_) {
        failure = Internal(describe_ + ": protocol error: a reply arrived with no call waiting");
        break;
      }
      Call& call = pending_.front();
      if (call.kind == Kind::kHandshake) {
        if (reply.IsError()) {
          failure = Unavailable(describe_ + ": AUTH/SELECT failed: " + reply.str);
          break;
        }
      } else {
        readonly = readonly || reply.IsErrorWithPrefix("READONLY");
        if (call.cb) completions_.emplace_back(std::move(call.cb), std::move(reply));
      }
      pending_.pop_front();
    }
  }
  const bool got_replies = !replies_.empty();
  replies_.clear();
  for (size_t i = 0; i < completions_.size(); ++i) budget_->Release();
  RunCompletions();
  for (Reply& push : pushes_) (*on_push)(std::move(push));
  pushes_.clear();

  if (failure.ok() && !protocol_error.ok()) {
    failure = Internal(describe_ + ": " + protocol_error.message());
  }
  if (failure.ok() && readonly && options_.reconnect_on_readonly) {
    // A replica now: the name may lead to the new master (Options).
    const Clock::time_point now = Clock::now();
    if (now >= next_readonly_reconnect_) {
      next_readonly_reconnect_ = now + options_.reconnect_max_backoff;
      failure = Unavailable(describe_ + ": the node is a replica now (READONLY); reconnecting");
    }
  }
  if (!failure.ok()) {
    FailConnection(failure);
    return;
  }
  if (got_replies) backoff_ = options_.reconnect_min_backoff;
  StartRead(session);
}

void Connection::Flush() {
  std::shared_ptr<Session> session = session_;
  {
    LockGuard lock(mu_);
    flush_posted_ = false;
    if (state_ != State::kConnected || writing_ || out_.empty() || !session) return;
    session->write_buf.swap(out_);
    unsent_ = 0;
    writing_ = true;
  }
  WithStream(*session, [&](auto& stream) {
    asio::async_write(
        stream, asio::buffer(session->write_buf),
        [self = shared_from_this(), session](error_code ec, size_t) {
          if (session != self->session_) return;
          if (ec) {
            self->FailConnection(Unavailable(self->describe_ + ": write failed: " + ec.message()));
            return;
          }
          session->write_buf.clear();
          {
            LockGuard lock(self->mu_);
            self->writing_ = false;
          }
          self->Flush();
        });
  });
}

void Connection::ArmDeadlineTimer() {
  Clock::time_point at;
  {
    LockGuard lock(mu_);
    at = timer_at_;
  }
  if (at == Clock::time_point::max()) return;
  deadline_timer_.expires_at(at);
  deadline_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->OnDeadlineTimer();
  });
}

void Connection::OnDeadlineTimer() {
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  bool handshake_timed_out = false;
  bool frozen = false;
  std::chrono::milliseconds frozen_for{0};
  {
    LockGuard lock(mu_);
    const size_t sent = pending_.size() - unsent_;
    bool drop_unsent = false;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Call& call = pending_[i];
      if (call.kind == Kind::kHandshake) {
        if (call.deadline <= now) handshake_timed_out = true;
        next = std::min(next, call.deadline);
        continue;
      }
      if (!call.cb) continue;
      if (call.deadline > now) {
        next = std::min(next, call.deadline);
        continue;
      }
      std::string message = "redis call timed out after " + Millis(call.timeout);
      if (i < sent) {
        message += "; outcome unknown";
      } else {
        message += " before it was sent";
        drop_unsent = true;
      }
      completions_.emplace_back(std::move(call.cb), DeadlineExceeded(std::move(message)));
    }
    // A server that leaves the oldest sent call unanswered for its timeout
    // plus the configured command timeout (at least) is considered frozen:
    // reconnect rather than pile up more calls. Calls with a short timeout of
    // their own (what is left of a caller's deadline) do not make a busy
    // server look frozen.
    if (sent > 0) {
      const Call& oldest = pending_.front();
      const auto grace = std::max(oldest.timeout, options_.command_timeout);
      const Clock::time_point limit = oldest.deadline + grace;
      if (limit <= now) {
        frozen = true;
        frozen_for = oldest.timeout + grace;
      }
      next = std::min(next, limit);
    }
    if (drop_unsent) {
      // Calls never written are removed outright: their outcome is known (not run).
      const size_t first = sent;
      std::string kept;
      kept.reserve(out_.size());
      size_t offset = 0;
      size_t write = first;
      for (size_t i = first; i < pending_.size(); ++i) {
        Call& call = pending_[i];
        const size_t size = call.size;
        const bool keep =
            call.cb || call.kind == Kind::kHandshake ||
            (call.kind == Kind::kAsking && i + 1 < pending_.size() && pending_[i + 1].cb);
        if (keep) {
          kept.append(out_, offset, size);
          if (write != i) pending_[write] = std::move(call);
          ++write;
        }
        offset += size;
      }
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(write), pending_.end());
      unsent_ = write - first;
      out_.swap(kept);
    }
    timer_at_ = next;
  }
  for (size_t i = 0; i < completions_.size(); ++i) budget_->Release();
  RunCompletions();

  if (handshake_timed_out) {
    FailConnection(Unavailable(describe_ + ": AUTH/SELECT got no reply in time"));
  } else if (frozen) {
    FailConnection(
        Unavailable(describe_ + ": no reply for " + Millis(frozen_for) + "; reconnecting"));
  } else if (next != Clock::time_point::max()) {
    deadline_timer_.expires_at(next);
    deadline_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->OnDeadlineTimer();
    });
  }
}

void Connection::FailConnection(const Status& status) {
  if (session_) {
    error_code ignored;
    session_->socket().close(ignored);
    session_.reset();
  }
  connect_timer_.cancel();
  resolver_.cancel();
  deadline_timer_.cancel();
  std::deque<Call> failed;
  bool closed = false;
  std::shared_ptr<const PushHandler> on_push;
  {
    LockGuard lock(mu_);
    on_push = on_push_;
    failed.swap(pending_);
    out_.clear();
    unsent_ = 0;
    writing_ = false;
    flush_posted_ = false;
    timer_at_ = Clock::time_point::max();
    first_connect_ = false;
    last_error_ = status.message();
    closed = state_ == State::kClosed;
    if (!closed) state_ = State::kDisconnected;
  }
  connected_.store(false, std::memory_order_relaxed);
  for (Call& call : failed) {
    if (!call.cb) continue;
    budget_->Release();
    completions_.emplace_back(std::move(call.cb), status);
  }
  RunCompletions();
  if (on_push) (*on_push)(status);
  if (!closed) ScheduleReconnect();
}

void Connection::ScheduleReconnect() {
  thread_local std::minstd_rand rng(std::random_device{}());
  // Full backoff with jitter: uniform in [backoff/2, backoff].
  const auto base = std::chrono::duration_cast<std::chrono::microseconds>(backoff_);
  const auto delay = base / 2 + std::chrono::microseconds(rng() % (base.count() / 2 + 1));
  backoff_ = std::min(backoff_ * 2, options_.reconnect_max_backoff);
  connect_timer_.expires_after(delay);
  connect_timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec) return;
    {
      LockGuard lock(self->mu_);
      if (self->state_ != State::kDisconnected) return;
    }
    self->StartConnect();
  });
}

void Connection::RunCompletions() {
  // These calls complete together (the replies of one read, the calls a
  // deadline or a failure ends): whoever answers them may write its answers
  // once, as the batch ends (core/completion_batch.h).
  core::CompletionBatch batch;
  for (auto& [cb, result] : completions_) cb(std::move(result));
  completions_.clear();
}

}  // namespace ratelimit::redis
