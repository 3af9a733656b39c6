#include "server/gateway.h"

#include <boost/beast/core/string.hpp>

#include "server/json_log.h"
#include "server/problem.h"

namespace ratelimit::server {
namespace {

bool IsHopByHop(std::string_view name) {
  static constexpr std::string_view kNames[] = {"connection", "keep-alive",        "te",
                                                "trailer",    "transfer-encoding", "upgrade"};
  for (std::string_view n : kNames) {
    if (EqualsIgnoreCase(name, n)) return true;
  }
  return name.size() >= 6 && EqualsIgnoreCase(name.substr(0, 6), "proxy-");
}

}  // namespace

void RemoveHopByHop(http::fields& fields) {
  // Headers named in Connection ("Connection: close, X-Foo") are hop-by-hop too.
  std::vector<std::string> named;
  for (auto it = fields.find(http::field::connection);
       it != fields.end() && it->name() == http::field::connection; ++it) {
    std::string_view v = it->value();
    while (!v.empty()) {
      const size_t comma = v.find(',');
      std::string_view token = v.substr(0, comma);
      while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
        token.remove_prefix(1);
      while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
        token.remove_suffix(1);
      if (!token.empty()) named.emplace_back(token);
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
    }
  }
  for (const std::string& n : named) fields.erase(n);
  for (auto it = fields.begin(); it != fields.end();) {
    if (IsHopByHop(it->name_string())) {
      it = fields.erase(it);
    } else {
      ++it;
    }
  }
}

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

std::unique_ptr<beast::tcp_stream> Gateway::TakeIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.empty()) return nullptr;
  auto s = std::move(idle_.back());
  idle_.pop_back();
  return s;
}

void Gateway::CloseIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.clear();
}

void Gateway::GiveBack(std::unique_ptr<beast::tcp_stream> stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < options_.max_idle) idle_.push_back(std::move(stream));
}

struct Gateway::Op : std::enable_shared_from_this<Gateway::Op> {
  Gateway& gw;
  Request up;
  std::function<void(Reply)> done;
  std::unique_ptr<beast::tcp_stream> stream;
  bool reused = false;
  bool retried = false;
  bool head = false;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> parser;

  Op(Gateway& g, Request r, std::function<void(Reply)> d)
      : gw(g), up(std::move(r)), done(std::move(d)) {}
  ~Op() { gw.active_.fetch_sub(1, std::memory_order_relaxed); }

  void Start() {
    stream = gw.TakeIdle();
    reused = stream != nullptr;
    if (reused) return Send();
    Connect();
  }

  void Connect() {
    stream = std::make_unique<beast::tcp_stream>(net::make_strand(gw.ioc_));
    stream->expires_after(gw.options_.connect_timeout);
    stream->async_connect(gw.endpoints_,
                          [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                            if (ec == beast::error::timeout)
                              return self->Fail(504, "upstream connect timed out");
                            if (ec) return self->Fail(502, "upstream unreachable: " + ec.message());
                            beast::error_code ignored;
                            self->stream->socket().set_option(tcp::no_delay(true), ignored);
                            self->Send();
                          });
  }

  void Send() {
    stream->expires_after(gw.options_.timeout);
    http::async_write(*stream, up, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->RetryOr(502, "upstream write failed: " + ec.message(), ec);
      self->Read();
    });
  }

  void Read() {
    buffer.clear();
    parser.emplace();
    parser->body_limit(gw.options_.max_response_body);
    parser->header_limit(64 * 1024);
    if (head) parser->skip(true);
    http::async_read(
        *stream, buffer, *parser, [self = shared_from_this()](beast::error_code ec, size_t n) {
          if (!ec) return self->Respond();
          if (ec == beast::error::timeout)
            return self->Fail(504, "upstream did not answer in time");
          if (ec == http::error::body_limit) {
            return self->Fail(502, "upstream response body exceeds " +
                                       std::to_string(self->gw.options_.max_response_body) +
                                       " bytes");
          }
          if (n == 0)
            return self->RetryOr(502, "upstream closed the connection: " + ec.message(), ec);
          self->Fail(502, "bad upstream response: " + ec.message());
        });
  }

  void RetryOr(unsigned status, std::string detail, beast::error_code) {
    if (reused && !retried) {
      retried = true;
      reused = false;
      beast::error_code ignored;
      stream->socket().close(ignored);
      return Connect();
    }
    Fail(status, std::move(detail));
  }

  void Respond() {
    auto& res = parser->get();
    Reply r;
    r.status = res.result_int();
    const bool keep = res.keep_alive() && !parser->need_eof();
    RemoveHopByHop(res.base());
    r.headers.reserve(16);
    for (const auto& f : res.base()) {
      if (f.name() == http::field::content_length && !head) continue;  // recomputed
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    }
    r.keep_content_length = head;
    r.body = std::move(res.body());
    if (keep) {
      stream->expires_never();
      gw.GiveBack(std::move(stream));
    }
    Finish(std::move(r));
  }

  void Fail(unsigned status, std::string detail) {
    Log(Level::kWarn, "upstream error",
        {{"status", status}, {"detail", detail}, {"upstream", gw.url_}});
    Reply r = ProblemReply(status, detail, std::string_view(up.target()));
    Finish(std::move(r));
  }

  void Finish(Reply r) {
    auto cb = std::move(done);
    if (cb) cb(std::move(r));
  }
};

void Gateway::Forward(const Request& request, std::string_view peer_ip,
                      std::function<void(Reply)> done) {
  if (active_.fetch_add(1, std::memory_order_relaxed) >= options_.max_active) {
    active_.fetch_sub(1, std::memory_order_relaxed);
    return done(ProblemReply(503, "too many concurrent upstream requests", request.target()));
  }
  Request up;
  // An extension method ("PURGE", "!GET": any token) is verb::unknown, which
  // method() rejects with an exception: copy its text instead.
  if (request.method() == http::verb::unknown) {
    up.method_string(request.method_string());
  } else {
    up.method(request.method());
  }
  up.target(request.target());
  up.version(11);
  std::string xff;
  for (const auto& f : request.base()) {
    if (EqualsIgnoreCase(f.name_string(), "X-Forwarded-For")) {
      if (!xff.empty()) xff += ", ";
      xff.append(f.value());
      continue;
    }
    if (f.name() == http::field::content_length) continue;  // recomputed
    up.insert(f.name_string(), f.value());
  }
  RemoveHopByHop(up.base());  // reads up's copy of Connection first
  if (!xff.empty()) xff += ", ";
  xff.append(peer_ip);
  up.set("X-Forwarded-For", xff);
  up.body() = request.body();
  up.keep_alive(true);
  up.prepare_payload();
  auto op = std::make_shared<Op>(*this, std::move(up), std::move(done));
  op->head = request.method() == http::verb::head;
  op->Start();
}

}  // namespace ratelimit::server
