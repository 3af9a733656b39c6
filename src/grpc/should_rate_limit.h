// ShouldRateLimit: one call of envoy.service.ratelimit.v3.RateLimitService,
// from the request message's bytes to the answer: the protobuf parse
// (refused before it allocates per descriptor or entry, when there are too
// many),
// the plan (envoy/plan.h), the decision (decide.h), the RateLimitResponse,
// its metrics and response_headers_to_add. What GrpcFace does with each
// call, apart from the server: the fuzz target (fuzz/grpc_fuzzer.cc) calls
// it on a store of its own, with a manual clock.
//
//   ShouldRateLimit(call.request(), {.config = config, .enforcer = &enforcer, .store = store},
//                   [call](RlsAnswer a) { ... call.Reply(std::move(a.message)) ... });
//
// Thread-safety: any thread; `done` runs once, on whatever thread the store
// completes on (inside the call for a memory store).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "envoy/config.h"
#include "grpc/h2_server.h"
#include "policy/config.h"
#include "ratelimit/clock.h"
#include "ratelimit/failure_mode.h"

namespace ratelimit::server {
class Enforcer;
}

namespace ratelimit::grpcface {

// What a call decides by. The shared pointers are held until it answers.
struct RlsContext {
  std::shared_ptr<const envoy::Config> config;
  server::Enforcer* enforcer = nullptr;
  FailureMode failure_mode = FailureMode::kOpen;
  std::shared_ptr<const policy::StoreConfig> store;  // deadline, local mode's numbers
  // response_headers_to_add (kNone: none, as envoyproxy/ratelimit).
  policy::HeaderDialect headers = policy::HeaderDialect::kNone;
  // The "now" of duration_until_reset (a fixed window's boundary).
  const Clock* clock = &Clock::System();
};

struct RlsAnswer {
  GrpcCode code = GrpcCode::kOk;
  std::string message;  // kOk: the serialized RateLimitResponse; otherwise grpc-message
};

// Answers the RateLimitRequest in `request` (read before it returns): OK
// with the response, INVALID_ARGUMENT for a request the plan refuses,
// INTERNAL for bytes that do not parse, UNAVAILABLE when failure mode
// `error` meets a store that cannot decide.
void ShouldRateLimit(std::string_view request, RlsContext context,
                     std::function<void(RlsAnswer)> done);

// Sends libprotobuf's own log lines (it writes one to stderr for every
// message whose string field is not UTF-8, which any client of the
// unauthenticated gRPC port can send) through the JSON log, at most 5 a
// second ("protobuf log lines suppressed" counts the rest). Once per
// process; GrpcFace::Start calls it.
void LogProtobufThroughJsonLog();

// How many descriptors (field 2) the bytes of a RateLimitRequest hold,
// counted up to `stop` + 1 without parsing them. Bytes that do not parse
// end the count (the parse then refuses them).
size_t DescriptorsIn(std::string_view bytes, size_t stop);
// How many entries (field 1 of a descriptor) its descriptors hold in all,
// counted the same way.
size_t EntriesIn(std::string_view bytes, size_t stop);

}  // namespace ratelimit::grpcface
