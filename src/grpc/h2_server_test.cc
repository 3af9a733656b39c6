// H2Server against gRPC C++'s own client (an independent implementation of
// the protocol) and raw sockets: unary and server-streaming calls, answers
// from other threads, the server's own error answers, bounds, graceful
// shutdown. The face's behaviour is tests/envoy's.
#include "grpc/h2_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "core/completion_batch.h"
#include "core/percent.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/raw_h2_test_util.h"

// ThreadSanitizer (make test's TSan run includes this test): gRPC C++'s and
// Abseil's libraries are not built with it, so the client's own threads look
// racy to it (also in gRPC's header code compiled into this binary, e.g. a
// status message handed from its thread to the caller's); those reports are
// suppressed, the server's code (namespace ratelimit) is not.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgpr.so\n"
         "called_from_lib:libgrpc++.so\n"
         "race:libgrpc.so\n"
         "race:libgpr.so\n"
         "race:libabsl_*\n"
         "race:grpc::internal::*\n"
         "race:grpc::CompletionQueue::*\n";
}

namespace ratelimit::grpcface {
namespace {

using namespace std::chrono_literals;
namespace hpb = ::grpc::health::v1;
namespace net = boost::asio;
using namespace ::ratelimit::grpcface::rawh2;  // NOLINT(google-build-using-namespace)

constexpr char kCheck[] = "/grpc.health.v1.Health/Check";
constexpr char kWatch[] = "/grpc.health.v1.Health/Watch";

std::string Answer(hpb::HealthCheckResponse::ServingStatus s) {
  hpb::HealthCheckResponse r;
  r.set_status(s);
  return r.SerializeAsString();
}

std::string ServiceOf(const GrpcCall& call) {
  hpb::HealthCheckRequest req;
  EXPECT_TRUE(req.ParseFromArray(call.request().data(), static_cast<int>(call.request().size())));
  return req.service();
}

// Threads that answer later; joined before the server goes.
std::mutex helpers_mu;
std::vector<std::thread> helpers;
void Later(std::function<void()> fn) {
  std::lock_guard lock(helpers_mu);
  helpers.emplace_back(std::move(fn));
}
std::vector<std::thread> Helpers() {
  std::lock_guard lock(helpers_mu);
  return std::exchange(helpers, {});
}

// A server on two threads; handlers set per test before Start.
class H2ServerTest : public ::testing::Test {
 protected:
  void Start(H2ServerOptions options = {}, int threads = 2) {
    server_.emplace(ioc_, options);
    for (auto& [path, h] : handlers_) server_->Handle(path, h);
    ASSERT_TRUE(server_->Listen({net::ip::make_address("127.0.0.1"), 0}).ok());
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { ioc_.run(); });
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    health_ = hpb::Health::NewStub(channel_);
  }
  void TearDown() override {
    for (auto& t : Helpers()) t.join();
    if (server_) server_->Shutdown(2s);
    work_.reset();
    ioc_.stop();
    for (auto& t : threads_) t.join();
  }
  grpc::Status Check(const std::string& service, hpb::HealthCheckResponse* out,
                     std::chrono::milliseconds timeout = 5s) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    hpb::HealthCheckRequest req;
    req.set_service(service);
    return health_->Check(&ctx, req, out);
  }

  net::io_context ioc_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_{
      ioc_.get_executor()};
  std::vector<std::pair<std::string, GrpcHandler>> handlers_;
  std::optional<H2Server> server_;
  std::vector<std::thread> threads_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<hpb::Health::Stub> health_;
};

TEST_F(H2ServerTest, UnaryCallsAreAnsweredInlineAndFromOtherThreads) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) {
    if (ServiceOf(call) == "inline") return call.Reply(Answer(hpb::HealthCheckResponse::SERVING));
    Later([call] {
      std::this_thread::sleep_for(5ms);
      call.Reply(Answer(hpb::HealthCheckResponse::NOT_SERVING));
    });
  });
  Start();
  hpb::HealthCheckResponse r;
  ASSERT_TRUE(Check("inline", &r).ok());
  EXPECT_EQ(r.status(), hpb::HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check("later", &r).ok());
  EXPECT_EQ(r.status(), hpb::HealthCheckResponse::NOT_SERVING);
}

// A Redis reply answers a batch of calls at once, on the I/O thread: given
// within a core::CompletionBatch (as redis::Connection gives them), the
// answers of one connection leave in one write; given one by one, one each.
TEST_F(H2ServerTest, AnswersGivenInOneCompletionBatchLeaveInOneWrite) {
  constexpr size_t kCalls = 8;
  std::mutex mu;
  std::vector<GrpcCall> held;
  std::condition_variable all_held;
  handlers_.emplace_back(kCheck, [&](GrpcCall call) {
    std::lock_guard lock(mu);
    held.push_back(std::move(call));
    all_held.notify_all();
  });
  Start({}, /*threads=*/1);  // the batch's thread is the connection's
  for (const bool batched : {true, false}) {
    SCOPED_TRACE(batched ? "in one batch" : "one by one");
    std::vector<std::thread> clients;
    for (size_t i = 0; i < kCalls; ++i) {
      clients.emplace_back([&] {
        hpb::HealthCheckResponse r;
        EXPECT_TRUE(Check("", &r).ok());
        EXPECT_EQ(r.status(), hpb::HealthCheckResponse::SERVING);
      });
    }
    std::vector<GrpcCall> calls;
    {
      std::unique_lock lock(mu);
      ASSERT_TRUE(all_held.wait_for(lock, 5s, [&] { return held.size() == kCalls; }));
      calls = std::exchange(held, {});
    }
    // Counted on the I/O thread, around the answers alone: nothing else of
    // the connection (a ping's ack) runs in between.
    std::promise<uint64_t> answered;
    net::post(ioc_, [&] {
      const uint64_t before = server_->socket_writes();
      std::optional<core::CompletionBatch> batch;
      if (batched) batch.emplace();
      for (const GrpcCall& c : calls) c.Reply(Answer(hpb::HealthCheckResponse::SERVING));
      batch.reset();
      answered.set_value(server_->socket_writes() - before);
    });
    const uint64_t writes = answered.get_future().get();
    for (auto& c : clients) c.join();
    if (batched) {
      EXPECT_EQ(writes, 1u);
    } else {
      EXPECT_EQ(writes, kCalls);
    }
  }
}

TEST_F(H2ServerTest, ManyConcurrentCallsOnOneConnectionAllGetTheirOwnAnswer) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) {
    hpb::HealthCheckResponse r;
    // The answer depends on the request: a mixed-up stream would show.
    r.set_status(ServiceOf(call).size() % 2 ? hpb::HealthCheckResponse::SERVING
                                            : hpb::HealthCheckResponse::NOT_SERVING);
    if (ServiceOf(call).size() % 3 == 0) return call.Reply(r.SerializeAsString());
    Later([call, a = r.SerializeAsString()] { call.Reply(a); });
  });
  Start();
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string service(static_cast<size_t>(1 + t * 50 + i), 'x');
        hpb::HealthCheckResponse r;
        const grpc::Status s = Check(service, &r);
        const auto want = service.size() % 2 ? hpb::HealthCheckResponse::SERVING
                                             : hpb::HealthCheckResponse::NOT_SERVING;
        if (!s.ok() || r.status() != want) ++wrong;
        ++done;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(done.load(), 400);
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(H2ServerTest, ErrorsCarryTheirCodeAndAPercentEncodedMessage) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) {
    call.Finish(GrpcCode::kInvalidArgument, "bad \"x\": 100% wrong\n\xc3\xa9");
  });
  Start();
  hpb::HealthCheckResponse r;
  const grpc::Status s = Check("", &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "bad \"x\": 100% wrong\n\xc3\xa9");
  EXPECT_EQ(core::PercentEncode("a%b\n"), "a%25b%0A");  // grpc-message's encoding
}

// Answers larger than the socket takes at once: the server writes what fits
// and hands the rest to an asynchronous write (Flush). Each answer's bytes
// depend on its request, so a lost, repeated or misplaced chunk shows.
TEST_F(H2ServerTest, AnswersLargerThanTheSocketBufferArriveWhole) {
  namespace rls = ::envoy::service::ratelimit::v3;
  constexpr size_t kBody = 3 << 20;
  auto body_of = [](const std::string& domain) {
    std::string b(kBody, '\0');
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<char>('a' + (i / 4096 + domain.size()) % 26);
    return b;
  };
  handlers_.emplace_back(
      "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", [body_of](GrpcCall call) {
        rls::RateLimitRequest req;
        if (!req.ParseFromArray(call.request().data(), static_cast<int>(call.request().size())))
          return call.Finish(GrpcCode::kInternal, "unparsable");
        rls::RateLimitResponse resp;
        resp.set_overall_code(rls::RateLimitResponse::OK);
        resp.set_raw_body(body_of(req.domain()));
        call.Reply(resp.SerializeAsString());
      });
  Start();
  auto stub = rls::RateLimitService::NewStub(channel_);
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 3; ++i) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 20s);
        rls::RateLimitRequest req;
        req.set_domain(std::string(static_cast<size_t>(1 + t * 3 + i), 'd'));
        rls::RateLimitResponse resp;
        const grpc::Status s = stub->ShouldRateLimit(&ctx, req, &resp);
        if (!s.ok() || resp.raw_body() != body_of(req.domain())) ++wrong;
      }
    });
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(H2ServerTest, AnUnknownMethodIsUnimplemented) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) { call.Reply(""); });
  Start();
  auto rls = ::envoy::service::ratelimit::v3::RateLimitService::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  ::envoy::service::ratelimit::v3::RateLimitRequest req;
  ::envoy::service::ratelimit::v3::RateLimitResponse resp;
  const grpc::Status s = rls->ShouldRateLimit(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_NE(s.error_message().find("ShouldRateLimit"), std::string::npos);
  // An empty answer is a message of length 0, not a missing one.
  hpb::HealthCheckResponse r;
  EXPECT_TRUE(Check("", &r).ok());
  EXPECT_EQ(r.status(), hpb::HealthCheckResponse::UNKNOWN);
}

TEST_F(H2ServerTest, ServerStreamingWritesThenFinishes) {
  handlers_.emplace_back(kWatch, [](GrpcCall call) {
    call.Write(Answer(hpb::HealthCheckResponse::SERVING));
    Later([call] {
      std::this_thread::sleep_for(10ms);
      call.Write(Answer(hpb::HealthCheckResponse::NOT_SERVING));
      call.Finish(GrpcCode::kOk);
    });
  });
  Start();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  hpb::HealthCheckRequest req;
  auto reader = health_->Watch(&ctx, req);
  std::vector<int> got;
  hpb::HealthCheckResponse r;
  while (reader->Read(&r)) got.push_back(r.status());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, (std::vector<int>{hpb::HealthCheckResponse::SERVING,
                                   hpb::HealthCheckResponse::NOT_SERVING}));
}

TEST_F(H2ServerTest, AnOversizedMessageIsRefusedAndTheConnectionServesOn) {
  handlers_.emplace_back(
      kCheck, [](GrpcCall call) { call.Reply(Answer(hpb::HealthCheckResponse::SERVING)); });
  Start({.max_message_bytes = 100});
  hpb::HealthCheckResponse r;
  const grpc::Status s = Check(std::string(300, 'x'), &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(Check(std::string(50, 'x'), &r).ok());
  EXPECT_EQ(r.status(), hpb::HealthCheckResponse::SERVING);
}

TEST_F(H2ServerTest, AnAnswerAfterTheDeadlineIsDeadlineExceeded) {
  std::promise<GrpcCall> held;
  handlers_.emplace_back(kCheck, [&held](GrpcCall call) {
    if (ServiceOf(call) == "warm") return call.Reply("");
    held.set_value(call);
  });
  Start();
  hpb::HealthCheckResponse r;
  // The channel is connected first: a 50 ms deadline could pass before a
  // slow (sanitized) client sent anything.
  ASSERT_TRUE(Check("warm", &r).ok());
  auto late = std::async(std::launch::async, [&] { return Check("", &r, 200ms); });
  std::future<GrpcCall> arrived = held.get_future();
  ASSERT_EQ(arrived.wait_for(10s), std::future_status::ready) << "the call never arrived";
  GrpcCall call = arrived.get();
  EXPECT_LT(call.deadline(), std::chrono::steady_clock::now() + 1s);
  EXPECT_EQ(late.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  call.Reply(Answer(hpb::HealthCheckResponse::SERVING));  // dropped or refused: no crash
  EXPECT_EQ(ParseGrpcTimeout("20m"), std::chrono::milliseconds(20));
  EXPECT_EQ(ParseGrpcTimeout("3S"), std::chrono::seconds(3));
  EXPECT_EQ(ParseGrpcTimeout("1234567n"), std::chrono::nanoseconds(1234567));
  EXPECT_LT(ParseGrpcTimeout("123456789S").count(), 0);  // more than 8 digits
  EXPECT_LT(ParseGrpcTimeout("5x").count(), 0);
  EXPECT_LT(ParseGrpcTimeout("m").count(), 0);
}

// Eight digits of hours overflow int64 nanoseconds past 2,562,047 h (signed
// overflow; 5124096H wrapped to a deadline of about +1526 s): such a
// timeout is no deadline at all.
// A sign is no digit (the grpc fuzz target found "-0S" taken as 0 s).
TEST(ParseGrpcTimeout, ASignIsRefused) {
  EXPECT_EQ(ParseGrpcTimeout("-0S").count(), -1);
  EXPECT_EQ(ParseGrpcTimeout("-5m").count(), -1);
  EXPECT_EQ(ParseGrpcTimeout("+5m").count(), -1);
  EXPECT_EQ(ParseGrpcTimeout("0S").count(), 0);
}

TEST(ParseGrpcTimeout, HoursBeyondInt64NanosecondsAreNoDeadline) {
  EXPECT_EQ(ParseGrpcTimeout("5124096H"), std::chrono::nanoseconds::max());
  EXPECT_EQ(ParseGrpcTimeout("99999999H"), std::chrono::nanoseconds::max());
  EXPECT_EQ(ParseGrpcTimeout("2562047H"), std::chrono::hours(2562047));
  EXPECT_EQ(ParseGrpcTimeout("99999999M"), std::chrono::minutes(99999999));
}

// Reads until the server closes; false if it did not within 5 s. `received`
// (if given) counts the bytes read before.
bool ClosedByServer(int fd, size_t* received = nullptr) {
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false;
    if (received != nullptr) *received += static_cast<size_t>(n);
  }
}

TEST_F(H2ServerTest, NotHttp2IsClosedAndOthersAreServed) {
  handlers_.emplace_back(
      kCheck, [](GrpcCall call) { call.Reply(Answer(hpb::HealthCheckResponse::SERVING)); });
  Start({.handshake_timeout = 200ms});
  const int http1 = Connect(server_->port());
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(http1, get.data(), get.size(), 0), static_cast<ssize_t>(get.size()));
  EXPECT_TRUE(ClosedByServer(http1));
  close(http1);
  const int silent = Connect(server_->port());  // sends nothing: the handshake timeout
  EXPECT_TRUE(ClosedByServer(silent));
  close(silent);
  hpb::HealthCheckResponse r;
  EXPECT_TRUE(Check("", &r).ok());
}

// The handshake timeout runs until the client's SETTINGS: a client that sends
// part of the preface (or all of it and no SETTINGS) and then nothing is
// closed by it.
TEST_F(H2ServerTest, APartialHandshakeIsClosedAfterTheHandshakeTimeout) {
  Start({.handshake_timeout = 200ms});
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  for (const size_t sent : {size_t{1}, preface.size() / 2, preface.size()}) {
    SCOPED_TRACE(sent);
    const int fd = Connect(server_->port());
    ASSERT_EQ(send(fd, preface.data(), sent, 0), static_cast<ssize_t>(sent));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(ClosedByServer(fd));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
    close(fd);
  }
  hpb::HealthCheckResponse r;  // a real client completes it
  EXPECT_EQ(Check("", &r).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// The server's side of a raw connection, frame by frame, its header blocks
// decoded (HPACK's dynamic table is the connection's: one inflater each).
class ServerFrames {
 public:
  struct Frame {
    uint8_t type = 0, flags = 0;
    uint32_t stream = 0;
    std::string payload;
    std::vector<std::pair<std::string, std::string>> headers;  // HEADERS
    std::string Header(const std::string& name) const {
      for (const auto& [n, v] : headers)
        if (n == name) return v;
      return "";
    }
  };
  explicit ServerFrames(int fd) : fd_(fd) { nghttp2_hd_inflate_new(&inflater_); }
  ~ServerFrames() { nghttp2_hd_inflate_del(inflater_); }
  ServerFrames(const ServerFrames&) = delete;
  ServerFrames& operator=(const ServerFrames&) = delete;

  // The next frame, or none when the connection ends or 5 s pass.
  std::optional<Frame> Next() {
    while (buf_.size() < 9 || buf_.size() < 9 + Length()) {
      char chunk[16384];
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buf_.append(chunk, static_cast<size_t>(n));
    }
    Frame f;
    const auto* b = reinterpret_cast<const unsigned char*>(buf_.data());
    f.type = b[3];
    f.flags = b[4];
    f.stream =
        (uint32_t{b[5]} << 24 | uint32_t{b[6]} << 16 | uint32_t{b[7]} << 8 | b[8]) & 0x7fffffff;
    f.payload = buf_.substr(9, Length());
    buf_.erase(0, 9 + Length());
    if (f.type == 0x1) {  // HEADERS; the server neither pads nor sends priorities
      auto* in = reinterpret_cast<uint8_t*>(f.payload.data());
      size_t left = f.payload.size();
      for (;;) {
        nghttp2_nv nv;
        int flags = 0;
        const ssize_t used = nghttp2_hd_inflate_hd2(inflater_, &nv, &flags, in, left, 1);
        if (used < 0) return std::nullopt;
        in += used;
        left -= static_cast<size_t>(used);
        if ((flags & NGHTTP2_HD_INFLATE_EMIT) != 0) {
          f.headers.emplace_back(std::string(reinterpret_cast<char*>(nv.name), nv.namelen),
                                 std::string(reinterpret_cast<char*>(nv.value), nv.valuelen));
        }
        if ((flags & NGHTTP2_HD_INFLATE_FINAL) != 0) break;
        if (used == 0 && left == 0 && (flags & NGHTTP2_HD_INFLATE_EMIT) == 0) break;
      }
      nghttp2_hd_inflate_end_headers(inflater_);
    }
    return f;
  }
  // The first frame of `type` on `stream` (others are skipped), if it comes.
  std::optional<Frame> Await(uint8_t type, uint32_t stream) {
    while (std::optional<Frame> f = Next())
      if (f->type == type && f->stream == stream) return f;
    return std::nullopt;
  }

 private:
  size_t Length() const {
    const auto* b = reinterpret_cast<const unsigned char*>(buf_.data());
    return size_t{b[0]} << 16 | size_t{b[1]} << 8 | b[2];
  }
  int fd_;
  std::string buf_;
  nghttp2_hd_inflater* inflater_ = nullptr;
};

// A client that starts requests and never ends them cannot make one
// connection hold more than max_pending_request_bytes: the stream whose bytes
// would pass it is refused, and the bytes of a stream that completes or is
// reset stop counting.
TEST_F(H2ServerTest, IncompleteRequestsOnAConnectionHoldABoundedNumberOfBytes) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) { call.Reply(""); });
  Start({.max_message_bytes = 1000, .max_pending_request_bytes = 3000});
  const int fd = Connect(server_->port());
  ServerFrames frames(fd);
  const std::string headers = RequestHeaders(kCheck);
  std::string out = std::string(kPreface) + Frame(0x4, 0, 0, "");
  // Streams 1, 3, 5: 900 bytes each of a 995-byte message that never ends.
  for (uint32_t id : {1, 3, 5})
    out += Frame(0x1, 0x4, id, headers) + Frame(0x0, 0, id, Framed(995).substr(0, 900));
  out += Frame(0x1, 0x4, 7, headers) + Frame(0x0, 0, 7, Framed(995).substr(0, 900));
  ASSERT_TRUE(SendAll(fd, out));
  // 2,700 + 900 > 3,000: stream 7 is refused at once, before its end.
  std::optional<ServerFrames::Frame> refused = frames.Await(0x1, 7);
  ASSERT_TRUE(refused.has_value()) << "stream 7 was not refused";
  EXPECT_EQ(refused->Header("grpc-status"), "8");
  EXPECT_NE(refused->Header("grpc-message").find("3000"), std::string::npos);

  // Stream 1 reset by the client: its 900 bytes are freed, so a whole
  // 900-byte request on stream 9 fits (1,800 + 900), and once it completes
  // its bytes are freed too (stream 11 fits as well).
  ASSERT_TRUE(SendAll(fd, Frame(0x3, 0, 1, Be32(0x8))));
  for (uint32_t id : {9, 11}) {
    SCOPED_TRACE(id);
    ASSERT_TRUE(SendAll(fd, Frame(0x1, 0x4, id, headers) + Frame(0x0, 0x1, id, Framed(895))));
    std::optional<ServerFrames::Frame> trailers;
    while ((trailers = frames.Await(0x1, id)) && trailers->Header("grpc-status").empty()) {
    }
    ASSERT_TRUE(trailers.has_value());
    EXPECT_EQ(trailers->Header("grpc-status"), "0");
  }
  close(fd);
}

// A request that stops half-way is reset after request_timeout: its bytes
// (and its stream) are not held for as long as the connection lives.
TEST_F(H2ServerTest, ARequestStillIncompleteAfterTheRequestTimeoutIsReset) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) { call.Reply(""); });
  Start({.request_timeout = 200ms});
  const int fd = Connect(server_->port());
  ServerFrames frames(fd);
  const std::string headers = RequestHeaders(kCheck);
  ASSERT_TRUE(SendAll(fd, std::string(kPreface) + Frame(0x4, 0, 0, "") +
                              Frame(0x1, 0x4, 1, headers) +
                              Frame(0x0, 0, 1, Framed(100).substr(0, 50))));
  const auto start = std::chrono::steady_clock::now();
  std::optional<ServerFrames::Frame> reset = frames.Await(0x3, 1);
  ASSERT_TRUE(reset.has_value()) << "stream 1 was not reset";
  EXPECT_EQ(reset->payload, Be32(0x8));  // CANCEL
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
  // The connection serves on.
  ASSERT_TRUE(SendAll(fd, Frame(0x1, 0x4, 3, headers) + Frame(0x0, 0x1, 3, Framed(0))));
  std::optional<ServerFrames::Frame> answer;
  while ((answer = frames.Await(0x1, 3)) && answer->Header("grpc-status").empty()) {
  }
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->Header("grpc-status"), "0");
  close(fd);
}

// A client that grants no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE
// 0, and no WINDOW_UPDATE) cannot make a connection hold its requests and
// answers for as long as it likes: a request's bytes are freed once its
// handler has it; while unsent answers hold max_unsent_answer_bytes,
// complete requests wait instead of going to their handler; and a stream
// whose answer has moved no byte within write_timeout is reset (CANCEL).
// Before, every request went to its handler and kept its bytes, and its
// stream stayed open with its answer (200 requests of 1 MB held 201 MB).
TEST_F(H2ServerTest, AClientThatGrantsNoWindowHoldsBoundedBytesAndItsStreamsAreReset) {
  struct Seen {
    std::mutex mu;
    std::vector<size_t> taken;     // request sizes, as the handler got them
    std::vector<size_t> at_close;  // request().size() when their streams closed
  };
  auto seen = std::make_shared<Seen>();
  handlers_.emplace_back(kCheck, [seen](GrpcCall call) {
    {
      std::lock_guard lock(seen->mu);
      seen->taken.push_back(call.request().size());
    }
    call.OnClosed([seen, call] {
      std::lock_guard lock(seen->mu);
      seen->at_close.push_back(call.request().size());
    });
    call.Reply(std::string(600, 'a'));  // 605 bytes framed
  });
  auto taken = [&] {
    std::lock_guard lock(seen->mu);
    return seen->taken;
  };
  Start({.max_unsent_answer_bytes = 1000, .write_timeout = 1s});
  const int fd = Connect(server_->port());
  ServerFrames frames(fd);
  const std::string headers = RequestHeaders(kCheck);
  const std::string no_window = std::string("\x00\x04", 2) + Be32(0);  // INITIAL_WINDOW_SIZE
  std::string out = std::string(kPreface) + Frame(0x4, 0, 0, no_window);
  for (uint32_t id : {1, 3, 5})
    out += Frame(0x1, 0x4, id, headers) + Frame(0x0, 0x1, id, Framed(1000 + id / 2));
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(SendAll(fd, out));

  // Two answers (1,210 bytes) fill the connection's 1,000: the third
  // request waits.
  for (int i = 0; i < 500 && taken().size() < 2; ++i) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(taken(), (std::vector<size_t>{1000, 1001}));

  // Their answers never move: reset after write_timeout, and then the third
  // request goes to its handler (its answer is stuck as well).
  std::set<uint32_t> reset;
  while (reset.size() < 2) {
    std::optional<ServerFrames::Frame> f = frames.Next();
    ASSERT_TRUE(f.has_value()) << "streams 1 and 3 were not reset";
    if (f->type != 0x3) continue;
    EXPECT_EQ(f->payload, Be32(0x8));  // CANCEL
    reset.insert(f->stream);
  }
  EXPECT_EQ(reset, (std::set<uint32_t>{1, 3}));
  EXPECT_GE(std::chrono::steady_clock::now() - sent, 900ms);
  ASSERT_TRUE(frames.Await(0x3, 5).has_value()) << "stream 5 was not reset";
  EXPECT_EQ(taken(), (std::vector<size_t>{1000, 1001, 1002}));
  {
    std::lock_guard lock(seen->mu);
    EXPECT_EQ(seen->at_close, (std::vector<size_t>(3, 0)));  // no request kept its bytes
  }

  // A window opens: the connection serves on.
  const std::string window = std::string("\x00\x04", 2) + Be32(65535);
  ASSERT_TRUE(SendAll(
      fd, Frame(0x4, 0, 0, window) + Frame(0x1, 0x4, 7, headers) + Frame(0x0, 0x1, 7, Framed(10))));
  std::optional<ServerFrames::Frame> data = frames.Await(0x0, 7);
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(data->payload.size(), 605u);
  std::optional<ServerFrames::Frame> trailers;
  while ((trailers = frames.Await(0x1, 7)) && trailers->Header("grpc-status").empty()) {
  }
  ASSERT_TRUE(trailers.has_value());
  EXPECT_EQ(trailers->Header("grpc-status"), "0");
  close(fd);
}

// A client that reads many large answers slowly but steadily (it opens the
// connection's window a frame at a time) is not a stuck one: a stream that
// waits its turn behind the others for longer than write_timeout, while the
// connection moves, is served, not reset. Before, it was reset (CANCEL) at
// write_timeout; under TSan, 12 answers of 3 MiB on one gRPC channel lost one
// (AnswersLargerThanTheSocketBufferArriveWhole).
TEST_F(H2ServerTest, AStreamWaitingItsTurnOnAMovingConnectionIsServed) {
  constexpr size_t kAnswer = 32 << 10;
  handlers_.emplace_back(kCheck, [](GrpcCall call) { call.Reply(std::string(kAnswer, 'a')); });
  Start({.write_timeout = 1s});
  const int fd = Connect(server_->port());
  ServerFrames frames(fd);
  const std::string headers = RequestHeaders(kCheck);
  // The streams' windows wide open; the connection's stays at 65,535 bytes
  // until the client grants more.
  std::string out =
      std::string(kPreface) + Frame(0x4, 0, 0, std::string("\x00\x04", 2) + Be32(0x7fffffff));
  const std::vector<uint32_t> ids = {1, 3, 5, 7, 9};
  for (uint32_t id : ids) out += Frame(0x1, 0x4, id, headers) + Frame(0x0, 0x1, id, Framed(10));
  ASSERT_TRUE(SendAll(fd, out));
  // One frame's worth every 250 ms: the connection moves every 250 ms, and
  // a stream waits about 1.25 s for its next frame (round robin), or longer.
  std::atomic<bool> done{false};
  std::thread granter([&] {
    const std::string grant = Frame(0x8, 0, 0, Be32(16384));
    while (!done) {
      std::this_thread::sleep_for(250ms);
      send(fd, grant.data(), grant.size(), MSG_NOSIGNAL);
    }
  });
  std::map<uint32_t, size_t> data;
  std::set<uint32_t> ended, reset;
  while (ended.size() + reset.size() < ids.size()) {
    std::optional<ServerFrames::Frame> f = frames.Next();
    if (!f) break;
    if (f->type == 0x0) data[f->stream] += f->payload.size();
    if (f->type == 0x3) reset.insert(f->stream);
    if (f->type == 0x1 && !f->Header("grpc-status").empty()) ended.insert(f->stream);  // trailers
  }
  done = true;
  granter.join();
  EXPECT_EQ(reset, std::set<uint32_t>{});
  EXPECT_EQ(ended, std::set<uint32_t>(ids.begin(), ids.end()));
  for (uint32_t id : ids) EXPECT_EQ(data[id], kAnswer + 5) << "stream " << id;
  close(fd);
}

TEST_F(H2ServerTest, AClientThatStopsReadingIsClosedAfterTheWriteTimeout) {
  constexpr size_t kAnswer = 16 << 20;  // far more than the sockets' buffers hold
  handlers_.emplace_back(kCheck, [](GrpcCall call) {
    if (!ServiceOf(call).empty()) return call.Reply(Answer(hpb::HealthCheckResponse::SERVING));
    call.Reply(std::string(kAnswer, 'x'));  // to the raw client below
  });
  Start({.write_timeout = 200ms});
  // A client with a small receive buffer that grants the server a window of
  // 2 GiB, asks for the answer, and then reads nothing.
  const int fd = Connect(server_->port(), /*rcvbuf=*/4096);
  const std::string headers = RequestHeaders(kCheck);
  const std::string out = std::string(kPreface) +
                          Frame(0x4, 0, 0, std::string("\x00\x04", 2) + Be32(0x7fffffff)) +
                          Frame(0x8, 0, 0, Be32(0x7fffffff - 65535)) + Frame(0x1, 0x4, 1, headers) +
                          Frame(0x0, 0x1, 1, std::string(5, '\0'));  // an empty request message
  ASSERT_EQ(send(fd, out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
  std::this_thread::sleep_for(800ms);  // not reading: the server's write waits, then times out

  // The server closed: what it had written arrives, then the end (without the
  // timeout the whole answer would arrive and the connection stay open).
  size_t received = 0;
  const bool closed = ClosedByServer(fd, &received);
  close(fd);
  EXPECT_TRUE(closed) << received << " bytes received, no end";
  EXPECT_LT(received, kAnswer);
  hpb::HealthCheckResponse r;  // the others are served
  EXPECT_TRUE(Check("other", &r).ok());
}

// Out of descriptors, the acceptor waits before accepting again instead of
// spinning on the connection that waits in the backlog. In a child process
// (its descriptor limit is its own), which measures its own CPU time.
TEST(H2ServerAccept, AnAcceptErrorIsRetriedAfterAPauseNotAtOnce) {
#if defined(RL_SANITIZED)
  // The sanitizers' runtime needs descriptors of its own (UBSan's vptr check
  // tests memory through a pipe: with none left it reports every virtual
  // call as made on an invalid object), and this test uses them all up. Its
  // property (CPU time while accepts fail) is the product build's, as for
  // the latency bounds of tests/chaos.
  GTEST_SKIP() << "needs every descriptor; run in the product build";
#endif
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    net::io_context ioc;
    H2Server server(ioc, {});
    if (!server.Listen({net::ip::make_address("127.0.0.1"), 0}).ok()) _exit(2);
    const int client = Connect(server.port());  // waits in the backlog
    rlimit lim{.rlim_cur = 1024, .rlim_max = 1024};
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_cur, 1024);
    setrlimit(RLIMIT_NOFILE, &lim);
    while (dup(client) >= 0) {
    }
    if (errno != EMFILE) _exit(3);
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    ioc.run_for(500ms);  // accept fails with EMFILE, again and again
    getrusage(RUSAGE_SELF, &after);
    auto cpu = [](const rusage& u) {
      return std::chrono::seconds(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
             std::chrono::microseconds(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    };
    // Spinning costs the whole 500 ms (most of it on a busy machine);
    // retrying every 50 ms, a few milliseconds.
    _exit(cpu(after) - cpu(before) < 150ms ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the acceptor spun; 2, 3: the setup failed";
}

// A drain's GOAWAY comes in RFC 9113's two steps (section 6.8): a notice
// (last stream 2^31-1) with a PING, then, once the PING is back or after a
// second, the final GOAWAY naming the last stream taken. A request the
// client sent before the notice reached it is served. Before, one GOAWAY
// named the last stream processed so far, and such a request was refused.
TEST_F(H2ServerTest, ADrainServesTheStreamsSentBeforeTheClientSawIt) {
  handlers_.emplace_back(kCheck, [](GrpcCall call) { call.Reply(""); });
  Start();
  // Two clients: one answers the drain's PING, one never does.
  const int acks = Connect(server_->port()), mute = Connect(server_->port());
  ServerFrames a(acks), m(mute);
  for (ServerFrames* frames : {&a, &m}) {
    ASSERT_TRUE(SendAll(frames == &a ? acks : mute, std::string(kPreface) + Frame(0x4, 0, 0, "")));
    ASSERT_TRUE(frames->Await(0x4, 0).has_value());  // the server's SETTINGS: it has the connection
  }
  const auto drained = std::chrono::steady_clock::now();
  server_->Drain();
  // The notice and its PING (in either order); the PING's payload.
  auto notice = [](ServerFrames& frames) {
    bool noticed = false;
    std::string ping;
    while (!noticed || ping.empty()) {
      std::optional<ServerFrames::Frame> f = frames.Next();
      if (!f) return std::string();
      if (f->type == 0x7) {
        EXPECT_EQ(f->payload.substr(0, 8), Be32(0x7fffffff) + Be32(0));  // 2^31-1, NO_ERROR
        noticed = true;
      }
      if (f->type == 0x6 && (f->flags & 0x1) == 0) ping = f->payload;
    }
    return ping;
  };
  // Then the request's answer and the final GOAWAY (in either order), and
  // when that came.
  struct End {
    std::string status, goaway;
    std::chrono::steady_clock::time_point at;
  };
  auto end = [](ServerFrames& frames) {
    End e;
    while (e.status.empty() || e.goaway.empty()) {
      std::optional<ServerFrames::Frame> f = frames.Next();
      if (!f) break;
      if (f->type == 0x1 && f->stream == 1) e.status = f->Header("grpc-status");
      if (f->type == 0x7) {
        e.goaway = f->payload.substr(0, 8);
        e.at = std::chrono::steady_clock::now();
      }
    }
    return e;
  };
  const std::string request =
      Frame(0x1, 0x4, 1, RequestHeaders(kCheck)) + Frame(0x0, 0x1, 1, Framed(0));
  const std::string ping = notice(a);
  ASSERT_EQ(ping.size(), 8u) << "no notice and PING";
  ASSERT_TRUE(SendAll(acks, request + Frame(0x6, 0x1, 0, ping)));
  const End acked = end(a);
  EXPECT_EQ(acked.status, "0");
  EXPECT_EQ(acked.goaway, Be32(1) + Be32(0));  // stream 1 was taken
  EXPECT_LT(acked.at - drained, 900ms);        // at the PING's return
  EXPECT_TRUE(ClosedByServer(acks));

  ASSERT_EQ(notice(m).size(), 8u) << "no notice and PING";
  ASSERT_TRUE(SendAll(mute, request));
  const End waited = end(m);
  EXPECT_EQ(waited.status, "0");
  EXPECT_EQ(waited.goaway, Be32(1) + Be32(0));
  EXPECT_GE(waited.at - drained, 900ms);  // no PING back: a second
  EXPECT_TRUE(ClosedByServer(mute));
  close(acks);
  close(mute);
}

// A connection with no open stream for idle_timeout is drained (the two
// GOAWAYs) and closed; one with a call open is not, and its idle time starts
// when its last stream closes. Before, a client that sent the preface and
// SETTINGS and then nothing kept one of the max_connections for good.
TEST_F(H2ServerTest, AConnectionIdleForTheIdleTimeoutIsClosed) {
  std::promise<GrpcCall> held;
  handlers_.emplace_back(kCheck, [&held](GrpcCall call) { held.set_value(call); });
  Start({.idle_timeout = 300ms});
  const auto began = std::chrono::steady_clock::now();
  const std::string hello = std::string(kPreface) + Frame(0x4, 0, 0, "");
  const int idle = Connect(server_->port()), busy = Connect(server_->port());
  ASSERT_TRUE(SendAll(idle, hello));
  ASSERT_TRUE(SendAll(
      busy, hello + Frame(0x1, 0x4, 1, RequestHeaders(kCheck)) + Frame(0x0, 0x1, 1, Framed(0))));
  std::future<GrpcCall> arrived = held.get_future();
  ASSERT_EQ(arrived.wait_for(5s), std::future_status::ready) << "the call never arrived";
  GrpcCall call = arrived.get();

  EXPECT_TRUE(ClosedByServer(idle)) << "the idle connection stayed open";
  EXPECT_GE(std::chrono::steady_clock::now() - began, 300ms);
  for (int i = 0; i < 200 && server_->connections() > 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server_->connections(), 1u);  // the one with a call open, well past 300 ms
  call.Reply("");
  EXPECT_TRUE(ClosedByServer(busy)) << "idle after its call, it stayed open";
  close(idle);
  close(busy);
}

TEST_F(H2ServerTest, ShutdownLetsCallsInFlightFinishAndRefusesNewOnes) {
  std::promise<GrpcCall> held;
  handlers_.emplace_back(kCheck, [&held](GrpcCall call) { held.set_value(call); });
  Start();
  hpb::HealthCheckResponse r;
  auto in_flight = std::async(std::launch::async, [&] { return Check("", &r); });
  std::future<GrpcCall> arrived = held.get_future();
  ASSERT_EQ(arrived.wait_for(10s), std::future_status::ready) << "the call never arrived";
  GrpcCall call = arrived.get();
  auto stopped = std::async(std::launch::async, [&] { server_->Shutdown(5s); });
  std::this_thread::sleep_for(50ms);  // GOAWAY is out; the call is still open
  EXPECT_EQ(stopped.wait_for(0ms), std::future_status::timeout);
  call.Reply(Answer(hpb::HealthCheckResponse::SERVING));
  EXPECT_TRUE(in_flight.get().ok());
  EXPECT_EQ(r.status(), hpb::HealthCheckResponse::SERVING);
  EXPECT_EQ(stopped.wait_for(3s), std::future_status::ready);
  EXPECT_EQ(server_->connections(), 0U);
  hpb::HealthCheckResponse after;
  EXPECT_EQ(Check("", &after, 500ms).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace ratelimit::grpcface
