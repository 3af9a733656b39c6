// Session framing: how a connection's bytes become requests and answers.
// A Session on a loopback socket (the thing under test is socket framing)
// hands each request to a fake RequestHandler that records it; the client
// side is a plain blocking socket with a receive timeout, so a test that
// waits for an answer that never comes fails instead of hanging. Covers
// keep-alive, pipelining, HTTP/1.0, Connection: close, 100-continue, a body
// that arrives after its head, and the 431/413/400 answers (each of which
// closes the connection without calling the handler).
#include "server/session.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ratelimit/thread_annotations.h"
#include "server/http.h"
#include "server/reply.h"
#include "server/request_handler.h"

namespace ratelimit::server {
namespace {

// Answers every request at once: 200, body "<method> <target> <body>";
// `close_after` makes the reply ask for the connection to close.
class RecordingHandler : public RequestHandler {
 public:
  struct Seen {
    std::string method, target, body;
  };

  void Handle(const Request& request, const policy::IpAddress&, std::string_view,
              std::function<void(Reply&&)> done, Holder*) override {
    Seen s{std::string(request.method_string()), std::string(request.target()), request.body()};
    Reply r;
    r.content_type = "text/plain";
    r.body = s.method + " " + s.target + " " + s.body;
    {
      LockGuard lock(mu_);
      seen_.push_back(std::move(s));
      r.close = close_after_;
    }
    done(std::move(r));
  }

  std::vector<Seen> seen() const {
    LockGuard lock(mu_);
    return seen_;
  }
  void set_close_after(bool c) {
    LockGuard lock(mu_);
    close_after_ = c;
  }

 private:
  mutable Mutex mu_;
  std::vector<Seen> seen_ RL_GUARDED_BY(mu_);
  bool close_after_ RL_GUARDED_BY(mu_) = false;
};

using Answer = http::response<http::string_body>;

// A blocking client socket; every read gives up after 5 s.
class Client {
 public:
  // `rcvbuf` > 0: the socket's receive buffer (SO_RCVBUF), set before connecting.
  explicit Client(uint16_t port, int rcvbuf) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  }
  ~Client() { ::close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool connected() const { return connected_; }

  // False if the connection failed (reset by the server) before all was sent.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next answer (an interim 100 Continue counts as one), or nullopt when
  // the connection ended or nothing came within the timeout.
  // `head`: the answer to a HEAD request (its Content-Length has no body).
  std::optional<Answer> Read(bool head = false) {
    http::response_parser<http::string_body> parser;
    parser.eager(true);
    parser.skip(head);
    for (;;) {
      if (!buf_.empty()) {
        beast::error_code ec;
        const size_t used = parser.put(net::buffer(buf_), ec);
        buf_.erase(0, used);
        if (ec && ec != http::error::need_more) return std::nullopt;
        if (parser.is_done()) return parser.release();
        if (!ec && used > 0) continue;
      }
      if (!Fill()) return std::nullopt;
    }
  }

  // The next answer; a test failure and an answer with status 0 when none came.
  Answer Next(bool head = false) {
    std::optional<Answer> a = Read(head);
    if (a.has_value()) return *std::move(a);
    ADD_FAILURE() << "no answer";
    Answer none;
    none.result(0u);
    return none;
  }

  // True when the server closed the connection (EOF before any more bytes).
  bool ClosedByServer() { return buf_.empty() && !Fill(); }

 private:
  // Reads what has arrived; false on EOF, error or timeout.
  bool Fill() {
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      eof_ = n == 0;
      return false;
    }
    buf_.append(chunk, static_cast<size_t>(n));
    return true;
  }

 public:
  bool eof() const { return eof_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

class SessionTest : public ::testing::Test {
 protected:
  SessionTest() : work_(net::make_work_guard(ioc_)), acceptor_(ioc_) {
    acceptor_.open(tcp::v4());
    acceptor_.bind(tcp::endpoint(net::ip::address_v4::loopback(), 0));
    acceptor_.listen();
  }
  ~SessionTest() override {
    work_.reset();
    ioc_.stop();
    if (io_.joinable()) io_.join();
  }

  // A client connected to a new Session with `limits`.
  // `buffers` > 0: both ends' socket buffers that small (the client's
  // receive buffer, the session's send buffer).
  std::unique_ptr<Client> Connect(SessionLimits limits = {}, int buffers = 0) {
    limits_ = limits;
    auto client = std::make_unique<Client>(acceptor_.local_endpoint().port(), buffers);
    EXPECT_TRUE(client->connected());
    tcp::socket socket = acceptor_.accept();  // the connection is in the backlog already
    if (buffers > 0) socket.set_option(net::socket_base::send_buffer_size(buffers));
    auto session = std::make_shared<Session>(std::move(socket), handler_, limits_, registry_);
    session->Start(nullptr, /*paced=*/false);
    if (!io_.joinable()) io_ = std::thread([this] { ioc_.run(); });
    return client;
  }

  // A refused request's answer: `status` as problem+json, then the
  // connection closes, and the handler never saw the request. Its body.
  std::string ExpectRefused(Client& c, unsigned status) {
    std::optional<Answer> a = c.Read();
    if (!a.has_value()) {
      ADD_FAILURE() << "no answer, expected " << status;
      return "";
    }
    EXPECT_EQ(a->result_int(), status);
    EXPECT_EQ((*a)[http::field::content_type], "application/problem+json");
    EXPECT_EQ((*a)[http::field::connection], "close");
    EXPECT_TRUE(c.ClosedByServer());
    EXPECT_TRUE(handler_.seen().empty());
    return a->body();
  }

  static std::string Get(std::string_view target, std::string_view extra = "") {
    return "GET " + std::string(target) + " HTTP/1.1\r\nHost: t\r\n" + std::string(extra) + "\r\n";
  }
  static std::string Post(std::string_view target, std::string_view body) {
    return "POST " + std::string(target) +
           " HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
           std::string(body);
  }

  // Declared before the io_context: sessions it still owns refer to them.
  RecordingHandler handler_;
  SessionRegistry registry_;
  SessionLimits limits_;
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  tcp::acceptor acceptor_;
  std::thread io_;
};

TEST_F(SessionTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  auto c = Connect();
  c->Send(Get("/a"));
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);
  EXPECT_EQ(a.body(), "GET /a ");
  EXPECT_EQ(a[http::field::content_length], "7");
  EXPECT_TRUE(a.keep_alive());
  c->Send(Post("/b", "xyz"));
  Answer b = c->Next();
  EXPECT_EQ(b.body(), "POST /b xyz");
  ASSERT_EQ(handler_.seen().size(), 2u);
}

TEST_F(SessionTest, PipelinedRequestsAreAnsweredInOrder) {
  auto c = Connect();
  // Three requests in one write: the second and third wait in the session's
  // buffer while the first is answered.
  c->Send(Get("/1") + Post("/2", "body") + Get("/3"));
  for (std::string_view want : {"GET /1 ", "POST /2 body", "GET /3 "}) {
    Answer a = c->Next();
    EXPECT_EQ(a.body(), want);
  }
  EXPECT_EQ(handler_.seen().size(), 3u);
}

// An answer larger than one send: 2 MB through 16 KB socket buffers, to a
// client that starts reading late, takes many. It arrives whole, and the
// connection serves the next request.
TEST_F(SessionTest, AnAnswerTheSocketCannotTakeAtOnceArrivesWhole) {
  auto c = Connect({.max_body_bytes = 4 * 1024 * 1024}, /*buffers=*/16 * 1024);
  std::string body(2 * 1024 * 1024, 'x');
  for (size_t i = 0; i < body.size(); i += 4096) body[i] = static_cast<char>('a' + i / 4096 % 26);
  c->Send(Post("/big", body));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server's buffer fills
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);
  EXPECT_EQ(a.body(), "POST /big " + body);
  c->Send(Get("/next"));
  EXPECT_EQ(c->Next().body(), "GET /next ");
}

TEST_F(SessionTest, BodyArrivingAfterItsHeadIsReadWhole) {
  auto c = Connect();
  c->Send("POST /late HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01234");
  c->Send("56789");
  Answer a = c->Next();
  EXPECT_EQ(a.body(), "POST /late 0123456789");
}

TEST_F(SessionTest, ExpectContinueGetsAnInterimAnswerBeforeTheBody) {
  auto c = Connect();
  c->Send("PUT /up HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  Answer interim = c->Next();
  EXPECT_EQ(interim.result_int(), 100);
  EXPECT_TRUE(handler_.seen().empty());
  c->Send("hello");
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);
  EXPECT_EQ(a.body(), "PUT /up hello");
}

TEST_F(SessionTest, AnHttp10ClientsExpectContinueIsIgnored) {
  auto c = Connect();
  c->Send("PUT /up HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello");
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);  // not a 100 first
  EXPECT_EQ(a.body(), "PUT /up hello");
}

TEST_F(SessionTest, Http10ClosesAfterTheAnswerUnlessAskedToKeepAlive) {
  auto c = Connect();
  c->Send("GET /old HTTP/1.0\r\n\r\n");
  Answer a = c->Next();
  EXPECT_EQ(a.version(), 10);
  EXPECT_FALSE(a.keep_alive());
  EXPECT_TRUE(c->ClosedByServer());

  auto k = Connect();
  k->Send("GET /one HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  Answer one = k->Next();
  EXPECT_EQ(one[http::field::connection], "keep-alive");
  k->Send("GET /two HTTP/1.0\r\n\r\n");
  Answer two = k->Next();
  EXPECT_EQ(two.body(), "GET /two ");
  EXPECT_TRUE(k->ClosedByServer());
}

TEST_F(SessionTest, ConnectionCloseIsHonouredAfterTheAnswer) {
  auto c = Connect();
  c->Send(Get("/bye", "Connection: close\r\n") + Get("/never"));
  Answer a = c->Next();
  EXPECT_EQ(a[http::field::connection], "close");
  EXPECT_TRUE(c->ClosedByServer());
  EXPECT_EQ(handler_.seen().size(), 1u);  // the pipelined /never is not read
}

TEST_F(SessionTest, AReplyThatAsksToCloseClosesTheConnection) {
  handler_.set_close_after(true);
  auto c = Connect();
  c->Send(Get("/x"));
  Answer a = c->Next();
  EXPECT_EQ(a[http::field::connection], "close");
  EXPECT_TRUE(c->ClosedByServer());
}

TEST_F(SessionTest, HeadAnswerHasTheLengthButNoBody) {
  auto c = Connect();
  // The HEAD answer's body would be read as the start of the next answer.
  c->Send("HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + Get("/after"));
  Answer h = c->Next(/*head=*/true);
  EXPECT_EQ(h.result_int(), 200);
  EXPECT_EQ(h[http::field::content_length], "8");  // "HEAD /h "
  EXPECT_EQ(h.body(), "");
  Answer after = c->Next();
  EXPECT_EQ(after.body(), "GET /after ");
}

TEST_F(SessionTest, ARequestSlowerThanTheReadTimeoutIsDisconnected) {
  auto c = Connect({.read_timeout = std::chrono::milliseconds(50)});
  c->Send("GET /slow HTTP/1.1\r\nHo");  // and nothing more
  EXPECT_TRUE(c->ClosedByServer());
  EXPECT_TRUE(c->eof());  // closed without an answer, well before the client's 5 s
  EXPECT_TRUE(handler_.seen().empty());
}

TEST_F(SessionTest, HeadersOverTheLimitAnswer431AndClose) {
  auto c = Connect({.max_header_bytes = 256});
  c->Send(Get("/big", "X-Big: " + std::string(1000, 'a') + "\r\n"));
  const std::string body = ExpectRefused(*c, 431);
  EXPECT_NE(body.find("256 bytes"), std::string::npos) << body;
  EXPECT_NE(body.find("/big"), std::string::npos) << body;  // the instance
}

// Beast 1.74 applies header_limit only to what its parser has not taken yet,
// and it takes every complete field at once when fewer than 3 bytes of the
// next one have arrived: a head sent in such pieces (each ends one byte into
// the next field) would pass any limit unless the session counts what the
// parser took. The pauses let each piece arrive in a read of its own.
TEST_F(SessionTest, HeadersSentInPiecesCannotPassTheLimit) {
  auto c = Connect({.max_header_bytes = 512});
  c->Send("GET /trickle HTTP/1.1\r\nHost: t\r\nX");
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    c->Send("-Field-" + std::to_string(i) + ": " + std::string(60, 'v') + "\r\nX");
  }
  c->Send("-End: 1\r\n\r\n");
  ExpectRefused(*c, 431);
}

TEST_F(SessionTest, HeadersJustUnderTheLimitAreServed) {
  auto c = Connect({.max_header_bytes = 512});
  std::string head = "GET /fits HTTP/1.1\r\nHost: t\r\nX-Pad: ";
  head += std::string(500 - head.size() - 4, 'p') + "\r\n\r\n";  // 500 bytes in all
  c->Send(head);
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);
}

TEST_F(SessionTest, BodyOverTheLimitAnswers413AndCloses) {
  auto c = Connect({.max_body_bytes = 16});
  c->Send(Post("/upload", std::string(100, 'b')));
  const std::string body = ExpectRefused(*c, 413);
  EXPECT_NE(body.find("16 bytes"), std::string::npos) << body;
}

// An upload refused while the client still sends it: the session reads on
// and drops the rest for a while instead of closing with bytes unread, which
// makes the kernel answer with a reset that can destroy the 413 before the
// client reads it. Here the client's bytes keep being taken after the answer
// and its end (the server's FIN): no reset comes.
TEST_F(SessionTest, ARefusedUploadIsReadOnAndDroppedNotAnsweredWithAReset) {
  auto c = Connect({.max_body_bytes = 16});
  // More than the session's first read takes: some stays unread in the kernel.
  ASSERT_TRUE(c->Send("POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 4000000\r\n\r\n" +
                      std::string(200'000, 'b')));
  ExpectRefused(*c, 413);
  EXPECT_TRUE(c->eof()) << "the connection was reset, not closed";
  // Still taken after the answer and its end: read and dropped, not reset.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(c->Send(std::string(64 << 10, 'b'))) << "reset after " << i << " pieces";
  }
}

TEST_F(SessionTest, ChunkedBodyOverTheLimitAnswers413) {
  auto c = Connect({.max_body_bytes = 16});
  c->Send(
      "POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "10\r\n0123456789abcdef\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n");
  ExpectRefused(*c, 413);
}

// RFC 9112 6.3: a request whose Transfer-Encoding does not end in chunked
// has no knowable length. Beast reads it as bodyless, and its "body" (here a
// whole request) would be served as the next request: one 400 instead, and
// the connection closed, so the smuggled request is never read.
TEST_F(SessionTest, ATransferEncodingNotEndingInChunkedIsRefusedAndNothingIsSmuggled) {
  for (std::string_view te : {"chunked, identity", "gzip", "gzip\r\nContent-Length: 0"}) {
    SCOPED_TRACE(te);
    auto c = Connect();
    c->Send("POST /front HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + std::string(te) +
            "\r\n\r\n" + Get("/smuggled"));
    const std::string body = ExpectRefused(*c, 400);
    EXPECT_NE(body.find("Transfer-Encoding"), std::string::npos) << body;
  }
}

// RFC 9112 6.1: the session decodes chunked and nothing else; another coding
// before it was dropped silently (the gateway forwards the body re-framed).
// 501, and the connection closes, whether the codings share a field or not.
TEST_F(SessionTest, ATransferCodingOtherThanChunkedIsNotImplemented) {
  for (std::string_view te :
       {"gzip, chunked", "gzip\r\nTransfer-Encoding: chunked", "identity, chunked"}) {
    SCOPED_TRACE(te);
    auto c = Connect();
    c->Send("POST /front HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + std::string(te) +
            "\r\n\r\n1\r\nx\r\n0\r\n\r\n" + Get("/smuggled"));
    const std::string body = ExpectRefused(*c, 501);
    EXPECT_NE(body.find("Transfer-Encoding"), std::string::npos) << body;
  }
  // Beast reads these as not ending in chunked (a second chunked; a coding
  // with parameters): 400, as in the test above.
  for (std::string_view te : {"chunked, chunked", "x;p=1, chunked"}) {
    SCOPED_TRACE(te);
    auto c = Connect();
    c->Send("POST /front HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + std::string(te) +
            "\r\n\r\n1\r\nx\r\n0\r\n\r\n" + Get("/smuggled"));
    ExpectRefused(*c, 400);
  }
  // One chunked, in any case and with empty list elements: served.
  for (std::string_view te : {"Chunked", " , chunked ,"}) {
    SCOPED_TRACE(te);
    auto c = Connect();
    c->Send("POST /one HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + std::string(te) +
            "\r\n\r\n1\r\nx\r\n0\r\n\r\n");
    EXPECT_EQ(c->Next().body(), "POST /one x");
  }
}

// Beast looks for CRLF only: chunk lines ending in a bare LF were waited on
// until the read timeout, without an answer. A prompt 400 now, as for a head
// with bare LFs, wherever the bare LF is (size line, after the data, the last
// chunk, the trailer), also when it arrives after the head.
TEST_F(SessionTest, ChunkLinesEndingInABareLfAre400NotATimeout) {
  const SessionLimits limits{.read_timeout = std::chrono::milliseconds(5000)};
  const std::string head = "POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const std::string body : {"1\nx\n0\n\n", "1\r\nx\n0\r\n\r\n", "1\r\nx\r\n0\n\n",
                                 "1\r\nx\r\n0\r\n\n", "1\r\nx\r\n0\r\nX-T: 1\n\r\n"}) {
    SCOPED_TRACE(body);
    for (const bool later : {false, true}) {
      auto c = Connect(limits);
      const auto start = std::chrono::steady_clock::now();
      if (later) {
        c->Send(head);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        c->Send(body);
      } else {
        c->Send(head + body);
      }
      ExpectRefused(*c, 400);
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    }
  }
}

TEST_F(SessionTest, AChunkedBodyWithExtensionsIsServedAndThePipelinedNextRequestToo) {
  auto c = Connect();
  c->Send(
      "POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n" +
      Get("/next"));
  EXPECT_EQ(c->Next().body(), "POST /chunks abcde");
  EXPECT_EQ(c->Next().body(), "GET /next ");
}

// Beast holds a chunk line, or a chunked body's trailer, unparsed until its
// end arrives, and its body limit counts chunk data only: an endless chunk
// extension or trailer grew the session's buffer for the whole
// read_timeout. The body's bytes on the wire, framing included, are bounded
// by max_body_bytes + max_header_bytes: a prompt 413, well before the read
// timeout (which would close without an answer).
TEST_F(SessionTest, EndlessChunkExtensionsOrTrailersAnswer413) {
  const SessionLimits limits{.max_header_bytes = 256,
                             .max_body_bytes = 256,
                             .read_timeout = std::chrono::milliseconds(3000)};
  const std::string head =
      "POST /endless HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  std::string trailer;
  for (int i = 0; i < 100; ++i) trailer += "X-T" + std::to_string(i) + ": " + "vvvv\r\n";
  for (const std::string& body : {"1;" + std::string(2000, 'e'), "1\r\nx\r\n0\r\n" + trailer}) {
    auto c = Connect(limits);
    c->Send(head + body);
    const std::string problem = ExpectRefused(*c, 413);
    EXPECT_NE(problem.find("512 bytes"), std::string::npos) << problem;
  }
}

// Beast adds a chunked body's trailer fields to the request's header fields:
// a trailer could supply an API key or user header, or be forwarded upstream
// as a header. Refused.
TEST_F(SessionTest, AChunkedRequestWithTrailerFieldsIsRefused) {
  auto c = Connect();
  c->Send(
      "POST /t HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
      "1\r\nx\r\n0\r\nX-Api-Key: forged\r\n\r\n");
  const std::string problem = ExpectRefused(*c, 400);
  EXPECT_NE(problem.find("trailer fields"), std::string::npos) << problem;
}

// RFC 9112 3.2: an HTTP/1.1 request has exactly one Host, and no request
// has two (which one a proxy or an upstream picks is anyone's guess). HTTP/1.0
// may go without. Every face is behind the session, so every face refuses.
TEST_F(SessionTest, AnHttp11RequestWithoutExactlyOneHostIsRefused) {
  for (const std::string request :
       {"GET /nohost HTTP/1.1\r\n\r\n", "GET /two HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET /two HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
        "POST /nohost HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"}) {
    SCOPED_TRACE(request);
    auto c = Connect();
    c->Send(request);
    const std::string problem = ExpectRefused(*c, 400);
    EXPECT_NE(problem.find("Host"), std::string::npos) << problem;
  }
  auto two = Connect();
  two->Send("GET /two HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n");
  std::optional<Answer> a = two->Read();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->result_int(), 400);
  EXPECT_TRUE(two->ClosedByServer());
  auto c = Connect();
  c->Send("GET /old HTTP/1.0\r\n\r\n");
  EXPECT_EQ(c->Next().result_int(), 200);
  EXPECT_EQ(handler_.seen().size(), 1u);
}

// RFC 9110 8.6: a Content-Length list of identical values (or the same value
// in two fields) is one length; differing ones are a 400 (BadInput rows "two
// Content-Lengths", "Content-Length list"). The gateway re-frames the body,
// so the upstream sees one Content-Length either way.
TEST_F(SessionTest, RepeatedIdenticalContentLengthsCountAsOne) {
  for (std::string_view cl : {"2, 3", "2\r\nContent-Length: 3"}) {
    SCOPED_TRACE(cl);
    auto c = Connect();
    c->Send("POST /cl HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::string(cl) + "\r\n\r\nabc");
    ExpectRefused(*c, 400);
  }
  for (std::string_view cl : {"2, 2", "2\r\nContent-Length: 2"}) {
    SCOPED_TRACE(cl);
    auto c = Connect();
    c->Send("POST /cl HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::string(cl) + "\r\n\r\nab" +
            Get("/next"));
    EXPECT_EQ(c->Next().body(), "POST /cl ab");
    EXPECT_EQ(c->Next().body(), "GET /next ");
  }
}

TEST_F(SessionTest, BodyAtTheLimitIsServed) {
  auto c = Connect({.max_body_bytes = 16});
  c->Send(Post("/upload", std::string(16, 'b')));
  Answer a = c->Next();
  EXPECT_EQ(a.result_int(), 200);
  EXPECT_EQ(a.body(), "POST /upload " + std::string(16, 'b'));
}

TEST_F(SessionTest, MalformedRequestAnswers400AndCloses) {
  auto c = Connect();
  c->Send("NOT HTTP AT ALL\r\n\r\n");
  const std::string body = ExpectRefused(*c, 400);
  EXPECT_NE(body.find("malformed HTTP request"), std::string::npos) << body;
}

TEST_F(SessionTest, MalformedRequestAfterAGoodOneStillGetsTheFirstAnswer) {
  auto c = Connect();
  c->Send(Get("/good") + "GET /bad HTTP/1.1\r\nBad Header\r\n\r\n");
  Answer good = c->Next();
  EXPECT_EQ(good.result_int(), 200);
  Answer bad = c->Next();
  EXPECT_EQ(bad.result_int(), 400);
  EXPECT_TRUE(c->ClosedByServer());
  EXPECT_EQ(handler_.seen().size(), 1u);
}

TEST_F(SessionTest, AClientSilentPastTheIdleTimeoutIsDisconnected) {
  auto c = Connect({.idle_timeout = std::chrono::milliseconds(50)});
  c->Send(Get("/first"));
  ASSERT_TRUE(c->Read().has_value());
  // Nothing more is sent: the session closes the connection by itself.
  EXPECT_TRUE(c->ClosedByServer());
  EXPECT_TRUE(c->eof());  // closed, not the client's own 5 s timeout
}

}  // namespace
}  // namespace ratelimit::server
