// libFuzzer's entry point for one fuzz target: RL_FUZZ_TARGET names its
// Fuzz<Name> (fuzz/CMakeLists.txt compiles this file once per target).
#include <cstddef>
#include <cstdint>

#include "fuzz/targets.h"

#ifndef RL_FUZZ_TARGET
#error "RL_FUZZ_TARGET must name the entry point, e.g. -DRL_FUZZ_TARGET=FuzzHttp"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return ::ratelimit::fuzz::RL_FUZZ_TARGET(data, size);
}
