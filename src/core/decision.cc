#include <algorithm>
#include <cassert>

#include "ratelimit/decision.h"

namespace ratelimit {

size_t SpeakerOf(std::span<const Decision> decisions) {
  assert(!decisions.empty());
  size_t pick = 0;
  bool all_allowed = true;
  for (const Decision& d : decisions) all_allowed = all_allowed && d.allowed;
  bool picked = false;
  for (size_t i = 0; i < decisions.size(); ++i) {
    const Decision& d = decisions[i];
    const Decision& p = decisions[pick];
    if (!all_allowed) {
      if (d.allowed) continue;
      if (!picked || d.retry_after > p.retry_after) pick = i;
    } else if (!picked || d.remaining < p.remaining ||
               (d.remaining == p.remaining && d.reset_after > p.reset_after)) {
      pick = i;
    }
    picked = true;
  }
  return pick;
}

Decision Combine(std::span<const Decision> decisions) {
  assert(!decisions.empty());
  Decision out = decisions[SpeakerOf(decisions)];
  out.allowed =
      std::all_of(decisions.begin(), decisions.end(), [](const Decision& d) { return d.allowed; });
  if (out.allowed) {
    out.retry_after = std::chrono::microseconds(0);
    for (const Decision& d : decisions) out.delay = std::max(out.delay, d.delay);
  } else {
    out.delay = std::chrono::microseconds(0);
  }
  return out;
}

}  // namespace ratelimit
