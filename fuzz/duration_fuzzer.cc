// duration_fuzzer: ParseDuration and FormatDuration (include/ratelimit/limit.h).
//
// Invariants: an accepted duration is in (0, Limit::kMaxWindowMicros], and
// ParseDuration(FormatDuration(d)) == d. The first 8 bytes are also read as
// an int64 count: every d in range formats to text that parses back to d.
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz/targets.h"
#include "ratelimit/limit.h"

namespace ratelimit::fuzz {
namespace {

void RoundTrip(std::chrono::microseconds d, std::string_view origin) {
  const std::string text = FormatDuration(d);
  StatusOr<std::chrono::microseconds> again = ParseDuration(text);
  RL_FUZZ_CHECK(again.ok(), std::string(origin) + " -> " + text + ": " + again.status().message());
  RL_FUZZ_CHECK(*again == d, std::string(origin) + " -> " + text + " -> " +
                                 std::to_string(again->count()) + "us");
}

}  // namespace

int FuzzDuration(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<std::chrono::microseconds> d = ParseDuration(text);
  if (d.ok()) {
    RL_FUZZ_CHECK(d->count() > 0 && d->count() <= Limit::kMaxWindowMicros, text);
    RoundTrip(*d, text);
  } else {
    RL_FUZZ_CHECK(!d.status().message().empty(), text);
  }
  if (size >= sizeof(int64_t)) {
    int64_t n = 0;
    std::memcpy(&n, data, sizeof n);
    if (n > 0 && n <= Limit::kMaxWindowMicros) RoundTrip(std::chrono::microseconds(n), "int64");
    (void)FormatDuration(std::chrono::microseconds(n));  // any value: no crash
  }
  return 0;
}

}  // namespace ratelimit::fuzz
