// grpc_load: a load driver for Envoy's rate limit service
// (ShouldRateLimit), on gRPC's async C++ API with one completion queue.
//
//   grpc_load --target=127.0.0.1:8081 --mode=closed --inflight=64 --duration-ms=3000
//       the most calls/s with `inflight` calls outstanding (closed loop)
//   grpc_load --target=127.0.0.1:8081 --mode=open --rate=20000 --duration-ms=3000
//       calls at a fixed rate (open loop); each latency counts from the call's
//       scheduled start, so a stall shows in the percentiles
//
// Prints one line: calls=N rps=R p50_us=.. p99_us=.. p999_us=.. errors=N
// over_limit=N. Every call asks domain `bench`, descriptor {key: k, value:
// one of --keys values}. Used by scripts/bench.sh (row 8).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

#include "flags.h"

namespace {

namespace pb = ::envoy::service::ratelimit::v3;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string target = "127.0.0.1:8081";
  std::string mode = "closed";
  int64_t inflight = 64;
  double rate = 1000;
  int64_t duration_ms = 3000;
  int64_t warmup_ms = 500;
  int64_t keys = 10000;
};

struct Call {
  grpc::ClientContext ctx;
  pb::RateLimitResponse resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::RateLimitResponse>> rpc;
  Clock::time_point start;
};

class Driver {
 public:
  explicit Driver(const Options& o)
      : o_(o),
        stub_(pb::RateLimitService::NewStub(
            grpc::CreateChannel(o.target, grpc::InsecureChannelCredentials()))) {}

  void Issue(Clock::time_point scheduled) {
    auto* c = new Call;
    c->start = scheduled;
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::RateLimitRequest req;
    req.set_domain("bench");
    auto* e = req.add_descriptors()->add_entries();
    e->set_key("k");
    e->set_value(std::to_string(next_key_++ % static_cast<uint64_t>(o_.keys)));
    c->rpc = stub_->PrepareAsyncShouldRateLimit(&c->ctx, req, &cq_);
    c->rpc->StartCall();
    c->rpc->Finish(&c->resp, &c->status, c);
    outstanding_.fetch_add(1);
  }

  // Returns false when the queue is shut down.
  bool Complete(bool reissue) {
    void* tag;
    bool ok;
    if (!cq_.Next(&tag, &ok)) return false;
    auto* c = static_cast<Call*>(tag);
    const auto now = Clock::now();
    if (now >= measure_from_ && now < measure_until_) {
      std::lock_guard lock(mu_);
      lat_us_.push_back(
          std::chrono::duration_cast<std::chrono::microseconds>(now - c->start).count());
      if (!c->status.ok())
        ++errors_;
      else if (c->resp.overall_code() != pb::RateLimitResponse::OK)
        ++over_;
    }
    delete c;
    completed_.fetch_add(1);
    outstanding_.fetch_sub(1);
    if (reissue && now < measure_until_) Issue(Clock::now());
    return true;
  }

  int Run() {
    const auto t0 = Clock::now();
    measure_from_ = t0 + std::chrono::milliseconds(o_.warmup_ms);
    measure_until_ = measure_from_ + std::chrono::milliseconds(o_.duration_ms);
    std::thread poller;
    if (o_.mode == "closed") {
      for (int64_t i = 0; i < o_.inflight; ++i) Issue(Clock::now());
      poller = std::thread([this] {
        while (outstanding_.load() > 0 && Complete(true)) {
        }
      });
    } else {
      poller = std::thread([this] {
        while (Complete(false)) {
        }
      });
      const auto interval = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / o_.rate));
      auto next = t0;
      while (next < measure_until_) {
        std::this_thread::sleep_until(next);
        Issue(next);
        next += interval;
      }
    }
    // Wait for the last answers (at most the deadline).
    while (outstanding_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    cq_.Shutdown();
    poller.join();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    std::sort(lat_us_.begin(), lat_us_.end());
    auto pct = [&](double p) {
      if (lat_us_.empty()) return int64_t{0};
      return lat_us_[std::min(lat_us_.size() - 1, static_cast<size_t>(p * lat_us_.size()))];
    };
    std::printf(
        "calls=%zu rps=%.0f p50_us=%lld p99_us=%lld p999_us=%lld errors=%lld over_limit=%lld\n",
        lat_us_.size(), lat_us_.size() * 1000.0 / o_.duration_ms, static_cast<long long>(pct(0.5)),
        static_cast<long long>(pct(0.99)), static_cast<long long>(pct(0.999)),
        static_cast<long long>(errors_), static_cast<long long>(over_));
    // Answers outside the measured window still show that the target works;
    // none at all is a failure.
    return completed_.load() == 0 ? 1 : 0;
  }

 private:
  Options o_;
  std::unique_ptr<pb::RateLimitService::Stub> stub_;
  grpc::CompletionQueue cq_;
  std::atomic<int64_t> outstanding_{0};
  std::atomic<int64_t> completed_{0};  // measured or not
  uint64_t next_key_ = 0;
  Clock::time_point measure_from_, measure_until_;
  std::mutex mu_;
  std::vector<int64_t> lat_us_;
  int64_t errors_ = 0, over_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const bench::Usage usage{"grpc_load",
                           "--target --mode --inflight --rate --duration-ms --warmup-ms --keys"};
  bench::ParseFlags(argc, argv, usage,
                    {{"target", &o.target},
                     {"mode", &o.mode},
                     {"inflight", &o.inflight},
                     {"rate", &o.rate},
                     {"duration-ms", &o.duration_ms},
                     {"warmup-ms", &o.warmup_ms},
                     {"keys", &o.keys}});
  o.keys = std::max<int64_t>(1, o.keys);
  if ((o.mode != "closed" && o.mode != "open") || o.rate <= 0 || o.inflight < 1) {
    std::fprintf(stderr, "grpc_load: --mode closed|open, --rate > 0, --inflight >= 1\n");
    return 2;
  }
  Driver d(o);
  return d.Run();
}
