#include "ratelimit/clock.h"

#include <time.h>

namespace ratelimit {
namespace {

class SystemClock final : public Clock {
 public:
  int64_t NowMicros() const override {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1000;
  }
};

}  // namespace

const Clock& Clock::System() {
  static const SystemClock* const clock = new SystemClock();
  return *clock;
}

}  // namespace ratelimit
