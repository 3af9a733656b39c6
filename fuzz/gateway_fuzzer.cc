// gateway_fuzzer: the gateway face end to end. A client's raw HTTP/1.1
// request goes through Beast's request parser (the session's limits) ->
// Router (public listener with a Gateway) -> the rules on a MemoryStore ->
// Gateway::Forward over a real loopback TCP connection to an in-process
// upstream, which checks the request it received and answers with bytes
// from the input -> the gateway's response parsing and header filtering ->
// the Reply the session would write.
//
// Input: one selector byte (bits 0-1: the TCP peer, as in http_fuzzer.cc),
// the client's bytes, then optionally kSplit and the upstream's answer
// (default: a short 200). The upstream closes after answering, so an
// incomplete answer ends in EOF, never in a wait.
//
// Invariants:
//   - each request is answered exactly once, within a few seconds;
//   - the forwarded request parses, keeps method, target and body, carries
//     no hop-by-hop header nor Expect and ends X-Forwarded-For with the
//     peer's address;
//   - if the upstream's bytes are a complete response (parsed here with the
//     gateway's limits) after at most 16 interim (1xx but 101) ones, the
//     reply has its status and (but for HEAD) body,
//     the body streamed whole, and no header with CR, LF or NUL; otherwise
//     either the head was good and the streamed body fails midway, or the
//     reply is the gateway's own (502, CheckReply's invariants), as is every
//     reply from the rules.
// A fresh Gateway per input (no idle connection survives an input); one
// io_context and one listening socket per process.
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/ascii.h"
#include "fuzz/server_fixture.h"
#include "fuzz/targets.h"
#include "server/gateway.h"
#include "server/http.h"
#include "server/session.h"

namespace ratelimit::fuzz {
namespace {

namespace http = server::http;
namespace net = server::net;
namespace beast = server::beast;
using server::tcp;

constexpr std::string_view kSplit = "|UPSTREAM|";
constexpr std::string_view kDefaultAnswer =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";

constexpr std::string_view kGatewayConfig = R"(
server:
  headers: draft06
store:
  type: memory
  max_keys: 64
  max_key_length: 256
  failure_mode: open
clients:
  api_key_header: X-API-Key
  trusted_proxies: [10.0.0.0/8]
limits:
  burst: {algorithm: token_bucket, capacity: 3, refill_per_second: 1}
global: [burst]
routes:
  - name: login
    methods: [POST]
    path: /login
    match: exact
    key_by: ip
    limits:
      - {name: login, algorithm: sliding_log, limit: 1, window: 15m}
  - name: items
    path: "/api/items/{id}"
    match: template
    limits: []
)";

constexpr std::array<std::string_view, 4> kPeers = {"10.0.0.1", "203.0.113.7", "::1",
                                                    "2001:db8::7"};

// The upstream's view of one exchange.
struct Exchange {
  const server::Request* sent = nullptr;  // the client's request
  std::string_view peer;
  std::string_view answer;  // the upstream's bytes
  bool received = false;    // the upstream read a whole request
};

bool IsHopByHop(std::string_view name) {
  for (std::string_view n : {"connection", "keep-alive", "te", "trailer", "transfer-encoding",
                             "upgrade", "proxy-authorization", "proxy-connection"}) {
    if (server::EqualsIgnoreCase(name, n)) return true;
  }
  return false;
}

// Checks what the upstream received against what the client sent.
void CheckForwarded(const server::Request& up, const Exchange& ex) {
  const server::Request& in = *ex.sent;
  const std::string what = std::string(in.method_string()) + " " + std::string(in.target());
  RL_FUZZ_CHECK(up.method_string() == in.method_string(),
                what + " became " + std::string(up.method_string()));
  RL_FUZZ_CHECK(up.target() == in.target(), what + " became " + std::string(up.target()));
  RL_FUZZ_CHECK(up.body() == in.body(), what + ": body changed");
  for (const auto& f : up.base()) {
    // Transfer-Encoding never: the gateway sends the whole body with a Content-Length.
    RL_FUZZ_CHECK(!IsHopByHop(f.name_string()),
                  what + ": forwarded " + std::string(f.name_string()));
    // The session answered 100-continue and holds the body.
    RL_FUZZ_CHECK(!server::EqualsIgnoreCase(f.name_string(), "expect"),
                  what + ": forwarded Expect");
  }
  const std::string_view xff = up["X-Forwarded-For"];
  RL_FUZZ_CHECK(
      xff.ends_with(ex.peer) && (xff.size() == ex.peer.size() ||
                                 xff.substr(0, xff.size() - ex.peer.size()).ends_with(", ")),
      what + ": X-Forwarded-For " + std::string(xff));
}

// One upstream connection: read a request, check it, write the answer, close.
struct UpstreamConn : std::enable_shared_from_this<UpstreamConn> {
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  Exchange& ex;

  UpstreamConn(tcp::socket s, Exchange& e) : stream(std::move(s)), ex(e) {
    parser.header_limit(1 << 20);
    parser.body_limit(1 << 20);
  }
  void Start() {
    stream.expires_after(std::chrono::seconds(2));
    http::async_read(
        stream, buffer, parser, [self = shared_from_this()](beast::error_code ec, size_t) {
          // The gateway's own bytes must parse (it may also give up first).
          RL_FUZZ_CHECK(!ec || ec == beast::error::timeout || ec == http::error::end_of_stream ||
                            ec == net::error::connection_reset ||
                            ec == net::error::operation_aborted,
                        "upstream could not parse the forwarded request: " + ec.message());
          if (ec) return;
          self->ex.received = true;
          CheckForwarded(self->parser.get(), self->ex);
          net::async_write(self->stream, net::buffer(self->ex.answer),
                           [self](beast::error_code, size_t) {
                             beast::error_code ignored;
                             self->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
                             self->stream.close();
                           });
        });
  }
};

struct Upstream {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)};
  std::string url = "http://127.0.0.1:" + std::to_string(acceptor.local_endpoint().port());

  void Accept(Exchange& ex) {
    acceptor.async_accept([this, &ex](beast::error_code ec, tcp::socket s) {
      if (ec) return;
      std::make_shared<UpstreamConn>(std::move(s), ex)->Start();
      Accept(ex);
    });
  }
};

// The response the gateway should have read from `answer` (nullopt: it must
// fail): the first final one, after interim (1xx) ones; a 101, or a 17th
// interim one, fails.
std::optional<http::response<http::string_body>> Expected(std::string_view answer, bool head) {
  for (int interim = 0;; ++interim) {
    http::response_parser<http::string_body> p;
    p.header_limit(64 * 1024);
    p.body_limit(8 * 1024 * 1024);  // the gateway streams any size; inputs are far smaller
    if (head) p.skip(true);
    p.eager(true);
    const beast::error_code ec = FeedAndClose(p, answer);  // the upstream closes after answering
    if (ec || !p.is_done()) return std::nullopt;
    const unsigned status = p.get().result_int();
    if (status / 100 != 1) return p.release();
    if (status == 101 || interim == 16) return std::nullopt;
  }
}

}  // namespace

int FuzzGateway(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const policy::Policy> kPolicy = CompilePolicy(kGatewayConfig);
  static Upstream* upstream = new Upstream();  // lives as long as the process
  if (size == 0) return 0;
  const std::string_view peer_text = kPeers[data[0] & 3];
  const policy::IpAddress peer = *policy::IpAddress::Parse(peer_text);
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string_view answer = kDefaultAnswer;
  if (const size_t split = in.find(kSplit); split != std::string_view::npos) {
    answer = in.substr(split + kSplit.size());
    in = in.substr(0, split);
  }

  const server::SessionLimits limits;
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  parser.body_limit(limits.max_body_bytes);
  parser.eager(true);
  const beast::error_code ec = FeedAndClose(parser, in);
  if (ec || !parser.is_done()) return 0;  // the session answers 400/413/431
  const server::Request req = parser.release();

  ServerFixture f(kPolicy);
  StatusOr<std::unique_ptr<server::Gateway>> gateway =
      server::Gateway::Create(upstream->ioc, upstream->url,
                              server::GatewayOptions{.connect_timeout = std::chrono::seconds(2),
                                                     .timeout = std::chrono::seconds(2)});
  RL_FUZZ_CHECK(gateway.ok(), gateway.status().ToString());
  server::Router router(f.holder(), f.enforcer(), gateway->get(), /*demo=*/false);

  Exchange ex{.sent = &req, .peer = peer_text, .answer = answer};
  upstream->ioc.restart();
  upstream->Accept(ex);
  int answers = 0;
  server::Reply reply;
  router.Handle(req, peer, peer_text, [&](server::Reply r) {
    ++answers;
    reply = std::move(r);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (answers == 0 && std::chrono::steady_clock::now() < deadline) {
    upstream->ioc.run_one_for(std::chrono::milliseconds(100));
  }
  const std::string what = std::string(req.method_string()) + " " + std::string(req.target());
  RL_FUZZ_CHECK(answers == 1, what + ": answered " + std::to_string(answers) + " times");

  // A streamed body: pulled the way the session pulls it, one piece at a time.
  const bool streamed = reply.body_stream != nullptr;
  bool stream_ok = true;
  if (streamed) {
    std::string body;
    for (bool last = false; !last && stream_ok;) {
      bool got = false;
      reply.body_stream->Next([&](bool ok, std::string_view piece, bool is_last) {
        got = true;
        stream_ok = ok;
        body.append(piece);
        last = is_last;
      });
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
      while (!got && std::chrono::steady_clock::now() < until) {
        upstream->ioc.run_one_for(std::chrono::milliseconds(100));
      }
      RL_FUZZ_CHECK(got, what + ": a body piece never came");
    }
    reply.body_stream.reset();
    reply.body = std::move(body);
  }

  // Let the upstream side finish, then drop everything of this input.
  (*gateway)->CloseIdle();
  upstream->acceptor.cancel();
  upstream->ioc.run_for(std::chrono::seconds(3));
  RL_FUZZ_CHECK(upstream->ioc.stopped(), what + ": upstream work left after 3 s");
  RL_FUZZ_CHECK(answers == 1, what + ": answered again");

  // The gateway reads the method as its upstreams do, case-insensitively
  // ("hEAD" is a HEAD: its answer has no body), so the model does too.
  const bool head =
      req.method() == http::verb::head ||
      (req.method() == http::verb::unknown && core::AsciiUpper(req.method_string()) == "HEAD");
  const auto expected = ex.received ? Expected(answer, head) : std::nullopt;
  if (expected) {
    // The upstream's answer, passed through: its status and body, clean headers.
    RL_FUZZ_CHECK(reply.status == expected->result_int(),
                  what + ": upstream said " + std::to_string(expected->result_int()) + ", reply " +
                      std::to_string(reply.status));
    RL_FUZZ_CHECK(stream_ok, what + ": the body failed midway");
    RL_FUZZ_CHECK(reply.body == expected->body(), what + ": body changed");
    for (const auto& [name, value] : reply.headers) {
      RL_FUZZ_CHECK(!name.empty() && !IsHopByHop(name), what + ": header " + name);
      for (char c : name) RL_FUZZ_CHECK(IsTokenChar(c), what + ": header name " + name);
      RL_FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos,
                    what + ": header " + name + ": " + value);
    }
  } else if (streamed && !stream_ok) {
    // The head was good and the body was not: the session cuts the client's
    // connection (the status is already sent), nothing else to check.
  } else {
    CheckReply(reply, what);
    if (ex.received) RL_FUZZ_CHECK(reply.status == 502, what + ": " + std::to_string(reply.status));
  }
  return 0;
}

}  // namespace ratelimit::fuzz
