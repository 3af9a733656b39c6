// GrpcFace in process, against gRPC C++'s client: what the daemon tests
// (tests/envoy) cannot see from outside.
#include "grpc/grpc_face.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/raw_h2_test_util.h"
#include "grpc/should_rate_limit.h"
#include "ratelimit/memory_store.h"

namespace ratelimit::grpcface {
namespace {

using namespace std::chrono_literals;
namespace hpb = ::grpc::health::v1;
namespace net = boost::asio;

constexpr char kWatch[] = "/grpc.health.v1.Health/Watch";

template <class Pred>
bool Eventually(Pred pred, std::chrono::milliseconds within = 5s) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Watch calls whose client cancels them, or whose connection closes, are
// forgotten: before, each stayed among the watchers until the shutdown and
// kept its connection (and its memory) alive.
// A face on a memory store, on two threads of its own io_context.
class GrpcFaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One domain: `k` of any value, 1 a minute.
    char dir[] = "/tmp/grpc_face_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    std::ofstream(dir_ + "/d.yaml") << "domain: d\ndescriptors:\n  - key: k\n"
                                       "    rate_limit: {unit: minute, requests_per_unit: 1}\n"
                                       "  - key: banned\n"
                                       "    rate_limit: {unit: minute, requests_per_unit: 0}\n"
                                       "  - key: f\n"
                                       "    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    StatusOr<std::unique_ptr<GrpcFace>> f =
        GrpcFace::Start({.listen = "127.0.0.1:0", .envoy_config_dir = dir_, .headers = headers_},
                        std::make_shared<MemoryStore>(), ioc_);
    ASSERT_TRUE(f.ok()) << f.status().message();
    face_ = std::move(*f);
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }
  void TearDown() override {
    if (face_) face_->Shutdown();
    work_.reset();
    ioc_.stop();  // the face's SIGHUP and inotify waits stay: its owner stops the loop
    for (auto& t : threads_) t.join();
    std::filesystem::remove_all(dir_);
  }
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(face_->port()),
                               grpc::InsecureChannelCredentials());
  }

  std::string dir_;
  policy::HeaderDialect headers_ = policy::HeaderDialect::kNone;  // set before SetUp

  net::io_context ioc_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_{
      ioc_.get_executor()};
  std::unique_ptr<GrpcFace> face_;
  std::vector<std::thread> threads_;
};

TEST_F(GrpcFaceTest, AWatchIsForgottenWhenItsClientCancelsOrGoes) {
  GrpcFace* face = face_.get();

  constexpr int kCycles = 20;
  for (int i = 0; i < kCycles; ++i) {
    SCOPED_TRACE(i);
    // A connection of its own each time (no subchannel shared between
    // channels).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(face->port()),
                                             grpc::InsecureChannelCredentials(), args);
    auto health = hpb::Health::NewStub(channel);
    grpc::ClientContext ctx;
    auto reader = health->Watch(&ctx, hpb::HealthCheckRequest());
    hpb::HealthCheckResponse r;
    ASSERT_TRUE(reader->Read(&r));
    EXPECT_EQ(r.status(), hpb::HealthCheckResponse::SERVING);
    ASSERT_TRUE(Eventually([&] { return face->watchers() == 1; }));
    ctx.TryCancel();  // RST_STREAM; the connection stays until the channel goes
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_TRUE(Eventually([&] { return face->watchers() == 0; }));
  }
  // A client that closes its connection with the call open (gRPC C++'s
  // client cannot: it cancels first).
  for (int i = 0; i < kCycles; ++i) {
    SCOPED_TRACE(i);
    const int fd = rawh2::Connect(face->port());
    const std::string watch = std::string(rawh2::kPreface) + rawh2::Frame(0x4, 0, 0, "") +
                              rawh2::Frame(0x1, 0x4, 1, rawh2::RequestHeaders(kWatch)) +
                              rawh2::Frame(0x0, 0x1, 1, rawh2::Framed(0));
    const bool sent = rawh2::SendAll(fd, watch);
    const bool watching = Eventually([&] { return face->watchers() == 1; });
    close(fd);
    ASSERT_TRUE(sent && watching);
    ASSERT_TRUE(Eventually([&] { return face->watchers() == 0; }));
  }
  // Every channel is gone: their connections close, and nothing keeps them.
  EXPECT_TRUE(Eventually([&] { return face->watchers() == 0; }))
      << face->watchers() << " watchers left";
  EXPECT_TRUE(Eventually([&] { return face->connections() == 0; }, 10s))
      << face->connections() << " connections left";
}

// More limits than one store step takes (kMaxChecksPerRequest, 16): decided
// 16 at a time, not refused (Envoy would fail open on the error, silently).
// A step after a denied one takes nothing.
TEST_F(GrpcFaceTest, ARequestWithMoreLimitsThanOneStoreStepIsDecided) {
  namespace rls = ::envoy::service::ratelimit::v3;
  auto stub = rls::RateLimitService::NewStub(Channel());
  // A request of descriptors {k: v<value>}; its status and answer.
  auto call = [&](const std::vector<int>& values, rls::RateLimitResponse* resp) {
    rls::RateLimitRequest req;
    req.set_domain("d");
    for (int v : values) {
      auto* e = req.add_descriptors()->add_entries();
      e->set_key("k");
      e->set_value("v" + std::to_string(v));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    return stub->ShouldRateLimit(&ctx, req, resp);
  };
  auto ask = [&](const std::vector<int>& values) {
    rls::RateLimitResponse resp;
    const grpc::Status s = call(values, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  };
  std::vector<int> first(20);
  for (int i = 0; i < 20; ++i) first[i] = i;
  rls::RateLimitResponse r = ask(first);
  ASSERT_EQ(r.statuses_size(), 20);
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OK);
  for (const auto& st : r.statuses()) EXPECT_EQ(st.limit_remaining(), 0u);
  r = ask(first);  // each of the 20 was counted
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  // The first step is denied; the second, asked without counting, reports
  // its standing count (as a descriptor does beside one whose cost is too big).
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(r.statuses(i).code(),
              i < 16 ? rls::RateLimitResponse::OVER_LIMIT : rls::RateLimitResponse::OK);
    EXPECT_EQ(r.statuses(i).limit_remaining(), 0u);
  }

  // v0 (spent) in the first step denies it; the second step (v35-v38) is
  // asked without counting: all of v20-v38 are still free afterwards.
  std::vector<int> mixed = {0};
  for (int i = 20; i < 39; ++i) mixed.push_back(i);
  r = ask(mixed);
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(19).code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(19).limit_remaining(), 1u);
  for (int v : {20, 34, 35, 38}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(ask({v}).overall_code(), rls::RateLimitResponse::OK);
  }
  // Past kMaxLimitsPerRequest: refused.
  std::vector<int> too_many(257);
  for (int i = 0; i < 257; ++i) too_many[i] = 1000 + i;
  rls::RateLimitResponse resp;
  EXPECT_EQ(call(too_many, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Envoy's apply_on_stream_done through the face: a cost that did not fit is
// charged before the answer (grpc/decide.cc), so the next check before a
// stream is OVER_LIMIT.
TEST_F(GrpcFaceTest, AStreamDoneCostThatDoesNotFitSpendsTheLimit) {
  namespace rls = ::envoy::service::ratelimit::v3;
  auto stub = rls::RateLimitService::NewStub(Channel());
  auto ask = [&](uint64_t hits) {
    rls::RateLimitRequest req;
    req.set_domain("d");
    auto* d = req.add_descriptors();
    auto* e = d->add_entries();
    e->set_key("k");
    e->set_value("stream");
    d->mutable_hits_addend()->set_value(hits);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    rls::RateLimitResponse resp;
    EXPECT_TRUE(stub->ShouldRateLimit(&ctx, req, &resp).ok());
    return resp.overall_code();
  };
  EXPECT_EQ(ask(0), rls::RateLimitResponse::OK);          // before the stream
  EXPECT_EQ(ask(3), rls::RateLimitResponse::OVER_LIMIT);  // its cost: 3 of 1
  EXPECT_EQ(ask(0), rls::RateLimitResponse::OVER_LIMIT);  // the next stream
}

namespace rls = ::envoy::service::ratelimit::v3;
using Descriptor = ::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

// One ShouldRateLimit of domain d with `descriptors`; the call's status.
grpc::Status Ask(const std::shared_ptr<grpc::Channel>& channel,
                 const std::vector<Descriptor>& descriptors, rls::RateLimitResponse* resp) {
  auto stub = rls::RateLimitService::NewStub(channel);
  rls::RateLimitRequest req;
  req.set_domain("d");
  for (const auto& d : descriptors) *req.add_descriptors() = d;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  return stub->ShouldRateLimit(&ctx, req, resp);
}

Descriptor Desc(const std::string& key, const std::string& value) {
  Descriptor d;
  auto* e = d.add_entries();
  e->set_key(key);
  e->set_value(value);
  return d;
}

// A request of more limits than one store step takes, denied in its second
// step: what the first step took stands, and is not charged again as an
// overdraft (grpc/decide.cc, envoy::Overdrafts). Before, each of the first
// step's checks whose cost was above what it had left after taking it was
// charged its cost once more.
TEST_F(GrpcFaceTest, ADenialInALaterStepChargesNothingMoreToAnEarlierOne) {
  rls::RateLimitResponse r;
  ASSERT_TRUE(Ask(Channel(), {Desc("k", "spent")}, &r).ok());
  ASSERT_EQ(r.overall_code(), rls::RateLimitResponse::OK);  // k=spent: 1 of 1 used
  std::vector<Descriptor> many;
  for (int i = 0; i < 16; ++i) {  // the first step: 3 of 5 each, 2 left
    many.push_back(Desc("f", "x" + std::to_string(i)));
    many.back().mutable_hits_addend()->set_value(3);
  }
  many.push_back(Desc("k", "spent"));  // the second step: denied
  ASSERT_TRUE(Ask(Channel(), many, &r).ok());
  ASSERT_EQ(r.statuses_size(), 17);
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 2u);
  EXPECT_EQ(r.statuses(16).code(), rls::RateLimitResponse::OVER_LIMIT);
  for (int i : {0, 15}) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(Ask(Channel(), {Desc("f", "x" + std::to_string(i))}, &r).ok());
    EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OK);
    EXPECT_EQ(r.statuses(0).limit_remaining(), 1u);  // 3 + 1 of 5
  }
}

// Two identical descriptors (two of a route's actions that produce the same
// entries) are answered, not refused: as envoyproxy/ratelimit's INCRBY per
// descriptor on the one counter, the first sees 1 of 1 (OK, 0 left), the
// second 2 (OVER_LIMIT), and both hits count. Before, the store refused the
// request: INVALID_ARGUMENT ("limit '...' appears twice in one request"),
// which Envoy lets through by default.
TEST_F(GrpcFaceTest, IdenticalDescriptorsAreAnsweredEachInTurn) {
  rls::RateLimitResponse r;
  const grpc::Status s = Ask(Channel(), {Desc("k", "twin"), Desc("k", "twin")}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(r.statuses_size(), 2);
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 1u);
  EXPECT_EQ(r.statuses(1).code(), rls::RateLimitResponse::OVER_LIMIT);
  rls::RateLimitResponse next;
  ASSERT_TRUE(Ask(Channel(), {Desc("k", "twin")}, &next).ok());
  EXPECT_EQ(next.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
}

// Through the face, as Envoy sends it: a descriptor without entries (a
// request_headers action with skip_if_absent, its header missing) is OK
// without a limit, and the request's other descriptor still counts. Before,
// the call failed with INVALID_ARGUMENT, and Envoy let the request through
// past every limit.
TEST_F(GrpcFaceTest, ADescriptorWithoutEntriesHasNoLimitAndTheOthersCount) {
  rls::RateLimitResponse r;
  grpc::Status s = Ask(Channel(), {Descriptor(), Desc("k", "no-header")}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(r.statuses_size(), 2);
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).code(), rls::RateLimitResponse::OK);
  EXPECT_FALSE(r.statuses(0).has_current_limit());
  EXPECT_EQ(r.statuses(1).current_limit().requests_per_unit(), 1u);
  s = Ask(Channel(), {Descriptor(), Desc("k", "no-header")}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);  // k: 1 a minute, spent
  EXPECT_EQ(r.statuses(0).code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(1).code(), rls::RateLimitResponse::OVER_LIMIT);
}

// More than kMaxDescriptorsPerRequest (1,024) descriptors is INVALID_ARGUMENT,
// refused before the request is parsed: empty descriptors (2 bytes each on
// the wire) cost about 250 times that parsed, planned and answered, so a
// 4 MiB request of them held about 1 GB. Before, any number was answered.
TEST_F(GrpcFaceTest, MoreDescriptorsThanTheMaximumAreRefused) {
  rls::RateLimitResponse r;
  std::vector<Descriptor> most(1024);
  most.back() = Desc("k", "last");
  grpc::Status s = Ask(Channel(), most, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.statuses_size(), 1024);
  EXPECT_EQ(r.statuses(1023).current_limit().requests_per_unit(), 1u);
  std::vector<Descriptor> too_many(1025);
  s = Ask(Channel(), too_many, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "the request has more than 1024 descriptors");
}

// The count that keeps more than the maximum from the parse counts what the
// parse keeps. A group is an unknown field to it, skipped whole: the count
// stopped at the first one, so a group and then any number of descriptors
// (2 bytes each when empty) reached the parse, and its memory, unbounded
// (fuzz/regressions/grpc/group-before-descriptors).
TEST(DescriptorsIn, CountsWhatTheParseKeepsAcrossGroups) {
  const std::string empty("\x12\x00", 2);  // a descriptor, field 2, of no bytes
  // Field 1 as an (empty) group, then three descriptors.
  std::string request = "\x0b\x0c" + empty + empty + empty;
  // A group of field 2 holding what looks like a descriptor, nested in a group
  // of field 7: not a descriptor; and one after it.
  request += "\x3b\x13" + empty + "\x14\x3c" + empty;
  rls::RateLimitRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request));
  ASSERT_EQ(parsed.descriptors_size(), 4);
  EXPECT_EQ(DescriptorsIn(request, 1024), 4u);
  EXPECT_EQ(DescriptorsIn(request, 2), 3u);  // stops past `stop`
  // An end without its start, or of another group: the parse fails too.
  EXPECT_FALSE(parsed.ParseFromString("\x0c" + empty));
  EXPECT_FALSE(parsed.ParseFromString("\x0b\x14" + empty));
}

// More than kMaxEntriesPerRequest (4,096) entries in all is INVALID_ARGUMENT,
// refused before the parse as too many descriptors are: an empty entry is 2
// bytes on the wire, so one descriptor of a 4 MiB request carried about two
// million of them into the parse and the plan. Before, any number was answered.
TEST_F(GrpcFaceTest, MoreEntriesThanTheMaximumAreRefused) {
  rls::RateLimitResponse r;
  Descriptor deep = Desc("k", "deep");  // 2,048 entries, the config's depth exceeded: no limit
  for (int i = 1; i < 2048; ++i) deep.add_entries()->set_key("x");
  grpc::Status s = Ask(Channel(), {deep, deep}, &r);  // 4,096 in all
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.statuses_size(), 2);
  Descriptor deeper = deep;
  deeper.add_entries();
  s = Ask(Channel(), {deeper, deep}, &r);  // 4,097
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "the request's descriptors have more than 4096 entries in all");
}

// The entries are counted as the parse keeps them: those of descriptors at
// the message's top level, not inside a group (an unknown field, skipped).
TEST(EntriesIn, CountsWhatTheParseKeeps) {
  const std::string entry("\x0a\x00", 2);              // an entry, field 1, of no bytes
  const std::string two = "\x12\x04" + entry + entry;  // a descriptor of two entries
  const std::string in_group = "\x12\x06\x0b" + entry + "\x0c" + entry;  // one, and one in a group
  std::string request = two + in_group + "\x1b" + two + "\x1c" + two;    // a group holding two
  rls::RateLimitRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(request));
  ASSERT_EQ(parsed.descriptors_size(), 3);
  size_t entries = 0;
  for (const auto& d : parsed.descriptors()) entries += static_cast<size_t>(d.entries_size());
  ASSERT_EQ(entries, 5u);
  EXPECT_EQ(EntriesIn(request, 4096), 5u);
  EXPECT_EQ(EntriesIn(request, 2), 3u);  // stops past `stop`
}

// A request's `limit` override of requests_per_unit 0 blocks, as
// `requests_per_unit: 0` in the config does; before, INVALID_ARGUMENT.
TEST_F(GrpcFaceTest, AnOverrideOfZeroBlocks) {
  Descriptor d = Desc("k", "overridden");
  d.mutable_limit()->set_requests_per_unit(0);
  d.mutable_limit()->set_unit(::envoy::type::v3::SECOND);
  rls::RateLimitResponse r;
  const grpc::Status s = Ask(Channel(), {d}, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  ASSERT_TRUE(r.statuses(0).has_current_limit());
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 0u);
  EXPECT_EQ(r.statuses(0).current_limit().unit(), rls::RateLimitResponse::RateLimit::SECOND);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
}

class GrpcFaceLegacyHeadersTest : public GrpcFaceTest {
 protected:
  GrpcFaceLegacyHeadersTest() { headers_ = policy::HeaderDialect::kLegacy; }
};

// The headers of a request blocked by a limit of 0 (`requests_per_unit: 0`,
// or a request's override of 0) say 0, as envoyproxy/ratelimit's do (the
// current_limit's requests_per_unit, and limit_remaining), and that it is
// denied. Before, they reported the store's stand-in limit of 1, with 1
// left and no Retry-After.
TEST_F(GrpcFaceLegacyHeadersTest, AZeroLimitReportsZero) {
  Descriptor overridden = Desc("k", "zero");
  overridden.mutable_limit()->set_requests_per_unit(0);
  overridden.mutable_limit()->set_unit(::envoy::type::v3::MINUTE);
  for (const auto& d : {Desc("banned", "x"), overridden}) {
    rls::RateLimitResponse r;
    const grpc::Status s = Ask(Channel(), {d}, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
    std::map<std::string, std::string> headers;
    for (const auto& h : r.response_headers_to_add()) headers[h.key()] = h.value();
    EXPECT_EQ(headers["X-RateLimit-Limit"], "0");
    EXPECT_EQ(headers["X-RateLimit-Remaining"], "0");
    EXPECT_TRUE(headers.contains("Retry-After"));
    const int reset = std::stoi(headers["X-RateLimit-Reset"]);
    EXPECT_GE(reset, 1);
    EXPECT_LE(reset, 60);
  }
  // A limit that is not 0 reports its numbers, as before.
  rls::RateLimitResponse r;
  ASSERT_TRUE(Ask(Channel(), {Desc("k", "one")}, &r).ok());
  std::map<std::string, std::string> headers;
  for (const auto& h : r.response_headers_to_add()) headers[h.key()] = h.value();
  EXPECT_EQ(headers["X-RateLimit-Limit"], "1");
  EXPECT_EQ(headers["X-RateLimit-Remaining"], "0");
  EXPECT_FALSE(headers.contains("Retry-After"));
}

// Any client of the gRPC port can send a domain that is not UTF-8; libprotobuf
// refuses it and logs a line of its own to stderr each time. Those lines go
// through the JSON log, sampled: a flood of 200 writes a handful.
TEST(ProtobufLog, InvalidUtf8FloodsGoThroughTheSampledJsonLog) {
  LogProtobufThroughJsonLog();
  const std::string bad_domain = std::string("\x0a\x02\xff\xfe", 4);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 200; ++i) {
    rls::RateLimitRequest request;
    EXPECT_FALSE(request.ParseFromString(bad_domain));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  std::vector<std::string> lines;
  for (size_t at = 0; at < err.size();) {
    const size_t nl = err.find('\n', at);
    lines.push_back(err.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    at = nl == std::string::npos ? err.size() : nl + 1;
  }
  ASSERT_FALSE(lines.empty()) << "libprotobuf logged nothing: the test no longer covers it";
  EXPECT_LE(lines.size(), 12u) << err.substr(0, 2000);
  for (const std::string& line : lines) {
    EXPECT_TRUE(line.starts_with('{')) << line;
    EXPECT_NE(line.find("\"msg\":\"protobuf"), std::string::npos)
        << line;  // or its suppressed count
  }
  EXPECT_NE(lines.front().find("invalid UTF-8"), std::string::npos) << lines.front();
}

}  // namespace
}  // namespace ratelimit::grpcface
