// Decision: the answer to "may this request proceed?" for one limit or for all
// the limits of a request. Over the limit is a result, not an error.
//
// The numbers mean the same in every store (memory, Redis, Redis Cluster):
//   limit        capacity (token bucket) or count per window (window algorithms)
//   remaining    whole units left after this request (floor), never negative
//   retry_after  0 when allowed; when denied, how long until this same request
//                (same cost) would be allowed if nothing else arrived
//   reset_after  how long until the limit is back to full if nothing else arrived
//   delay        leaky bucket only (0 otherwise, and 0 when denied): how long the
//                allowed request should wait before it proceeds, its place in
//                the queue
//
// A denied request changes no state.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace ratelimit {

struct Decision {
  bool allowed = false;
  int64_t limit = 0;
  int64_t remaining = 0;
  std::chrono::microseconds retry_after{0};
  std::chrono::microseconds reset_after{0};
  std::chrono::microseconds delay{0};

  friend bool operator==(const Decision&, const Decision&) = default;
};

// The overall decision of several limits checked together: allowed only if
// every one allows. When denied, the numbers are those of the denying limit
// that asks the longest wait (and no delay); when allowed, those of the limit
// with the least room left (ties: the one that resets last), and the longest
// delay of all the limits.
// REQUIRES: !decisions.empty()
Decision Combine(std::span<const Decision> decisions);

// The index of the decision whose numbers Combine carries: the limit that
// speaks for the request (its name goes into the headers). Combine's answer
// need not equal that decision (it carries the longest delay of all the
// limits), so find the speaker by this, never by comparing decisions.
// REQUIRES: !decisions.empty()
size_t SpeakerOf(std::span<const Decision> decisions);

}  // namespace ratelimit
