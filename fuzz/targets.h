// Fuzz targets: one entry point per fuzzed surface, each taking arbitrary
// bytes. They are linked two ways:
//
//   fuzz/<name>_fuzzer.cc   defines Fuzz<Name> and, unless RL_FUZZ_REPLAY is
//                           defined, a thin LLVMFuzzerTestOneInput calling it
//                           (built with clang -DRL_FUZZ=ON, run by scripts/fuzz.sh)
//   tests/fuzz_regressions  compiles the same files with RL_FUZZ_REPLAY and
//                           replays every file of fuzz/corpus/<name>/ and
//                           fuzz/regressions/<name>/ through them (GCC, ctest label unit)
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

// The libFuzzer entry point of one target (omitted in the replay test).
#ifdef RL_FUZZ_REPLAY
#define RL_FUZZ_ENTRY(fn)
#else
#define RL_FUZZ_ENTRY(fn)                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    return ::ratelimit::fuzz::fn(data, size);                               \
  }
#endif
