// A fast seeded 64-bit hash for in-memory keys (not cryptographic: the random
// seed makes collisions hard to aim at, not impossible).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace ratelimit::store {

inline uint64_t Mix(uint64_t a, uint64_t b) {
  const __uint128_t r = static_cast<__uint128_t>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

inline uint64_t Hash64(std::string_view s, uint64_t seed) {
  constexpr uint64_t kP0 = 0xa0761d6478bd642fULL, kP1 = 0xe7037ed1a0b428dbULL,
                     kP2 = 0x8ebc6af09c88c6e3ULL, kP3 = 0x589965cc75374cc3ULL;
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = seed ^ Mix(n ^ kP0, kP1);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = Mix(w ^ kP1, h ^ kP2);
    p += 8;
    n -= 8;
  }
  // The last n < 8 bytes, read with fixed-size loads (a memcpy of n bytes
  // into a word compiled to byte stores and a word load, which the CPU could
  // not forward: a stall of a dozen cycles on every decision).
  uint64_t tail = 0;
  if (n == 0) {
  } else if (s.size() >= 8) {  // the word ending where the string ends, less what was hashed
    std::memcpy(&tail, p + n - 8, 8);
    tail >>= (8 - n) * 8;
  } else if (n >= 4) {  // two overlapping halves cover all n bytes
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + n - 4, 4);
    tail = lo | (uint64_t{hi} << 32);
  } else {
    tail = static_cast<uint8_t>(p[0]) | (uint64_t{static_cast<uint8_t>(p[n / 2])} << 8) |
           (uint64_t{static_cast<uint8_t>(p[n - 1])} << 16);
  }
  h = Mix(tail ^ kP3 ^ n, h ^ kP0);
  return Mix(h ^ kP2, kP3);
}

}  // namespace ratelimit::store
