// Parsing the Redis Cluster topology replies and redirection errors.
//
//   StatusOr<std::vector<SlotRange>> map = ParseClusterShards(reply, /*tls=*/false, "10.0.0.1");
//   StatusOr<Redirect> r = ParseRedirect("MOVED 3999 127.0.0.1:6381", "127.0.0.1");
//   // r->kind == Redirect::kMoved, r->slot == 3999, r->to == {"127.0.0.1", 6381}
//
// Every malformed input is a kInternal status naming what was wrong, never a
// crash: these bytes come from the network. `asked_host` is the host of the
// node that sent the reply; it stands in when a reply leaves the host empty
// (Redis does when it does not know its own address).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ratelimit/status.h"
#include "redis/reply.h"
#include "redis/url.h"

namespace ratelimit::redis {

// Slots [first, last] are served by `master`.
struct SlotRange {
  uint16_t first = 0;
  uint16_t last = 0;
  NodeAddress master;
};

// CLUSTER SHARDS (Redis 7.0+). With `tls`, a node's "tls-port" is used when given.
// A shard's slots go to its first master whose "health" is "online" (a node
// without the field counts as online); a shard with none (a failover under
// way) leaves its slots out of the map. A map serving no slot is an error.
StatusOr<std::vector<SlotRange>> ParseClusterShards(const Reply& reply, bool tls,
                                                    std::string_view asked_host);
// CLUSTER SLOTS (deprecated, the fallback for servers before 7.0).
StatusOr<std::vector<SlotRange>> ParseClusterSlots(const Reply& reply, std::string_view asked_host);

// "-MOVED <slot> <host>:<port>" or "-ASK <slot> <host>:<port>" (text without the '-').
struct Redirect {
  enum Kind { kMoved, kAsk };
  Kind kind = kMoved;
  uint16_t slot = 0;
  NodeAddress to;
};
StatusOr<Redirect> ParseRedirect(std::string_view error, std::string_view asked_host);

}  // namespace ratelimit::redis
