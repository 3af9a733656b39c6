// Demo: the page at / (web/index.html, embedded at build time), the demo
// API answer of /api/ping, and the limit of the page's own poll,
// /demo/state. Only served when server.demo is set (the embedded default
// config).
//
//   DemoStateLimit poll;                 // one per server
//   if (std::optional<Reply> no = poll.Admit(who.ip_key)) return done(*std::move(no));
//
// Thread-safety: DemoPage and Pong are pure functions over constant data;
// DemoStateLimit is thread-safe (a MemoryStore).
#pragma once

#include <optional>
#include <string_view>

#include "ratelimit/clock.h"
#include "ratelimit/limit.h"
#include "ratelimit/memory_store.h"
#include "server/reply.h"

namespace ratelimit::server {

extern const std::string_view kDemoPage;  // generated from web/index.html

Reply DemoPage();  // 200 text/html
Reply Pong();      // 200 {"pong": true}

// /demo/state is public and each call costs a store Peek (a Redis round trip
// per limit group with Redis), so it has a limit of its own, per client
// address: a token bucket of kBurst refilled kPerSecond a second. The page
// polls 4 times a second in a visible tab (browsers slow hidden tabs to about
// once a second) and once after each answer it shows, coalesced: a few tabs
// of one address stay under it. Kept in this process's memory, never in the
// shared store: it guards the store.
class DemoStateLimit {
 public:
  static constexpr int64_t kBurst = 20;
  static constexpr double kPerSecond = 10;
  // Client addresses tracked at once (about 56 bytes each); an address idle
  // for kBurst / kPerSecond (2 s) is forgotten. Beyond it, new addresses get 503.
  static constexpr size_t kMaxClients = 100'000;

  explicit DemoStateLimit(const Clock* clock = nullptr);

  // nullopt: answer the call of `ip_key` (Identity::ip_key: the address
  // formed as for the demo's own limit, through trusted proxies only).
  // Otherwise the answer instead: 429 with Retry-After, or 503 when
  // kMaxClients addresses are tracked; both problem+json.
  std::optional<Reply> Admit(std::string_view ip_key);

  // The server's sweep (Store::SweepPart).
  size_t SweepPart(size_t part, size_t parts) { return store_.SweepPart(part, parts); }

 private:
  const Limit limit_;
  MemoryStore store_;
};

}  // namespace ratelimit::server
