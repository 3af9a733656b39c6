#include "redis/client.h"

#include <openssl/evp.h>

#include <array>
#include <future>

#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>

#include "core/hex.h"
#include "core/steady_clock.h"
#include "redis/command.h"

namespace ratelimit::redis {
namespace {

namespace asio = boost::asio;

// Up to 16 argument views on the stack, more on the heap.
class ArgViews {
 public:
  explicit ArgViews(size_t n) : size_(n) {
    if (n > inline_.size()) heap_.resize(n);
  }
  std::string_view& operator[](size_t i) { return size_ > inline_.size() ? heap_[i] : inline_[i]; }
  std::span<const std::string_view> span() const {
    return size_ > inline_.size() ? std::span<const std::string_view>(heap_)
                                  : std::span<const std::string_view>(inline_.data(), size_);
  }

 private:
  size_t size_;
  std::array<std::string_view, 16> inline_;
  std::vector<std::string_view> heap_;
};

// Null without TLS: an OpenSSL context costs ~0.3 ms to make (SSL_CTX_new;
// 3.5 ms for the first in a process), and a cluster makes a client per node,
// also when a node appears.
StatusOr<std::shared_ptr<asio::ssl::context>> MakeTlsContext(const Options& o) {
  if (!o.tls) return std::shared_ptr<asio::ssl::context>();
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  boost::system::error_code ec;
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                       asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                       asio::ssl::context::no_tlsv1_1,
                   ec);
  if (o.tls_verify) {
    if (o.tls_ca_file.empty()) {
      ctx->set_default_verify_paths(ec);
      if (ec)
        return InvalidArgument("redis TLS: cannot load the default CA store: " + ec.message());
    } else {
      ctx->load_verify_file(o.tls_ca_file, ec);
      if (ec) {
        return InvalidArgument("redis TLS: cannot load tls_ca_file '" + o.tls_ca_file +
                               "': " + ec.message());
      }
    }
  }
  if (!o.tls_cert_file.empty()) {
    ctx->use_certificate_chain_file(o.tls_cert_file, ec);
    if (ec) {
      return InvalidArgument("redis TLS: cannot load tls_cert_file '" + o.tls_cert_file +
                             "': " + ec.message());
    }
    ctx->use_private_key_file(o.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return InvalidArgument("redis TLS: cannot load tls_key_file '" + o.tls_key_file +
                             "': " + ec.message());
    }
  }
  return ctx;
}

Status ValidateOptions(const Options& o) {
  if (o.connections < 1) return InvalidArgument("redis options: connections must be >= 1");
  if (o.max_pending < 1) return InvalidArgument("redis options: max_pending must be >= 1");
  if (o.command_timeout.count() <= 0 || o.connect_timeout.count() <= 0) {
    return InvalidArgument("redis options: timeouts must be > 0");
  }
  if (o.reconnect_min_backoff.count() <= 0 || o.reconnect_max_backoff < o.reconnect_min_backoff) {
    return InvalidArgument(
        "redis options: need 0 < reconnect_min_backoff <= reconnect_max_backoff");
  }
  return Status::Ok();
}

// State of one EvalScript call, kept for the NOSCRIPT retry.
struct EvalCall {
  const Script* script;
  std::string evalsha;  // the encoded EVALSHA command
  // The caller's deadline for the whole call: the SCRIPT LOAD and the retry
  // after a NOSCRIPT share it (each with a fresh timeout, a call could take
  // three times as long as asked).
  core::SteadyClock::time_point deadline;
  std::chrono::milliseconds timeout;
  std::weak_ptr<Connection> connection;  // weak: the call sits in that connection's FIFO
  Callback cb;
  bool asking;  // send ASKING first (cluster -ASK redirection)
  // EvalScriptWithUndo: the encoded undo ("": none), and the client's other
  // connections, for when the script's is gone.
  std::string undo;
  std::vector<std::weak_ptr<Connection>> others;

  // Before the next step (`step`, for the status): the connection and what is
  // left of the deadline, or the call fails (closed, or no time left).
  std::shared_ptr<Connection> Next(std::string_view step, std::chrono::milliseconds* left) {
    std::shared_ptr<Connection> conn = connection.lock();
    if (!conn) {
      cb(Unavailable("redis client closed"));
      return nullptr;
    }
    const auto rest = deadline - core::SteadyClock::now();
    if (rest <= core::SteadyClock::duration::zero()) {
      cb(DeadlineExceeded("redis call timed out after " + std::to_string(timeout.count()) +
                          " ms (" + std::string(step) + ")"));
      return nullptr;
    }
    *left = std::chrono::ceil<std::chrono::milliseconds>(rest);
    return conn;
  }

  // The EVALSHA failed without a reply: the undo goes out now, behind it on
  // its connection if that is still up (Redis then runs it after the script
  // if it runs the script at all), else on another one.
  void Undo(const StatusOr<Reply>& r) {
    if (undo.empty() || r.ok() || r.status().code() == StatusCode::kResourceExhausted) return;
    std::shared_ptr<Connection> conn = connection.lock();
    if (conn && !conn->IsConnected()) conn = nullptr;
    for (size_t i = 0; !conn && i < others.size(); ++i) {
      conn = others[i].lock();
      if (conn && !conn->IsConnected()) conn = nullptr;
    }
    if (conn)
      conn->ExecuteEncoded(
          undo, [](StatusOr<Reply>) {}, timeout);
  }

  void Send(Connection& c, Callback done, std::chrono::milliseconds within) {
    if (asking) {
      c.ExecuteAsking(evalsha, std::move(done), within);
    } else {
      c.ExecuteEncoded(evalsha, std::move(done), within);
    }
  }
};

}  // namespace

Status CheckTlsFiles(const Options& options) { return MakeTlsContext(options).status(); }

std::string Sha1Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha1(), nullptr);
  return core::Hex(std::span<const unsigned char>(digest, len));
}

Script Script::Create(std::string source) {
  std::string sha1 = Sha1Hex(source);
  return Script{std::move(source), std::move(sha1)};
}

Client::Client(asio::any_io_executor executor, Options options)
    : options_(std::move(options)),
      executor_(std::move(executor)),
      budget_(std::make_shared<PendingBudget>(std::max(options_.max_pending, 1))) {
  init_status_ = ValidateOptions(options_);
  if (!init_status_.ok()) return;
  StatusOr<std::shared_ptr<asio::ssl::context>> tls = MakeTlsContext(options_);
  if (!tls.ok()) {
    init_status_ = tls.status();
    return;
  }
  for (int i = 0; i < options_.connections; ++i) {
    connections_.push_back(Connection::Create(executor_, options_, *tls, budget_));
    connections_.back()->Start();
  }
}

StatusOr<std::unique_ptr<Client>> Client::Create(asio::any_io_executor executor, Options options) {
  auto client = std::make_unique<Client>(std::move(executor), std::move(options));
  if (!client->init_status().ok()) return client->init_status();
  return client;
}

Client::~Client() { Close(); }

std::string Client::Describe(int) const { return "redis " + RedactedUrl(); }
std::string Client::RedactedUrl() const { return redis::RedactedUrl(options_); }

void Client::Close() {
  for (auto& c : connections_) c->Close();
}

void Client::OnPush(const Connection::PushHandler& on_push) {
  for (auto& c : connections_) c->OnPush(on_push);
}

Connection& Client::Pick() {
  const size_t n = connections_.size();
  const size_t start = next_.fetch_add(1, std::memory_order_relaxed) % n;
  for (size_t i = 0; i < n; ++i) {
    Connection& c = *connections_[(start + i) % n];
    if (c.IsConnected()) return c;
  }
  return *connections_[start];  // none connected: it queues (first connect) or fails fast
}

void Client::Execute(std::span<const std::string_view> args, Callback cb,
                     std::chrono::milliseconds timeout) {
  if (!init_status_.ok()) {
    asio::post(executor_, [cb = std::move(cb), s = init_status_]() mutable { cb(s); });
    return;
  }
  Pick().Execute(args, std::move(cb), timeout);
}

void Client::Execute(std::span<const std::string_view> args, Callback cb) {
  Execute(args, std::move(cb), options_.command_timeout);
}

void Client::Execute(std::initializer_list<std::string_view> args, Callback cb) {
  Execute(std::span<const std::string_view>(args.begin(), args.size()), std::move(cb),
          options_.command_timeout);
}

void Client::Execute(const std::vector<std::string>& args, Callback cb) {
  ArgViews views(args.size());
  for (size_t i = 0; i < args.size(); ++i) views[i] = args[i];
  Execute(views.span(), std::move(cb), options_.command_timeout);
}

StatusOr<Reply> Client::ExecuteSync(std::initializer_list<std::string_view> args) {
  return ExecuteSync(std::span<const std::string_view>(args.begin(), args.size()));
}

StatusOr<Reply> Client::ExecuteSync(std::span<const std::string_view> args) {
  std::promise<StatusOr<Reply>> promise;
  std::future<StatusOr<Reply>> future = promise.get_future();
  Execute(args, [&promise](StatusOr<Reply> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void Client::EvalScript(const Script& script, std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, Callback cb) {
  EvalScript(script, keys, args, std::move(cb), options_.command_timeout);
}

void Client::EvalScript(const Script& script, std::span<const std::string_view> keys,
                        std::span<const std::string_view> args, Callback cb,
                        std::chrono::milliseconds timeout) {
  Eval(script, keys, args, std::move(cb), timeout, /*asking=*/false);
}

void Client::EvalScriptWithUndo(const Script& script, std::span<const std::string_view> keys,
                                std::span<const std::string_view> args,
                                std::span<const std::string_view> undo, Callback cb,
                                std::chrono::milliseconds timeout) {
  Eval(script, keys, args, std::move(cb), timeout, /*asking=*/false, undo);
}

void Client::EvalScriptAsking(const Script& script, std::span<const std::string_view> keys,
                              std::span<const std::string_view> args, Callback cb,
                              std::chrono::milliseconds timeout,
                              std::span<const std::string_view> undo) {
  Eval(script, keys, args, std::move(cb), timeout, /*asking=*/true, undo);
}

void Client::ExecuteAsking(std::span<const std::string_view> args, Callback cb,
                           std::chrono::milliseconds timeout) {
  if (!init_status_.ok()) {
    asio::post(executor_, [cb = std::move(cb), s = init_status_]() mutable { cb(s); });
    return;
  }
  Pick().ExecuteAsking(EncodeCommand(args), std::move(cb), timeout);
}

void Client::Eval(const Script& script, std::span<const std::string_view> keys,
                  std::span<const std::string_view> args, Callback cb,
                  std::chrono::milliseconds timeout, bool asking,
                  std::span<const std::string_view> undo) {
  if (!init_status_.ok()) {
    asio::post(executor_, [cb = std::move(cb), s = init_status_]() mutable { cb(s); });
    return;
  }
  const std::string numkeys = std::to_string(keys.size());
  ArgViews views(3 + keys.size() + args.size());
  size_t n = 0;
  views[n++] = "EVALSHA";
  views[n++] = script.sha1;
  views[n++] = numkeys;
  for (std::string_view k : keys) views[n++] = k;
  for (std::string_view a : args) views[n++] = a;

  Connection& connection = Pick();
  auto call = std::make_unique<EvalCall>(
      EvalCall{&script, EncodeCommand(views.span()), core::SteadyClock::now() + timeout, timeout,
               connection.shared_from_this(), std::move(cb), asking});
  if (!undo.empty()) {
    call->undo = EncodeCommand(undo);
    call->others.assign(connections_.begin(), connections_.end());
  }
  EvalCall& first = *call;
  first.Send(
      connection,
      [call = std::move(call)](StatusOr<Reply> r) mutable {
        if (!r.ok() || !r->IsErrorWithPrefix("NOSCRIPT")) {
          call->Undo(r);
          call->cb(std::move(r));
          return;
        }
        // The script cache was emptied (restart, failover, SCRIPT FLUSH): load, retry once.
        std::chrono::milliseconds left{};
        std::shared_ptr<Connection> conn = call->Next("NOSCRIPT, no time left to load it", &left);
        if (!conn) return;
        std::string_view load[] = {"SCRIPT", "LOAD", call->script->source};
        conn->Execute(
            load,
            [call = std::move(call)](StatusOr<Reply> loaded) mutable {
              if (!loaded.ok() || loaded->IsError()) {
                call->cb(std::move(loaded));  // e.g. a Lua compile error reply
                return;
              }
              std::chrono::milliseconds left{};
              std::shared_ptr<Connection> conn =
                  call->Next("the script loaded, no time left to run it", &left);
              if (!conn) return;
              EvalCall& retry = *call;
              retry.Send(
                  *conn,
                  [call = std::move(call)](StatusOr<Reply> r) mutable {
                    call->Undo(r);
                    call->cb(std::move(r));
                  },
                  left);
            },
            left);
      },
      timeout);
}

}  // namespace ratelimit::redis
