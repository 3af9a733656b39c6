// Fuzz targets: one entry point per fuzzed surface, each taking arbitrary
// bytes. fuzz/<name>_fuzzer.cc defines Fuzz<Name>; all of them are the
// library rl_fuzz_targets (fuzz/CMakeLists.txt), linked two ways:
//
//   <name>_fuzzer           fuzz/entry.cc, libFuzzer's LLVMFuzzerTestOneInput
//                           calling Fuzz<Name> (clang -DRL_FUZZ=ON, run by
//                           scripts/fuzz.sh)
//   tests/fuzz_regressions  replays every file of fuzz/corpus/<name>/ and
//                           fuzz/regressions/<name>/ through them (any
//                           compiler, ctest label unit)
//
// Each entry point returns 0 and never throws. A broken invariant prints what
// broke and aborts (RL_FUZZ_CHECK), which libFuzzer records as a crash.
// Entry points keep no state between calls, so an input replays the same way
// alone and after any other input.
//
// Thread-safety: call from one thread at a time (some targets keep a policy
// built once in a function-local static, read-only after construction).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ratelimit::fuzz {

int FuzzConfig(const uint8_t* data, size_t size);       // YAML loader, Policy, DumpRedacted
int FuzzPath(const uint8_t* data, size_t size);         // CanonicalPath, CanonicalRoutePath
int FuzzClientIp(const uint8_t* data, size_t size);     // ClientIp, IpAddress, Cidr
int FuzzRedisReply(const uint8_t* data, size_t size);   // ReplyReader, command encoding
int FuzzRedisUrl(const uint8_t* data, size_t size);     // ParseRedisUrl, RedactedUrl, RedactUrl
int FuzzDuration(const uint8_t* data, size_t size);     // ParseDuration, FormatDuration
int FuzzDecisionApi(const uint8_t* data, size_t size);  // POST /v1/check(/batch) bodies
int FuzzHttp(const uint8_t* data, size_t size);         // raw HTTP/1.1 bytes -> Router
int FuzzGateway(const uint8_t* data, size_t size);      // request -> Gateway -> upstream answer
int FuzzGrpc(const uint8_t* data, size_t size);         // ShouldRateLimit: protobuf, HTTP/2, gRPC

// Prints "fuzz invariant failed at file:line: what (detail)" and aborts.
[[noreturn]] inline void InvariantFailed(const char* file, int line, const char* what,
                                         std::string_view detail) {
  std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s (%.*s)\n", file, line, what,
               static_cast<int>(detail.size() > 2000 ? 2000 : detail.size()), detail.data());
  std::abort();
}

}  // namespace ratelimit::fuzz

// RL_FUZZ_CHECK(cond, detail): `detail` is anything convertible to string_view,
// evaluated only on failure.
#define RL_FUZZ_CHECK(cond, detail)                                                       \
  do {                                                                                    \
    if (!(cond)) ::ratelimit::fuzz::InvariantFailed(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)
