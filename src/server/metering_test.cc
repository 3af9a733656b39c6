// Metered costs (issue 21 D): the SSE reader and the reservation without
// sockets, then the whole path in one process: a client on a real socket, the
// real listener, router and gateway, a real streaming upstream (below), and a
// MemoryStore or a real Redis on a manual clock, so that the arithmetic is
// exact: a token bucket of 10,000 tokens a minute (one token per 6 ms of the
// manual clock), requests reserving 1,000 and using 200..5,000.
#include "server/metering.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "policy/config.h"
#include "policy/policy.h"
#include "ratelimit/clock.h"
#include "ratelimit/memory_store.h"
#include "ratelimit/redis_store.h"
#include "server/gateway.h"
#include "server/listener.h"
#include "server/policy_holder.h"
#include "server/router.h"
#include "support/redis_server.h"
#include "support/sse_upstream.h"

namespace ratelimit::server {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// ---- no sockets -------------------------------------------------------------

std::optional<int64_t> ReadAll(std::string_view stream, size_t piece, const char* path) {
  SseFieldReader r(policy::SplitJsonPath(path));
  for (size_t i = 0; i < stream.size(); i += piece) r.Feed(stream.substr(i, piece));
  r.Finish();
  return r.value();
}

TEST(SseFieldReader, KeepsTheLastEventThatCarriesTheFieldWhateverThePieces) {
  const std::string stream =
      ": a comment\r\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"total_tokens\"}}]}\r\n\r\n"
      "event: message\n"
      "data: {\"usage\":{\"total_tokens\":17}}\n\n"
      "data: {\"usage\":\n"
      "data:  {\"total_tokens\": 1234}}\n\n"
      "data: {\"usage\":{\"total_tokens\":\"many\"}}\r\r"  // not a number: ignored
      "data: [DONE]\n\n";
  for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, stream.size()}) {
    EXPECT_EQ(ReadAll(stream, piece, "usage.total_tokens"), 1234) << "pieces of " << piece;
  }
  EXPECT_EQ(ReadAll("data: {\"usage\":{\"total_tokens\":5}}", 4, "usage.total_tokens"), 5)
      << "a last event without its blank line still counts";
  EXPECT_EQ(ReadAll("data: {\"a\":[{\"n\":3}]}\n\n", 5, "a.0.n"), 3);
  EXPECT_FALSE(ReadAll("data: {\"usage\":{}}\n\ndata: [DONE]\n\n", 3, "usage.total_tokens"));
  EXPECT_FALSE(ReadAll("data: {\"usage\":{\"total_tokens\":-4}}\n\n", 3, "usage.total_tokens"));
  EXPECT_FALSE(ReadAll("database: {\"usage\":{\"total_tokens\":4}}\n\n", 3, "usage.total_tokens"));
}

TEST(SseFieldReader, SkipsLinesBeyondTheBound) {
  SseFieldReader r(policy::SplitJsonPath("n"));
  r.Feed("data: {\"n\": 1}\n\ndata: ");
  const std::string big(SseFieldReader::kMaxLine, 'x');
  r.Feed(big);
  r.Feed("{\"n\": 2}\n\n");
  r.Finish();
  EXPECT_EQ(r.value(), 1);
}

// An event whose data grows beyond kMaxEvent (an upstream sending data
// lines without the blank line that ends an event) is dropped as it grows,
// not buffered: it gives no value, and a later event's usage still counts.
// The reader held the whole event (260 MB of data lines: 281 MB RSS), and a
// usage spread over it counted.
TEST(SseFieldReader, AnEventsDataIsBoundedAndALaterUsageStillCounts) {
  SseFieldReader r(std::vector<std::string>{"usage", "total_tokens"});
  r.Feed("data: {\"usage\": {\"total_tokens\": 7}\n");
  const std::string spaces = "data: " + std::string(1000, ' ') + "\n";  // JSON whitespace
  for (size_t fed = 0; fed < 3 * SseFieldReader::kMaxEvent; fed += spaces.size()) {
    r.Feed(spaces);
    ASSERT_LE(r.buffered(), SseFieldReader::kMaxEvent + SseFieldReader::kMaxLine);
  }
  r.Feed("data: }\n\n");
  EXPECT_EQ(r.value(), std::nullopt) << "an event beyond the bound gave a value";
  r.Feed("data: {\"usage\": {\"total_tokens\": 9}}\n\n");
  EXPECT_EQ(r.value(), 9);
  EXPECT_LE(r.buffered(), size_t{64});
}

TEST(ParseCostText, WholeNumbersOnly) {
  EXPECT_EQ(ParseCostText(" 42 "), 42);
  EXPECT_EQ(ParseCostText("0"), 0);
  for (const char* bad : {"", "-1", "4.5", "1e3", "12abc", "+3"}) {
    EXPECT_FALSE(ParseCostText(bad).has_value()) << bad;
  }
  // A whole number beyond int64 is a very large cost, capped where it is used.
  EXPECT_EQ(ParseCostText("99999999999999999999"), INT64_MAX);
}

policy::MeteredCost Cost(policy::MeteredCost::Source source, std::string field,
                         std::optional<int64_t> reserve, std::optional<int64_t> max) {
  policy::MeteredCost c;
  c.source = source;
  c.request_field = std::move(field);
  if (source == policy::MeteredCost::Source::kRequestJson) {
    c.request_path = policy::SplitJsonPath(c.request_field);  // as the loader does
  }
  c.reserve = reserve;
  c.max = max;
  c.settle_from = policy::MeteredCost::SettleFrom::kSseLastEvent;
  c.field = "usage.total_tokens";
  return c;
}

TEST(ReserveCost, FromTheRequestCappedAtMaxElseTheFallback) {
  using Source = policy::MeteredCost::Source;
  Request req{http::verb::post, "/v1/chat", 11};
  req.set("X-Estimate", "700");
  req.body() = R"({"model": "m", "max_tokens": 9000, "bad": "x"})";
  EXPECT_EQ(*ReserveCost(Cost(Source::kReserve, "", 1000, std::nullopt), 1000, req), 1000);
  EXPECT_EQ(*ReserveCost(Cost(Source::kRequestHeader, "x-estimate", 5, 8000), 5, req), 700);
  EXPECT_EQ(*ReserveCost(Cost(Source::kRequestJson, "max_tokens", 5, 8000), 5, req), 8000);
  EXPECT_EQ(*ReserveCost(Cost(Source::kRequestJson, "missing", 5, 8000), 5, req), 5);
  StatusOr<int64_t> bad = ReserveCost(Cost(Source::kRequestJson, "bad", 5, 8000), 5, req);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("whole number"), std::string::npos);
  StatusOr<int64_t> none =
      ReserveCost(Cost(Source::kRequestHeader, "X-Other", std::nullopt, std::nullopt), 1, req);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("X-Other is required"), std::string::npos);
}

// ---- a streaming upstream ---------------------------------------------------

// ---- ratelimitd's HTTP path in-process ------------------------------------------

constexpr int64_t kStart = 1'700'000'000'000'000;  // the manual clock's start (us)

std::string ConfigFor(const std::string& upstream) {
  return "limits:\n"
         "  tokens: {algorithm: token_bucket, capacity: 10000, refill_per_second: "
         "166.66666666666666}\n"
         "  tokens_b: {algorithm: token_bucket, capacity: 10000, refill_per_second: 1}\n"
         "routes:\n"
         "  - name: estimate\n    methods: [POST]\n    path: /header\n    limits: [tokens]\n"
         "    cost: {from_request_header: X-Estimate, settle_from: response_header, "
         "field: X-Usage}\n"
         "  - name: trial\n    methods: [PUT]\n    path: /header\n    shadow: true\n"
         "    limits: [tokens]\n"
         "    cost: {from_request_header: X-Estimate, settle_from: response_header, "
         "field: X-Usage}\n"
         "  - name: chat\n    path: /sse\n    limits: [tokens]\n"
         "    cost: {from_request_header: X-Estimate, reserve: 1000, settle_from: sse_last_event, "
         "field: usage.total_tokens, max: 6000, unit: tokens}\n"
         "  - name: completion\n    path: /json\n    limits: [tokens]\n"
         "    cost: {from_request_header: X-Estimate, settle_from: sse_last_event, "
         "field: usage.total_tokens, max: 2000}\n"
         "  - name: header\n    path: /header\n    limits: [tokens]\n"
         "    cost: {reserve: 1000, settle_from: response_header, field: X-Usage}\n"
         "  - name: split\n    path: /split\n    limits: [tokens, {name: tokens_b, failure_mode: "
         "closed}]\n"
         "    cost: {reserve: 1000, settle_from: sse_last_event, field: usage.total_tokens}\n"
         "  - name: trailer\n    path: /trailer\n    limits: [tokens]\n"
         "    cost: {reserve: 1000, settle_from: response_trailer, field: X-Usage}\n"
         "server:\n  headers: structured\n  upstream: " +
         upstream + "\n";
}

uint64_t SettlementsSoFar() {
  Metrics& m = Metrics::Global();
  uint64_t n = 0;
  for (auto o : {Metrics::SettleOutcome::kSettled, Metrics::SettleOutcome::kMissing,
                 Metrics::SettleOutcome::kDisconnected, Metrics::SettleOutcome::kError,
                 Metrics::SettleOutcome::kNotForwarded}) {
    n += m.Settlements(o).value();
  }
  return n;
}

struct Answer {
  std::string raw;
  std::string body;  // de-chunked
};

std::string Dechunk(std::string_view b) {
  std::string out;
  while (true) {
    const size_t eol = b.find("\r\n");
    if (eol == std::string_view::npos) return out;
    const size_t n = std::stoul(std::string(b.substr(0, eol)), nullptr, 16);
    if (n == 0) return out;
    out.append(b.substr(eol + 2, n));
    b.remove_prefix(eol + 2 + n + 2);
  }
}

class MeteredGateway : public ::testing::TestWithParam<bool> {  // true: Redis
 protected:
  void SetUp() override {
    if (GetParam()) {
      redis_ = std::make_unique<testing::RedisServer>();
      auto s = RedisStore::Create({.url = redis_->url(),
                                   .time_source = RedisStore::TimeSource::kLocal,
                                   .clock = &clock_,
                                   .steady_clock = &clock_});
      ASSERT_TRUE(s.ok()) << s.status().message();
      store_ = std::shared_ptr<Store>(std::move(*s));
    } else {
      store_ = std::make_shared<MemoryStore>(MemoryStore::Options{.clock = &clock_});
    }
    StatusOr<policy::Config> c = policy::ParseConfig(ConfigFor(upstream_.url()), "m.yaml");
    ASSERT_TRUE(c.ok()) << c.status().message();
    StatusOr<std::shared_ptr<const policy::Policy>> p = policy::Policy::Create(*std::move(c));
    ASSERT_TRUE(p.ok()) << p.status().message();
    policy_ = *p;
    holder_ = std::make_unique<PolicyHolder>(policy_);
    enforcer_ = std::make_unique<Enforcer>(store_, 1000);
    auto g = Gateway::Create(ioc_, upstream_.url(), GatewayOptions{});
    ASSERT_TRUE(g.ok());
    gateway_ = std::move(*g);
    router_ = std::make_unique<Router>(*holder_, *enforcer_, gateway_.get(), false);
    listener_ = std::make_shared<Listener>(ioc_, tcp::endpoint(net::ip::address_v4::loopback(), 0),
                                           *router_, SessionLimits{}, registry_, ConnectionCaps{});
    ASSERT_TRUE(listener_->Open().ok());
    port_ = listener_->local_endpoint().port();
    listener_->Run();
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }
  void TearDown() override {
    if (listener_) listener_->Stop();
    if (other_listener_) other_listener_->Stop();
    for (const auto& s : registry_.Snapshot()) s->Shutdown();
    if (gateway_) gateway_->CloseIdle();
    work_.reset();
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
  }

  // Serves the same policy and store through a gateway to `upstream`; the
  // port to connect to.
  uint16_t ServeThrough(const std::string& upstream) {
    auto g = Gateway::Create(ioc_, upstream, GatewayOptions{});
    EXPECT_TRUE(g.ok());
    if (!g.ok()) return 0;
    other_gateway_ = std::move(*g);
    other_router_ = std::make_unique<Router>(*holder_, *enforcer_, other_gateway_.get(), false);
    other_listener_ =
        std::make_shared<Listener>(ioc_, tcp::endpoint(net::ip::address_v4::loopback(), 0),
                                   *other_router_, SessionLimits{}, registry_, ConnectionCaps{});
    EXPECT_TRUE(other_listener_->Open().ok());
    other_listener_->Run();
    return other_listener_->local_endpoint().port();
  }

  int Connect(uint16_t port = 0) const {
    const int c = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port != 0 ? port : port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{10, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return c;
  }
  static std::string Request(const std::string& path, int64_t usage, bool hold = false) {
    return "GET " + path + " HTTP/1.1\r\nHost: t\r\nX-Usage: " + std::to_string(usage) +
           (hold ? "\r\nX-Hold: 1" : "") + "\r\nConnection: close\r\n\r\n";
  }
  // One request, read to the end; waits until its settlement was counted.
  Answer Get(const std::string& path, int64_t usage) {
    const uint64_t before = SettlementsSoFar();
    const int c = Connect();
    const std::string req = Request(path, usage);
    EXPECT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    Answer a;
    char buf[8192];
    for (;;) {
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      a.raw.append(buf, static_cast<size_t>(n));
    }
    ::close(c);
    const size_t head = a.raw.find("\r\n\r\n");
    if (head != std::string::npos && a.raw.starts_with("HTTP/1.1 200")) {
      a.body = a.raw.find("Transfer-Encoding: chunked") < head ? Dechunk(a.raw.substr(head + 4))
                                                               : a.raw.substr(head + 4);
      WaitForSettlements(before + 1);
    }
    return a;
  }
  // A GET of `path` with `headers` ("Name: value\r\n" each), read to the
  // end; waits until its settlement was counted.
  std::string GetWith(const std::string& path, const std::string& headers) {
    const uint64_t before = SettlementsSoFar();
    std::string raw = Exchange("GET " + path + " HTTP/1.1\r\nHost: t\r\n" + headers +
                               "Connection: close\r\n\r\n");
    WaitForSettlements(before + 1);
    return raw;
  }
  // Sends `req` on a new connection (to `port`, else the gateway's) and
  // reads the answer until the server closes.
  std::string Exchange(const std::string& req, uint16_t port = 0) const {
    const int c = Connect(port);
    EXPECT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string raw;
    char buf[8192];
    for (ssize_t n; (n = ::recv(c, buf, sizeof buf, 0)) > 0;)
      raw.append(buf, static_cast<size_t>(n));
    ::close(c);
    return raw;
  }
  static void WaitForSettlements(uint64_t n) {
    const auto until = SteadyClock::now() + std::chrono::seconds(10);
    while (SettlementsSoFar() < n && SteadyClock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    EXPECT_GE(SettlementsSoFar(), n) << "no settlement counted";
  }
  // The client's bucket now, as a cost-0 check reports it.
  int64_t Remaining() {
    const Limit* l = policy_->NamedLimit("tokens");
    LimitCheck checks[] = {{l, 0}};
    std::promise<StatusOr<CheckResult>> got;
    store_->Peek({.key = "ip:127.0.0.1", .checks = checks},
                 [&](StatusOr<CheckResult> r) { got.set_value(std::move(r)); });
    StatusOr<CheckResult> r = got.get_future().get();
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->decisions[0].remaining : -1;
  }

  ManualClock clock_{kStart};
  testing::SseUpstream upstream_;
  std::unique_ptr<testing::RedisServer> redis_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<const policy::Policy> policy_;
  std::unique_ptr<PolicyHolder> holder_;
  std::unique_ptr<Enforcer> enforcer_;
  net::io_context ioc_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_{
      ioc_.get_executor()};
  std::unique_ptr<Gateway> gateway_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<Gateway> other_gateway_;  // ServeThrough
  std::unique_ptr<Router> other_router_;
  SessionRegistry registry_;
  std::shared_ptr<Listener> listener_;
  std::shared_ptr<Listener> other_listener_;
  uint16_t port_ = 0;
  std::vector<std::thread> threads_;
};

// The run: each request reserves 1,000 and reports 200..5,000; the bucket
// may go into debt (then the next requests are denied until the manual clock
// has refilled it). The test's own model of the bucket is exact (no refill
// ever reaches the capacity), and the store must agree with it throughout:
// what was charged is the sum of the reported usages.
TEST_P(MeteredGateway, TotalChargedIsTheSumOfReportedUsages) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int64_t> usage_of(200, 5000);
  int64_t tokens = 10'000, usages = 0, refilled = 0;
  int allowed = 0, denied = 0;
  const uint64_t debited = Metrics::Global().settled_debited.value();
  const uint64_t refunded = Metrics::Global().settled_refunded.value();
  const std::string stream_start = "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n";
  while (allowed < 40) {
    const int64_t usage = usage_of(rng);
    Answer a = Get("/sse", usage);
    if (tokens >= 1000) {
      ASSERT_TRUE(a.raw.starts_with("HTTP/1.1 200")) << "tokens " << tokens << ": " << a.raw;
      // The stream is relayed unchanged.
      EXPECT_EQ(a.body, stream_start +
                            "data: {\"id\":\"x\",\"usage\":{\"prompt_tokens\":1,\"total_tokens\":" +
                            std::to_string(usage) + "}}\n\ndata: [DONE]\n\n");
      tokens -= usage;
      usages += usage;
      ++allowed;
    } else {
      ASSERT_TRUE(a.raw.starts_with("HTTP/1.1 429")) << "tokens " << tokens << ": " << a.raw;
      ++denied;
      clock_.Advance(std::chrono::seconds(6));  // 1,000 tokens
      tokens += 1000;
      refilled += 1000;
    }
    if (tokens >= 0) {
      ASSERT_EQ(Remaining(), tokens) << "after " << allowed << " requests";
    }
  }
  EXPECT_GT(denied, 0) << "the run never went into debt";
  // Bring the bucket out of debt without reaching its capacity, and read it.
  while (tokens < 0) {
    clock_.Advance(std::chrono::seconds(6));
    tokens += 1000;
    refilled += 1000;
  }
  EXPECT_EQ(Remaining(), tokens);
  EXPECT_EQ(10'000 + refilled - Remaining(), usages) << "charged != the sum of the usages";
  // And the settled units say the same: reserved + debited - refunded.
  EXPECT_EQ(int64_t{1000} * allowed +
                static_cast<int64_t>(Metrics::Global().settled_debited.value() - debited) -
                static_cast<int64_t>(Metrics::Global().settled_refunded.value() - refunded),
            usages);
}

TEST_P(MeteredGateway, MaxCapsTheActualCost) {
  ASSERT_TRUE(Get("/sse", 9000).raw.starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 10'000 - 6000);
}

// The chat route's limit counts tokens (`unit: tokens`): its RateLimit-Policy
// says so with qu; the header route's (no unit) counts requests, no qu. The
// next response's RateLimit shows what the last settlement left.
TEST_P(MeteredGateway, RateLimitPolicyNamesTheUnitAndRateLimitFollowsTheSettlement) {
  Answer a = Get("/sse", 2500);
  ASSERT_TRUE(a.raw.starts_with("HTTP/1.1 200")) << a.raw;
  EXPECT_NE(a.raw.find("RateLimit-Policy: \"tokens\";q=10000;w=60;qu=\"tokens\"\r\n"),
            std::string::npos)
      << a.raw;
  EXPECT_NE(a.raw.find("RateLimit: \"tokens\";r=9000;"), std::string::npos) << a.raw;  // reserved
  Answer b = Get("/sse", 100);
  EXPECT_NE(b.raw.find("RateLimit: \"tokens\";r=6500;"),
            std::string::npos)  // 10,000 - 2,500 - 1,000
      << b.raw;
  Answer h = Get("/header", 300);
  EXPECT_NE(h.raw.find("RateLimit-Policy: \"tokens\";q=10000;w=60\r\n"), std::string::npos)
      << h.raw;
}

TEST_P(MeteredGateway, FromAResponseHeaderAndFromATrailer) {
  const uint64_t settled = Metrics::Global().Settlements(Metrics::SettleOutcome::kSettled).value();
  Answer h = Get("/header", 300);
  ASSERT_TRUE(h.raw.starts_with("HTTP/1.1 200")) << h.raw;
  EXPECT_EQ(h.body, "ok");
  EXPECT_EQ(Remaining(), 10'000 - 300);
  Answer t = Get("/trailer", 2500);
  ASSERT_TRUE(t.raw.starts_with("HTTP/1.1 200")) << t.raw;
  EXPECT_EQ(t.body, "embedding");
  EXPECT_EQ(Remaining(), 10'000 - 300 - 2500);
  EXPECT_EQ(Metrics::Global().Settlements(Metrics::SettleOutcome::kSettled).value(), settled + 2);
  // Without the header or trailer the reservation stands.
  const uint64_t missing = Metrics::Global().Settlements(Metrics::SettleOutcome::kMissing).value();
  const uint64_t before = SettlementsSoFar();
  const int c = Connect();
  const std::string req = "GET /header HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
  ::send(c, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[4096];
  while (::recv(c, buf, sizeof buf, 0) > 0) {
  }
  ::close(c);
  WaitForSettlements(before + 1);
  EXPECT_EQ(Metrics::Global().Settlements(Metrics::SettleOutcome::kMissing).value(), missing + 1);
  EXPECT_EQ(Remaining(), 10'000 - 300 - 2500 - 1000);
}

// Unbuffered: the client reads the first event while the upstream holds the
// rest back; the client then leaves, and the request (its reservation the
// route's `reserve`, 1,000: the request names none) is settled at the route's
// max, 6,000, however much the upstream reports afterwards. (It paid its
// reservation: a client could pay what it chose by leaving.)
TEST_P(MeteredGateway, FirstEventArrivesBeforeTheLastAndALeavingClientPaysTheMax) {
  const uint64_t disconnected =
      Metrics::Global().Settlements(Metrics::SettleOutcome::kDisconnected).value();
  const int c = Connect();
  const std::string req = Request("/sse", 4000, /*hold=*/true);
  ASSERT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string got;
  ASSERT_TRUE(ratelimit::testing::ReadFirstEvent(c, got))
      << "the first event did not come through while the upstream held: " << got;
  EXPECT_EQ(upstream_.last_event_sent.load(), 0) << "the upstream had already finished";
  ::close(c);
  upstream_.Release();
  const auto until = SteadyClock::now() + std::chrono::seconds(10);
  while (Metrics::Global().Settlements(Metrics::SettleOutcome::kDisconnected).value() ==
             disconnected &&
         SteadyClock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  EXPECT_EQ(Metrics::Global().Settlements(Metrics::SettleOutcome::kDisconnected).value(),
            disconnected + 1);
  EXPECT_EQ(Remaining(), 10'000 - 6000);
}

// The reservation a request names (X-Estimate, as max_tokens) is not what it
// pays when the usage cannot be read: a JSON answer (a non-streaming request)
// is read whole for the usage, whether it came with its head or chunked; no
// usable usage charges the route's max (2,000), and so does a client leaving
// mid-stream (the chat route's 6,000). The client paid 1 for a JSON answer
// reporting 1,500 (no SSE event to read), and 0 by leaving.
TEST_P(MeteredGateway, ClientChosenReservationIsNotTheCostWhenUsageIsMissingOrTheClientLeaves) {
  Metrics& m = Metrics::Global();
  const uint64_t missing = m.Settlements(Metrics::SettleOutcome::kMissing).value();
  std::string raw = GetWith("/json", "X-Estimate: 1\r\nX-Usage: 1500\r\n");
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  EXPECT_EQ(Remaining(), 10'000 - 1500);
  raw = GetWith("/json", "X-Estimate: 1\r\nX-Usage: 500\r\nX-Chunked: 1\r\n");
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  EXPECT_EQ(Remaining(), 10'000 - 1500 - 500);
  raw = GetWith("/json", "X-Estimate: 1\r\nX-Usage: \"many\"\r\n");  // not a number
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  EXPECT_EQ(m.Settlements(Metrics::SettleOutcome::kMissing).value(), missing + 1);
  EXPECT_EQ(Remaining(), 10'000 - 1500 - 500 - 2000);
  // The upstream's own error (its 429, no usage) did no metered work: the
  // reservation stands, not the max.
  raw = GetWith("/json", "X-Estimate: 0\r\nX-Status: 429\r\n");
  EXPECT_TRUE(raw.starts_with("HTTP/1.1 429")) << raw;
  EXPECT_EQ(m.Settlements(Metrics::SettleOutcome::kMissing).value(), missing + 2);
  EXPECT_EQ(Remaining(), 10'000 - 1500 - 500 - 2000);
  // A stream reserving 0, left after its first event: the route's max.
  const uint64_t before = SettlementsSoFar();
  const int c = Connect();
  const std::string req =
      "GET /sse HTTP/1.1\r\nHost: t\r\nX-Estimate: 0\r\nX-Usage: 5000\r\nX-Hold: 1\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string got;
  ASSERT_TRUE(ratelimit::testing::ReadFirstEvent(c, got)) << got;
  ::close(c);
  upstream_.Release();
  WaitForSettlements(before + 1);
  EXPECT_EQ(Remaining(), 10'000 - 1500 - 500 - 2000 - 6000);
}

// A small answer that arrives whole with its head (a Content-Length body of
// up to 64 KiB) is settled at once, from its usage, when the gateway has it:
// a client that leaves without reading it pays the usage (outcome settled),
// as configuration.md says; a streamed one settles after its last piece.
TEST_P(MeteredGateway, ASmallSseAnswerSettlesAtItsUsageEvenIfTheClientLeaves) {
  const uint64_t settled = Metrics::Global().Settlements(Metrics::SettleOutcome::kSettled).value();
  const uint64_t before = SettlementsSoFar();
  const int c = Connect();
  const std::string req =
      "GET /sse HTTP/1.1\r\nHost: t\r\nX-Estimate: 100\r\nX-Usage: 2500\r\nX-Small: 1\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(::send(c, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  ::shutdown(c, SHUT_WR);
  ::close(c);  // gone without reading a byte
  WaitForSettlements(before + 1);
  EXPECT_EQ(Metrics::Global().Settlements(Metrics::SettleOutcome::kSettled).value(), settled + 1);
  EXPECT_EQ(Remaining(), 10'000 - 2500);
}

// A reservation the request names (no `max`) above the limit's capacity can
// never fit: a denial (429, the limit's numbers, nothing taken), not a 400;
// on a shadow route it passes, and nothing is settled for the group that
// took nothing (a settlement would refund what was never taken).
TEST_P(MeteredGateway, AReservationAboveTheCapacityIsDeniedAndAShadowRouteLetsItPass) {
  ASSERT_TRUE(Get("/header", 3000).raw.starts_with("HTTP/1.1 200"));
  ASSERT_EQ(Remaining(), 7000);
  auto send = [this](std::string_view method) {
    return Exchange(std::string(method) +
                    " /header HTTP/1.1\r\nHost: t\r\nX-Estimate: 20000\r\n"
                    "X-Usage: 300\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  };
  const std::string denied = send("POST");
  EXPECT_TRUE(denied.starts_with("HTTP/1.1 429")) << denied;
  EXPECT_NE(denied.find("RateLimit: \"tokens\";r=7000;"), std::string::npos) << denied;
  EXPECT_NE(denied.find("Retry-After: 60\r\n"), std::string::npos) << denied;  // a full refill
  EXPECT_EQ(Remaining(), 7000);
  const std::string shadow = send("PUT");
  EXPECT_TRUE(shadow.starts_with("HTTP/1.1 200")) << shadow;
  // Let a settlement, if one were made, land before looking.
  EXPECT_TRUE(Get("/header", 0).raw.starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 7000);
}

// A request the gateway never sent (the upstream refuses the connection:
// 502) gives its reservation back, counted as not_forwarded; the reservation
// of 2,500 stood, uncounted (outcome missing).
TEST_P(MeteredGateway, AnUnreachableUpstreamRefundsTheReservation) {
  // A port nobody listens on: bound, then closed.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(s);
  const uint16_t port = ServeThrough("http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  ASSERT_NE(port, 0);
  Metrics& m = Metrics::Global();
  const uint64_t unforwarded = m.Settlements(Metrics::SettleOutcome::kNotForwarded).value();
  const uint64_t before = SettlementsSoFar();
  const std::string raw = Exchange(
      "POST /header HTTP/1.1\r\nHost: t\r\nX-Estimate: 2500\r\nContent-Length: 0\r\n"
      "Connection: close\r\n\r\n",
      port);
  ASSERT_TRUE(raw.starts_with("HTTP/1.1 502")) << raw;
  WaitForSettlements(before + 1);
  EXPECT_EQ(m.Settlements(Metrics::SettleOutcome::kNotForwarded).value(), unforwarded + 1);
  EXPECT_EQ(Remaining(), 10'000);
}

// A usage above what an int64 holds is a very large cost, capped (at `max`,
// else at the most one settlement debits), not an unusable value: read as
// missing, it left the reservation standing. From an SSE event (an unsigned
// JSON number above INT64_MAX), a JSON body (above uint64: a float) and a
// trailer (text).
TEST_P(MeteredGateway, AnOverflowingUsageIsCappedNotIgnored) {
  const uint64_t missing = Metrics::Global().Settlements(Metrics::SettleOutcome::kMissing).value();
  EXPECT_TRUE(GetWith("/sse", "X-Usage: 9223372036854775808\r\n").starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 10'000 - 6000);  // the chat route's max
  EXPECT_TRUE(GetWith("/json", "X-Estimate: 1\r\nX-Usage: 99999999999999999999999\r\n")
                  .starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 10'000 - 6000 - 2000);  // the completion route's max
  EXPECT_TRUE(
      GetWith("/trailer", "X-Usage: 99999999999999999999999\r\n").starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 0);  // 2^31-1 debited beyond the reservation: deep in debt
  EXPECT_EQ(Metrics::Global().Settlements(Metrics::SettleOutcome::kMissing).value(), missing);
}

// A route whose limits fall into two groups (another failure_mode) settles
// each group, but its units count once: a refund of 700 counted 1,400.
TEST_P(MeteredGateway, SettledUnitsCountOncePerRequest) {
  const uint64_t refunded = Metrics::Global().settled_refunded.value();
  ASSERT_TRUE(Get("/split", 300).raw.starts_with("HTTP/1.1 200"));
  EXPECT_EQ(Remaining(), 10'000 - 300);
  EXPECT_EQ(Metrics::Global().settled_refunded.value() - refunded, 700u);
}

INSTANTIATE_TEST_SUITE_P(Stores, MeteredGateway, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Redis" : "Memory";
                         });

}  // namespace
}  // namespace ratelimit::server
