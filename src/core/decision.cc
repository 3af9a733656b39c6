#include <algorithm>
#include <cassert>

#include "ratelimit/decision.h"

namespace ratelimit {

Decision Combine(std::span<const Decision> decisions) {
  assert(!decisions.empty());
  const Decision* pick = nullptr;
  bool all_allowed = true;
  for (const Decision& d : decisions) all_allowed = all_allowed && d.allowed;
  for (const Decision& d : decisions) {
    if (!all_allowed) {
      if (d.allowed) continue;
      if (pick == nullptr || d.retry_after > pick->retry_after) pick = &d;
    } else if (pick == nullptr || d.remaining < pick->remaining ||
               (d.remaining == pick->remaining && d.reset_after > pick->reset_after)) {
      pick = &d;
    }
  }
  Decision out = *pick;
  out.allowed = all_allowed;
  if (all_allowed) {
    out.retry_after = std::chrono::microseconds(0);
    for (const Decision& d : decisions) out.delay = std::max(out.delay, d.delay);
  } else {
    out.delay = std::chrono::microseconds(0);
  }
  return out;
}

}  // namespace ratelimit
