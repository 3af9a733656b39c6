// GrpcFace in process, against gRPC C++'s client: what the daemon tests
// (tests/envoy) cannot see from outside.
#include "grpc/grpc_face.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/raw_h2_test_util.h"
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
    StatusOr<std::unique_ptr<GrpcFace>> f =
        GrpcFace::Start({.listen = "127.0.0.1:0"}, std::make_shared<MemoryStore>(), ioc_);
    ASSERT_TRUE(f.ok()) << f.status().message();
    face_ = std::move(*f);
    for (int i = 0; i < 2; ++i) threads_.emplace_back([this] { ioc_.run(); });
  }
  void TearDown() override {
    if (face_) face_->Shutdown();
    work_.reset();
    ioc_.stop();  // the face's SIGHUP and inotify waits stay: its owner stops the loop
    for (auto& t : threads_) t.join();
  }

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

}  // namespace
}  // namespace ratelimit::grpcface
