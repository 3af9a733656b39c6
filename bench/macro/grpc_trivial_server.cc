// grpc_trivial_server: the same RateLimitService (proto/), answering every
// ShouldRateLimit OK without deciding anything: gRPC's own ceiling on this
// machine, the peer of ratelimitd's gRPC face in scripts/bench.sh (row 8).
// gRPC C++ (callback API, gRPC's default threads), what a service written
// with gRPC's own server would start from; ratelimitd's face runs on a
// server of its own (src/grpc/h2_server.h).
//
//   grpc_trivial_server --listen=127.0.0.1:0    prints "listening PORT", serves until SIGTERM
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace {

namespace pb = ::envoy::service::ratelimit::v3;

class Trivial final : public pb::RateLimitService::CallbackService {
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const pb::RateLimitRequest* req,
                                            pb::RateLimitResponse* resp) override {
    resp->set_overall_code(pb::RateLimitResponse::OK);
    for (int i = 0; i < req->descriptors_size(); ++i)
      resp->add_statuses()->set_code(pb::RateLimitResponse::OK);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--listen=", 0) == 0) listen = a.substr(9);
  }
  // Abseil's deadlock detector off, as a release build of Abseil has it
  // (Debian's leaves it on: 5-8% of a gRPC server's CPU behind one
  // process-wide lock, docs/performance.md row 8).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Trivial service;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  auto server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "grpc_trivial_server: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::printf("listening %d\n", port);
  std::fflush(stdout);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  server->Shutdown();
  return 0;
}
