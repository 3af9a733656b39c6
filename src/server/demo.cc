#include "server/demo.h"

#include <string>

#include "server/headers.h"
#include "server/problem.h"

namespace ratelimit::server {

Reply DemoPage() {
  Reply r;
  r.content_type = "text/html; charset=utf-8";
  r.body.assign(kDemoPage);
  r.Add("Cache-Control", "no-cache");
  return r;
}

Reply Pong() {
  Reply r;
  r.content_type = "application/json";
  r.body = "{\"pong\":true}";
  return r;
}

DemoStateLimit::DemoStateLimit(const Clock* clock)
    : limit_(*Limit::TokenBucket("demo_state", kBurst, kPerSecond)),
      store_({.shards = 16, .max_keys = kMaxClients, .clock = clock}) {}

std::optional<Reply> DemoStateLimit::Admit(std::string_view ip_key) {
  constexpr std::string_view kPath = "/demo/state";
  StatusOr<Decision> d = store_.DecideOne(ip_key, limit_, 1);
  if (!d.ok()) {
    // Full of other addresses (a flood from many): this cosmetic view waits,
    // the decisions do not.
    Reply r = ProblemReply(503, "/demo/state is busy: too many client addresses polling it", kPath);
    r.Add("Retry-After", "1");
    return r;
  }
  if (d->allowed) return std::nullopt;
  const int64_t seconds = RetryAfterSeconds(*d);
  Reply r = ProblemReply(429,
                         "/demo/state answers a client address at most " +
                             std::to_string(static_cast<int>(kPerSecond)) + " times a second (" +
                             std::to_string(kBurst) +
                             " at once); the demo page polls it 4 times a second: close some of "
                             "its tabs, or retry after " +
                             std::to_string(seconds) + " s",
                         kPath);
  r.Add("Retry-After", std::to_string(seconds));
  return r;
}

}  // namespace ratelimit::server
