// The gateway's upstream connections: which exchange gets a pooled
// connection, which gets a new one, and what a client sees when the pool's
// bounds are reached. The pool's own arithmetic is upstream_pool_test.cc
// (no sockets); here Gateway::Forward talks to a loopback upstream, as the
// thing under test is when a real connection may be reused. The upstream is
// a few blocking threads that count the connections they accepted.
#include "server/gateway.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/ascii.h"
#include "ratelimit/thread_annotations.h"
#include "server/http.h"
#include "server/reply.h"

namespace ratelimit::server {
namespace {

// A loopback HTTP/1.1 upstream; every answer's body is the request target.
class FakeUpstream {
 public:
  enum class Mode {
    kKeepAlive,        // answers and keeps the connection
    kClose,            // answers with Connection: close, then closes
    kDropAfterAnswer,  // answers as keep-alive, then closes anyway (an idle timeout)
    kHang,             // reads the request, never answers
    kEcho,             // keep-alive; the body is the request as it arrived (ShowRequest)
    kEchoLate,         // kEcho, reading each connection's first request 200 ms late
    kSlow,             // keep-alive; answers each request 100 ms after it arrived
    kStallBody,        // announces 100 bytes of body, sends 10, then nothing
    kTrickledHead,     // a head of `fields` 200-byte fields and one more, 1 ms apart
    kInterim,          // kEcho, after a 100 Continue and a 103 Early Hints
    kSwitch,           // answers 101 Switching Protocols, then keeps the connection
    kDropSecond,       // answers a connection's first request; reads the second, closes
    kHeadBody,         // kKeepAlive, but a HEAD answer is followed 50 ms later by kStray
    kOverlong,         // kKeepAlive, each answer followed by padding and kStray, one write
  };
  // What a faulty upstream sends beyond an answer: read as the next request's
  // answer, another client gets it.
  static constexpr std::string_view kStray =
      "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\nsomeone-else's!";

  explicit FakeUpstream(Mode mode, int fields = 0)
      : mode_(mode),
        fields_(fields),
        acceptor_(ioc_, tcp::endpoint(net::ip::address_v4::loopback(), 0)) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeUpstream() {
    stopping_ = true;
    {
      tcp::socket wake(ioc_);  // unblocks accept()
      beast::error_code ec;
      wake.connect(acceptor_.local_endpoint(), ec);
    }
    accept_thread_.join();
    {
      LockGuard lock(mu_);
      for (const auto& s : open_) ::shutdown(s->native_handle(), SHUT_RDWR);  // unblocks reads
    }
    for (auto& t : conn_threads_) t.join();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  int connections() const { return connections_.load(); }
  int closed_by_client() const { return closed_by_client_.load(); }
  int closed_by_server() const { return closed_by_server_.load(); }
  int requests() const { return requests_.load(); }

 private:
  void AcceptLoop() {
    for (;;) {
      beast::error_code ec;
      tcp::socket s = acceptor_.accept(ec);
      if (stopping_ || ec) return;
      connections_.fetch_add(1);
      auto sock = std::make_shared<tcp::socket>(std::move(s));
      {
        LockGuard lock(mu_);
        open_.push_back(sock);  // closed (destroyed) only at the end: no fd is reused meanwhile
      }
      conn_threads_.emplace_back([this, sock] { Serve(*sock); });
    }
  }

  // "METHOD target", each field as "Name: value" in the order it came, then
  // the body after an empty line.
  static std::string ShowRequest(const Request& req) {
    std::string out = std::string(req.method_string()) + " " + std::string(req.target()) + "\n";
    for (const auto& f : req.base())
      out += std::string(f.name_string()) + ": " + std::string(f.value()) + "\n";
    return out + "\n" + req.body();
  }

  void Serve(tcp::socket& s) {
    beast::flat_buffer buf;
    if (mode_ == Mode::kEchoLate) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int n = 1;; ++n) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(64 * 1024 * 1024);  // the big request's test sends 16 MB
      beast::error_code ec;
      http::read(s, buf, parser, ec);
      const Request req = parser.release();
      if (ec) {
        if (!stopping_ && ec == http::error::end_of_stream) closed_by_client_.fetch_add(1);
        return;
      }
      requests_.fetch_add(1);
      if (mode_ == Mode::kDropSecond && n == 2) {  // took the request, then went away
        s.shutdown(tcp::socket::shutdown_both, ec);
        closed_by_server_.fetch_add(1);
        return;
      }
      if (mode_ == Mode::kHang) continue;  // the next read blocks until the end
      if (mode_ == Mode::kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (mode_ == Mode::kStallBody) {
        net::write(s,
                   net::buffer(std::string("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n") +
                               std::string(10, 'x')),
                   ec);
        continue;  // the next read blocks until the end
      }
      if (mode_ == Mode::kTrickledHead) {
        // Each piece ends one byte into the next field and is smaller than
        // Beast's smallest read: Beast then takes every field but that byte at
        // once, and its header limit never sees more than a piece.
        s.set_option(tcp::no_delay(true), ec);
        net::write(s, net::buffer(std::string("HTTP/1.1 200 OK\r\nX")), ec);
        for (int i = 0; i < fields_ && !ec; ++i) {
          net::write(s,
                     net::buffer("-F" + std::to_string(i) + ": " + std::string(190, 'v') + "\r\nX"),
                     ec);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        net::write(s, net::buffer(std::string("-Last: 1\r\nContent-Length: 2\r\n\r\nok")), ec);
        continue;
      }
      if (mode_ == Mode::kSwitch) {
        net::write(s,
                   net::buffer(std::string("HTTP/1.1 101 Switching Protocols\r\n"
                                           "Connection: upgrade\r\nUpgrade: x\r\n\r\n")),
                   ec);
        continue;
      }
      if (mode_ == Mode::kInterim) {  // the final answer follows in a write of its own
        net::write(s,
                   net::buffer(std::string("HTTP/1.1 100 Continue\r\n\r\n"
                                           "HTTP/1.1 103 Early Hints\r\n"
                                           "Link: </s.css>; rel=preload\r\n\r\n")),
                   ec);
      }
      const std::string body =
          mode_ == Mode::kEcho || mode_ == Mode::kEchoLate || mode_ == Mode::kInterim
              ? ShowRequest(req)
              : std::string(req.target());
      // As Werkzeug: the method upper-cased ("head" is a HEAD). (Not
      // Beast's iequals: Boost 1.74's reads one byte past its first argument
      // when the two differ in case, caught by ASan here.)
      const bool head = core::EqualsIgnoreCase(req.method_string(), "HEAD");
      std::string out = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\n" + (mode_ == Mode::kClose ? "Connection: close\r\n" : "") + "\r\n" +
                        (head ? "" : body);
      if (mode_ == Mode::kOverlong) {
        // Padding, then kStray where Beast's first read of a response (512
        // bytes) ends: the padding is read with the answer, kStray stays in
        // the socket, where the next request on the connection would find it.
        const size_t pad_head =
            std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 000\r\n\r\n").size();
        const size_t pad = 512 - out.size() - pad_head;
        out += "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(pad) + "\r\n\r\n" +
               std::string(pad, 'p');
        out += kStray;
      }
      net::write(s, net::buffer(out), ec);
      if (mode_ == Mode::kHeadBody && head && !ec) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        net::write(s, net::buffer(kStray), ec);
      }
      if (ec || mode_ == Mode::kClose || mode_ == Mode::kDropAfterAnswer) {
        s.shutdown(tcp::socket::shutdown_both, ec);
        closed_by_server_.fetch_add(1);
        return;
      }
    }
  }

  const Mode mode_;
  const int fields_;
  net::io_context ioc_;  // for the blocking sockets only: never run
  tcp::acceptor acceptor_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> closed_by_client_{0};
  std::atomic<int> closed_by_server_{0};
  std::atomic<int> requests_{0};
  std::thread accept_thread_;
  std::vector<std::thread> conn_threads_;  // the accept thread's; joined after it
  Mutex mu_;
  std::vector<std::shared_ptr<tcp::socket>> open_ RL_GUARDED_BY(mu_);
};

struct Got {
  unsigned status = 0;
  std::string body;
  bool body_ok = true;
  size_t fields = 0;  // header fields in the reply
  std::string retry_after;
};

// Pulls a streamed body to its end (the connection goes back to the pool
// only then), then hands over what arrived.
class Drainer : public std::enable_shared_from_this<Drainer> {
 public:
  Drainer(Reply r, std::promise<Got>* out) : stream_(std::move(r.body_stream)), out_(out) {
    got_.status = r.status;
    got_.fields = r.headers.size();
  }
  void Pull() {
    stream_->Next([self = shared_from_this()](bool ok, std::string_view piece, bool last) {
      self->got_.body.append(piece);
      if (!ok || last) {
        self->got_.body_ok = ok;
        return self->out_->set_value(self->got_);
      }
      self->Pull();
    });
  }

 private:
  std::shared_ptr<BodyStream> stream_;
  std::promise<Got>* out_;
  Got got_;
};

class GatewayTest : public ::testing::Test {
 protected:
  GatewayTest() : work_(net::make_work_guard(ioc_)) {
    io_ = std::thread([this] { ioc_.run(); });
  }
  ~GatewayTest() override {
    Sync();  // the last exchange's handler has returned: no handler refers to the gateway
    if (gateway_ != nullptr) gateway_->CloseIdle();
    gateway_.reset();
    work_.reset();
    ioc_.stop();
    io_.join();
  }

  void Open(const FakeUpstream& upstream, GatewayOptions options) {
    StatusOr<std::unique_ptr<Gateway>> g = Gateway::Create(ioc_, upstream.url(), options);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gateway_ = *std::move(g);
  }

  // Polls `done` (a fake upstream's counter) for up to 5 s.
  template <typename Done>
  void WaitFor(Done done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(done());
  }

  // Forwards GET `target`; the future is ready once the answer has ended.
  std::future<Got> Start(std::string_view target, std::promise<Got>& promise) {
    Request req{http::verb::get, target, 11};
    req.set(http::field::host, "upstream.test");
    return Start(req, promise);
  }
  std::future<Got> Start(const Request& req, std::promise<Got>& promise) {
    gateway_->Forward(req, "192.0.2.1", [&promise](Reply r) {
      if (r.body_stream == nullptr) {
        Got g{r.status, r.body, true, r.headers.size()};
        for (const auto& [name, value] : r.headers) {
          if (name == "Retry-After") g.retry_after = value;
        }
        return promise.set_value(g);
      }
      std::make_shared<Drainer>(std::move(r), &promise)->Pull();
    });
    return promise.get_future();
  }
  // Waits until the io thread has finished what it is running now (an
  // exchange that just answered ends, and gives its place back, after).
  void Sync() {
    std::promise<void> done;
    net::post(ioc_, [&done] { done.set_value(); });
    done.get_future().wait();
  }
  Got Forward(std::string_view target) {
    Request req{http::verb::get, target, 11};
    req.set(http::field::host, "upstream.test");
    return Forward(req);
  }
  Got Forward(const Request& req) {
    std::promise<Got> promise;
    std::future<Got> f = Start(req, promise);
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "no answer for " << req.target();
      return {};
    }
    return f.get();
  }

  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  std::thread io_;
  std::unique_ptr<Gateway> gateway_;
};

TEST_F(GatewayTest, AKeepAliveConnectionIsReusedForTheNextRequests) {
  FakeUpstream up(FakeUpstream::Mode::kKeepAlive);
  Open(up, {});
  for (std::string_view t : {"/a", "/b", "/c"}) {
    Got g = Forward(t);
    EXPECT_EQ(g.status, 200u) << t;
    EXPECT_EQ(g.body, t);
  }
  EXPECT_EQ(up.connections(), 1);
}

// What the upstream receives: the client's fields in their order without the
// hop-by-hop ones (and those Connection names), every X-Forwarded-For joined
// into one with the peer last, and Content-Length only for a body or a method
// that takes one.
TEST_F(GatewayTest, TheUpstreamGetsTheClientsEndToEndFieldsInOrder) {
  FakeUpstream up(FakeUpstream::Mode::kEcho);
  Open(up, {});
  Request post{http::verb::post, "/p?q=1", 11};
  post.insert("Host", "h.test");
  post.insert("X-Forwarded-For", "198.51.100.1");
  post.insert("X-A", "dropped: named in Connection");
  post.insert("x-b", "kept");
  post.insert("Connection", "keep-alive, X-A");
  post.insert("Keep-Alive", "timeout=5");
  post.insert("Proxy-Authorization", "Basic eA==");
  post.insert("x-forwarded-for", "198.51.100.2");
  post.insert("Content-Length", "999");
  post.body() = "data";
  Got g = Forward(post);
  EXPECT_EQ(g.status, 200u);
  EXPECT_EQ(g.body,
            "POST /p?q=1\nHost: h.test\nx-b: kept\n"
            "X-Forwarded-For: 198.51.100.1, 198.51.100.2, 192.0.2.1\nContent-Length: 4\n\ndata");

  Request get{http::verb::get, "/g", 11};
  get.insert("Host", "h.test");
  EXPECT_EQ(Forward(get).body, "GET /g\nHost: h.test\nX-Forwarded-For: 192.0.2.1\n\n");
  Request put{http::verb::put, "/u", 11};  // a method that takes a body: Content-Length: 0
  EXPECT_EQ(Forward(put).body, "PUT /u\nX-Forwarded-For: 192.0.2.1\nContent-Length: 0\n\n");
  Request del{http::verb::delete_, "/d", 11};
  del.body() = "x";
  EXPECT_EQ(Forward(del).body, "DELETE /d\nX-Forwarded-For: 192.0.2.1\nContent-Length: 1\n\nx");
  EXPECT_EQ(up.connections(), 1);
}

// Beast takes a 1xx head for a whole response. Relayed as the answer, it
// left the final response unread on a pooled connection, where the next
// request read it as its own. The interim answers are dropped; the client
// gets the final one, and the next request on the connection its own.
// Expect is not forwarded: the session answered it and holds the body.
TEST_F(GatewayTest, UpstreamInterimAnswersAreSkipped) {
  FakeUpstream up(FakeUpstream::Mode::kInterim);
  Open(up, {});
  Request post{http::verb::post, "/a", 11};
  post.insert("Expect", "100-continue");
  post.body() = "data";
  Got a = Forward(post);
  EXPECT_EQ(a.status, 200u);
  EXPECT_EQ(a.body, "POST /a\nX-Forwarded-For: 192.0.2.1\nContent-Length: 4\n\ndata");
  Got b = Forward("/b");
  EXPECT_EQ(b.status, 200u);
  EXPECT_EQ(b.body, "GET /b\nHost: upstream.test\nX-Forwarded-For: 192.0.2.1\n\n");
  EXPECT_EQ(up.connections(), 1);
}

// After a 101 the connection no longer carries HTTP/1.1 answers to our
// requests: a 502, and the next request gets a new connection.
TEST_F(GatewayTest, AnUpstreamProtocolSwitchIs502AndItsConnectionIsNotReused) {
  FakeUpstream up(FakeUpstream::Mode::kSwitch);
  Open(up, {});
  Got a = Forward("/a");
  EXPECT_EQ(a.status, 502u);
  EXPECT_NE(a.body.find("switched protocols"), std::string::npos) << a.body;
  Sync();
  EXPECT_EQ(Forward("/b").status, 502u);
  EXPECT_EQ(up.connections(), 2);
}

// An upstream request larger than one send: 16 MB to an upstream that
// starts reading late (900 KB went in one send on loopback). It arrives
// whole and in order.
TEST_F(GatewayTest, ARequestTheSocketCannotTakeAtOnceArrivesWhole) {
  FakeUpstream up(FakeUpstream::Mode::kEchoLate);
  Open(up, {});
  Request post{http::verb::post, "/big", 11};
  std::string body(16 * 1024 * 1024, 'x');
  for (size_t i = 0; i < body.size(); i += 1000) body[i] = static_cast<char>('a' + i / 1000 % 26);
  post.body() = body;
  Got g = Forward(post);
  EXPECT_EQ(g.status, 200u);
  EXPECT_EQ(g.body, "POST /big\nX-Forwarded-For: 192.0.2.1\nContent-Length: 16777216\n\n" + body);
}

TEST_F(GatewayTest, AConnectionTheUpstreamClosesIsNotReused) {
  FakeUpstream up(FakeUpstream::Mode::kClose);
  Open(up, {});
  EXPECT_EQ(Forward("/a").status, 200u);
  EXPECT_EQ(Forward("/b").status, 200u);
  EXPECT_EQ(up.connections(), 2);
}

TEST_F(GatewayTest, MaxIdleZeroOpensAConnectionPerRequest) {
  FakeUpstream up(FakeUpstream::Mode::kKeepAlive);
  Open(up, {.max_idle = 0});
  EXPECT_EQ(Forward("/a").status, 200u);
  EXPECT_EQ(Forward("/b").status, 200u);
  EXPECT_EQ(up.connections(), 2);
}

// The upstream closed the pooled connection while it was idle: the request
// that finds it dead before any byte of an answer is retried once, on a new
// connection, and the client never sees the failure.
TEST_F(GatewayTest, AStalePooledConnectionIsRetriedOnANewOne) {
  FakeUpstream up(FakeUpstream::Mode::kDropAfterAnswer);
  Open(up, {});
  EXPECT_EQ(Forward("/a").status, 200u);
  Got g = Forward("/b");
  EXPECT_EQ(g.status, 200u) << g.body;
  EXPECT_EQ(g.body, "/b");
  EXPECT_EQ(up.connections(), 2);
}

// The same for a request that must not be sent twice (a POST): the closed
// idle connection is seen before the request is written to it.
TEST_F(GatewayTest, APostDoesNotTakeAPooledConnectionTheUpstreamClosed) {
  FakeUpstream up(FakeUpstream::Mode::kDropAfterAnswer);
  Open(up, {});
  EXPECT_EQ(Forward("/a").status, 200u);
  WaitFor([&] { return up.closed_by_server() == 1; });
  Request post{http::verb::post, "/b", 11};
  post.set(http::field::host, "upstream.test");
  post.body() = "x";
  post.prepare_payload();
  const Got g = Forward(post);
  EXPECT_EQ(g.status, 200u) << g.body;
  EXPECT_EQ(g.body, "/b");
  EXPECT_EQ(up.requests(), 2);
  EXPECT_EQ(up.connections(), 2);
}

// An upstream that read the request and closed without answering may have
// acted on it: a POST is not sent again (502), a GET, idempotent, is, and
// a POST with an Idempotency-Key too.
TEST_F(GatewayTest, ARequestTheUpstreamTookIsSentAgainOnlyIfIdempotent) {
  struct Case {
    http::verb method;
    bool key;
    unsigned status;
    int requests;
  };
  for (const Case c :
       {Case{http::verb::post, false, 502u, 2}, Case{http::verb::patch, false, 502u, 2},
        Case{http::verb::get, false, 200u, 3}, Case{http::verb::delete_, false, 200u, 3},
        Case{http::verb::post, true, 200u, 3}}) {
    SCOPED_TRACE(std::string(http::to_string(c.method)) + (c.key ? " with Idempotency-Key" : ""));
    FakeUpstream up(FakeUpstream::Mode::kDropSecond);
    Open(up, {});
    EXPECT_EQ(Forward("/a").status, 200u);
    Request req{c.method, "/b", 11};
    req.set(http::field::host, "upstream.test");
    if (c.key) req.set("Idempotency-Key", "k1");
    const Got g = Forward(req);
    EXPECT_EQ(g.status, c.status) << g.body;
    EXPECT_EQ(up.requests(), c.requests);  // /a, /b, and /b again if retried
    Sync();
    gateway_->CloseIdle();
    Sync();
    gateway_.reset();
  }
}

// An upstream that sends more than its answer (a body after a HEAD answer,
// more than its Content-Length) must not have the rest read as the answer to
// the next request on the connection, another client's. Some of it was read
// with the answer: the connection is not pooled (the rest may still be in the
// socket, where the watch on an idle connection would not see it until more
// arrives).
TEST_F(GatewayTest, BytesReadBeyondAnAnswerKeepItsConnectionOutOfThePool) {
  FakeUpstream up(FakeUpstream::Mode::kOverlong);
  Open(up, {});
  for (const http::verb method : {http::verb::get, http::verb::head}) {
    Request req{method, "/first", 11};
    req.set(http::field::host, "upstream.test");
    EXPECT_EQ(Forward(req).status, 200u);
    const Got g = Forward("/mine");
    EXPECT_EQ(g.status, 200u);
    EXPECT_EQ(g.body, "/mine") << "another request's answer";
  }
  EXPECT_EQ(up.connections(), 4);
}

// What arrives while the connection is idle in the pool (the reviewer's case:
// a HEAD answered, its "body" 50 ms later): the read wait on the idle
// connection sees it and drops the connection from the pool.
TEST_F(GatewayTest, BytesArrivingOnAnIdleConnectionDropItFromThePool) {
  for (const bool one_thread : {false, true}) {
    SCOPED_TRACE(one_thread ? "one thread" : "strands");
    FakeUpstream up(FakeUpstream::Mode::kHeadBody);
    Open(up, {.one_thread = one_thread});
    Request head{http::verb::head, "/h", 11};
    head.set(http::field::host, "upstream.test");
    EXPECT_EQ(Forward(head).status, 200u);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const Got g = Forward("/mine");
    EXPECT_EQ(g.status, 200u);
    EXPECT_EQ(g.body, "/mine") << "another request's answer";
    EXPECT_EQ(up.connections(), 2);
    // A connection that stays quiet while idle is still reused.
    EXPECT_EQ(Forward("/again").body, "/again");
    EXPECT_EQ(up.connections(), 2);
    Sync();
    gateway_->CloseIdle();
    Sync();
    gateway_.reset();
  }
}

// A lower-case "head" reaches an upstream that upper-cases methods as a
// HEAD: its answer has no body whatever its Content-Length says, and the
// exchange ends with the head (it waited for the body until the timeout,
// then cut the answer and closed the connection).
TEST_F(GatewayTest, ALowerCaseHeadIsAnsweredWithoutABody) {
  FakeUpstream up(FakeUpstream::Mode::kKeepAlive);
  Open(up, {.timeout = std::chrono::milliseconds(500)});
  Request head{http::verb::unknown, "/h", 11};
  head.method_string("head");
  head.set(http::field::host, "upstream.test");
  const Got g = Forward(head);
  EXPECT_EQ(g.status, 200u);
  EXPECT_EQ(g.body, "");
  // The exchange ended with the head: its connection went back to the pool
  // (cut at the timeout, it was closed).
  EXPECT_EQ(Forward("/after").body, "/after");
  EXPECT_EQ(up.connections(), 1);
}

TEST_F(GatewayTest, CloseIdleClosesThePooledConnections) {
  FakeUpstream up(FakeUpstream::Mode::kKeepAlive);
  Open(up, {});
  EXPECT_EQ(Forward("/a").status, 200u);
  gateway_->CloseIdle();
  EXPECT_EQ(Forward("/b").status, 200u);
  EXPECT_EQ(up.connections(), 2);  // /b could not reuse the closed one
}

TEST_F(GatewayTest, BeyondMaxActiveTheAnswerIs503AndAPlaceFreesWhenAnExchangeEnds) {
  FakeUpstream up(FakeUpstream::Mode::kHang);
  Open(up, {.timeout = std::chrono::milliseconds(300), .max_active = 1});
  std::promise<Got> first;
  std::future<Got> f = Start("/slow", first);
  Got second = Forward("/second");  // answered at once, without the upstream
  EXPECT_EQ(second.status, 503u);
  EXPECT_NE(second.body.find("too many concurrent upstream requests"), std::string::npos);
  EXPECT_EQ(second.retry_after, "1");
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get().status, 504u);  // the upstream never answered
  Sync();
  // The timed-out exchange gave its place back.
  Got third = Forward("/third");
  EXPECT_EQ(third.status, 504u);
  EXPECT_EQ(up.connections(), 2);
}

// The upstream deadline is lazy (UpstreamConnection): each operation moves
// it, and the timer armed for the first exchange's deadline, when it fires,
// waits again for the one then current. Six exchanges of 100 ms on one
// connection with a 300 ms timeout: none is cut, though the first deadline
// passes during the fourth.
TEST_F(GatewayTest, TheDeadlineFollowsEachExchangeOnAPooledConnection) {
  FakeUpstream up(FakeUpstream::Mode::kSlow);
  Open(up, {.timeout = std::chrono::milliseconds(300)});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) {
    const Got g = Forward("/r" + std::to_string(i));
    EXPECT_EQ(g.status, 200u) << i << ": " << g.body;
    EXPECT_EQ(g.body, "/r" + std::to_string(i));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(600));
  EXPECT_EQ(up.connections(), 1);
}

// A response whose body stops arriving is cut once the timeout passes
// without a byte: the client gets what came and a failed end.
TEST_F(GatewayTest, AStalledBodyIsCutAfterTheTimeout) {
  FakeUpstream up(FakeUpstream::Mode::kStallBody);
  Open(up, {.timeout = std::chrono::milliseconds(300)});
  const auto start = std::chrono::steady_clock::now();
  const Got g = Forward("/stall");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(g.status, 200u);
  EXPECT_FALSE(g.body_ok);
  EXPECT_EQ(g.body, std::string(10, 'x'));
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(5));
  Sync();
  // The cut connection is not reused.
  EXPECT_EQ(Forward("/next").status, 200u);
  EXPECT_EQ(up.connections(), 2);
}

// Beast takes a head's fields as they arrive and applies its header limit
// only to what it has not taken yet: the gateway bounds the fields it keeps
// (64 KiB), so an upstream that sends field after field is a bad response,
// not a reply of unbounded size. A head of 30 KiB in pieces comes through.
TEST_F(GatewayTest, AnUpstreamHeadPastTheLimitIsABadResponseEvenInPieces) {
  {
    FakeUpstream up(FakeUpstream::Mode::kTrickledHead, 150);
    Open(up, {});
    const Got g = Forward("/150-fields");
    EXPECT_EQ(g.status, 200u) << g.body;
    EXPECT_EQ(g.body, "ok");
    EXPECT_EQ(g.fields, 151u);
    Sync();
    gateway_->CloseIdle();
  }
  FakeUpstream up(FakeUpstream::Mode::kTrickledHead, 400);
  Open(up, {});
  const Got g = Forward("/400-fields");
  EXPECT_EQ(g.status, 502u) << g.fields << " fields";
  EXPECT_NE(g.body.find("bad upstream response"), std::string::npos) << g.body;
}

}  // namespace
}  // namespace ratelimit::server
