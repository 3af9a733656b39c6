// h2_trivial_server: the RateLimitService on ratelimitd's own gRPC server
// (src/grpc/h2_server.h), answering every ShouldRateLimit OK without deciding
// anything: the ceiling of the server the face runs on, the peer of row 8c
// in scripts/bench.sh (which runs both with one thread). Row 8a's peer,
// grpc_trivial_server, is the same on gRPC C++.
//
//   h2_trivial_server --listen=127.0.0.1:0 [--threads=N]
//       prints "listening PORT", serves until SIGTERM; N threads (default:
//       one per core)
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "grpc/h2_server.h"
#include "server/listen_address.h"

namespace pb = ::envoy::service::ratelimit::v3;
using ratelimit::grpcface::GrpcCall;
using ratelimit::grpcface::GrpcCode;

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  unsigned n = std::max(1U, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--listen=", 0) == 0) {
      listen = a.substr(9);
    } else if (a.rfind("--threads=", 0) == 0 && std::atoi(a.c_str() + 10) > 0) {
      n = static_cast<unsigned>(std::atoi(a.c_str() + 10));
    } else {
      std::fprintf(stderr, "h2_trivial_server: unknown or bad argument %s\n", a.c_str());
      return 2;
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the threads start: they inherit it

  boost::asio::io_context ioc;
  auto work = boost::asio::make_work_guard(ioc);
  ratelimit::grpcface::H2Server server(ioc, {});
  server.Handle("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", [](GrpcCall call) {
    pb::RateLimitRequest req;
    if (!req.ParseFromArray(call.request().data(), static_cast<int>(call.request().size())))
      return call.Finish(GrpcCode::kInternal, "cannot parse the RateLimitRequest");
    pb::RateLimitResponse resp;
    resp.set_overall_code(pb::RateLimitResponse::OK);
    for (int i = 0; i < req.descriptors_size(); ++i)
      resp.add_statuses()->set_code(pb::RateLimitResponse::OK);
    call.Reply(resp.SerializeAsString());
  });
  auto endpoint = ratelimit::server::ResolveListenAddress(ioc, listen);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "h2_trivial_server: %s\n", endpoint.status().message().c_str());
    return 1;
  }
  if (auto s = server.Listen(*endpoint); !s.ok()) {
    std::fprintf(stderr, "h2_trivial_server: %s\n", s.message().c_str());
    return 1;
  }
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < n; ++i) threads.emplace_back([&ioc] { ioc.run(); });
  std::printf("listening %d\n", server.port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  server.Shutdown(std::chrono::seconds(1));
  work.reset();
  ioc.stop();
  for (auto& t : threads) t.join();
  return 0;
}
